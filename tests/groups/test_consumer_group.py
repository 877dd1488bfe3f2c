"""The consumer group protocol (KIP-848) through the coordinator, rule by rule, with time
passed in: heartbeats in, epochs and assignments out."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode as E

from replicad.groups.classic_group import CommittedOffset
from replicad.groups.consumer_group import ConsumerHeartbeat, HeartbeatResult, MemberState
from replicad.groups.coordinator import (
    CoordinatorConfig,
    GroupCoordinator,
    JoinRequest,
    MemberRef,
)
from replicad.types import OffsetAndMetadata, TopicPartition

SESSION = 45_000
REBALANCE = 30_000
TOPICS = {"t": 4}
G = "g"


def tps(*partitions: int, topic: str = "t") -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(topic, p) for p in partitions)


class Harness:
    def __init__(self, topics: dict[str, int] | None = None) -> None:
        self.coordinator = GroupCoordinator(CoordinatorConfig(consumer_session_timeout_ms=SESSION))
        self.topics = dict(topics or TOPICS)
        self.now = 1_000
        # What each member believes it owns and its epoch (as the client keeps them).
        self.owned: dict[str, frozenset[TopicPartition]] = {}
        self.epoch: dict[str, int] = {}

    def beat(self, member: str, epoch: int | None = None, **fields: Any) -> HeartbeatResult:
        req = ConsumerHeartbeat(
            G, member, self.epoch.get(member, 0) if epoch is None else epoch, **fields
        )
        return self.coordinator.consumer_heartbeat(req, self.topics, now_ms=self.now)

    def join(self, member: str, *topics: str, **fields: Any) -> HeartbeatResult:
        result = self.beat(
            member,
            0,
            rebalance_timeout_ms=REBALANCE,
            subscribed_topic_names=topics or ("t",),
            owned=frozenset(),
            **fields,
        )
        self._take(member, result)
        return result

    def join_error(self, **fields: Any) -> E:
        return self.beat(
            "a",
            0,
            rebalance_timeout_ms=REBALANCE,
            subscribed_topic_names=("t",),
            owned=frozenset(),
            **fields,
        ).error

    def poll_member(self, member: str) -> HeartbeatResult:
        """A heartbeat as the Java client sends it: its owned partitions after it applied
        the last assignment (revoking first)."""
        result = self.beat(member, owned=self.owned.get(member, frozenset()))
        self._take(member, result)
        return result

    def _take(self, member: str, result: HeartbeatResult) -> None:
        assert result.error == E.none, result
        self.epoch[member] = result.member_epoch
        if result.assignment is not None:
            self.owned[member] = result.assignment

    def member(self, member_id: str) -> Any:
        return self.coordinator.consumer_groups[G].members[member_id]

    def no_partition_held_twice(self) -> None:
        group = self.coordinator.consumer_groups[G]
        seen: list[TopicPartition] = []
        for m in group.members.values():
            seen.extend(m.assigned | m.pending_revocation)
        assert len(seen) == len(set(seen))


def test_a_first_member_gets_every_partition_at_epoch_1() -> None:
    h = Harness()
    result = h.join("a")
    assert (result.member_epoch, result.assignment) == (1, tps(0, 1, 2, 3))
    assert result.heartbeat_interval_ms == 5_000
    assert h.coordinator.consumer_groups[G].state.value == "Stable"


def test_a_second_member_gets_partitions_only_once_the_first_revoked_them() -> None:
    h = Harness()
    h.join("a")
    joined = h.join("b")
    # Nothing is free yet: b is at the new epoch, waiting for a to release.
    assert joined.assignment == frozenset()
    assert h.member("b").state is MemberState.UNRELEASED_PARTITIONS
    # a is told to keep two (revoke before assign) and stays at its epoch until it did.
    told = h.beat("a", owned=tps(0, 1, 2, 3))
    h._take("a", told)
    assert told.member_epoch == 1 and len(told.assignment or ()) == 2
    assert h.member("a").state is MemberState.UNREVOKED_PARTITIONS
    h.no_partition_held_twice()
    assert h.poll_member("b").assignment is None  # nothing new: a has not revoked yet
    done = h.poll_member("a")  # owned is now the two it keeps
    assert done.member_epoch == 2
    got = h.poll_member("b")
    assert got.assignment is not None and len(got.assignment) == 2
    assert h.owned["a"] | h.owned["b"] == tps(0, 1, 2, 3)
    h.no_partition_held_twice()
    assert h.coordinator.consumer_groups[G].state.value == "Stable"


def test_leaving_frees_the_partitions_for_the_others() -> None:
    h = Harness()
    h.join("a")
    h.join("b")
    h.poll_member("a")
    h.poll_member("a")
    h.poll_member("b")
    left = h.beat("a", -1)
    assert (left.error, left.member_epoch) == (E.none, -1)
    h.poll_member("b")
    assert h.poll_member("b").member_epoch > 2
    assert h.owned["b"] == tps(0, 1, 2, 3)


def test_a_member_not_heard_from_within_the_session_is_removed() -> None:
    h = Harness()
    h.join("a")
    h.now += 1_000
    h.join("b")
    h.now += SESSION - 500  # past a's session, not b's
    h.coordinator.poll(now_ms=h.now)
    assert set(h.coordinator.consumer_groups[G].members) == {"b"}
    assert h.poll_member("b").assignment == tps(0, 1, 2, 3)
    assert h.beat("a").error == E.unknown_member_id


def test_a_member_that_does_not_revoke_within_its_rebalance_timeout_is_removed() -> None:
    h = Harness()
    h.join("a")
    h.join("b")
    h.beat("a", owned=tps(0, 1, 2, 3))  # told to revoke two
    for _ in range(3):  # still heartbeating, never revoking
        h.now += REBALANCE // 3
        h.beat("b")
        h.beat("a", owned=tps(0, 1, 2, 3))
    h.coordinator.poll(now_ms=h.now)
    assert set(h.coordinator.consumer_groups[G].members) == {"b"}


def test_epochs_ahead_or_behind_are_fenced_but_a_lost_answer_is_forgiven() -> None:
    h = Harness()
    h.join("a")
    assert h.beat("a", 5).error == E.fenced_member_epoch
    h.join("b")
    h.poll_member("a")
    h.poll_member("a")  # a is at epoch 2 now (previous 1)
    assert h.epoch["a"] == 2
    assert h.beat("a", 1, owned=h.owned["a"]).error == E.none
    assert h.beat("a", 1, owned=tps(0, 1, 2, 3)).error == E.fenced_member_epoch
    assert h.beat("zz", 1).error == E.unknown_member_id


def test_joining_again_under_the_same_id_starts_over() -> None:
    h = Harness()
    h.join("a")
    again = h.join("a")
    assert again.assignment == tps(0, 1, 2, 3)
    assert again.member_epoch > 1


def test_first_heartbeats_missing_fields_are_invalid() -> None:
    h = Harness()
    assert h.beat("a", 0, subscribed_topic_names=("t",), owned=frozenset()).error == (
        E.invalid_request
    )
    assert h.beat("a", 0, rebalance_timeout_ms=1, owned=frozenset()).error == E.invalid_request
    assert h.beat("", 0).error == E.invalid_request
    assert h.join_error(server_assignor="sticky") == E.unsupported_assignor


def test_a_bad_regex_is_refused_and_a_good_one_subscribes() -> None:
    h = Harness({"t": 1, "orders": 2, "other": 1})
    assert h.join_error(subscribed_topic_regex="(") == E.invalid_regular_expression
    result = h.beat(
        "a",
        0,
        rebalance_timeout_ms=REBALANCE,
        subscribed_topic_names=(),
        subscribed_topic_regex="ord.*",
        owned=frozenset(),
    )
    assert result.assignment == tps(0, 1, topic="orders")


def test_the_range_assignor_is_used_when_asked_for() -> None:
    h = Harness({"t": 4})
    h.join("a", server_assignor="range")
    h.join("b", server_assignor="range")
    group = h.coordinator.consumer_groups[G]
    assert group.assignor_name() == "range"
    assert group.target == {"a": tps(0, 1), "b": tps(2, 3)}


def test_new_partitions_of_a_subscribed_topic_are_assigned() -> None:
    h = Harness({"t": 2})
    h.join("a")
    h.topics["t"] = 3
    result = h.poll_member("a")
    assert result.assignment == tps(0, 1, 2)


def test_commits_need_the_members_current_epoch_and_v9() -> None:
    h = Harness()
    h.join("a")
    c = h.coordinator
    offsets = {TopicPartition("t", 0): OffsetAndMetadata(5)}
    ok = c.commit(G, 1, MemberRef("a"), offsets, now_ms=h.now, version=9).result
    assert set(ok.errors.values()) == {E.none}
    stale = c.commit(G, 0, MemberRef("a"), offsets, now_ms=h.now, version=9).result
    assert set(stale.errors.values()) == {E.stale_member_epoch}
    old = c.commit(G, 1, MemberRef("a"), offsets, now_ms=h.now, version=8).result
    assert set(old.errors.values()) == {E.unsupported_version}
    admin = c.commit(G, -1, MemberRef(""), offsets, now_ms=h.now, version=9).result
    assert set(admin.errors.values()) == {E.unknown_member_id}
    assert c.fetch_offsets(G, None, member_id="a", member_epoch=0).error == E.stale_member_epoch
    fetched = c.fetch_offsets(G, None, member_id="a", member_epoch=1)
    assert fetched.offsets[TopicPartition("t", 0)].offset == 5  # type: ignore[union-attr]


def test_a_classic_group_with_offsets_becomes_a_consumer_group_and_back() -> None:
    h = Harness()
    c = h.coordinator
    c.commit(G, -1, MemberRef(""), {TopicPartition("t", 0): OffsetAndMetadata(7)}, now_ms=h.now)
    assert G in c.groups
    h.join("a")
    assert G not in c.groups and G in c.consumer_groups
    assert c.fetch_offsets(G, None).offsets[TopicPartition("t", 0)].offset == 7  # type: ignore[union-attr]
    classic = JoinRequest(G, "", 10_000, 10_000, "consumer", (("range", b""),))
    refused = c.join(classic, "token", now_ms=h.now).replies[0].result
    assert refused.error == E.inconsistent_group_protocol
    h.beat("a", -1)
    c.join(classic, "token2", now_ms=h.now)
    assert G in c.groups and G not in c.consumer_groups
    assert c.groups[G].offsets[TopicPartition("t", 0)].offset == 7


def test_a_heartbeat_into_a_classic_group_with_members_is_group_id_not_found() -> None:
    h = Harness()
    classic = JoinRequest(G, "", 10_000, 10_000, "consumer", (("range", b""),))
    h.coordinator.join(classic, "token", now_ms=h.now)
    assert h.join_error() == E.group_id_not_found


def test_describe_list_and_delete() -> None:
    h = Harness()
    c = h.coordinator
    assert c.describe_consumer_group(G).error == E.group_id_not_found
    h.join("a", client_id="cid", client_host="/127.0.0.1")
    described = c.describe_consumer_group(G)
    assert (described.state, described.assignor_name, described.group_epoch) == (
        "Stable",
        "uniform",
        1,
    )
    (member,) = described.members
    assert (member.client_id, member.assignment) == ("cid", tps(0, 1, 2, 3))
    listed = c.list_groups(types=("consumer",))
    assert [(g.group_id, g.group_type, g.state) for g in listed] == [(G, "consumer", "Stable")]
    assert c.list_groups(types=("classic",)) == ()
    assert c.describe(G) is None  # DescribeGroups does not describe consumer groups
    assert c.delete_groups([G], now_ms=h.now) == {G: E.non_empty_group}
    h.beat("a", -1)
    assert c.delete_groups([G], now_ms=h.now) == {G: E.none}
    assert G not in c.consumer_groups


def test_after_a_restart_members_are_told_to_join_again_and_find_their_offsets() -> None:
    h = Harness()
    c = h.coordinator
    # What a restart of serve finds: the group's offsets, no members.
    c.restore({G: {TopicPartition("t", 0): CommittedOffset(11, -1, "", 0)}}, now_ms=h.now)
    assert h.beat("a", 4, owned=tps(0)).error == E.unknown_member_id
    h.join("a")
    assert c.fetch_offsets(G, None, member_id="a", member_epoch=h.epoch["a"]).offsets[
        TopicPartition("t", 0)
    ] == CommittedOffset(11, -1, "", 0)


def test_a_commit_with_a_lagging_epoch_is_taken_for_partitions_still_assigned_kip_1251() -> None:
    h = Harness()
    h.join("a")  # epoch 1, every partition
    h.join("b")
    h.poll_member("a")
    h.poll_member("a")  # revoked two, now at epoch 2 with the two it kept
    kept = h.owned["a"]
    assert h.epoch["a"] == 2 and len(kept) == 2
    c = h.coordinator
    gone = tps(0, 1, 2, 3) - kept
    offsets = {tp: OffsetAndMetadata(1) for tp in tps(0, 1, 2, 3)}
    result = c.commit(G, 1, MemberRef("a"), offsets, now_ms=h.now, version=10).result
    assert {tp for tp, e in result.errors.items() if e == E.none} == kept
    assert {tp for tp, e in result.errors.items() if e == E.stale_member_epoch} == gone
    ahead = c.commit(G, 3, MemberRef("a"), offsets, now_ms=h.now, version=10).result
    assert set(ahead.errors.values()) == {E.stale_member_epoch}
    # b joined at epoch 2 and got its partitions then: a commit with epoch 1 is not b's.
    h.poll_member("b")
    b_offsets = {tp: OffsetAndMetadata(1) for tp in h.owned["b"]}
    assert h.owned["b"] and h.epoch["b"] == 2
    early = c.commit(G, 1, MemberRef("b"), b_offsets, now_ms=h.now, version=10).result
    assert set(early.errors.values()) == {E.stale_member_epoch}


def test_a_static_member_back_within_its_session_takes_its_place_without_a_rebalance() -> None:
    h = Harness()
    h.join("a", instance_id="i-a")
    h.join("b")
    for member in ("a", "a", "b"):
        h.poll_member(member)
    group = h.coordinator.consumer_groups[G]
    epoch, held = group.group_epoch, h.owned["a"]
    assert h.beat("a", -2).error == E.none  # a static member's temporary leave
    assert h.beat("a").error == E.fenced_member_epoch  # it has left: it must join again

    def join_as(member_id: str) -> HeartbeatResult:  # a new process: a new member id
        return h.beat(
            member_id, 0, rebalance_timeout_ms=REBALANCE, subscribed_topic_names=("t",),
            owned=frozenset(), instance_id="i-a",
        )  # fmt: skip

    back = join_as("a2")
    assert (back.error, back.assignment) == (E.none, held)
    assert set(group.members) == {"a2", "b"} and group.group_epoch == epoch
    # Another process with the instance id while it is held: refused.
    assert join_as("x").error == E.unreleased_instance_id


def test_a_static_member_not_back_within_its_session_is_removed() -> None:
    h = Harness()
    h.join("a", instance_id="i-a")
    h.beat("a", -2)
    h.now += SESSION
    h.coordinator.poll(now_ms=h.now)
    assert not h.coordinator.consumer_groups[G].members
