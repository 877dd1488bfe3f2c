"""The follower's core, event by event, against an in-memory log: every rule of
partition_table.py (R1..R9) and every event and action kind, without a socket or a clock."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field, replace

import pytest

from replicad.follower.actions import (
    Append,
    EpochAnswer,
    EpochQuestion,
    Halt,
    NextFetch,
    OffsetAnswer,
    OffsetsAnswer,
    RequestMetadata,
    SetHighWatermark,
    StartAt,
    Truncate,
)
from replicad.follower.fetch_response import (
    NO_DIVERGING_EPOCH,
    EpochEndOffset,
    FetchedPartition,
    FetchedTopic,
    FetchResponseView,
)
from replicad.follower.fetch_settings import (
    PARTITION_OVERHEAD_BYTES,
    RESPONSE_OVERHEAD_BYTES,
    TOPIC_OVERHEAD_BYTES,
    FetchSettings,
)
from replicad.follower.partition_phase import ASKS_OFFSETS, PartitionPhase
from replicad.follower.partition_state import PartitionState
from replicad.follower.partition_table import (
    DISK_FULL_RETRY_MS,
    FULL_WALK_EVERY_MS,
    PartitionTable,
)
from replicad.log.epoch import EpochEndOffset as LogEpochEnd
from replicad.log.epoch import LeaderEpochCache
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from replicad.wire import READ_COMMITTED
from tools.logdata.batches import producer_batch

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
TOPIC_ID = uuid.UUID(int=7)
NONE, OUT_OF_RANGE, NOT_LEADER, UNKNOWN_SERVER_ERROR = 0, 1, 6, -1
FETCH_SESSION_ID_NOT_FOUND = 70


@dataclass
class MemoryLog:
    """The facts the core reads of a log, kept as the log store keeps them."""

    log_start_offset: int = 0
    log_end_offset: int = 0
    high_watermark: int = 0
    epochs: LeaderEpochCache = field(default_factory=LeaderEpochCache)

    def latest_epoch(self) -> int | None:
        return self.epochs.latest_epoch()

    def end_offset_for_epoch(self, epoch: int) -> LogEpochEnd:
        return self.epochs.end_offset_for(epoch, self.log_end_offset)

    def append(self, append: Append) -> None:
        for b in append.fetched.batches:
            self.epochs.maybe_assign_from_batch(b.partition_leader_epoch, b.base_offset)
        self.log_end_offset = append.fetched.next_fetch_offset

    def truncate_to(self, offset: int) -> None:
        self.log_end_offset = min(self.log_end_offset, offset)
        self.high_watermark = min(self.high_watermark, self.log_end_offset)
        self.epochs.truncate_from_end(self.log_end_offset)

    def start_at(self, offset: int) -> None:
        self.log_start_offset = self.log_end_offset = self.high_watermark = offset
        self.epochs.truncate_from_end(-1)


def _table(**settings) -> PartitionTable:
    return PartitionTable(1, FetchSettings(backoff_ms=100, **settings))


def _add(table, tp=TP0, *, end=0, hw=0, epoch=5, phase=PartitionPhase.FETCHING, epochs=()):
    local = MemoryLog(log_end_offset=end, high_watermark=hw)
    for e, start in epochs:
        local.epochs.assign(e, start)
    state = PartitionState(
        tp=tp, topic_id=TOPIC_ID, leader_id=1, leader_epoch=epoch, phase=phase, fetch_offset=end
    )
    table.add(state, local)
    return state, local


def _batches(start: int, count: int, *, epoch: int = 5, per_batch: int = 2) -> bytes:
    return b"".join(
        producer_batch(start + i * per_batch, [b"v"] * per_batch, leader_epoch=epoch)
        for i in range(count)
    )


def _partition(tp, *, error=NONE, hw=-1, records=b"", log_start=0, diverging=None):
    return FetchedPartition(
        partition_index=tp.partition,
        error_code=error,
        high_watermark=hw,
        last_stable_offset=hw,
        log_start_offset=log_start,
        diverging_epoch=diverging or NO_DIVERGING_EPOCH,
        aborted_transactions=-1,
        preferred_read_replica=-1,
        records=memoryview(records),
    )


def _response(fetch: NextFetch, *partitions, error=NONE, session_id=None):
    if session_id is None:
        session_id = fetch.plan.session_id or 99
    # Below v13 an answer names its topics (every test partition is of topic "t").
    by_id = fetch.version >= 13
    topic = FetchedTopic(None if by_id else "t", TOPIC_ID if by_id else None, tuple(partitions))
    return FetchResponseView(
        version=fetch.version,
        correlation_id=1,
        throttle_time_ms=0,
        error_code=error,
        session_id=session_id,
        responses=(topic,) if partitions else (),
    )


def _perform(table, actions, logs, now_ms=0):
    """What the shell does, on MemoryLogs."""
    for action in actions:
        if isinstance(action, Append):
            logs[action.tp].append(action)
            _perform(table, table.appended(action, now_ms), logs, now_ms)
        elif isinstance(action, Truncate):
            logs[action.tp].truncate_to(action.offset)
            _perform(table, table.truncated(action), logs, now_ms)
        elif isinstance(action, StartAt):
            logs[action.tp].start_at(action.offset)
            _perform(table, table.truncated(action), logs, now_ms)
        elif isinstance(action, SetHighWatermark):
            logs[action.tp].high_watermark = action.high_watermark


# -- the request -------------------------------------------------------------------------


def test_the_request_asks_each_partition_from_its_log_end_with_its_epochs():
    table = _table()
    _add(table, TP0, end=40, epochs=[(3, 0), (4, 20)], epoch=6)
    _add(table, TP1, end=0, epoch=6)
    fetch = table.next_fetch(0, max_version=13)
    assert fetch is not None and fetch.version == 13
    p0, p1 = fetch.request.by_name()[TP0], fetch.request.by_name()[TP1]
    assert (p0.fetch_offset, p0.current_leader_epoch, p0.last_fetched_epoch) == (40, 6, 4)
    assert (p1.fetch_offset, p1.last_fetched_epoch) == (0, -1)
    assert fetch.plan.epoch == 0 and fetch.plan.is_full  # KIP-227: a new session
    assert table.stats.requests == 1


def test_an_unchanged_partition_keeps_its_partition_fetch_and_a_change_makes_a_new_one():
    # The session handler skips unchanged partitions by identity (session/client.py). A
    # change made outside the table's handlers is told by `touched` (R13), as the shells do.
    table = _table()
    state, local = _add(table, TP0, end=40, epochs=[(4, 0)])
    first = table.next_fetch(0, max_version=13).plan.to_send[TP0]
    table.next_fetch(0, max_version=13)
    assert state.want is first
    for change in (
        lambda: setattr(state, "fetch_offset", 41),
        lambda: setattr(local, "log_start_offset", 1),
        lambda: setattr(state, "leader_epoch", 6),
        lambda: local.epochs.assign(5, 41),
        lambda: setattr(state, "topic_id", uuid.UUID(int=8)),
    ):
        before = state.want
        change()
        table.touched(TP0)
        table.next_fetch(0, max_version=13)
        assert state.want is not before
    want = state.want
    assert (want.fetch_offset, want.log_start_offset, want.current_leader_epoch) == (41, 1, 6)
    assert (want.last_fetched_epoch, want.topic_id) == (5, uuid.UUID(int=8))


def test_a_change_the_table_was_not_told_of_is_asked_after_the_next_full_walk():
    """R13: a change no handler marked (a log start moved by local retention) is seen when
    every partition is examined again, FULL_WALK_EVERY_MS after the last full walk."""
    table = _table()
    _, local = _add(table, TP0, end=40, epochs=[(4, 0)])
    first = table.next_fetch(0, max_version=13)
    table.on_response(first, _response(first, _partition(TP0, hw=40)), 0)  # a session
    quiet = table.next_fetch(0, max_version=13)
    table.on_response(quiet, _response(quiet), 0)  # nothing new
    local.log_start_offset = 10
    early = table.next_fetch(FULL_WALK_EVERY_MS - 1, max_version=13)
    assert dict(early.plan.to_send) == {}  # incremental: nothing changed that it knows of
    table.on_response(early, _response(early), FULL_WALK_EVERY_MS - 1)
    walked = table.next_fetch(FULL_WALK_EVERY_MS, max_version=13)
    assert walked.plan.to_send[TP0].log_start_offset == 10


def test_below_v12_no_last_fetched_epoch_is_sent():
    table = _table()
    _add(table, TP0, end=40, epochs=[(4, 0)])
    fetch = table.next_fetch(0, max_version=11)
    assert fetch.request.by_name()[TP0].last_fetched_epoch == -1


def test_a_partition_without_a_topic_id_makes_the_request_use_names():
    table = _table()
    state, _ = _add(table)
    state.topic_id = None
    assert table.next_fetch(0, max_version=13).version == 12


def test_a_leader_below_v7_gets_no_session():
    table = _table()
    _add(table)
    fetch = table.next_fetch(0, max_version=6)
    assert fetch.version == 6 and not table.session.sessions_enabled


def test_nothing_fetchable_means_no_request_and_a_wakeup_at_the_first_backoff_end():
    table = _table()
    state, _ = _add(table)
    state.delay(1_000, 250, "x")
    assert table.next_fetch(1_000, max_version=13) is None
    assert table.next_wakeup_ms(1_000) == 1_250
    assert table.next_wakeup_ms(1_000, idle_ms=100) == 1_100
    assert table.next_fetch(1_250, max_version=13) is not None


def test_partitions_dropped_while_nothing_is_fetchable_are_forgotten_by_the_next_request():
    """tools/sim seed 2292: TP1 moved to another leader while TP0 backed off, so no request
    was built; the next one must still tell the leader's session to forget TP1."""
    table = _table()
    state0, _ = _add(table, TP0)
    _add(table, TP1)
    fetch = table.next_fetch(0, max_version=13)
    assert table.on_response(fetch, _response(fetch, _partition(TP0), _partition(TP1)), 0).accepted
    table.remove(TP1)
    state0.delay(0, 100, "backing off")
    assert table.next_fetch(0, max_version=13) is None
    fetch = table.next_fetch(100, max_version=13)
    assert not fetch.plan.is_full and list(fetch.plan.to_forget) == [TP1]


def test_partitions_needing_offsets_or_a_question_are_not_fetched():
    table = _table()
    _add(table, TP0, phase=PartitionPhase.NEEDS_OFFSET)
    state1, _ = _add(table, TP1)
    state1.epoch_check_pending = True
    assert table.next_fetch(0, max_version=13) is None


def test_response_budget_counts_partitions_and_topics():
    table = _table(response_max_bytes=10_000, buffer_memory=10_000)
    before = table.response_max_bytes()
    _add(table, TP0)
    _add(table, TP1)
    one_more = table.response_max_bytes()
    assert before - one_more > 0
    table.remove(TP0)
    table.remove(TP1)
    assert table.response_max_bytes() == before
    assert table.remove(TP0) is None


def test_response_budget_counts_a_topic_entry_per_partition_once_topics_interleave():
    """Rotation interleaves topics, and a response names a topic again for each run of its
    partitions: with two topics, three partitions may come as three topic entries."""
    table = _table(response_max_bytes=100_000, buffer_memory=10_000)
    other = TopicPartition("other", 0)
    for tp in (TP0, TP1, other):
        _add(table, tp)
    overhead = RESPONSE_OVERHEAD_BYTES + 3 * PARTITION_OVERHEAD_BYTES + 3 * TOPIC_OVERHEAD_BYTES
    assert table.response_max_bytes() == 10_000 - overhead
    table.remove(other)  # one topic: its partitions are one entry
    overhead = RESPONSE_OVERHEAD_BYTES + 2 * PARTITION_OVERHEAD_BYTES + TOPIC_OVERHEAD_BYTES
    assert table.response_max_bytes() == 10_000 - overhead


# -- data, high watermarks, rotation (R1, R5, R7) ----------------------------------------


def test_data_is_appended_and_the_high_watermark_follows_the_leaders_within_the_log():
    table = _table()
    state, local = _add(table, TP0)
    fetch = table.next_fetch(0, max_version=13)
    records = _batches(0, 3)
    outcome = table.on_response(
        fetch, _response(fetch, _partition(TP0, hw=100, records=records)), 7
    )
    assert outcome.accepted and [a.tp for a in outcome.appends] == [TP0]
    assert state.fetch_offset == 6  # R1: past the validated data before it is written
    _perform(table, outcome.appends, {TP0: local}, now_ms=7)
    # R5: the leader says 100, the log ends at 6.
    assert local.high_watermark == 6 and state.progress_ms == 7
    assert table.stats.batches_appended == 3 and state.records_replicated == 6


def test_a_pipelined_request_counts_the_epoch_of_data_not_yet_appended():
    table = _table()
    _add(table, TP0, epochs=[(2, 0)], end=0)
    fetch = table.next_fetch(0, max_version=13)
    outcome = table.on_response(
        fetch, _response(fetch, _partition(TP0, records=_batches(0, 1, epoch=3))), 0
    )
    assert table.may_pipeline(outcome, 0)
    nxt = table.next_fetch(0, max_version=13)
    assert nxt.request.by_name()[TP0].fetch_offset == 2
    assert nxt.request.by_name()[TP0].last_fetched_epoch == 3


def test_the_high_watermark_is_never_lowered_by_a_leader_nor_by_a_leader_not_answering():
    """Defect 1's rule: a restart's loaded high watermark is the floor (R5)."""
    table = _table()
    state, local = _add(table, TP0, end=50, hw=50)  # loaded from the checkpoint
    fetch = table.next_fetch(0, max_version=13)
    assert state.high_watermark == -1  # nothing heard from the leader yet
    for leader_hw in (-1, 0, 20, 70):
        outcome = table.on_response(fetch, _response(fetch, _partition(TP0, hw=leader_hw)), 0)
        assert outcome.actions == ()
        _perform(table, outcome.actions, {TP0: local})
        assert local.high_watermark == 50
        fetch = table.next_fetch(0, max_version=13)
    # Data up to 60 arrives with the leader's 55: raised to 55, never back.
    outcome = table.on_response(
        fetch, _response(fetch, _partition(TP0, hw=55, records=_batches(50, 5))), 0
    )
    _perform(table, outcome.appends, {TP0: local})
    assert local.high_watermark == 55


def test_a_high_watermark_without_data_is_raised_up_to_the_log_end():
    table = _table()
    state, _ = _add(table, TP0, end=50, hw=10)
    fetch = table.next_fetch(0, max_version=13)
    outcome = table.on_response(fetch, _response(fetch, _partition(TP0, hw=30)), 0)
    assert outcome.actions == (SetHighWatermark(TP0, 30),)
    assert state.leader_log_start_offset == 0 and state.last_stable_offset == 30


def test_partitions_that_returned_data_move_to_the_back():
    table = _table()
    _add(table, TP0)
    _add(table, TP1)
    fetch = table.next_fetch(0, max_version=13)
    table.on_response(
        fetch, _response(fetch, _partition(TP0, records=_batches(0, 1)), _partition(TP1)), 0
    )
    assert list(table.partitions) == [TP1, TP0]


def test_a_corrupt_batch_is_never_appended_what_came_before_it_is():
    table = _table()
    state, _ = _add(table, TP0)
    good = _batches(0, 2)
    bad = bytearray(_batches(4, 1))
    bad[-1] ^= 0xFF  # the CRC no longer matches
    fetch = table.next_fetch(0, max_version=13)
    outcome = table.on_response(
        fetch, _response(fetch, _partition(TP0, records=good + bytes(bad))), 5
    )
    (append,) = outcome.appends
    assert append.fetched.next_fetch_offset == 4 and bytes(append.fetched.data) == good
    assert table.stats.crc_failures == 1 and state.corrupt_count == 1
    assert state.delayed_until_ms == 105  # R7: refetched after the backoff


def test_a_batch_of_another_lineage_holding_our_log_end_halts_the_partition():
    """R8: the leader's log starts inside a batch our lineage does not have (an unclean
    election, then DeleteRecords): it holds our log end, so no refetch would get past it.
    The partition halts with the reason, as Kafka fails it; nothing is appended."""
    table = _table()
    state, local = _add(table, TP0, end=6, hw=6, epoch=6)  # the leader of epoch 6
    fetch = table.next_fetch(0, max_version=13)
    foreign = producer_batch(4, [b"x"] * 5, leader_epoch=6)  # offsets 4..8
    answer = _partition(TP0, hw=9, log_start=5, records=foreign + _batches(9, 1))
    outcome = table.on_response(fetch, _response(fetch, answer), 0)
    assert outcome.appends == ()
    assert [type(a) for a in outcome.actions] == [Halt]
    assert state.phase is PartitionPhase.HALTED and state.last_error == outcome.actions[0].reason
    assert "another lineage" in state.last_error and "4..8" in state.last_error
    assert "log end 6" in state.last_error and "starts at 5" in state.last_error
    assert table.stats.crc_failures == 0 and table.stats.partition_errors["another_lineage"] == 1
    assert local.log_end_offset == 6 and table.next_fetch(0, max_version=13) is None


def test_an_answer_by_name_is_kept_only_while_metadata_names_the_logs_topic_id():
    """R9: below Fetch v13 the answer may be a re-created topic's. A Metadata answer after
    it decides: the same id keeps the actions, another id halts the partition (its data
    kept), a topic not listed drops them and asks for metadata."""
    for ids, kept in [({"t": TOPIC_ID}, True), ({"t": uuid.UUID(int=8)}, False), ({}, False)]:
        table = _table()
        state, local = _add(table, TP0)
        fetch = table.next_fetch(0, max_version=12)
        answer = _partition(TP0, records=_batches(0, 2), hw=4)
        by_name = FetchedTopic("t", None, (answer,))  # v12: topics by name
        outcome = table.on_response(fetch, replace(_response(fetch), responses=(by_name,)), 0)
        assert len(outcome.appends) == 1
        assert table.topics_to_confirm([*outcome.actions, *outcome.appends]) == ["t"]
        confirmed = table.confirm_outcome(outcome, ids)
        if kept:
            assert confirmed == outcome
            continue
        assert confirmed.appends == () and state.fetch_offset == local.log_end_offset == 0
        if ids:
            assert [type(a) for a in confirmed.actions] == [Halt]
            assert state.phase is PartitionPhase.HALTED and "re-created" in state.last_error
        else:
            assert [type(a) for a in confirmed.actions] == [RequestMetadata]
            assert state.phase is PartitionPhase.FETCHING


def test_a_halt_an_answer_by_name_made_is_confirmed_and_names_a_recreation():
    """R9 over R8 (found by tools/sim, seed 27926): below Fetch v13 a re-created topic's
    first batch, across our log end, looks like another lineage. The halt stays (HALTED is
    final); the Metadata answer after it says why: another id is the re-creation, the
    same id leaves R8's reason, a topic not listed leaves the halt as it is."""
    for ids, recreated in [({"t": uuid.UUID(int=8)}, True), ({"t": TOPIC_ID}, False), ({}, False)]:
        table = _table()
        state, local = _add(table, TP0, end=6, hw=6, epoch=6)
        fetch = table.next_fetch(0, max_version=12)
        foreign = producer_batch(4, [b"x"] * 5, leader_epoch=6)  # offsets 4..8
        answer = _partition(TP0, hw=9, log_start=4, records=foreign)
        by_name = FetchedTopic("t", None, (answer,))
        outcome = table.on_response(fetch, replace(_response(fetch), responses=(by_name,)), 0)
        assert [type(a) for a in outcome.actions] == [Halt]
        assert table.topics_to_confirm([*outcome.actions, *outcome.appends]) == ["t"]
        confirmed = table.confirm_outcome(outcome, ids)
        assert [type(a) for a in confirmed.actions] == [Halt] and confirmed.appends == ()
        assert state.phase is PartitionPhase.HALTED and local.log_end_offset == 6
        assert confirmed.actions[0].reason == state.last_error
        assert ("re-created" in state.last_error) is recreated
        assert ("another lineage" in state.last_error) is not recreated


def test_a_leader_below_fetch_v7_is_asked_without_a_session_from_the_first_request():
    table = _table()
    _add(table, TP0)
    fetch = table.next_fetch(0, max_version=4)
    assert fetch.version == 4 and not table.session.sessions_enabled
    outcome = table.on_response(fetch, _response(fetch, _partition(TP0), session_id=0), 0)
    assert outcome.accepted


def test_a_trailing_partial_batch_is_dropped_and_counted():
    table = _table()
    _add(table, TP0)
    records = _batches(0, 2)
    fetch = table.next_fetch(0, max_version=13)
    outcome = table.on_response(fetch, _response(fetch, _partition(TP0, records=records[:-5])), 0)
    assert outcome.appends[0].fetched.next_fetch_offset == 2
    assert table.stats.partial_batches_dropped == 1


def test_an_answer_without_records_is_not_validated_and_still_says_all_it_says(monkeypatch):
    # Issue 32: nothing to validate in an empty answer (validate_fetched cost ~1 ms a
    # share of 100 answered caught up). What it says is still taken: high watermark, last
    # stable offset, log start, the join check used up; a partial batch alone is validated.
    import replicad.follower.partition_table as partition_table

    validated: list[int] = []
    real = partition_table.validate_fetched

    def counted(records, **kwargs):
        validated.append(len(records))
        return real(records, **kwargs)

    monkeypatch.setattr(partition_table, "validate_fetched", counted)
    table = _table()
    state, _ = _add(table, TP0, end=50, hw=10)
    partial, _ = _add(table, TP1, end=0, hw=0)
    state.join_checked = (50, 5)
    fetch = table.next_fetch(0, max_version=13)
    cut = _batches(0, 1)[:-5]
    outcome = table.on_response(
        fetch,
        _response(fetch, _partition(TP0, hw=30, log_start=7), _partition(TP1, hw=9, records=cut)),
        0,
    )
    assert validated == [len(cut)]  # TP1's partial batch only (the old code: [0, len(cut)])
    assert outcome.actions == (SetHighWatermark(TP0, 30),)
    assert (state.high_watermark, state.last_stable_offset) == (30, 30)
    assert state.leader_log_start_offset == 7 and state.join_checked is None
    assert table.stats.partial_batches_dropped == 1 and partial.fetch_offset == 0


def test_an_answer_for_an_offset_we_no_longer_fetch_from_is_dropped_unread():
    """R1: an append failed after the next request went out."""
    table = _table()
    state, _ = _add(table, TP0)
    fetch = table.next_fetch(0, max_version=13)
    outcome = table.on_response(fetch, _response(fetch, _partition(TP0, records=_batches(0, 1))), 0)
    pipelined = table.next_fetch(0, max_version=13)
    table.append_failed(outcome.appends[0], "boom", 0, disk_full=False)
    assert state.fetch_offset == 0 and state.delayed_until_ms == 100
    late = table.on_response(
        pipelined, _response(pipelined, _partition(TP0, records=_batches(2, 1))), 0
    )
    assert late.accepted and late.appends == ()


def test_a_full_disk_pauses_the_partition_until_space_is_back():
    table = _table()
    state, _ = _add(table, TP0)
    fetch = table.next_fetch(0, max_version=13)
    outcome = table.on_response(fetch, _response(fetch, _partition(TP0, records=_batches(0, 1))), 0)
    table.append_failed(outcome.appends[0], "ENOSPC", 10, disk_full=True)
    assert state.phase is PartitionPhase.PAUSED_DISK_FULL and state.fetch_offset == 0
    assert state.disk_full_ms == 10  # when the disk refused it (status shows it)
    assert table.next_fetch(20, max_version=13) is None
    table.disk_back(20)
    assert state.phase is PartitionPhase.FETCHING
    assert table.next_fetch(20, max_version=13) is not None


def test_an_answer_the_disk_refused_starts_the_turn_count_over():
    """Session 13's 10,000-partition Tansu soak: a pass of shares took 100 s; a partition
    whose records the disk refused had its answers counted as answers that left it behind,
    and was stalled while it waited for its next turn after the retry."""
    table = _table()
    state, _ = _add(table, TP0)
    for now in (0, 10):  # two answers without records while behind
        fetch = table.next_fetch(now, max_version=13)
        table.on_response(fetch, _response(fetch, _partition(TP0, hw=4)), now)
    assert state.answers_since_move == 2
    fetch = table.next_fetch(20, max_version=13)
    outcome = table.on_response(
        fetch, _response(fetch, _partition(TP0, records=_batches(0, 1))), 20
    )
    table.append_failed(outcome.appends[0], "ENOSPC", 20, disk_full=True)
    assert state.answers_since_move == 0 and state.fetch_offset == 0


def test_a_full_disk_is_tried_again_after_its_retry_time_without_disk_back():
    table = _table()
    _add(table, TP0)
    fetch = table.next_fetch(0, max_version=13)
    outcome = table.on_response(fetch, _response(fetch, _partition(TP0, records=_batches(0, 1))), 0)
    table.append_failed(outcome.appends[0], "ENOSPC", 0, disk_full=True)
    assert table.next_fetch(4_999, max_version=13) is None
    assert table.next_fetch(5_000, max_version=13) is not None


# -- a sessionless leader's partitions in turns (R11) ------------------------------------


def _asked(fetch) -> list[int]:
    return [tp.partition for tp in fetch.plan.to_send]


def _nothing_new(fetch, session_id):
    """An answer naming every partition asked, none with records."""
    return _response(fetch, *(_partition(tp) for tp in fetch.plan.to_send), session_id=session_id)


def test_a_sessionless_leader_is_asked_its_partitions_in_turns_every_one_in_a_round():
    """The first request names every partition (the leader may keep a session); once it
    answered without one, each request names at most the cap, the next ones each time, and
    every partition is asked within a round although none returns data."""
    table = _table(sessionless_max_partitions=3)
    for p in range(8):
        _add(table, TopicPartition("t", p))
    first = table.next_fetch(0, max_version=13)
    assert _asked(first) == list(range(8))
    table.on_response(first, _response(first, session_id=0), 0)  # no session, no data
    turns = []
    for _ in range(3):
        fetch = table.next_fetch(0, max_version=13)
        assert fetch.plan.is_full and fetch.plan.session_id == 0
        turns.append(_asked(fetch))
        table.on_response(fetch, _response(fetch, session_id=0), 0)
    assert turns == [[0, 1, 2], [3, 4, 5], [6, 7, 0]]


def test_a_first_request_that_got_no_answer_is_followed_by_shares():
    """Tansu under load took longer than the request timeout to read 1,000 partitions: the
    same full request again would never be answered either. A Kafka whose first full
    request timed out pays one share: the share's answer makes a session, and the next
    (incremental) request adds the rest -- every partition in the session after two."""
    table = _table(sessionless_max_partitions=3)
    for p in range(5):
        _add(table, TopicPartition("t", p))
    assert _asked(table.next_fetch(0, max_version=13)) == list(range(5))
    table.send_failed(0)
    share = table.next_fetch(0, max_version=13)
    assert _asked(share) == [0, 1, 2] and table.stats.in_shares
    table.on_response(share, _nothing_new(share, 42), 0)  # Kafka: a session
    rest = table.next_fetch(0, max_version=13)
    assert not rest.plan.is_full and sorted(_asked(rest)) == [3, 4]
    assert sorted(tp.partition for tp in rest.plan.session_partitions) == list(range(5))
    assert not table.stats.in_shares and not table.session.sessionless_so_far


def test_a_share_answered_with_data_moves_on_and_its_records_are_appended():
    table = _table(sessionless_max_partitions=2)
    logs = {}
    for p in range(4):
        _, logs[TopicPartition("t", p)] = _add(table, TopicPartition("t", p))
    first = table.next_fetch(0, max_version=13)
    table.on_response(first, _response(first, session_id=0), 0)
    fetch = table.next_fetch(0, max_version=13)
    assert _asked(fetch) == [0, 1]
    outcome = table.on_response(
        fetch,
        _response(fetch, _partition(TP0, records=_batches(0, 1)), _partition(TP1), session_id=0),
        0,
    )
    _perform(table, outcome.appends, logs)
    assert logs[TP0].log_end_offset == 2
    assert _asked(table.next_fetch(0, max_version=13)) == [2, 3]


def test_a_share_that_creates_a_session_after_all_adds_the_rest_next():
    """A Kafka whose session cache had no room at first: a share creates the session, and
    the next (incremental) request adds the partitions the share left out."""
    table = _table(sessionless_max_partitions=2)
    for p in range(5):
        _add(table, TopicPartition("t", p))
    first = table.next_fetch(0, max_version=13)
    table.on_response(first, _response(first, session_id=0), 0)
    share = table.next_fetch(0, max_version=13)
    assert _asked(share) == [0, 1]
    table.on_response(share, _nothing_new(share, 42), 0)  # a session after all
    rest = table.next_fetch(0, max_version=13)
    assert not rest.plan.is_full and rest.plan.session_id == 42
    assert sorted(_asked(rest)) == [2, 3, 4]
    assert sorted(tp.partition for tp in rest.plan.session_partitions) == list(range(5))
    assert not table.session.sessionless_so_far


def test_a_leader_that_keeps_a_session_is_asked_every_partition_at_once():
    table = _table(sessionless_max_partitions=2)
    for p in range(5):
        _add(table, TopicPartition("t", p))
    first = table.next_fetch(0, max_version=13)
    assert _asked(first) == list(range(5))
    table.on_response(first, _nothing_new(first, 7), 0)
    # The session is lost (the cache evicted it) and the leader answers without one: it
    # made a session once, so every partition bids for the next (KIP-227's valuation).
    again = table.next_fetch(0, max_version=13)
    table.on_response(again, _response(again, error=FETCH_SESSION_ID_NOT_FOUND), 0)
    full = table.next_fetch(0, max_version=13)
    assert full.plan.is_full and _asked(full) == list(range(5))
    table.on_response(full, _response(full, session_id=0), 0)
    assert _asked(table.next_fetch(0, max_version=13)) == list(range(5))


def test_a_share_asks_those_known_behind_first_and_every_partition_once_a_pass():
    """R11's order: within a pass, the partitions whose high watermark is above our fetch
    offset, or that were asked in a share and not served since, go first (Tansu reads a
    share in order until its max wait has passed and answers the rest without records);
    every partition is asked once in each pass. After an answer that left a partition
    behind without records, the next share waits longer."""
    table = _table(sessionless_max_partitions=3, wait_max_ms=500, sessionless_wait_ms=2_000)
    logs = {}
    for p in range(8):
        _, logs[TopicPartition("t", p)] = _add(table, TopicPartition("t", p))
    first = table.next_fetch(0, max_version=13)
    assert first.request.max_wait_ms == 500 and not table.stats.in_shares
    # No session; 5 and 7 behind (their high watermark 4, no records), the rest caught up.
    caught_up_but = {5: 4, 7: 4}
    answers = [_partition(tp, hw=caught_up_but.get(tp.partition, 0)) for tp in logs]
    table.on_response(first, _response(first, *answers, session_id=0), 0)
    shares, waits = [], []

    def share():
        fetch = table.next_fetch(0, max_version=13)
        assert table.stats.in_shares
        shares.append(_asked(fetch))
        waits.append(fetch.request.max_wait_ms)
        return fetch

    one = share()
    tp5, tp7 = TopicPartition("t", 5), TopicPartition("t", 7)
    outcome = table.on_response(
        one,
        _response(
            one,
            _partition(tp5, hw=2, records=_batches(0, 1)),  # served
            _partition(tp7, hw=4),  # still behind: the leader's wait ran out
            _partition(TP0, hw=0),
            session_id=0,
        ),
        0,
    )
    _perform(table, outcome.appends, logs)
    two = share()
    table.on_response(two, _response(two, session_id=0), 0)  # none answered: not served
    three = share()
    table.on_response(three, _response(three, session_id=0), 0)
    share()
    # 7, cut short by the first share's answer (behind, after 5, which got records), keeps
    # its place: first in the next share; a pass still asks every partition.
    assert shares == [[5, 7, 0], [7, 1, 2], [3, 4, 6], [7, 1, 2]]
    assert waits == [2_000, 2_000, 500, 500]  # 7 left behind by the first two answers
    assert sorted({p for s in shares[:3] for p in s}) == list(range(8))
    assert sum(len(s) for s in shares[:3]) == 9  # 7 twice: its cut turn and its own
    assert table.stats.share_passes == 2
    # Requests that named each and ended since its log last moved or an answer found it
    # caught up (the stall rule's wait for a turn): 5 moved by its answer; 7 answered
    # without records by the first request, not counted for the share that cut it short,
    # left out of the second share's answer; 1 found caught up by the first answer (R12),
    # left out of the second share's answer, and named by the one in flight, not counted yet.
    counts = {p: table.partitions[TopicPartition("t", p)].answers_since_move for p in (5, 7, 1)}
    assert counts == {5: 0, 7: 2, 1: 1}


def test_a_partition_of_a_share_the_leader_never_answers_is_judged_after_two_requests():
    """A partition waits for its turn in a pass (control/stalls.py) until two requests that
    named it have ended since its log last moved -- whether the answer named it or not: a
    sessionless answer may leave a partition out, and a share may never be answered (a
    timeout). Counted on answers alone, such a partition waited for its turn forever and
    was never called stalled."""
    from replicad.control.stalls import SHARE_ANSWERS_TO_JUDGE, waits_for_turn

    table = _table(sessionless_max_partitions=2)
    logs = {}
    for p in range(4):
        _, logs[TopicPartition("t", p)] = _add(table, TopicPartition("t", p))
    first = table.next_fetch(0, max_version=13)  # every partition: no session yet
    table.send_failed(0, leader_failed_it=True)  # the first on its connection: no turn (R14)
    left_out = TopicPartition("t", 1)
    asked = []
    for _ in range(4):  # two passes of two shares
        fetch = table.next_fetch(0, max_version=13)
        assert table.stats.in_shares
        asked.append(_asked(fetch))
        others = [_partition(tp, hw=4) for tp in fetch.plan.to_send if tp != left_out]
        table.on_response(fetch, _response(fetch, *others, session_id=0), 0)
    assert sorted(p for s in asked for p in s) == [0, 0, 1, 1, 2, 2, 3, 3]
    counts = {tp.partition: s.answers_since_move for tp, s in table.partitions.items()}
    assert counts == {p: 2 for p in range(4)}  # two shares each
    row = {"leader": 1, "answers_since_move": counts[1]}
    assert counts[1] >= SHARE_ANSWERS_TO_JUDGE and not waits_for_turn(row, frozenset({1}))
    assert first.plan.is_full
    # A share that times out on a connection that has answered counts (R14)...
    fetch = table.next_fetch(0, max_version=13)
    table.send_failed(0, leader_failed_it=True)
    assert all(table.partitions[tp].answers_since_move == 3 for tp in fetch.plan.to_send)
    # ... one lost with its connection, or abandoned for a new one, does not.
    before = {tp: s.answers_since_move for tp, s in table.partitions.items()}
    table.connection_failed("reset", 0)
    table.next_fetch(0, max_version=13)
    table.send_failed(0, leader_failed_it=True)  # the first on the new connection
    again = table.next_fetch(0, max_version=13)
    table.on_response(again, _response(again, session_id=0), 0)  # answered: left out
    table.next_fetch(0, max_version=13)
    table.send_failed(0)  # reset by the peer
    table.next_fetch(0, max_version=13)  # abandoned: a new connection
    after = {tp: s.answers_since_move for tp, s in table.partitions.items()}
    assert after == {tp: n + (tp in again.plan.to_send) for tp, n in before.items()}


def test_under_read_committed_an_open_transaction_is_not_behind():
    """R11's "behind" is the end the leader serves us: under read_committed a consumer is
    answered only below the last stable offset, so a partition held by an open transaction
    (high watermark 10, last stable offset 4 = our fetch offset) is answered without
    records every time. Taken as behind (by its high watermark), it went first in every
    share and made every share wait fetch.sessionless_wait_ms. A replica (replica_id 0) is
    served to the log end: there the high watermark says it."""
    tp1 = TopicPartition("t", 1)
    for replica_id, waits in ((-1, [500, 500]), (0, [2_000, 2_000])):
        table = _table(
            sessionless_max_partitions=1,
            wait_max_ms=500,
            sessionless_wait_ms=2_000,
            isolation_level=READ_COMMITTED,
            replica_id=replica_id,
        )
        for p in range(3):
            _add(table, TopicPartition("t", p), end=4)
        first = table.next_fetch(0, max_version=13)
        held = replace(_partition(tp1, hw=10), last_stable_offset=4)
        others = [_partition(tp, hw=4) for tp in first.plan.to_send if tp != tp1]
        table.on_response(first, _response(first, held, *others, session_id=0), 0)
        seen = []
        for _ in range(2):
            fetch = table.next_fetch(0, max_version=13)
            seen.append(fetch.request.max_wait_ms)
            answers = [
                replace(_partition(tp, hw=10), last_stable_offset=4)
                if tp == tp1
                else _partition(tp, hw=4)
                for tp in fetch.plan.to_send
            ]
            table.on_response(fetch, _response(fetch, *answers, session_id=0), 0)
        assert seen == waits, replica_id


def test_with_sessions_off_every_request_is_a_share():
    table = _table(sessionless_max_partitions=2, sessions=False)
    for p in range(3):
        _add(table, TopicPartition("t", p))
    share = table.next_fetch(0, max_version=13)
    assert _asked(share) == [0, 1]
    table.on_response(share, _response(share, session_id=0), 0)
    assert _asked(table.next_fetch(0, max_version=13)) == [2, 0]


# -- what a request examines (R13) -------------------------------------------------------


@dataclass
class CountingLog(MemoryLog):
    """A MemoryLog that counts the reads of its latest epoch (once per partition examined
    for a request: the table's `_want`) in `reads`, shared by every log of a table."""

    reads: list[int] = field(default_factory=lambda: [0])

    def latest_epoch(self) -> int | None:
        self.reads[0] += 1
        return super().latest_epoch()


def _counting_table(partitions: int, **settings):
    table, reads = _table(**settings), [0]
    for p in range(partitions):
        local = CountingLog(log_end_offset=50, high_watermark=50, reads=reads)
        local.epochs.assign(5, 0)
        state = PartitionState(
            tp=TopicPartition("t", p),
            topic_id=TOPIC_ID,
            leader_id=1,
            leader_epoch=5,
            phase=PartitionPhase.FETCHING,
            fetch_offset=50,
        )
        table.add(state, local)
    return table, reads


def test_a_share_examines_about_its_own_partitions_not_the_whole_table():
    """R13 (issue 34): at 10,000 partitions every request walked every partition (24-25 ms
    of a 26.8 ms request). 1,000 partitions in shares of 100, answered caught up with nothing
    new, a request every 10 ms: after the first, each request examines the partitions the
    last answer named (100), not 1,000 (on the old code: 1,000 a request); two passes still
    ask every partition twice."""
    table, reads = _counting_table(1_000, sessionless_max_partitions=100)
    first = table.next_fetch(0, max_version=13)
    assert len(first.plan.to_send) == 1_000 and reads[0] == 1_000  # new: all examined
    table.on_response(first, _response(first, session_id=0), 0)
    examined, asked = [], []
    for step in range(1, 21):
        reads[0] = 0
        fetch = table.next_fetch(step * 10, max_version=13)
        examined.append(reads[0])
        asked.extend(fetch.plan.to_send)
        answers = [_partition(tp, hw=50) for tp in fetch.plan.to_send]
        table.on_response(fetch, _response(fetch, *answers, session_id=0), step * 10)
    assert examined == [0] + [100] * 19
    assert sorted(asked) == sorted(list(table.partitions) * 2)


def test_a_sessions_request_examines_what_the_last_answer_named():
    """R13 with one session (Kafka): an incremental answer names only the partitions with
    news; the next request examines those, and the full walk once a second examines all
    (on the old code: 1,000 a request)."""
    table, reads = _counting_table(1_000)
    first = table.next_fetch(0, max_version=13)
    table.on_response(first, _nothing_new(first, 7), 0)
    examined = []
    for step in range(1, 101):  # a request every 10 ms for one second
        reads[0] = 0
        fetch = table.next_fetch(step * 10, max_version=13)
        assert not fetch.plan.is_full
        examined.append(reads[0])
        news = [_partition(TopicPartition("t", step), hw=60)]
        table.on_response(fetch, _response(fetch, *news, session_id=7), step * 10)
    # The first examines the 1,000 the full answer named; the last, at 1,000 ms, is the
    # full walk.
    assert examined == [1_000] + [1] * 98 + [1_000]


class _WalkingTable(PartitionTable):
    """The table as it chose before R13, the reference of R13's test: every partition
    examined at every request (full walks 0 ms apart), a sessionless leader's share (R11)
    found by a scan of the fetchable partitions in rotation order, those behind first,
    among the partitions the pass has not asked yet (a set), and the questions before a
    request answered by a walk over every partition."""

    def __init__(self, settings: FetchSettings) -> None:
        super().__init__(1, settings, full_walk_every_ms=0)
        self._walk_left: set[TopicPartition] = set()

    def add(self, state, local=None) -> None:
        if state.tp not in self.partitions and self._walk_left:
            self._walk_left.add(state.tp)
        super().add(state, local)

    def remove(self, tp):
        self._walk_left.discard(tp)
        return super().remove(tp)

    def _sessionless_share(self, wanted):
        cap = self.settings.sessionless_max_partitions
        if len(wanted) <= cap or not self.session.sessionless_so_far:
            self._walk_left.clear()
            self._unserved.clear()
            return None
        in_order = {tp: wanted[tp] for tp in self.partitions if tp in wanted}
        share = self._walk_from_pass(in_order, cap)
        if len(share) < cap:
            self._walk_left = set(self.partitions).difference(share)
            self.stats.share_passes += 1
            share.update(self._walk_from_pass(in_order, cap - len(share)))
        return share

    def _walk_from_pass(self, wanted, count):
        behind, others = [], []
        for tp in wanted:
            if tp not in self._walk_left:
                continue
            if self._behind(tp, self.partitions[tp]):
                behind.append(tp)
                if len(behind) == count:
                    break
            elif len(others) < count:
                others.append(tp)
        chosen = (behind + others)[:count]
        self._walk_left.difference_update(chosen)
        return {tp: wanted[tp] for tp in chosen}

    def _keep_places(self, cut) -> None:
        for tp in reversed(cut):
            self.partitions.move_to_end(tp, last=False)
        self._walk_left.update(cut)

    # The questions before a request, each a walk over every partition (after the full
    # walk the table makes there too: a disk-full pause that ended is over from then on).

    def without_log(self, now_ms):
        if now_ms < self._open_logs_after_ms:
            return []
        self._refresh(now_ms)
        halted = PartitionPhase.HALTED
        return [s for s in self.partitions.values() if s.log is None and s.phase is not halted]

    def epoch_check_due(self, now_ms):
        self._refresh(now_ms)
        return any(
            s.epoch_check_pending and now_ms >= s.delayed_until_ms for s in self.partitions.values()
        )

    def offset_questions(self, now_ms):
        self._refresh(now_ms)
        return [
            s
            for s in self.partitions.values()
            if s.phase in ASKS_OFFSETS and now_ms >= s.delayed_until_ms and s.log is not None
        ]

    def next_wakeup_ms(self, now_ms, *, idle_ms=1000):
        self._refresh(now_ms)
        wake = now_ms + idle_ms
        for s in self.partitions.values():
            if now_ms < s.delayed_until_ms < wake:
                wake = s.delayed_until_ms
        return wake

    def may_pipeline(self, outcome, now_ms):
        if not outcome.accepted or any(a.fetched.restart_at is not None for a in outcome.appends):
            return False
        self._refresh(now_ms)
        return not any(
            s.epoch_check_pending
            or s.log is None
            or (s.phase in ASKS_OFFSETS and now_ms >= s.delayed_until_ms)
            for s in self.partitions.values()
        )


class _Twins:
    """Two tables fed the same events (R13's reference test): [0] examines only what was
    marked and takes shares from its queues, [1] is a `_WalkingTable`. Each has its own
    logs; answers are made once, for both."""

    def __init__(self, rng, *, partitions: int, **settings) -> None:
        self.rng = rng
        self.tables = [
            _table(**settings),
            _WalkingTable(FetchSettings(backoff_ms=100, **settings)),
        ]
        self.logs: list[dict] = [{}, {}]
        self.states: list[dict] = [{}, {}]
        self.ends: dict[TopicPartition, int] = {}  # the leader's
        self.in_flight: list | None = None
        self.to_perform: list[list] = [[], []]
        self.requests = 0
        self.added = 0
        for p in range(partitions):
            self.add(TopicPartition("t", p))

    def add(self, tp, *, opened: bool = True) -> None:
        """A new partition; not `opened`: its log is opened later (`open_logs`)."""
        assert tp not in self.ends
        self.added += 1
        self.ends[tp] = 0
        for i, table in enumerate(self.tables):
            self.states[i][tp], self.logs[i][tp] = _add(table, tp, epochs=[(5, 0)])
            if not opened:
                self.states[i][tp].log = None

    def open_logs(self, now) -> None:
        """What fetcher._open_logs does: each log the table waits for, opened, told."""
        waiting = [[s.tp for s in table.without_log(now)] for table in self.tables]
        assert waiting[0] == waiting[1]
        for i, table in enumerate(self.tables):
            for tp in waiting[i]:
                self.states[i][tp].log = self.logs[i][tp]
                table.touched(tp)

    def remove(self, tp) -> None:
        del self.ends[tp]
        for table in self.tables:
            table.remove(tp)

    def new_epoch(self, tp) -> None:
        """Metadata's new leader epoch, made in place by the shell (assignment.py)."""
        for i, table in enumerate(self.tables):
            self.states[i][tp].leader_epoch += 1
            self.states[i][tp].epoch_check_pending = True
            table.touched(tp)

    def questions(self, now) -> None:
        # When to look again, asked before anything else examined what was marked.
        wakes = [table.next_wakeup_ms(now, idle_ms=5_000) for table in self.tables]
        assert wakes[0] == wakes[1]
        due = [table.epoch_check_due(now) for table in self.tables]
        assert due[0] == due[1]
        epochs = [
            table.epoch_questions(now, fetch_version=13, ofle_version=3) for table in self.tables
        ]
        assert epochs == [{}, {}]  # Fetch v12+ says divergence itself: nothing is asked
        offsets = [sorted(st.tp for st in table.offset_questions(now)) for table in self.tables]
        assert offsets[0] == offsets[1]
        for i, table in enumerate(self.tables):
            asked = [st.tp for st in table.offset_questions(now)]
            earliest, _ = table.offsets_answer([OffsetAnswer(tp, NONE, 0) for tp in asked])
            latest, _ = table.offsets_answer(
                [OffsetAnswer(tp, NONE, self.logs[i][tp].log_end_offset) for tp in asked]
            )
            _perform(table, table.on_offsets(asked, earliest, latest, now), self.logs[i], now)

    def fetch(self, now) -> None:
        a, b = fetches = [table.next_fetch(now, max_version=13) for table in self.tables]
        if a is None or b is None:
            assert fetches == [None, None]
            # Nothing to send: when to look again (the delay heap against a walk).
            idle = self.rng.choice((50, 1_000, 5_000))
            wakes = [table.next_wakeup_ms(now, idle_ms=idle) for table in self.tables]
            assert wakes[0] == wakes[1]
            return
        self.requests += 1
        assert (a.plan.is_full, a.plan.session_id, a.request.max_wait_ms) == (
            b.plan.is_full,
            b.plan.session_id,
            b.request.max_wait_ms,
        )
        if a.plan.is_full:  # in rotation order
            assert list(a.plan.to_send.items()) == list(b.plan.to_send.items())
        else:
            assert dict(a.plan.to_send) == dict(b.plan.to_send)
            assert sorted(a.plan.to_forget) == sorted(b.plan.to_forget)
        self.in_flight = fetches

    def answer(self, now, session_id) -> None:
        rng, outcomes = self.rng, {}
        for tp, asked in self.in_flight[0].plan.to_send.items():
            roll, end = rng.random(), self.ends.get(tp, 0)
            if roll < 0.05:
                continue  # left out of the answer
            if roll < 0.1:
                outcomes[tp] = dict(error=rng.choice((NOT_LEADER, OUT_OF_RANGE)))
            elif roll < 0.45 and end >= asked.fetch_offset + 2:
                records = _batches(asked.fetch_offset, min(2, (end - asked.fetch_offset) // 2))
                outcomes[tp] = dict(hw=end, records=records)
            else:
                outcomes[tp] = dict(hw=end)
        pipelined = []
        for i, (table, fetch) in enumerate(zip(self.tables, self.in_flight, strict=True)):
            parts = (_partition(tp, **o) for tp, o in outcomes.items())
            outcome = table.on_response(fetch, _response(fetch, *parts, session_id=session_id), now)
            pipelined.append(table.may_pipeline(outcome, now))
            self.to_perform[i].extend((*outcome.actions, *outcome.appends))
        assert pipelined[0] == pipelined[1]
        self.in_flight = None

    def perform(self, now, *, disk_full: bool) -> None:
        for i, table in enumerate(self.tables):
            todo, self.to_perform[i] = self.to_perform[i], []
            for action in todo:
                if isinstance(action, RequestMetadata) or action.tp not in table.partitions:
                    continue
                if isinstance(action, Append) and disk_full:
                    table.append_failed(action, "ENOSPC", now, disk_full=True)
                else:
                    _perform(table, [action], self.logs[i], now)

    def same_states(self) -> None:
        for tp in self.ends:
            one, other = self.states[0][tp], self.states[1][tp]
            assert (
                one.phase,
                one.fetch_offset,
                one.delayed_until_ms,
                one.epoch_check_pending,
                one.log is None,
            ) == (
                other.phase,
                other.fetch_offset,
                other.delayed_until_ms,
                other.epoch_check_pending,
                other.log is None,
            ), tp


@pytest.mark.parametrize("seed", range(8))
def test_what_is_asked_is_what_a_walk_over_every_partition_asks(seed):
    """R13 against its reference: two tables fed the same events in a random order, one
    examining only what was marked, one walking every partition at every request, ask the
    same partitions, from the same offsets, in the same shares, at every request, and the
    same questions first (logs to open, divergence checks, ListOffsets; whether to
    pipeline): answers with and without records, behind or caught up, left out, errors that
    back off, out of range (ListOffsets), requests built before the last answer's appends
    (pipelined), full disks and their retry or disk_back, new leader epochs made in place
    (told by `touched`), partitions removed and added, logs opened later; with a session
    (odd seeds) and without."""
    import random

    rng = random.Random(seed)
    session_id = 7 if seed % 2 else 0
    twins = _Twins(
        rng, partitions=24, sessionless_max_partitions=7, wait_max_ms=500, sessionless_wait_ms=900
    )
    now = 0
    for _ in range(1_500):
        move = rng.random()
        if move < 0.2:
            now += rng.choice((10, 100, 400, 2_000))
        elif move < 0.22:
            for table in twins.tables:
                table.disk_back(now)
        elif move < 0.24:
            twins.new_epoch(rng.choice(sorted(twins.ends)))
        elif move < 0.25 and len(twins.ends) > 8:
            twins.remove(rng.choice(sorted(twins.ends)))
        elif move < 0.26:
            twins.add(TopicPartition("t", 100 + twins.added), opened=rng.random() < 0.5)
        elif move < 0.28:
            twins.open_logs(now)
        elif move < 0.35:
            for tp in twins.ends:
                twins.ends[tp] += rng.choice((0, 0, 0, 2, 4))
        elif move < 0.45:
            twins.questions(now)
        elif move < 0.7:
            if twins.in_flight is None:
                twins.fetch(now)
        elif move < 0.85:
            if twins.in_flight is not None:
                twins.answer(now, session_id)
        else:
            twins.perform(now, disk_full=rng.random() < 0.2)
        twins.same_states()
    assert twins.requests > 100


# -- errors (R2, R6) ---------------------------------------------------------------------


@pytest.mark.parametrize("code", [777, -42, 32767])
def test_an_unknown_error_code_backs_off_its_partition_alone(code):
    table = _table()
    state0, _ = _add(table, TP0)
    _add(table, TP1)
    fetch = table.next_fetch(0, max_version=13)
    outcome = table.on_response(
        fetch,
        _response(fetch, _partition(TP0, error=code), _partition(TP1, records=_batches(0, 1))),
        0,
    )
    assert [a.tp for a in outcome.appends] == [TP1]
    assert table.stats.partition_errors["unknown_server_error"] == 1
    assert state0.delayed_until_ms == 100 and state0.phase is PartitionPhase.FETCHING


def test_a_leadership_error_backs_off_and_asks_for_metadata():
    table = _table()
    state, _ = _add(table, TP0)
    fetch = table.next_fetch(0, max_version=13)
    outcome = table.on_response(fetch, _response(fetch, _partition(TP0, error=NOT_LEADER)), 0)
    assert outcome.actions == (RequestMetadata(f"{TP0}: not_leader_or_follower"),)
    assert state.delayed_until_ms == 100


def test_a_session_error_rejects_the_whole_response():
    table = _table()
    _add(table, TP0)
    fetch = table.next_fetch(0, max_version=13)
    table.on_response(fetch, _response(fetch, _partition(TP0), session_id=5), 0)
    incremental = table.next_fetch(0, max_version=13)
    assert not incremental.plan.is_full
    outcome = table.on_response(
        incremental, _response(incremental, error=FETCH_SESSION_ID_NOT_FOUND, session_id=0), 0
    )
    assert not outcome.accepted and table.stats.rejected_responses == 1
    assert 80 <= outcome.retry_in_ms <= 120  # back off before asking again
    assert table.stats.session_recoveries["fetch_session_id_not_found"] == 1
    assert table.next_fetch(0, max_version=13).plan.is_full


def test_a_failed_send_starts_the_session_over_and_failures_are_timed_for_health():
    table = _table()
    _add(table, TP0)
    fetch = table.next_fetch(0, max_version=13)
    table.on_response(fetch, _response(fetch, _partition(TP0), session_id=5), 0)
    table.next_fetch(0, max_version=13)
    table.send_failed(10)
    first = table.connection_failed("reset", 10)
    second = table.connection_failed("reset", 20)
    assert table.stats.failing_since_ms == 10 and table.stats.connection_errors == 2
    # reconnect_backoff_ms 100, doubling, +-20% jitter
    assert 80 <= first <= 120 and 160 <= second <= 240
    fetch = table.next_fetch(30, max_version=13)
    assert fetch.plan.is_full
    table.on_response(fetch, _response(fetch, _partition(TP0)), 30)
    assert table.stats.failing_since_ms is None


# -- divergence (R3) ---------------------------------------------------------------------


def test_a_diverging_epoch_truncates_and_fetches_from_the_new_end():
    table = _table()
    state, local = _add(table, TP0, end=30, hw=10, epochs=[(1, 0), (2, 20)])
    fetch = table.next_fetch(0, max_version=13)
    outcome = table.on_response(
        fetch, _response(fetch, _partition(TP0, hw=15, diverging=EpochEndOffset(1, 25))), 0
    )
    assert outcome.actions == (Truncate(TP0, 20, "diverging epoch", 15),)
    _perform(table, outcome.actions, {TP0: local})
    assert state.fetch_offset == 20
    assert local.high_watermark == 15  # the answer's, applied once the log is cut
    assert table.stats.truncations == 1


def test_the_high_watermark_of_a_diverging_answer_is_not_lost():
    """Found by tools/sim (seed 3277 of the long run): after a crash the log kept data
    past the new leader's end and its checkpointed high watermark (1); the diverging
    answer said 8, and in an incremental session the leader never says an unchanged 8
    again -- the replica served up to 1 until new data came."""
    table = _table()
    _, local = _add(table, TP0, end=10, hw=1, epochs=[(1, 1)], epoch=4)
    local.log_start_offset = 1
    fetch = table.next_fetch(0, max_version=13)
    outcome = table.on_response(
        fetch, _response(fetch, _partition(TP0, hw=8, diverging=EpochEndOffset(1, 8))), 0
    )
    _perform(table, outcome.actions, {TP0: local})
    assert (local.log_end_offset, local.high_watermark) == (8, 8)
    # Nothing to cut (the leader's epoch ends at our end): raised at once.
    fetch = table.next_fetch(0, max_version=13)
    local.high_watermark = 1
    outcome = table.on_response(
        fetch, _response(fetch, _partition(TP0, hw=8, diverging=EpochEndOffset(1, 8))), 0
    )
    assert outcome.actions == (SetHighWatermark(TP0, 8),)


def test_a_truncation_without_a_fresh_high_watermark_does_not_raise_it():
    """OffsetForLeaderEpoch answers carry no high watermark: the one kept from an older
    leader must not be applied after the cut (it may not be committed on the new one)."""
    table = _table()
    state, local = _add(table, TP0, end=30, hw=5, epochs=[(1, 0), (2, 20)], epoch=3)
    state.high_watermark = 30  # the old leader's
    state.epoch_check_pending = True
    questions = table.epoch_questions(0, fetch_version=11, ofle_version=3)
    actions = table.on_epoch_answers(questions, [EpochAnswer(TP0, NONE, 2, 24)], 0)
    _perform(table, actions, {TP0: local})
    assert (local.log_end_offset, local.high_watermark) == (24, 5)


def test_below_v12_a_leader_change_asks_offset_for_leader_epoch_first():
    table = _table()
    state, _ = _add(table, TP0, end=30, epochs=[(1, 0), (2, 20)], epoch=3)
    state.epoch_check_pending = True
    questions = table.epoch_questions(0, fetch_version=11, ofle_version=3)
    assert questions[TP0].leader_epoch == 2 and questions[TP0].current_leader_epoch == 3
    # The leader's epoch 2 ended at 24: truncate there, done.
    actions = table.on_epoch_answers(questions, [EpochAnswer(TP0, NONE, 2, 24)], 0)
    assert actions == [Truncate(TP0, 24, "leader epoch")]
    assert not state.epoch_check_pending


def test_a_leader_that_never_had_our_latest_epoch_makes_us_ask_again():
    """decide_truncation's rule 4: the leader answers with an older epoch; truncate to
    where ours ends, and ask again."""
    table = _table()
    state, local = _add(table, TP0, end=30, epochs=[(1, 0), (3, 20)], epoch=4)
    state.epoch_check_pending = True
    questions = table.epoch_questions(0, fetch_version=11, ofle_version=3)
    # The leader's largest epoch at or below our 3 is 2, which we never had.
    actions = table.on_epoch_answers(questions, [EpochAnswer(TP0, NONE, 2, 25)], 0)
    _perform(table, actions, {TP0: local})
    assert actions == [Truncate(TP0, 20, "leader epoch")] and state.epoch_check_pending
    again = table.epoch_questions(0, fetch_version=11, ofle_version=3)
    assert again[TP0].leader_epoch == 1


def test_epoch_questions_are_not_asked_of_v12_leaders_or_leaders_without_the_api():
    table = _table()
    state, _ = _add(table, TP0, end=30, epochs=[(1, 0)])
    state.epoch_check_pending = True
    assert table.epoch_questions(0, fetch_version=12, ofle_version=3) == {}
    assert not state.epoch_check_pending
    state.epoch_check_pending = True
    assert table.epoch_questions(0, fetch_version=11, ofle_version=None) == {}
    assert not state.epoch_check_pending
    state.epoch_check_pending = True
    empty, _ = _add(table, TP1)
    empty.epoch_check_pending = True
    questions = table.epoch_questions(0, fetch_version=11, ofle_version=3)
    assert list(questions) == [TP0] and not empty.epoch_check_pending


@pytest.mark.parametrize(("code", "metadata"), [(NOT_LEADER, True), (777, False)])
def test_an_epoch_answer_error_backs_off_that_partition(code, metadata):
    table = _table()
    state, _ = _add(table, TP0, end=30, epochs=[(1, 0)])
    state.epoch_check_pending = True
    questions = table.epoch_questions(0, fetch_version=11, ofle_version=3)
    actions = table.on_epoch_answers(questions, [EpochAnswer(TP0, code)], 0)
    assert bool(actions) == metadata and state.epoch_check_pending
    assert state.delayed_until_ms == 100
    # Not asked: an answer for it is ignored.
    assert table.on_epoch_answers([], [EpochAnswer(TP0, NONE, 0, 0)], 0) == []


# -- epochs of fetched batches (R10) -----------------------------------------------------


def _metadata_says(state, epoch):
    """What assignment.py does when metadata shows a new epoch."""
    state.leader_epoch, state.epoch_check_pending = epoch, True


def test_below_v9_a_batch_above_the_known_epoch_waits_for_the_divergence_check():
    """tools/sim seed 8667: at Fetch v4 the leader fences nothing. Two unclean elections the
    follower never saw made the same node leader at epoch 3, its log of epoch 1 ending at
    4; it serves epoch 3 at our log end 12. Appended, our epoch-1 tail 4..12 would stay."""
    table = _table()
    state, local = _add(table, TP0, end=12, hw=12, epochs=[(1, 0)], epoch=1)
    fetch = table.next_fetch(0, max_version=4)
    answer = _partition(TP0, hw=20, records=_batches(12, 4, epoch=3))
    outcome = table.on_response(fetch, _response(fetch, answer, session_id=0), 0)
    assert outcome.accepted and outcome.appends == ()
    assert [type(a) for a in outcome.actions] == [RequestMetadata]
    assert state.epoch_check_pending and state.delayed_until_ms == 100
    assert "above the epoch 1 we know" in state.last_error
    assert table.stats.partition_errors["unchecked_epoch"] == 1
    assert state.fetch_offset == 12 and table.next_fetch(100, max_version=4) is None
    # Metadata shows epoch 3; the check truncates to where the leader's epoch 1 ended.
    _metadata_says(state, 3)
    questions = table.epoch_questions(100, fetch_version=4, ofle_version=1)
    assert questions[TP0] == EpochQuestion(3, 1)
    actions = table.on_epoch_answers(questions, [EpochAnswer(TP0, NONE, 1, 4)], 100)
    assert actions == [Truncate(TP0, 4, "leader epoch")]
    _perform(table, actions, {TP0: local}, 100)
    assert local.log_end_offset == 4 and not state.epoch_check_pending


def test_below_v9_the_first_batch_of_a_new_epoch_at_our_end_needs_a_check_first():
    """R10: the epoch is one metadata showed (not above it), but a leader that checks
    nothing may not be the one we checked our log against: a new epoch at our log end
    is appended only right after a check found that join to be the leader's."""
    table = _table()
    state, local = _add(table, TP0, end=12, hw=12, epochs=[(1, 0)], epoch=3)
    fetch = table.next_fetch(0, max_version=8)
    answer = _partition(TP0, hw=20, records=_batches(12, 2, epoch=2))
    outcome = table.on_response(fetch, _response(fetch, answer, session_id=0), 0)
    assert outcome.appends == () and state.epoch_check_pending
    assert "starts leader epoch 2 at our log end" in state.last_error
    questions = table.epoch_questions(100, fetch_version=8, ofle_version=1)
    # The leader's epoch 1 ends at our end: nothing to truncate, the join is checked.
    assert table.on_epoch_answers(questions, [EpochAnswer(TP0, NONE, 1, 12)], 100) == []
    fetch = table.next_fetch(100, max_version=8)
    outcome = table.on_response(fetch, _response(fetch, answer, session_id=0), 100)
    assert [a.tp for a in outcome.appends] == [TP0] and not state.epoch_check_pending
    _perform(table, outcome.appends, {TP0: local}, 100)
    assert local.log_end_offset == 16 and local.latest_epoch() == 2


def test_a_checked_join_is_used_up_by_the_next_answer():
    table = _table()
    state, _ = _add(table, TP0, end=12, hw=12, epochs=[(1, 0)], epoch=3)
    state.epoch_check_pending = True
    questions = table.epoch_questions(0, fetch_version=8, ofle_version=1)
    table.on_epoch_answers(questions, [EpochAnswer(TP0, NONE, 1, 12)], 0)
    assert state.join_checked == (12, 1)
    fetch = table.next_fetch(0, max_version=8)
    table.on_response(fetch, _response(fetch, _partition(TP0, hw=12), session_id=0), 0)
    assert state.join_checked is None  # nothing came: a later epoch change is checked again
    fetch = table.next_fetch(0, max_version=8)
    late = _partition(TP0, hw=20, records=_batches(12, 1, epoch=3))
    outcome = table.on_response(fetch, _response(fetch, late, session_id=0), 0)
    assert outcome.appends == () and state.epoch_check_pending


def test_from_v9_a_leader_fenced_by_our_epoch_starts_its_epoch_at_our_end_at_once():
    """R10 asks nothing of a leader that checked our log: fenced by our current epoch
    (v9+), its log is the one the check at the leader change found ours to prefix."""
    table = _table()
    state, _ = _add(table, TP0, end=12, hw=12, epochs=[(1, 0)], epoch=3)
    for version in (9, 11, 13):
        fetch = table.next_fetch(0, max_version=version)
        answer = _partition(TP0, hw=20, records=_batches(12, 1, epoch=3))
        outcome = table.on_response(fetch, _response(fetch, answer), 0)
        assert [a.tp for a in outcome.appends] == [TP0], version
        table.append_failed(outcome.appends[0], "not this time", 0, disk_full=False)
        state.delayed_until_ms = 0
    # Above our epoch is refused at every version (a leader fenced at 3 cannot send 4).
    fetch = table.next_fetch(0, max_version=13)
    answer = _partition(TP0, hw=20, records=_batches(12, 1, epoch=3) + _batches(14, 1, epoch=4))
    outcome = table.on_response(fetch, _response(fetch, answer), 0)
    assert outcome.appends[0].fetched.next_fetch_offset == 14 and state.epoch_check_pending


def test_an_answer_arriving_while_a_divergence_check_waits_is_dropped_unread():
    """R10: asked before metadata showed a new epoch (a held or pipelined response)."""
    table = _table()
    state, _ = _add(table, TP0, end=12, hw=12, epochs=[(1, 0)], epoch=1)
    fetch = table.next_fetch(0, max_version=4)
    _metadata_says(state, 3)
    answer = _partition(TP0, hw=20, records=_batches(12, 2, epoch=3))
    outcome = table.on_response(fetch, _response(fetch, answer, session_id=0), 0)
    assert outcome.accepted and outcome.appends == () and outcome.actions == ()
    assert state.fetch_offset == 12 and state.epoch_check_pending


# -- offsets: start and out of range (R4) ------------------------------------------------


def _offsets(table, lo, hi, tp=TP0):
    earliest, _ = table.offsets_answer([OffsetAnswer(tp, NONE, lo)])
    latest, _ = table.offsets_answer([OffsetAnswer(tp, NONE, hi)])
    return earliest, latest


def test_list_offsets_asks_a_share_halved_when_not_answered_in_time_and_grown_again():
    """R15: Tansu on S3 answers ListOffsets in about 35 ms a partition; a request for all of
    10,000 new partitions never came back within the request timeout, was asked again
    whole, and nothing was replicated in 11 minutes. A request asks at most
    OFFSETS_SHARE_MAX; one not answered in time halves the next, an answer doubles it; the
    partitions answered start while the others wait."""
    from replicad.follower.partition_table import OFFSETS_SHARE_MAX

    table = _table()
    tps = [TopicPartition("t", p) for p in range(2 * OFFSETS_SHARE_MAX + 5)]
    for tp in tps:
        _add(table, tp, phase=PartitionPhase.NEEDS_OFFSET)
    first = [s.tp for s in table.offset_questions(0)]
    assert first == tps[:OFFSETS_SHARE_MAX]  # in the order they need it
    sizes = []
    for _ in range(3):  # three requests not answered in time
        table.offsets_not_answered()
        sizes.append(len(table.offset_questions(0)))
    assert sizes == [OFFSETS_SHARE_MAX // 2, OFFSETS_SHARE_MAX // 4, OFFSETS_SHARE_MAX // 8]
    asked = [s.tp for s in table.offset_questions(0)]
    answers = [OffsetAnswer(tp, NONE, 0) for tp in asked]
    earliest, _ = table.offsets_answer(answers)
    latest, _ = table.offsets_answer(answers)
    table.on_offsets(asked, earliest, latest, 0)
    assert all(table.partitions[tp].phase is PartitionPhase.FETCHING for tp in asked)
    after = [s.tp for s in table.offset_questions(0)]
    assert len(after) == OFFSETS_SHARE_MAX // 4 and after[0] == tps[len(asked)]
    for _ in range(20):
        table.offsets_not_answered()
    assert len(table.offset_questions(0)) == 1  # never none


@pytest.mark.parametrize(("start_from", "expected"), [("earliest", 10), ("latest", 90)])
def test_a_new_partition_starts_where_start_from_says(start_from, expected):
    table = _table(start_from=start_from)
    state, local = _add(table, TP0, phase=PartitionPhase.NEEDS_OFFSET)
    asked = [s.tp for s in table.offset_questions(0)]
    assert asked == [TP0]
    actions = table.on_offsets(asked, *_offsets(table, 10, 90), 0)
    assert actions == [StartAt(TP0, expected, f"start_from={start_from}")]
    _perform(table, actions, {TP0: local})
    assert state.phase is PartitionPhase.FETCHING and state.fetch_offset == expected


def test_a_new_partition_is_idle_from_its_start_not_from_its_creation():
    """Session 13's 10,000-partition cluster soak: a partition created at metadata time
    started fetching 20 s later (ListOffsets at load 35) and was stalled 10 s after it could
    first fetch, its idle time counted from its creation."""
    table = _table()
    state, local = _add(table, TP0, phase=PartitionPhase.NEEDS_OFFSET)
    state.progress_ms = 1_000  # created
    asked = [s.tp for s in table.offset_questions(21_000)]
    actions = table.on_offsets(asked, *_offsets(table, 0, 4), 21_000)
    _perform(table, actions, {TP0: local}, now_ms=21_000)
    assert state.phase is PartitionPhase.FETCHING and state.progress_ms == 21_000


def test_out_of_range_with_the_leader_ending_below_us_truncates_to_its_end():
    table = _table()
    state, local = _add(table, TP0, end=50, hw=40)
    fetch = table.next_fetch(0, max_version=13)
    table.on_response(fetch, _response(fetch, _partition(TP0, error=OUT_OF_RANGE)), 0)
    assert state.phase is PartitionPhase.TRUNCATING and table.next_fetch(0, max_version=13) is None
    actions = table.on_offsets([TP0], *_offsets(table, 0, 30), 0)
    assert actions == [Truncate(TP0, 30, "leader's log ends below ours")]
    _perform(table, actions, {TP0: local})
    assert state.fetch_offset == 30 and local.high_watermark == 30
    assert state.phase is PartitionPhase.FETCHING


@pytest.mark.parametrize("on_gap", ["reset", "halt"])
def test_a_leader_starting_above_our_end_is_a_gap(on_gap):
    table = _table(on_gap=on_gap)
    state, local = _add(table, TP0, end=50, phase=PartitionPhase.TRUNCATING)
    actions = table.on_offsets([TP0], *_offsets(table, 80, 120), 0)
    if on_gap == "reset":
        assert actions == [StartAt(TP0, 80, "gap (on_gap=reset)")]
        _perform(table, actions, {TP0: local})
        assert state.fetch_offset == 80 and local.log_start_offset == 80
        # The gap is counted with its size: offsets 50..79 were never replicated.
        assert (state.gaps, state.gap_offsets) == (1, 30)
    else:
        assert [type(a) for a in actions] == [Halt] and state.phase is PartitionPhase.HALTED
        assert "gap" in state.last_error and table.next_fetch(0, max_version=13) is None
        # Met, and nothing skipped: the partition waits for an operator.
        assert (state.gaps, state.gap_offsets) == (1, 0)


def test_an_out_of_range_that_no_longer_holds_is_transient():
    table = _table()
    state, _ = _add(table, TP0, end=50, phase=PartitionPhase.TRUNCATING)
    assert table.on_offsets([TP0], *_offsets(table, 0, 60), 0) == []
    assert state.phase is PartitionPhase.FETCHING and state.delayed_until_ms == 100


@pytest.mark.parametrize(("code", "metadata"), [(777, False), (NOT_LEADER, True)])
def test_a_list_offsets_error_waits_for_that_partition_alone(code, metadata):
    table = _table()
    state0, _ = _add(table, TP0, phase=PartitionPhase.NEEDS_OFFSET)
    state1, _ = _add(table, TP1, phase=PartitionPhase.NEEDS_OFFSET)
    earliest, actions = table.offsets_answer([OffsetAnswer(TP0, code), OffsetAnswer(TP1, NONE, 0)])
    assert bool(actions) == metadata
    latest = OffsetsAnswer({TP1: 5}, {})
    actions = table.on_offsets([TP0, TP1], earliest, latest, 0)
    assert actions == []  # TP1 starts at 0 on an empty log: nothing to change
    assert state0.phase is PartitionPhase.NEEDS_OFFSET and state0.delayed_until_ms == 100
    assert state1.phase is PartitionPhase.FETCHING
    assert table.offset_questions(0) == [] and table.offset_questions(100) == [state0]


def test_no_pipelining_while_a_question_waits():
    table = _table()
    _add(table, TP0)
    waiting, _ = _add(table, TP1, phase=PartitionPhase.NEEDS_OFFSET)
    fetch = table.next_fetch(0, max_version=13)
    outcome = table.on_response(fetch, _response(fetch, _partition(TP0, records=_batches(0, 1))), 0)
    assert not table.may_pipeline(outcome, 0)
    waiting.phase = PartitionPhase.FETCHING
    table.touched(TP1)  # changed outside the table's handlers (R13)
    assert table.may_pipeline(outcome, 0)
    assert not table.may_pipeline(type(outcome)(False), 0)


def test_answers_for_removed_partitions_are_ignored():
    table = _table()
    _add(table, TP0)
    fetch = table.next_fetch(0, max_version=13)
    table.remove(TP0)
    outcome = table.on_response(fetch, _response(fetch, _partition(TP0, records=_batches(0, 1))), 0)
    assert outcome.appends == () and table.appended(Append(TP0, None), 0) == []
    assert table.on_offsets([TP0], *_offsets(table, 0, 1), 0) == []


def test_scan_of_the_test_batches_is_sane():
    # The helper batches are what the tests above assume: 2 records each, valid CRCs.
    scan = scan_batches(memoryview(_batches(0, 3)))
    assert [b.base_offset for b in scan.batches] == [0, 2, 4]


def test_a_partition_waits_for_its_log_to_be_opened():
    """The shell opens logs between requests (creating thousands at once takes the loop's
    time); until then the partition is neither asked about nor fetched."""
    table = _table()
    waiting = PartitionState(
        tp=TP1, topic_id=TOPIC_ID, leader_id=1, leader_epoch=5, phase=PartitionPhase.FETCHING
    )
    waiting.epoch_check_pending = True
    table.add(waiting)
    _add(table, TP0, phase=PartitionPhase.NEEDS_OFFSET)
    assert table.without_log(0) == [waiting]
    assert table.epoch_questions(0, fetch_version=11, ofle_version=3) == {}
    assert [s.tp for s in table.offset_questions(0)] == [TP0]
    waiting.epoch_check_pending = False
    assert table.next_fetch(0, max_version=13) is None
    halted, _ = _add(table, TopicPartition("t", 2))
    halted.log, halted.phase = None, PartitionPhase.HALTED
    assert table.without_log(0) == [waiting]  # a halted partition's log stays shut
    table.add(waiting, MemoryLog())
    assert table.without_log(0) == []
    assert list(table.next_fetch(0, max_version=13).request.by_name()) == [TP1]


def test_the_leader_backoff_grows_while_failures_go_on_and_resets_on_an_answer():
    table = _table()
    _add(table, TP0)
    delays = [table.connection_failed("refused", 0) for _ in range(4)]
    assert delays == sorted(delays) and delays[-1] >= 640  # 100, 200, 400, 800 (+-20%)
    assert table.loop_failed("boom") >= 1280 and table.stats.loop_errors == 1
    fetch = table.next_fetch(0, max_version=13)
    table.on_response(fetch, _response(fetch, _partition(TP0)), 0)
    assert table.connection_failed("refused", 0) <= 120


def test_logs_a_full_disk_refused_wait_and_say_so():
    """The shell could not make these logs (ENOSPC): each partition shows the full disk in
    status (last_error, disk_full_ms) and no log is tried again before DISK_FULL_RETRY_MS."""
    table = _table()
    waiting = PartitionState(
        tp=TP1, topic_id=TOPIC_ID, leader_id=1, leader_epoch=5, phase=PartitionPhase.FETCHING
    )
    table.add(waiting)
    table.logs_not_opened([TP1], "no space left", now_ms=1_000)
    assert waiting.disk_full_ms == 1_000
    assert waiting.last_error == "disk full: log not created"
    assert table.without_log(1_000 + DISK_FULL_RETRY_MS - 1) == []
    assert table.without_log(1_000 + DISK_FULL_RETRY_MS) == [waiting]


# -- a slow sessionless leader after a full disk (R11 and the stall rule, issue 34) -------


@dataclass
class TansuLike:
    """A sessionless leader as Tansu answers under load: it reads a request's partitions in
    order and has time to read `reads` of those behind before its max wait runs out; it
    answers every partition named, the rest without records (their high watermark only).
    `never_serves` are behind and never given their records, wherever they are named."""

    ends: dict[TopicPartition, int]
    reads: int
    never_serves: frozenset[TopicPartition] = frozenset()

    def answer(self, fetch: NextFetch):
        answers, read = [], 0
        for tp, asked in fetch.plan.to_send.items():
            end = self.ends[tp]
            behind = end > asked.fetch_offset
            if behind and read < self.reads:
                read += 1
                if tp not in self.never_serves:
                    records = _batches(asked.fetch_offset, (end - asked.fetch_offset) // 2)
                    answers.append(_partition(tp, hw=end, records=records))
                    continue
            answers.append(_partition(tp, hw=end))
        return _response(fetch, *answers, session_id=0)


def _soak_against(
    leader,
    table,
    logs,
    *,
    until_ms,
    disk_full=None,
    produce_until_ms=None,
    fails=None,
    produced_a_request=4,
):
    """The shell's loop and the daemon's stall check, on a simulated clock: one request every
    2 s, two records produced in each of `produced_a_request` partitions (in turn) a request
    until
    `produce_until_ms`, appends refused while `disk_full` (start, end) holds; `fails(now,
    fetch)` says how a request fails ("reset": lost with its connection, "timeout": no answer
    in time) or None (answered), and a failed one's connection is made again (the shell's
    `_connection_failed`); the stall watch (30 s, the soak's) checks after each request the
    rows the daemon gives it (lagging and idle for the stall time: follower/status.py), with
    the leader connected as status says (answered since its last failure). The stalls that
    began, by name."""
    from replicad.control.stalls import StallWatch
    from replicad.follower.status import ProblemRow

    watch = StallWatch(stall_after_ms=30_000)
    tps = list(logs)
    produced = 0
    stalls: list[str] = []
    now = 0
    while now < until_ms:
        producing = produce_until_ms is None or now < produce_until_ms
        for _ in range(produced_a_request if producing else 0):
            tp = tps[produced % len(tps)]
            leader.ends[tp] += 2
            produced += 1
        fetch = table.next_fetch(now, max_version=13)
        now += 2_000
        if fetch is None:
            continue
        failure = fails(now, fetch) if fails is not None else None
        if failure is not None:
            table.send_failed(now, leader_failed_it=failure == "timeout")
            table.connection_failed(failure, now)
        else:
            outcome = table.on_response(fetch, leader.answer(fetch), now)
            full = disk_full is not None and disk_full[0] <= now < disk_full[1]
            for append in outcome.appends:
                if full:
                    table.append_failed(append, "ENOSPC", now, disk_full=True)
                else:
                    logs[append.tp].append(append)
                    table.appended(append, now)
        rows = [
            ProblemRow(tp, st, None, now)
            for tp, st in table.partitions.items()
            if st.lag and now - st.progress_ms >= watch.stall_after_ms
        ]
        connected = table.stats.failing_since_ms is None
        leaders = [{"node_id": 1, "connected": connected, "in_shares": table.stats.in_shares}]
        stalls.extend(f"{p['topic']}-{p['partition']}" for p in watch.check(rows, leaders).began)
    return stalls


def _slow_leader_table(partitions=400):
    table = _table(sessionless_max_partitions=50, wait_max_ms=500, sessionless_wait_ms=2_000)
    logs = {}
    for p in range(partitions):
        _, logs[TopicPartition("t", p)] = _add(table, TopicPartition("t", p))
    return table, logs


def test_after_a_full_minute_partitions_a_slow_sessionless_leader_cut_short_are_not_stalled():
    """Session 14's Tansu soaks (1,000 and 10,000 partitions): after each full disk hundreds
    of partitions were behind, Tansu read 20 of each share of 100 before its max wait ran out
    and answered the rest without records, and those waited for the next pass; after two
    such answers the stall rule judged them on idle time counted from before the full disk
    (7,670 and 11,442 stalls). A partition the leader's wait cut short keeps its place: it
    goes first in the next share and is not judged for that answer; and, as a Kafka leader
    counts a follower's lag from when it was last caught up, an answer that finds a partition
    caught up starts its idle time again (a partition with no new records for minutes was
    judged on the first answer that cut it short once it had some). Here 400 partitions in
    shares of 50, the leader reading 10 of those behind a request, a request every 2 s, 4
    partitions produced to a request, the disk full from 30 to 90 s: the backlog drains at
    the leader's pace, and nothing is stalled. On the old code: 334 stalls (270 partitions)."""
    table, logs = _slow_leader_table()
    leader = TansuLike({tp: 0 for tp in logs}, reads=10)
    stalls = _soak_against(
        leader, table, logs, until_ms=300_000, disk_full=(30_000, 90_000), produce_until_ms=200_000
    )
    assert stalls == []
    # The backlog drained: the replica holds everything produced.
    assert [tp for tp, local in logs.items() if local.log_end_offset != leader.ends[tp]] == []


def test_a_partition_a_sessionless_leader_never_serves_is_still_stalled():
    """The stall a user must see: a partition the leader has records for and never gives
    them, first in a share or not, while the others move (and the disk is not full), is
    reported stalled -- once -- and no other partition is (on the old code 245 other stalls
    were, of partitions cut short twice in a row)."""
    table, logs = _slow_leader_table()
    wedged = TopicPartition("t", 7)
    leader = TansuLike({tp: 0 for tp in logs}, reads=10, never_serves=frozenset({wedged}))
    assert _soak_against(leader, table, logs, until_ms=240_000) == ["t-7"]


def test_requests_lost_while_a_leader_restarts_are_no_turns_after_a_full_disk():
    """Session 16's soak on Tansu with S3 storage: after a full disk the leader was SIGKILLed
    and restarted, and connections were cut and reset; the requests lost so were counted as
    turns, and 104 partitions still behind since the disk refused their records were called
    stalled the moment the leader answered again, each moving 5-15 s later at its turn. A
    request lost with its connection, or the first on a new connection not answered in time,
    is no turn (R14). Here 400 partitions in shares of 50, the disk full from 30 to 90 s,
    then 40 s of a leader restarting: every request reset, or not answered in time on its new
    connection. On the old code: 288 stalls."""
    table, logs = _slow_leader_table()
    leader = TansuLike({tp: 0 for tp in logs}, reads=10)
    failures = itertools.cycle(["reset", "timeout"])

    def restarting(now, fetch):
        return next(failures) if 90_000 <= now < 130_000 else None

    stalls = _soak_against(
        leader,
        table,
        logs,
        until_ms=300_000,
        disk_full=(30_000, 90_000),
        produce_until_ms=200_000,
        fails=restarting,
    )
    assert stalls == []
    assert [tp for tp, local in logs.items() if local.log_end_offset != leader.ends[tp]] == []


def _in_shares_of_two(partitions: int) -> PartitionTable:
    """A table of `partitions` whose leader answered the first (full) request without a
    session: from now on it is asked in shares of two (R11)."""
    table = _table(sessionless_max_partitions=2)
    for p in range(partitions):
        _add(table, TopicPartition("t", p))
    first = table.next_fetch(0, max_version=13)
    table.on_response(first, _response(first, session_id=0), 0)
    return table


def test_a_share_failed_by_the_leader_or_lost_with_its_connection_is_asked_again_first():
    """Session 18's soak on Tansu with S3 storage at 10,000 partitions: a pass over the
    partitions took 46-90 s, longer than the stall time, and the network faults (a request
    not answered in time, an answer cut short by the proxy, a connection reset) ended a
    share now and then without an answer. Its partitions, taken out of the pass when sent,
    waited for the next pass. A share without a usable answer keeps its place (R16): asked
    again in the next request, counted as a turn only as R14 says; once (a retry that fails
    too waits for the next pass, or a share never answered would hold the others back)."""
    table = _in_shares_of_two(6)
    answered = table.next_fetch(0, max_version=13)
    table.on_response(answered, _response(answered, session_id=0), 0)
    failed = table.next_fetch(0, max_version=13)
    assert _asked(failed) == [2, 3]
    table.send_failed(0, leader_failed_it=True)  # no answer in time: a turn (R14)
    table.connection_failed("timeout", 0)
    again = table.next_fetch(0, max_version=13)
    assert _asked(again) == [2, 3]
    turns = {tp.partition: st.answers_since_move for tp, st in table.partitions.items()}
    table.send_failed(0)  # reset by the peer: no turn, and the retry failed: next pass
    assert {tp.partition: st.answers_since_move for tp, st in table.partitions.items()} == turns
    assert turns[2] == turns[3] == turns[4] + 1  # the first (full) answer, and the timeout
    assert _asked(table.next_fetch(0, max_version=13)) == [4, 5]
    table.send_failed(0)  # lost with its connection: asked again first
    assert _asked(table.next_fetch(0, max_version=13)) == [4, 5]


def test_each_turn_since_a_partition_last_moved_is_recorded_by_its_kind():
    """Session 18's soak: 103 stalls of partitions with two turns since they last moved,
    and nothing said what the turns were. Status (and a stall's line) says each: here one
    answer that served no partition, one that served another but not this one, one that
    left it out, one failed by the leader and one refused whole; the last four kept
    (tests/follower/test_status.py: status spells them out)."""
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    table = _table()
    _add(table, tp0)
    _add(table, tp1)
    fetch = table.next_fetch(0, max_version=13)
    table.on_response(
        fetch, _response(fetch, _partition(tp0, hw=4), _partition(tp1, hw=4), session_id=0), 0
    )
    fetch = table.next_fetch(0, max_version=13)
    served = _partition(tp1, hw=4, records=_batches(0, 2))
    outcome = table.on_response(
        fetch, _response(fetch, _partition(tp0, hw=4), served, session_id=0), 0
    )
    for append in outcome.appends:
        table.appended(append, 0)
    fetch = table.next_fetch(0, max_version=13)
    table.on_response(fetch, _response(fetch, _partition(tp1, hw=4), session_id=0), 0)
    table.next_fetch(0, max_version=13)
    table.send_failed(0, leader_failed_it=True)
    fetch = table.next_fetch(0, max_version=13)
    table.on_response(fetch, _response(fetch, error=UNKNOWN_SERVER_ERROR, session_id=0), 0)
    state = table.partitions[tp0]
    assert state.answers_since_move == 5 and state.turns == "nofr"  # "e" dropped
    assert table.partitions[tp1].turns == "efr"  # moved by its records, then three turns


def test_a_share_the_leader_refuses_or_a_new_connection_abandons_is_asked_again_first():
    """R16 for the other two ways a share ends without records: an answer refused whole (a
    top-level error) and a request abandoned for a new connection."""
    table = _in_shares_of_two(6)
    share = table.next_fetch(0, max_version=13)
    assert _asked(share) == [0, 1]
    refused = _response(share, error=UNKNOWN_SERVER_ERROR, session_id=0)
    assert not table.on_response(share, refused, 0).accepted
    again = table.next_fetch(0, max_version=13)
    assert _asked(again) == [0, 1]
    table.on_response(again, _response(again, session_id=0), 0)
    assert _asked(table.next_fetch(0, max_version=13)) == [2, 3]
    table.connection_failed("reset", 0)  # abandoned: the shell connects again
    assert _asked(table.next_fetch(0, max_version=13)) == [2, 3]


def test_a_share_that_times_out_every_time_while_others_are_answered_is_stalled():
    """What R14 must not hide: a leader that answers the other shares and never answers the
    share naming one partition (no answer in time, on a connection that answered) has that
    partition judged: it is reported stalled, while the disk has room (and so are the
    partitions that keep sharing its request: they do not move either)."""
    table, logs = _slow_leader_table()
    wedged = TopicPartition("t", 7)
    # Behind from the start: its first answer says so and gives nothing; then no answer.
    leader = TansuLike({tp: 0 for tp in logs}, reads=10, never_serves=frozenset({wedged}))
    leader.ends[wedged] = 10

    def times_out(now, fetch):
        return "timeout" if wedged in fetch.plan.to_send and now > 10_000 else None

    stalls = _soak_against(leader, table, logs, until_ms=240_000, fails=times_out)
    assert "t-7" in stalls
