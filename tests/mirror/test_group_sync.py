"""The group sync rules (replicad/mirror/group_sync.py), time passed in."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replicad.errors import LocalProtocolError
from replicad.mirror.group_sync import (
    FORGET_AFTER_ROUNDS,
    TRANSITIONS,
    Commit,
    DestinationGroup,
    FailedOver,
    GroupEvent,
    GroupState,
    GroupSync,
    MirroredPartition,
    Sent,
    Written,
    translate,
)
from replicad.mirror.offset_map import OffsetMap, SyncPoint
from replicad.types import OffsetAndMetadata, TopicPartition

T0 = TopicPartition("orders", 0)
T1 = TopicPartition("orders", 1)
D0 = TopicPartition("east.orders", 0)
D1 = TopicPartition("east.orders", 1)


def kept(position: int, dest: TopicPartition = D0) -> MirroredPartition:
    return MirroredPartition(dest, position, position, OffsetMap.of([SyncPoint(0, 0)]))


def mapped(position: int, dest_next: int, points: list[tuple[int, int]]) -> MirroredPartition:
    return MirroredPartition(D0, position, dest_next, OffsetMap.of(SyncPoint(*p) for p in points))


def src(**offsets: int) -> dict[str, dict[TopicPartition, OffsetAndMetadata]]:
    """Group g's offsets: src(p0=5, p1=7)."""
    return {
        "g": {
            TopicPartition("orders", int(k[1:])): OffsetAndMetadata(v, 3, "meta")
            for k, v in offsets.items()
        }
    }


def idle(offsets: Mapping[TopicPartition, int] | None = None) -> dict[str, DestinationGroup]:
    return {"g": DestinationGroup(0, "Empty", dict(offsets or {}))}


def apply(sync: GroupSync, now: int, plan_commits: Mapping[str, Mapping[TopicPartition, Commit]]):
    """The destination takes every commit; returns what it now holds for g."""
    for group, planned in plan_commits.items():
        sync.committed(now, group, planned, {tp: None for tp in planned})
    return {tp: c.offset for tp, c in plan_commits.get("g", {}).items()}


def test_kept_offsets_are_committed_as_they_are_with_the_metadata_and_no_epoch() -> None:
    sync = GroupSync()
    plan = sync.plan(1_000, src(p0=40), idle(), {T0: kept(100)})
    commit = plan.commits["g"][D0]
    assert (commit.offset, commit.metadata, commit.held_back) == (40, "meta", False)
    sync.committed(1_000, "g", plan.commits["g"], {D0: None})
    status = sync.groups["g"]
    assert (status.last_sync_ms, status.partitions, status.held_back_offsets) == (1_000, 1, 0)


def test_mapped_offsets_translate_through_the_exact_map() -> None:
    # A marker at source 10 was skipped: source 11 landed at 10, source 30 at 29.
    partition = mapped(50, 49, [(0, 0), (11, 10)])
    assert translate(5, partition).offset == 5
    # The marker's own offset: where the next mirrored record landed.
    assert translate(10, partition).offset == 10
    assert translate(30, partition).offset == 29
    assert translate(50, partition).offset == 49


def test_an_offset_past_the_trailing_skipped_marker_stops_at_the_mirrored_end() -> None:
    # Source 0..9 data, 10 a marker (skipped): position 11, mirrored end 10.
    partition = mapped(11, 10, [(0, 0)])
    assert translate(11, partition).offset == 10


def test_an_offset_ahead_of_the_mirror_is_held_at_the_mirrored_end_then_caught_up() -> None:
    sync = GroupSync()
    plan = sync.plan(1_000, src(p0=90), idle(), {T0: kept(60)})
    assert plan.commits["g"][D0].offset == 60 and plan.commits["g"][D0].held_back
    held = apply(sync, 1_000, plan.commits)
    status = sync.groups["g"]
    assert (status.held_back_partitions, status.held_back_offsets) == (1, 30)
    plan = sync.plan(6_000, src(p0=90), idle(held), {T0: kept(80)})
    assert plan.commits["g"][D0].offset == 80
    # Waiting since the sync that first saw 90.
    assert sync.groups["g"].sync_lag_ms == 5_000
    held = apply(sync, 6_000, plan.commits)
    plan = sync.plan(11_000, src(p0=90), idle(held), {T0: kept(95)})
    assert plan.commits["g"][D0].offset == 90 and not plan.commits["g"][D0].held_back
    apply(sync, 11_000, plan.commits)
    assert sync.groups["g"].held_back_offsets == 0
    assert sync.snapshot()["held_back_offsets"] == 0


def test_nothing_mirrored_yet_and_data_never_mirrored() -> None:
    sync = GroupSync()
    empty = MirroredPartition(D0, 0, None, OffsetMap())
    plan = sync.plan(0, src(p0=5), idle(), {T0: empty})
    assert plan.commits == {}
    assert sync.groups["g"].skipped == {"orders-0": "nothing mirrored yet"}
    # The mirror began at source 100 (local log start): 5 goes to the first mirrored record.
    late = MirroredPartition(D0, 150, 50, OffsetMap.of([SyncPoint(100, 0)]))
    assert sync.plan(0, src(p0=5), idle(), {T0: late}).commits["g"][D0].offset == 0


def test_a_group_with_members_at_the_destination_is_never_written_again() -> None:
    sync = GroupSync()
    live = {"g": DestinationGroup(2, "Stable", {D0: 7})}
    plan = sync.plan(1_000, src(p0=40), live, {T0: kept(100)})
    assert plan.commits == {}
    assert sync.state("g") is GroupState.FAILED_OVER
    assert sync.failed_over["g"].since_ms == 1_000
    assert "2 member(s)" in sync.failed_over["g"].reason
    assert [s.event for s in plan.said] == [
        "group failed over at the destination; no longer synced"
    ]
    # Its members left: it is still not synced, and not even asked about.
    assert sync.wanted(src(p0=41), ["orders"]) == []
    assert sync.plan(2_000, src(p0=41), idle({D0: 7}), {T0: kept(100)}).commits == {}


def test_a_commit_made_at_the_destination_by_someone_else_fails_the_group_over() -> None:
    sync = GroupSync()
    held = apply(sync, 0, sync.plan(0, src(p0=40), idle(), {T0: kept(100)}).commits)
    # A consumer joined, committed 45 and left between two syncs.
    plan = sync.plan(5_000, src(p0=41), idle({**held, D0: 45}), {T0: kept(100)})
    assert plan.commits == {}
    assert sync.state("g") is GroupState.FAILED_OVER
    assert "45" in sync.failed_over["g"].reason


def test_a_commit_refused_as_for_a_live_group_fails_it_over() -> None:
    sync = GroupSync()
    plan = sync.plan(0, src(p0=40), idle(), {T0: kept(100)})
    said = sync.committed(0, "g", plan.commits["g"], {D0: "unknown_member_id"})
    assert sync.state("g") is GroupState.FAILED_OVER
    assert said and "unknown_member_id" in said[0].fields["reason"]


def test_other_commit_errors_are_counted_and_retried() -> None:
    sync = GroupSync()
    plan = sync.plan(0, src(p0=40), idle(), {T0: kept(100)})
    sync.committed(0, "g", plan.commits["g"], {D0: "coordinator_load_in_progress"})
    assert sync.state("g") is GroupState.SYNCING
    assert sync.groups["g"].sync_errors == 1 and sync.sync_errors_total == 1
    assert sync.plan(1, src(p0=40), idle(), {T0: kept(100)}).commits["g"][D0].offset == 40


def test_resume_syncs_a_failed_over_group_again() -> None:
    sync = GroupSync(failed_over={"g": FailedOver(5, "had members")})
    assert sync.plan(10, src(p0=40), idle(), {T0: kept(100)}).commits == {}
    said = sync.resume("g", 20)
    assert said is not None and sync.state("g") is GroupState.SYNCING
    assert "g" not in sync.failed_over
    assert sync.plan(30, src(p0=40), idle(), {T0: kept(100)}).commits["g"][D0].offset == 40
    assert sync.resume("g", 40) is None


def test_a_source_offset_moving_backwards_is_followed_while_idle_and_said() -> None:
    sync = GroupSync()
    held = apply(sync, 0, sync.plan(0, src(p0=80), idle(), {T0: kept(100)}).commits)
    plan = sync.plan(5_000, src(p0=20), idle(held), {T0: kept(100)})
    assert plan.commits["g"][D0].offset == 20
    assert [s.event for s in plan.said] == [
        "source offset moved backwards; followed at the destination"
    ]
    assert plan.said[0].fields["from"] == 80 and sync.groups["g"].resets_followed == 1


def test_halted_unmirrored_and_promoted_partitions_are_skipped_and_named() -> None:
    sync = GroupSync(promoted=["payments"])
    halted = MirroredPartition(D1, 10, 10, OffsetMap.of([SyncPoint(0, 0)]), halted="refused")
    source = {
        "g": {
            T0: OffsetAndMetadata(5),
            T1: OffsetAndMetadata(5),
            TopicPartition("audit", 0): OffsetAndMetadata(5),
            TopicPartition("payments", 0): OffsetAndMetadata(5),
        }
    }
    plan = sync.plan(0, source, idle(), {T0: kept(100), T1: halted})
    assert list(plan.commits["g"]) == [D0]
    assert sync.groups["g"].skipped == {
        "audit-0": "not mirrored",
        "orders-1": "mirror halted: refused",
        "payments-0": "promoted",
    }


def test_groups_without_offsets_on_mirrored_topics_are_not_synced() -> None:
    sync = GroupSync()
    source = {"other": {TopicPartition("audit", 0): OffsetAndMetadata(5)}, **src(p0=1)}
    assert sync.wanted(source, ["orders"]) == ["g"]


def test_an_offset_already_at_the_destination_is_not_written_again() -> None:
    sync = GroupSync()
    held = apply(sync, 0, sync.plan(0, src(p0=40), idle(), {T0: kept(100)}).commits)
    assert sync.plan(5_000, src(p0=40), idle(held), {T0: kept(100)}).commits == {}
    # After a restart (nothing remembered) the same offset there is taken as ours.
    again = GroupSync()
    assert again.plan(0, src(p0=40), idle({D0: 40}), {T0: kept(100)}).commits == {}
    assert again.plan(1, src(p0=41), idle({D0: 40}), {T0: kept(100)}).commits["g"][D0].offset == 41


def restarted(sync: GroupSync) -> GroupSync:
    """The sync as a restart finds it: only what the shell persists."""
    return GroupSync(
        sync.failed_over,
        sync.promoted,
        sync.written,
        sync.sent,
        sync_interval_ms=sync.forget_after_ms // FORGET_AFTER_ROUNDS,
    )


def test_a_group_that_failed_over_while_stopped_is_recognised_at_the_restart() -> None:
    sync = GroupSync()
    held = apply(sync, 0, sync.plan(0, src(p0=40), idle(), {T0: kept(100)}).commits)
    assert sync.written == {"g": {D0: Written(40, 40)}} and sync.sent == {}
    # Stopped; the application joins at the destination, commits 45 and leaves.
    again = restarted(sync)
    plan = again.plan(9_000, src(p0=50), idle({**held, D0: 45}), {T0: kept(100)})
    assert plan.commits == {}
    assert again.state("g") is GroupState.FAILED_OVER
    assert "at 45 where the sync left 40" in again.failed_over["g"].reason
    assert again.written == {} and restarted(again).state("g") is GroupState.FAILED_OVER


def test_our_own_commit_whose_answer_was_not_kept_is_not_taken_for_someone_elses() -> None:
    sync = GroupSync()
    apply(sync, 0, sync.plan(0, src(p0=40), idle(), {T0: kept(100)}).commits)
    plan = sync.plan(5_000, src(p0=60), idle({D0: 40}), {T0: kept(100)})
    assert sync.sent == {"g": {D0: Sent(60, 60, 40)}}
    # The destination took 60; replicad stopped before the answer was saved.
    again = restarted(sync)
    assert again.plan(9_000, src(p0=60), idle({D0: 60}), {T0: kept(100)}).commits == {}
    assert again.state("g") is GroupState.SYNCING
    assert again.written == {"g": {D0: Written(60, 60)}} and again.sent == {}
    # The same when the answer was lost while running, and when it never arrived at all.
    sync.failed("g", "connection lost")
    assert (
        sync.plan(10_000, src(p0=70), idle({D0: 60}), {T0: kept(100)}).commits["g"][D0].offset == 70
    )
    sync.failed("g", "connection lost")
    plan = sync.plan(15_000, src(p0=70), idle({D0: 60}), {T0: kept(100)})
    assert plan.commits["g"][D0].offset == 70 and sync.state("g") is GroupState.SYNCING
    # A commit the destination refused is not ours if found later.
    sync.committed(15_000, "g", plan.commits["g"], {D0: "coordinator_load_in_progress"})
    assert sync.sent == {}
    sync.plan(20_000, src(p0=70), idle({D0: 70}), {T0: kept(100)})
    assert sync.state("g") is GroupState.FAILED_OVER


def test_a_group_the_destination_could_not_describe_is_not_written() -> None:
    sync = GroupSync()
    unknown = {"g": DestinationGroup(error="coordinator_not_available")}
    assert sync.plan(0, src(p0=40), unknown, {T0: kept(100)}).commits == {}
    assert sync.state("g") is GroupState.SYNCING
    assert sync.groups["g"].error == "coordinator_not_available"


def test_every_transition_is_in_the_table_and_others_are_errors() -> None:
    assert set(TRANSITIONS.values()) == set(GroupState)
    sync = GroupSync()
    with pytest.raises(LocalProtocolError):
        sync._event("g", GroupEvent.RESUME, 0, "")


def test_sync_lag_runs_from_the_last_read_without_the_commit_to_the_answer_taking_it() -> None:
    sync = GroupSync()
    held = apply(sync, 0, sync.plan(0, src(p0=40), idle(), {T0: kept(100)}).commits)
    assert sync.groups["g"].sync_lag_ms == 0
    # Read at 0 with 40; at 5,000 the source has 90, committed between the two reads, and
    # the mirror has only 60 of it: waiting since 0, not since the read that saw it.
    plan = sync.plan(5_000, src(p0=90), idle(held), {T0: kept(60)})
    assert sync.groups["g"].sync_lag_ms == 5_000
    held = {**held, **apply(sync, 5_200, plan.commits)}
    assert sync.groups["g"].sync_lag_ms == 5_200  # held back: still waiting at the answer
    assert sync.snapshot()["sync_lag_ms"] == 5_200
    plan = sync.plan(10_000, src(p0=90), idle(held), {T0: kept(100)})
    assert sync.groups["g"].sync_lag_ms == 10_000
    apply(sync, 10_300, plan.commits)
    # The destination took 90: nothing waits.
    assert sync.groups["g"].sync_lag_ms == 0 and sync.snapshot()["sync_lag_ms"] == 0


def test_a_group_found_in_sync_is_synced_as_of_that_round() -> None:
    # After a restart the destination already holds the source's offset: nothing to
    # write, and the group is in sync, not "never synced".
    sync = GroupSync()
    assert sync.plan(7_000, src(p0=40), idle({D0: 40}), {T0: kept(100)}).commits == {}
    assert sync.groups["g"].last_sync_ms == 7_000
    assert sync.snapshot()["groups_synced"] == 1
    # Nothing of it mirrored yet: not synced.
    empty = MirroredPartition(D0, 0, None, OffsetMap())
    other = GroupSync()
    other.plan(7_000, src(p0=5), idle(), {T0: empty})
    assert other.groups["g"].last_sync_ms is None


# -- forgetting groups gone at the source and at the destination -------------------------

GONE: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}
AFTER = FORGET_AFTER_ROUNDS * 1_000  # with a 1 s sync interval


def absent(sync: GroupSync, now: int, source=GONE, complete: bool = True) -> list[str]:
    return sync.absent(now, source, ["orders"], complete=complete)


def test_a_group_gone_on_both_sides_is_forgotten_after_a_while() -> None:
    sync = GroupSync(sync_interval_ms=1_000)
    plan = sync.plan(0, src(p0=90), idle(), {T0: kept(60)})
    held = apply(sync, 0, plan.commits)
    assert sync.written and sync.groups["g"].held_back_offsets == 30
    assert sync.snapshot()["groups_synced"] == 1
    # The group is deleted at the source: nothing of it waits any more, nor is it synced.
    assert absent(sync, 1_000) == []
    status = sync.groups["g"]
    assert (status.absent_since_ms, status.held_back_offsets, status.sync_lag_ms) == (1_000, 0, 0)
    assert sync.snapshot()["groups_synced"] == 0
    assert absent(sync, AFTER) == []
    # Absent long enough: looked up at the destination, where our offsets still are: kept.
    assert absent(sync, 1_000 + AFTER) == ["g"]
    assert sync.forget(1_000 + AFTER, idle(held)) == []
    assert sync.written == {"g": {D0: Written(60, 90)}}
    # Not looked up again until another while has passed.
    assert absent(sync, 2_000 + AFTER) == []
    assert absent(sync, 1_000 + 2 * AFTER) == ["g"]
    # Expired there too (offsets.retention.minutes), or deleted: forgotten.
    said = sync.forget(1_000 + 2 * AFTER, idle())
    assert [s.event for s in said] == ["group forgotten: gone at the source and at the destination"]
    assert sync.written == {} and sync.sent == {} and "g" not in sync.groups
    assert absent(sync, 3_000 + 2 * AFTER) == []


def test_a_failed_over_group_is_kept_while_anything_of_it_is_left() -> None:
    sync = GroupSync(
        failed_over={"g": FailedOver(5, "2 member(s) at the destination")}, sync_interval_ms=1_000
    )
    # Still committing at the source, deleted at the destination: still failed over.
    for now in range(0, 3 * AFTER, 1_000):
        assert absent(sync, now, src(p0=40)) == []
    assert sync.state("g") is GroupState.FAILED_OVER
    # Gone at the source; its members still at the destination: kept.
    assert absent(sync, 3 * AFTER) == []
    assert absent(sync, 4 * AFTER) == ["g"]
    assert sync.forget(4 * AFTER, {"g": DestinationGroup(2, "Stable", {D0: 7})}) == []
    assert sync.state("g") is GroupState.FAILED_OVER
    # Its members left, its offsets stay: kept.
    assert absent(sync, 5 * AFTER) == ["g"]
    assert sync.forget(5 * AFTER, idle({D0: 7})) == []
    # Deleted at the destination too: forgotten, and not failed over after a restart.
    assert absent(sync, 6 * AFTER) == ["g"]
    assert len(sync.forget(6 * AFTER, {"g": DestinationGroup(0, "Dead")})) == 1
    assert sync.failed_over == {} and restarted(sync).state("g") is GroupState.SYNCING


def test_a_partial_listing_or_an_unreadable_group_is_not_absence() -> None:
    sync = GroupSync(failed_over={"g": FailedOver(5, "had members")}, sync_interval_ms=1_000)
    # A broker did not list its groups: g may be one of them.
    assert absent(sync, 0, complete=False) == []
    assert absent(sync, 2 * AFTER, complete=False) == []
    assert sync.groups["g"].absent_since_ms is None
    # Its offsets could not be read: not absent either.
    assert sync.absent(2 * AFTER, GONE, ["orders"], complete=True, unreadable=["g"]) == []
    assert sync.groups["g"].absent_since_ms is None
    # Offsets only on topics not mirrored: absent.
    other = {"g": {TopicPartition("audit", 0): OffsetAndMetadata(5)}}
    assert absent(sync, 3 * AFTER, other) == []
    assert sync.groups["g"].absent_since_ms == 3 * AFTER
    # Back before the while is out: the clock starts again.
    assert absent(sync, 4 * AFTER - 1, src(p0=1)) == []
    assert absent(sync, 4 * AFTER) == []
    assert absent(sync, 5 * AFTER - 1) == []
    assert absent(sync, 5 * AFTER) == ["g"]
    # The destination could not be read: asked again next round.
    assert sync.forget(5 * AFTER, {"g": DestinationGroup(error="coordinator_not_available")}) == []
    assert absent(sync, 5 * AFTER + 1) == ["g"]


def test_a_forgotten_group_that_comes_back_is_synced_as_a_new_one() -> None:
    sync = GroupSync(sync_interval_ms=1_000)
    apply(sync, 0, sync.plan(0, src(p0=40), idle(), {T0: kept(100)}).commits)
    absent(sync, 1_000)
    assert absent(sync, 1_000 + AFTER) == ["g"]
    sync.forget(1_000 + AFTER, idle())
    plan = sync.plan(2_000 + AFTER, src(p0=10), idle(), {T0: kept(100)})
    assert plan.commits["g"][D0].offset == 10 and plan.said == ()  # not a reset followed


# -- the property: whatever happens, never ahead of the data, never into a live group ----

# What becomes of the next commit: taken; written but its answer lost; lost before the
# destination; written, then replicad stopped before the answer (restarted from what was
# saved before sending).
TAKEN, ANSWER_LOST, REQUEST_LOST, STOPPED = range(4)


@st.composite
def scenarios(draw: st.DrawFn) -> list[tuple[str, int]]:
    steps = st.one_of(
        st.tuples(st.just("commit"), st.integers(0, 40)),
        st.tuples(st.just("reset"), st.integers(0, 40)),
        st.tuples(st.just("mirror"), st.integers(0, 15)),
        st.tuples(st.just("marker"), st.just(0)),
        st.tuples(st.just("join"), st.integers(1, 3)),
        st.tuples(st.just("leave"), st.just(0)),
        st.tuples(st.just("sync"), st.just(0)),
        st.tuples(st.just("resume"), st.just(0)),
        # Someone commits at the destination without staying a member: an application
        # that ran and stopped while replicad was stopped (restarted after it).
        st.tuples(st.just("app_commit"), st.integers(0, 60)),
        st.tuples(st.just("restart"), st.just(0)),
        # The group is deleted at the source (and comes back), or at the destination;
        # time passes (the sync interval is 1 ms here: forgotten after FORGET_AFTER_ROUNDS).
        st.tuples(st.just("source_gone"), st.just(0)),
        st.tuples(st.just("source_back"), st.just(0)),
        st.tuples(st.just("destination_gone"), st.just(0)),
        st.tuples(st.just("wait"), st.integers(1, 2 * FORGET_AFTER_ROUNDS)),
    )
    return draw(st.lists(steps, max_size=60))


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.lists(st.integers(TAKEN, STOPPED), max_size=20))
# The two ways a restart goes wrong, always tried: an application commits while replicad
# is stopped; replicad stops after a commit was taken and before its answer was saved.
@example([("commit", 9), ("mirror", 9), ("app_commit", 4), ("commit", 1), ("mirror", 1)], [])
@example([("commit", 1), ("mirror", 1), ("commit", 1), ("mirror", 1), ("sync", 0)], [0, 3])
# Gone at the source long enough to be looked up, while its offsets stay at the destination.
@example([("commit", 5), ("mirror", 5), ("source_gone", 0), ("wait", 24), ("sync", 0)], [])
def test_no_destination_offset_ahead_of_the_data_nor_a_write_to_a_live_group(
    steps: list[tuple[str, int]], outcomes: list[int]
) -> None:
    sync = GroupSync(sync_interval_ms=1)
    now = 0
    at_source = True  # the group has its committed offset at the source
    source_log: list[str] = []  # "d" a data record, "m" a transaction marker
    committed = 0  # the group's committed offset at the source
    position = dest_next = 0  # the mirror: source mirrored below position, dest end
    points: list[SyncPoint] = []
    records: dict[int, int] = {}  # source offset -> destination offset of mirrored records
    members = 0
    dest_offsets: dict[TopicPartition, int] = {}
    # Since the last resume: had members, or someone else committed over what we wrote.
    had_members_since_resume = owned_since_resume = False
    # The destination offsets the sync can take for its own (None: it has none there yet):
    # what it wrote or found there, and while a commit's fate is unknown, the one before.
    ours: set[int] | None = None
    fates = iter(outcomes)  # of the commits in turn; taken once they run out
    for kind, n in steps:
        now += n if kind == "wait" else 1
        if kind == "commit":
            source_log.extend("d" * n)
            committed = min(len(source_log), committed + n)
        elif kind == "reset":
            committed = min(committed, n)
        elif kind == "marker":
            source_log.append("m")
        elif kind == "mirror":
            for _ in range(min(n, len(source_log) - position)):
                if source_log[position] == "d":
                    if not points or dest_next - position != points[-1].shift:
                        points.append(SyncPoint(position, dest_next))
                    records[position] = dest_next
                    dest_next += 1
                position += 1
        elif kind == "join":
            members += n
        elif kind == "leave":
            members = 0
        elif kind == "app_commit":
            if ours is not None and n not in ours:
                owned_since_resume = True
            dest_offsets[D0] = n
            sync = restarted(sync)
        elif kind == "restart":
            sync = restarted(sync)
        elif kind in ("source_gone", "source_back"):
            at_source = kind == "source_back"
        elif kind == "destination_gone":
            members = 0
            dest_offsets.clear()
        elif kind == "resume" and sync.resume("g", now) is not None:
            had_members_since_resume = False
            owned_since_resume, ours = False, None
        if members and at_source:
            # Seen by this step's sync (a group absent at the source is not looked at:
            # members that come and go meanwhile, committing nothing, leave no trace).
            had_members_since_resume = True
        partition = MirroredPartition(
            D0, position, dest_next if points else None, OffsetMap.of(points)
        )
        source = {"g": {T0: OffsetAndMetadata(committed)}} if at_source else {}
        destination = {
            "g": DestinationGroup(members, "Stable" if members else "Empty", dict(dest_offsets))
        }
        if sync.absent(now, source, ["orders"], complete=True) and sync.forget(now, destination):
            # Forgotten only when nothing of it is left at the destination: a new group.
            assert members == 0 and not dest_offsets, "forgot a group the destination has"
            assert sync.state("g") is GroupState.SYNCING and not sync.written
            had_members_since_resume = owned_since_resume = False
            ours = None
        plan = sync.plan(now, source, destination, {T0: partition})
        # A group fails over only when it was live or written by someone else.
        if sync.state("g") is GroupState.FAILED_OVER:
            assert had_members_since_resume or owned_since_resume, "failed over for nothing"
        planned = plan.commits.get("g", {})
        if (
            sync.state("g") is GroupState.SYNCING
            and at_source
            and points
            and not members
            and not planned
        ):
            ours = {dest_offsets[D0]}  # what it wants is there: its own from now on
        if planned:
            assert members == 0, "wrote into a live group"
            assert not had_members_since_resume, "wrote into a group that failed over"
            assert not owned_since_resume, "wrote over someone else's commit"
            offset = planned[D0].offset
            assert offset <= dest_next, "destination offset ahead of the mirrored data"
            # Exact: every mirrored record the source group had not read is read, none before.
            unread = [d for s, d in records.items() if s >= committed]
            assert offset == (min(unread) if unread else dest_next)
            saved = restarted(sync)  # the shell saves before sending
            outcome = next(fates, TAKEN)
            before = dest_offsets.get(D0)
            ours = {offset} if outcome == TAKEN or before is None else {offset, before}
            if outcome in (TAKEN, ANSWER_LOST, STOPPED):
                dest_offsets[D0] = offset
            if outcome == TAKEN:
                sync.committed(now, "g", planned, {D0: None})
            elif outcome in (ANSWER_LOST, REQUEST_LOST):
                sync.failed("g", "no answer")
            else:
                sync = saved
