"""Metadata answered: every rule of follower/assignment.py, without a broker or a disk."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

from replicad.follower.assignment import RECREATED, LeaderInfo, LocalFacts, assign, place_all
from replicad.follower.partition_phase import PartitionPhase
from replicad.follower.partition_state import PartitionState
from replicad.types import TopicPartition

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)
OLD, NEW = uuid.UUID(int=1), uuid.UUID(int=2)


def _state(tp=TP0, *, leader=1, epoch=3, topic_id=OLD, log_topic_id=OLD, with_log=True):
    state = PartitionState(
        tp=tp,
        topic_id=topic_id,
        leader_id=leader,
        leader_epoch=epoch,
        phase=PartitionPhase.FETCHING,
    )
    if with_log:
        state.log = SimpleNamespace(topic_id=log_topic_id)
    return state


def _placed(_state) -> bool:
    return True


def test_a_new_partition_without_local_data_needs_a_start_offset():
    plan = assign({}, {TP0: LeaderInfo(1, 3, OLD)}, {}, now_ms=7, is_placed=_placed)
    (state,) = plan.added
    assert state.phase is PartitionPhase.NEEDS_OFFSET and not state.epoch_check_pending
    assert (state.leader_id, state.leader_epoch, state.topic_id, state.progress_ms) == (
        1,
        3,
        OLD,
        7,
    )


def test_a_new_partition_with_local_data_resumes_at_its_end_and_checks_divergence():
    plan = assign(
        {}, {TP0: LeaderInfo(1, 3, OLD)}, {TP0: LocalFacts(OLD, 42)}, now_ms=0, is_placed=_placed
    )
    (state,) = plan.added
    assert state.phase is PartitionPhase.FETCHING and state.fetch_offset == 42
    assert state.epoch_check_pending and plan.halted == ()


def test_local_data_of_a_recreated_topic_halts_and_keeps_its_id():
    plan = assign(
        {}, {TP0: LeaderInfo(1, 0, NEW)}, {TP0: LocalFacts(OLD, 42)}, now_ms=0, is_placed=_placed
    )
    (state,) = plan.added
    assert plan.halted == (state,) and state.phase is PartitionPhase.HALTED
    assert state.topic_id == OLD and state.last_error == RECREATED


def test_a_topic_recreated_while_replicating_halts_the_partition_once():
    state = _state()
    states = {TP0: state}
    plan = assign(states, {TP0: LeaderInfo(1, 0, NEW)}, {}, now_ms=0, is_placed=_placed)
    assert plan.halted == (state,) and state.phase is PartitionPhase.HALTED
    assert state.topic_id == OLD
    again = assign(states, {TP0: LeaderInfo(1, 0, NEW)}, {}, now_ms=0, is_placed=_placed)
    assert again.halted == ()


def test_the_first_topic_id_seen_is_stored_in_a_log_without_one():
    state = _state(topic_id=None, log_topic_id=None)
    plan = assign({TP0: state}, {TP0: LeaderInfo(1, 3, NEW)}, {}, now_ms=0, is_placed=_placed)
    assert plan.topic_ids == ((state, NEW),) and state.topic_id == NEW
    assert plan.halted == () and state.phase is PartitionPhase.FETCHING


def test_a_log_not_opened_yet_is_judged_by_what_the_disk_holds():
    waiting = _state(with_log=False)
    plan = assign(
        {TP0: waiting},
        {TP0: LeaderInfo(1, 3, NEW)},
        {TP0: LocalFacts(OLD, 5)},
        now_ms=0,
        is_placed=_placed,
    )
    assert plan.halted == (waiting,)
    nothing_on_disk = _state(with_log=False)
    plan = assign(
        {TP0: nothing_on_disk}, {TP0: LeaderInfo(1, 3, NEW)}, {}, now_ms=0, is_placed=_placed
    )
    assert plan.halted == () and nothing_on_disk.topic_id == NEW and plan.topic_ids == ()


def test_a_new_leader_or_epoch_asks_about_divergence_and_a_new_leader_moves_it():
    state = _state()
    plan = assign({TP0: state}, {TP0: LeaderInfo(1, 4, OLD)}, {}, now_ms=0, is_placed=_placed)
    assert state.epoch_check_pending and state.leader_epoch == 4 and plan.moved == ()
    state.epoch_check_pending = False
    plan = assign({TP0: state}, {TP0: LeaderInfo(2, 4, OLD)}, {}, now_ms=0, is_placed=_placed)
    assert state.epoch_check_pending and plan.moved == (state,) and state.leader_id == 2


def test_a_new_leader_or_epoch_starts_the_idle_clock_again_and_the_same_one_does_not():
    """Idle since before a leader change (a full disk's pause, then the leader SIGKILLed:
    session 14's soak), a partition is judged from the change, not from its last move: the
    new leader answers UNKNOWN_LEADER_EPOCH until it has applied the move itself."""
    state = _state()
    state.progress_ms = 1_000
    assign({TP0: state}, {TP0: LeaderInfo(1, 3, OLD)}, {}, now_ms=70_000, is_placed=_placed)
    assert state.progress_ms == 1_000  # same leader, same epoch: still idle since 1 s
    assign({TP0: state}, {TP0: LeaderInfo(2, 4, OLD)}, {}, now_ms=75_000, is_placed=_placed)
    assert state.progress_ms == 75_000
    assign({TP0: state}, {TP0: LeaderInfo(2, 5, OLD)}, {}, now_ms=90_000, is_placed=_placed)
    assert state.progress_ms == 90_000  # the same node elected again: a new term
    state.progress_ms = 95_000  # moved since; a late metadata answer does not turn it back
    assign({TP0: state}, {TP0: LeaderInfo(3, 6, OLD)}, {}, now_ms=92_000, is_placed=_placed)
    assert state.progress_ms == 95_000


def test_an_unplaced_partition_is_placed_again_and_unchosen_ones_are_removed():
    kept, gone = _state(TP0), _state(TP1)
    plan = assign(
        {TP0: kept, TP1: gone},
        {TP0: LeaderInfo(1, 3, OLD)},
        {},
        now_ms=0,
        is_placed=lambda s: False,
    )
    assert plan.moved == (kept,) and plan.removed == (gone,) and not kept.epoch_check_pending


def test_place_all_adds_moves_and_removes():
    kept, gone = _state(TP0), _state(TP1)
    states = {TP0: kept, TP1: gone}
    plan = assign(
        states,
        {TP0: LeaderInfo(2, 3, OLD), TopicPartition("t", 2): LeaderInfo(1, 0, OLD)},
        {},
        now_ms=0,
        is_placed=_placed,
    )
    calls: list[tuple[str, TopicPartition]] = []
    place_all(
        plan,
        states,
        place=lambda s: calls.append(("place", s.tp)),
        unplace=lambda s: calls.append(("unplace", s.tp)),
        touch=lambda s: calls.append(("touch", s.tp)),
    )
    new = TopicPartition("t", 2)
    assert set(states) == {TP0, new}
    assert calls == [("place", new), ("unplace", TP0), ("place", TP0), ("unplace", TP1)]


def test_a_partition_changed_in_place_is_touched_in_its_table_and_an_unchanged_one_is_not():
    """The partition table examines again only the partitions it was told of (its R13): a
    new leader epoch of the same leader, a first topic id, a re-created topic change a
    state in place, and its table must be told; the same metadata again changes nothing."""
    epoch, first_id, recreated, same = (
        _state(TP0),
        _state(TP1, topic_id=None, log_topic_id=None),
        _state(TopicPartition("t", 2)),
        _state(TopicPartition("t", 3)),
    )
    states = {s.tp: s for s in (epoch, first_id, recreated, same)}
    chosen = {
        TP0: LeaderInfo(1, 4, OLD),
        TP1: LeaderInfo(1, 3, OLD),
        recreated.tp: LeaderInfo(1, 3, NEW),
        same.tp: LeaderInfo(1, 3, OLD),
    }
    plan = assign(states, chosen, {}, now_ms=0, is_placed=_placed)
    assert [s.tp for s in plan.updated] == [TP0, TP1, recreated.tp]
    touched: list[TopicPartition] = []
    place_all(
        plan,
        states,
        place=lambda s: None,
        unplace=lambda s: None,
        touch=lambda s: touched.append(s.tp),
    )
    assert touched == [TP0, TP1, recreated.tp]
    assert assign(states, chosen, {}, now_ms=1, is_placed=_placed).updated == ()
