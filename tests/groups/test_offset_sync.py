"""Source offsets into serve's coordinator: replicated partitions only, held at the replica's
end, and never into a group that is the replica's own."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from replicad.groups.coordinator import (
    CoordinatorConfig,
    GroupCoordinator,
    JoinRequest,
    MemberRef,
)
from replicad.groups.offset_sync import plan_group_sync
from replicad.types import OffsetAndMetadata, TopicPartition

T0, T1, OTHER = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("x", 0)


def test_only_replicated_partitions_and_offsets_beyond_the_end_are_held_there() -> None:
    plan = plan_group_sync(
        {
            T0: OffsetAndMetadata(40, 3, "m"),
            T1: OffsetAndMetadata(90, 3, "m"),
            OTHER: OffsetAndMetadata(5),
        },
        {T0: 50, T1: 60},
    )
    assert plan.offsets == {T0: OffsetAndMetadata(40, 3, "m"), T1: OffsetAndMetadata(60, -1, "m")}
    assert plan.held == (T1,)
    assert plan.not_replicated == (OTHER,)


def test_offsets_are_taken_into_a_new_group_and_not_again_when_unchanged() -> None:
    coordinator = GroupCoordinator()
    first = coordinator.sync_offsets("g", {T0: OffsetAndMetadata(4, 1)}, now_ms=10)
    assert set(first.applied) == {T0} and not first.stopped
    assert coordinator.fetch_offsets("g", [T0]).offsets[T0].offset == 4
    again = coordinator.sync_offsets("g", {T0: OffsetAndMetadata(4, 1)}, now_ms=20)
    assert again.applied == {} and not again.stopped
    moved = coordinator.sync_offsets("g", {T0: OffsetAndMetadata(9, 1)}, now_ms=30)
    assert moved.applied[T0].offset == 9


def test_a_group_a_client_committed_to_here_is_no_longer_synced() -> None:
    coordinator = GroupCoordinator()
    coordinator.sync_offsets("g", {T0: OffsetAndMetadata(4)}, now_ms=0)
    errors = coordinator.commit("g", -1, MemberRef(""), {T0: OffsetAndMetadata(7)}, now_ms=1)
    assert errors.result.errors == {T0: ErrorCode.none}
    stopped = coordinator.sync_offsets("g", {T0: OffsetAndMetadata(5)}, now_ms=2)
    assert stopped.stopped and stopped.applied == {}
    assert coordinator.fetch_offsets("g", [T0]).offsets[T0].offset == 7


def test_a_group_a_member_joined_here_is_no_longer_synced_even_once_it_is_empty() -> None:
    coordinator = GroupCoordinator(CoordinatorConfig(initial_rebalance_delay_ms=0))
    coordinator.sync_offsets("g", {T0: OffsetAndMetadata(4)}, now_ms=0)
    join = JoinRequest("g", "", 10_000, 10_000, "consumer", (("range", b""),))
    coordinator.join(join, "token", now_ms=0)  # KIP-394: a member id first
    assert coordinator.sync_offsets("g", {T0: OffsetAndMetadata(5)}, now_ms=1).applied == {
        T0: coordinator.groups["g"].offsets[T0]
    }  # only asked for an id: not a member yet
    member_id = next(iter(coordinator.groups["g"].pending_members))
    coordinator.join(
        JoinRequest("g", member_id, 10_000, 10_000, "consumer", (("range", b""),)), "t2", now_ms=1
    )
    assert coordinator.sync_offsets("g", {T0: OffsetAndMetadata(6)}, now_ms=2).stopped
    coordinator.leave("g", [MemberRef(member_id)], now_ms=3)
    assert coordinator.groups["g"].state.value == "Empty"
    assert coordinator.sync_offsets("g", {T0: OffsetAndMetadata(6)}, now_ms=4).stopped
    assert coordinator.fetch_offsets("g", [T0]).offsets[T0].offset == 5


def test_a_group_owned_here_stays_owned_once_deleted_and_after_a_restore() -> None:
    coordinator = GroupCoordinator(CoordinatorConfig(initial_rebalance_delay_ms=0))
    join = JoinRequest("g", "", 10_000, 10_000, "consumer", (("range", b""),), client_id="c")
    member_id = coordinator.join(join, "t1", now_ms=0).replies[0].result.member_id
    coordinator.join(
        JoinRequest("g", member_id, 10_000, 10_000, "consumer", (("range", b""),)), "t2", now_ms=0
    )
    assert coordinator.take_newly_owned() == ("g",)
    assert coordinator.take_newly_owned() == ()  # each mark is handed out once
    coordinator.leave("g", [MemberRef(member_id)], now_ms=1)
    assert coordinator.delete_groups(["g"], now_ms=1) == {"g": ErrorCode.none}
    assert "g" not in coordinator.groups
    assert coordinator.sync_offsets("g", {T0: OffsetAndMetadata(6)}, now_ms=2).stopped

    restarted = GroupCoordinator()
    restarted.restore({}, now_ms=3, owned={"g"})
    assert restarted.sync_offsets("g", {T0: OffsetAndMetadata(6)}, now_ms=4).stopped
    assert restarted.fetch_offsets("g", [T0]).offsets[T0] is None
    assert restarted.take_newly_owned() == ()  # restored marks are on disk already


def test_an_admin_commit_makes_the_group_owned_once() -> None:
    coordinator = GroupCoordinator()
    coordinator.commit("g", -1, MemberRef(""), {T0: OffsetAndMetadata(7)}, now_ms=1)
    coordinator.commit("g", -1, MemberRef(""), {T0: OffsetAndMetadata(8)}, now_ms=2)
    assert coordinator.take_newly_owned() == ("g",)


def test_a_read_only_group_refuses_commits_and_stays_synced_once_its_members_leave() -> None:
    coordinator = GroupCoordinator(
        CoordinatorConfig(initial_rebalance_delay_ms=0), read_only=lambda g: g == "synced"
    )
    coordinator.sync_offsets("synced", {T0: OffsetAndMetadata(4)}, now_ms=0)
    refused = coordinator.commit("synced", -1, MemberRef(""), {T0: OffsetAndMetadata(9)}, now_ms=1)
    assert refused.result.errors == {T0: ErrorCode.group_authorization_failed}
    assert coordinator.fetch_offsets("synced", [T0]).offsets[T0].offset == 4
    join = JoinRequest("synced", "", 10_000, 10_000, "consumer", (("range", b""),))
    member_id = coordinator.join(join, "t1", now_ms=1).replies[0].result.member_id
    coordinator.join(
        JoinRequest("synced", member_id, 10_000, 10_000, "consumer", (("range", b""),)),
        "t2",
        now_ms=1,
    )
    assert coordinator.sync_offsets("synced", {T0: OffsetAndMetadata(5)}, now_ms=2).stopped
    coordinator.leave("synced", [MemberRef(member_id)], now_ms=3)
    assert coordinator.take_newly_owned() == ()
    assert coordinator.sync_offsets("synced", {T0: OffsetAndMetadata(6)}, now_ms=4).applied
    # Other groups commit as ever.
    other = coordinator.commit("other", -1, MemberRef(""), {T0: OffsetAndMetadata(3)}, now_ms=5)
    assert other.result.errors == {T0: ErrorCode.none}
