"""The leader's fetch-session cache: Kafka's rules with time passed in, the O(changes) cost,
and property tests against a Kafka-style full-scan reference and against our own client."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from replicad.errors import LocalProtocolError
from replicad.session.cache import (
    DEFAULT_EVICTION_MS,
    ContextKind,
    FetchContext,
    FetchSessionCache,
    PartitionRead,
    PartitionResult,
    SessionRequest,
    SessionResponse,
    unresolved_topic_name,
)
from replicad.session.client import FetchRequestPlan, FetchSessionHandler
from replicad.session.metadata import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    MAX_EPOCH,
    MAX_SESSION_ID,
    PartitionFetch,
    TopicIdPartition,
)
from replicad.types import TopicPartition

RECORD_BYTES = 100
EVICT = DEFAULT_EVICTION_MS
T_A = uuid.UUID(int=0xA)
T_A2 = uuid.UUID(int=0xA2)
T_B = uuid.UUID(int=0xB)


def tp(topic: str, partition: int = 0) -> TopicPartition:
    return TopicPartition(topic, partition)


def pf(
    offset: int = 0, *, max_bytes: int = 1 << 20, topic_id: uuid.UUID | None = None
) -> PartitionFetch:
    return PartitionFetch(
        fetch_offset=offset, log_start_offset=0, max_bytes=max_bytes, topic_id=topic_id
    )


def parts(n: int, topic: str = "t") -> dict[TopicPartition, PartitionFetch]:
    return {tp(topic, i): pf() for i in range(n)}


@dataclass
class FakeLog:
    """One partition as a follower-fetch reads it: records up to `end`."""

    end: int = 0
    hw: int = 0
    lso: int = 0
    error: int = 0
    preferred: int = -1
    diverging: bool = False


@dataclass
class Fetched:
    kind: ContextKind
    response: SessionResponse
    results: dict[TopicPartition, PartitionResult]

    @property
    def session_id(self) -> int:
        return self.response.session_id

    @property
    def partitions(self) -> list[TopicPartition]:
        return list(self.response.partitions)


@dataclass
class FakeLeader:
    """The leader's log layer in miniature: it reads partitions and reports every change."""

    cache: FetchSessionCache
    logs: dict[TopicPartition, FakeLog] = field(default_factory=dict)

    def log(self, part: TopicPartition) -> FakeLog:
        return self.logs.setdefault(part, FakeLog())

    def change(self, part: TopicPartition, **fields: object) -> None:
        log = self.log(part)
        for name, value in fields.items():
            setattr(log, name, value)
        self.cache.partition_changed(part)

    def append(self, part: TopicPartition, records: int, *, advance_hw: bool = True) -> None:
        log = self.log(part)
        self.change(part, end=log.end + records, hw=log.end + records if advance_hw else log.hw)

    def read(self, read: PartitionRead, budget: int) -> PartitionResult:
        log = self.log(read.partition)
        if log.error:
            return PartitionResult(high_watermark=-1, log_start_offset=-1, error_code=log.error)
        available = max(0, log.end - read.fetch.fetch_offset) * RECORD_BYTES
        size = min(available, read.fetch.max_bytes, max(budget, 0))
        return PartitionResult(
            high_watermark=log.hw,
            log_start_offset=log.lso,
            records_size=size,
            preferred_read_replica=log.preferred,
            diverging_epoch=log.diverging,
            more_data=size < available,
        )

    def read_all(
        self, context: FetchContext, max_bytes: int
    ) -> dict[TopicPartition, PartitionResult]:
        budget = max_bytes
        results = {}
        for read in context.to_read():
            result = self.read(read, budget)
            budget -= result.records_size
            results[read.partition] = result
        return results

    def fetch(self, request: SessionRequest, *, now_ms: int, max_bytes: int = 1 << 30) -> Fetched:
        context = self.cache.new_context(request, now_ms=now_ms)
        results = self.read_all(context, max_bytes)
        return Fetched(context.kind, context.build_response(results, now_ms=now_ms), results)


def full(
    partitions: Mapping[TopicPartition, PartitionFetch],
    *,
    privileged: bool = False,
    session_id: int = 0,
    epoch: int = INITIAL_EPOCH,
    uses_topic_ids: bool = False,
) -> SessionRequest:
    return SessionRequest(
        session_id=session_id,
        epoch=epoch,
        partitions=dict(partitions),
        uses_topic_ids=uses_topic_ids,
        privileged=privileged,
    )


def incremental(
    session_id: int,
    epoch: int,
    partitions: Mapping[TopicPartition, PartitionFetch] | None = None,
    forgotten: Iterable[TopicPartition | TopicIdPartition] = (),
    *,
    uses_topic_ids: bool = False,
) -> SessionRequest:
    forgets = tuple(
        f if isinstance(f, TopicIdPartition) else TopicIdPartition(None, f) for f in forgotten
    )
    return SessionRequest(
        session_id=session_id,
        epoch=epoch,
        partitions=dict(partitions or {}),
        forgotten=forgets,
        uses_topic_ids=uses_topic_ids,
    )


def new_cache(slots: int = 1000, seed: int = 7) -> tuple[FetchSessionCache, FakeLeader]:
    cache = FetchSessionCache(rng=random.Random(seed), max_slots=slots)
    return cache, FakeLeader(cache)


def create(
    leader: FakeLeader, n: int, *, now_ms: int, privileged: bool = False, topic: str = "t"
) -> int:
    """A new session over n partitions, as a full fetch creates it; its id or 0."""
    return leader.fetch(full(parts(n, topic), privileged=privileged), now_ms=now_ms).session_id


def use(leader: FakeLeader, session_id: int, *, now_ms: int) -> Fetched:
    """One idle incremental fetch in the session (it touches the session)."""
    view = leader.cache.session(session_id)
    assert view is not None
    fetched = leader.fetch(incremental(session_id, view.epoch), now_ms=now_ms)
    assert fetched.kind is ContextKind.INCREMENTAL
    return fetched


# -- session life --------------------------------------------------------------------------


def test_full_request_creates_a_session_at_epoch_1_in_request_order() -> None:
    cache, leader = new_cache()
    request = full({tp("c"): pf(), tp("a"): pf(), tp("b"): pf()}, privileged=True)
    fetched = leader.fetch(request, now_ms=5)
    assert fetched.kind is ContextKind.FULL
    assert fetched.response.error_code == 0
    assert fetched.partitions == [tp("c"), tp("a"), tp("b")]
    view = cache.session(fetched.session_id)
    assert view is not None
    assert (view.epoch, view.privileged, view.creation_ms, view.last_used_ms) == (1, True, 5, 5)
    assert list(view.partitions) == [tp("c"), tp("a"), tp("b")]


class ScriptedRandom(random.Random):
    """Hands out the ids it is given, and remembers the range asked for."""

    def __init__(self, ids: list[int]) -> None:
        super().__init__(0)
        self.ids = ids
        self.ranges: list[tuple[int, int]] = []

    def randint(self, a: int, b: int) -> int:
        self.ranges.append((a, b))
        return self.ids.pop(0)


def test_session_ids_are_positive_31_bit_unique_and_from_the_injected_rng() -> None:
    rng = ScriptedRandom([17, 17, 99])
    cache = FetchSessionCache(rng=rng)
    leader = FakeLeader(cache)
    assert create(leader, 1, now_ms=0) == 17
    # 17 is taken: the cache draws again.
    assert create(leader, 1, now_ms=0) == 99
    assert set(rng.ranges) == {(1, MAX_SESSION_ID)}
    assert MAX_SESSION_ID == 2**31 - 1


def test_same_seed_same_ids() -> None:
    ids = []
    for _ in range(2):
        _, leader = new_cache(seed=3)
        ids.append([create(leader, 1, now_ms=0) for _ in range(5)])
    assert ids[0] == ids[1]
    assert all(0 < i <= MAX_SESSION_ID for i in ids[0])


def test_incremental_fetches_advance_the_epoch() -> None:
    cache, leader = new_cache()
    sid = create(leader, 2, now_ms=0)
    for epoch in (1, 2, 3):
        assert leader.fetch(incremental(sid, epoch), now_ms=epoch).kind is ContextKind.INCREMENTAL
    view = cache.session(sid)
    assert view is not None and view.epoch == 4


def test_epoch_wraps_from_max_to_one() -> None:
    cache, leader = new_cache()
    sid = create(leader, 1, now_ms=0)
    # Reaching 2^31-1 by fetching would take years; set the session as it would then be.
    cache._sessions[sid].epoch = MAX_EPOCH
    assert leader.fetch(incremental(sid, MAX_EPOCH), now_ms=1).kind is ContextKind.INCREMENTAL
    view = cache.session(sid)
    assert view is not None and view.epoch == 1


def test_full_request_naming_a_session_removes_it() -> None:
    cache, leader = new_cache()
    old = create(leader, 2, now_ms=0)
    new = leader.fetch(full(parts(2), session_id=old), now_ms=1).session_id
    assert new not in (0, old)
    assert cache.session(old) is None
    assert cache.session_ids() == [new]


def test_final_epoch_closes_the_session_and_creates_none() -> None:
    cache, leader = new_cache()
    sid = create(leader, 2, now_ms=0)
    fetched = leader.fetch(full(parts(2), session_id=sid, epoch=FINAL_EPOCH), now_ms=1)
    assert fetched.kind is ContextKind.SESSIONLESS
    assert (fetched.response.error_code, fetched.session_id) == (0, 0)
    assert fetched.partitions == list(parts(2))
    assert cache.session_ids() == []


def test_legacy_sessionless_request_creates_nothing() -> None:
    cache, leader = new_cache()
    fetched = leader.fetch(full(parts(3), epoch=FINAL_EPOCH), now_ms=0)
    assert fetched.session_id == 0
    assert fetched.partitions == list(parts(3))
    assert cache.metrics().num_incremental_fetch_sessions == 0


def test_incremental_request_that_leaves_no_partitions_removes_the_session() -> None:
    cache, leader = new_cache()
    sid = create(leader, 2, now_ms=0)
    fetched = leader.fetch(incremental(sid, 1, forgotten=list(parts(2))), now_ms=1)
    assert fetched.kind is ContextKind.SESSIONLESS
    assert fetched.session_id == 0
    assert cache.session(sid) is None


def test_forgotten_partitions_leave_the_session() -> None:
    cache, leader = new_cache()
    sid = create(leader, 3, now_ms=0)
    leader.fetch(incremental(sid, 1, forgotten=[tp("t", 1)]), now_ms=1)
    view = cache.session(sid)
    assert view is not None and list(view.partitions) == [tp("t", 0), tp("t", 2)]
    # Its changes no longer reach this session.
    leader.append(tp("t", 1), 5)
    assert leader.fetch(incremental(sid, 2), now_ms=2).partitions == []


def test_added_partitions_go_to_the_end_and_are_answered() -> None:
    cache, leader = new_cache()
    sid = create(leader, 2, now_ms=0)
    leader.append(tp("new"), 1)
    fetched = leader.fetch(incremental(sid, 1, {tp("new"): pf()}), now_ms=1)
    assert fetched.partitions == [tp("new")]
    assert fetched.results[tp("new")].records_size == RECORD_BYTES
    view = cache.session(sid)
    assert view is not None and list(view.partitions)[-1] == tp("new")


# -- session errors ------------------------------------------------------------------------


def test_unknown_session_id_is_fetch_session_id_not_found() -> None:
    _, leader = new_cache()
    fetched = leader.fetch(incremental(12345, 1, parts(1)), now_ms=0)
    assert fetched.kind is ContextKind.SESSION_ERROR
    assert fetched.response == SessionResponse(ErrorCode.fetch_session_id_not_found, 0, ())
    assert fetched.results == {}


def test_wrong_epoch_is_invalid_fetch_session_epoch_and_changes_nothing() -> None:
    cache, leader = new_cache()
    sid = create(leader, 2, now_ms=0)
    fetched = leader.fetch(incremental(sid, 2, {tp("x"): pf()}), now_ms=1)
    assert fetched.response == SessionResponse(ErrorCode.invalid_fetch_session_epoch, 0, ())
    view = cache.session(sid)
    assert view is not None and view.epoch == 1 and tp("x") not in view.partitions


def test_crossing_the_topic_id_boundary_is_fetch_session_topic_id_error() -> None:
    _, leader = new_cache()
    sid = create(leader, 2, now_ms=0)  # a v12 session, topics by name
    fetched = leader.fetch(incremental(sid, 1, uses_topic_ids=True), now_ms=1)
    assert fetched.response.error_code == ErrorCode.fetch_session_topic_id_error


def test_a_duplicate_request_racing_the_session_gets_invalid_epoch() -> None:
    cache, leader = new_cache()
    sid = create(leader, 2, now_ms=0)
    first = cache.new_context(incremental(sid, 1), now_ms=1)
    second = cache.new_context(incremental(sid, 2), now_ms=1)
    second.build_response(leader.read_all(second, 1 << 30), now_ms=1)
    response = first.build_response(leader.read_all(first, 1 << 30), now_ms=1)
    assert response == SessionResponse(ErrorCode.invalid_fetch_session_epoch, sid, ())


def test_context_misuse_is_a_local_error() -> None:
    cache, leader = new_cache()
    context = cache.new_context(full(parts(2)), now_ms=0)
    with pytest.raises(LocalProtocolError):
        context.build_response({}, now_ms=0)  # before to_read
    reads = context.to_read()
    with pytest.raises(LocalProtocolError):
        cache.new_context(full(parts(2)), now_ms=0).build_response({}, now_ms=0)
    results = {r.partition: leader.read(r, 1 << 30) for r in reads}
    with pytest.raises(LocalProtocolError, match="no read result"):
        context.build_response({tp("t", 0): results[tp("t", 0)]}, now_ms=0)
    # A refused call changed nothing: the context still answers, once.
    assert context.build_response(results, now_ms=0).session_id != 0
    with pytest.raises(LocalProtocolError, match="twice"):
        context.build_response(results, now_ms=0)


# -- eviction: one test per rule -------------------------------------------------------------


def test_full_cache_with_nothing_evictable_answers_sessionless() -> None:
    cache, leader = new_cache(slots=1)
    first = create(leader, 5, now_ms=0)
    fetched = leader.fetch(full(parts(10, "u")), now_ms=1000)
    assert fetched.session_id == 0
    assert fetched.partitions == list(parts(10, "u"))  # still a complete full response
    assert cache.session_ids() == [first]
    assert cache.metrics().incremental_fetch_session_evictions == 0


def test_least_recently_used_session_idle_past_the_limit_is_evicted_by_anyone() -> None:
    cache, leader = new_cache(slots=1)
    follower = create(leader, 100, now_ms=0, privileged=True)
    # Idle exactly the limit is not stale yet (Kafka compares with >).
    assert create(leader, 1, now_ms=EVICT, topic="c") == 0
    consumer = create(leader, 1, now_ms=EVICT + 1, topic="c")
    assert consumer != 0
    assert cache.session_ids() == [consumer]
    assert cache.session(follower) is None
    assert cache.metrics().incremental_fetch_session_evictions == 1


def test_privileged_newcomer_evicts_an_unprivileged_session_at_once() -> None:
    cache, leader = new_cache(slots=1)
    consumer = create(leader, 100, now_ms=0)
    follower = create(leader, 1, now_ms=1, privileged=True)
    assert follower != 0
    assert cache.session(consumer) is None


def test_young_unprivileged_session_is_safe_from_a_bigger_unprivileged_newcomer() -> None:
    cache, leader = new_cache(slots=1)
    first = create(leader, 1, now_ms=0)
    use(leader, first, now_ms=EVICT)  # touched at exactly the age limit: not old enough
    assert create(leader, 50, now_ms=EVICT + 1, topic="u") == 0
    assert cache.session_ids() == [first]


def test_old_session_is_evicted_only_by_a_strictly_bigger_newcomer_of_equal_privilege() -> None:
    cache, leader = new_cache(slots=1)
    first = create(leader, 2, now_ms=0)
    use(leader, first, now_ms=EVICT + 10_000)  # older than the limit when last touched
    now = EVICT + 11_000
    assert create(leader, 2, now_ms=now, topic="u") == 0  # equal size: no
    bigger = create(leader, 3, now_ms=now, topic="u")
    assert bigger != 0
    assert cache.session_ids() == [bigger]


def test_privileged_session_is_evictable_only_by_a_privileged_newcomer_once_old() -> None:
    cache, leader = new_cache(slots=1)
    follower = create(leader, 2, now_ms=0, privileged=True)
    # Young: not even a bigger privileged newcomer may evict it.
    use(leader, follower, now_ms=1000)
    assert create(leader, 50, now_ms=1001, privileged=True, topic="p") == 0
    use(leader, follower, now_ms=EVICT + 10_000)
    now = EVICT + 11_000
    # Old now, but an unprivileged newcomer never wins over a privileged session.
    assert create(leader, 1000, now_ms=now, topic="u") == 0
    assert create(leader, 2, now_ms=now, privileged=True, topic="p") == 0  # equal size
    other = create(leader, 3, now_ms=now, privileged=True, topic="p")
    assert other != 0
    assert cache.session_ids() == [other]


def test_evictability_is_refreshed_only_when_a_session_is_used() -> None:
    cache, leader = new_cache(slots=1)
    first = create(leader, 1, now_ms=0)
    use(leader, first, now_ms=100_000)  # 100 s old at its last use: not evictable
    # 150 s old now, idle only 50 s: still judged as at its last use.
    assert create(leader, 9, now_ms=150_000, topic="u") == 0
    use(leader, first, now_ms=160_000)  # used again, now old enough
    assert create(leader, 9, now_ms=161_000, topic="u") != 0
    assert cache.session(first) is None


def test_the_smallest_evictable_session_goes_first() -> None:
    cache, leader = new_cache(slots=3)
    sizes = {create(leader, n, now_ms=0, topic=f"s{n}"): n for n in (5, 2, 3)}
    for sid in sizes:
        use(leader, sid, now_ms=EVICT + 1000)
    create(leader, 1, now_ms=EVICT + 2000, privileged=True, topic="p")
    survivors = {sizes[sid] for sid in cache.session_ids() if sid in sizes}
    assert survivors == {5, 3}


def test_a_flood_of_unprivileged_sessions_cannot_evict_a_follower() -> None:
    """sarama PR 1644 / platformatic issue 315: clients that never reuse their session."""
    cache, leader = new_cache(slots=2, seed=11)
    follower = create(leader, 10, now_ms=0, privileged=True, topic="f")
    flood = random.Random(5)
    created = 0
    now = 0
    for tick in range(6000):  # 10 minutes in 100 ms steps
        now += 100
        # Mostly bigger than the follower's session: size alone must not win.
        if create(leader, flood.randint(1, 100), now_ms=now, topic=f"c{tick}") != 0:
            created += 1
        if tick % 5 == 0:
            assert use(leader, follower, now_ms=now).response.error_code == 0
    assert follower in cache.session_ids()
    # A consumer session never used again is never made evictable by a touch; it only
    # goes once idle past the limit (Kafka's rule). So the flood got about one session
    # every two minutes, each time by evicting a stale consumer.
    assert created == 5
    assert cache.metrics().incremental_fetch_session_evictions == created - 1


# -- what incremental responses carry -------------------------------------------------------


def test_idle_incremental_response_is_empty() -> None:
    _, leader = new_cache()
    sid = create(leader, 5, now_ms=0)
    assert leader.fetch(incremental(sid, 1), now_ms=1).partitions == []


@pytest.mark.parametrize(
    "change",
    [
        {"hw": 7},
        {"lso": 3},
        {"preferred": 2},
        {"diverging": True},
        {"error": ErrorCode.not_leader_or_follower},
    ],
)
def test_incremental_response_carries_a_partition_whose_answer_changed(
    change: dict[str, object],
) -> None:
    _, leader = new_cache()
    for i in range(4):
        leader.log(tp("t", i)).end = 10
        leader.log(tp("t", i)).hw = 5
    sid = create(leader, 4, now_ms=0)
    # Catch up (fetch offsets 10) so nothing is pending.
    caught_up = {tp("t", i): pf(10) for i in range(4)}
    assert leader.fetch(incremental(sid, 1, caught_up), now_ms=1).partitions == []
    leader.change(tp("t", 2), **change)
    assert leader.fetch(incremental(sid, 2), now_ms=2).partitions == [tp("t", 2)]


def test_records_are_sent_and_the_partition_then_goes_quiet() -> None:
    _, leader = new_cache()
    sid = create(leader, 3, now_ms=0)
    leader.append(tp("t", 1), 4)
    fetched = leader.fetch(incremental(sid, 1), now_ms=1)
    assert fetched.partitions == [tp("t", 1)]
    assert fetched.results[tp("t", 1)].records_size == 4 * RECORD_BYTES
    # The follower moves its fetch offset: included (new offset, nothing new), then quiet.
    assert leader.fetch(incremental(sid, 2, {tp("t", 1): pf(4)}), now_ms=2).partitions == []
    assert leader.fetch(incremental(sid, 3), now_ms=3).partitions == []


def test_records_are_sent_again_while_the_follower_does_not_advance() -> None:
    _, leader = new_cache()
    sid = create(leader, 2, now_ms=0)
    leader.append(tp("t", 0), 2)
    for epoch in (1, 2, 3):
        # Kafka includes a partition with records every time; so does the cache,
        # though nothing changed since.
        assert leader.fetch(incremental(sid, epoch), now_ms=epoch).partitions == [tp("t", 0)]


def test_an_error_is_sent_every_time_and_the_recovery_once() -> None:
    _, leader = new_cache()
    sid = create(leader, 2, now_ms=0)
    leader.change(tp("t", 0), error=ErrorCode.kafka_storage_error)
    assert leader.fetch(incremental(sid, 1), now_ms=1).partitions == [tp("t", 0)]
    assert leader.fetch(incremental(sid, 2), now_ms=2).partitions == [tp("t", 0)]
    # The error clears with the same watermarks as before; the cached high watermark was
    # set to -1, so the recovered partition is still sent once.
    leader.change(tp("t", 0), error=0)
    fetched = leader.fetch(incremental(sid, 3), now_ms=3)
    assert fetched.partitions == [tp("t", 0)]
    assert fetched.results[tp("t", 0)].error_code == 0
    assert leader.fetch(incremental(sid, 4), now_ms=4).partitions == []


def test_rotation_moves_partitions_that_returned_records_to_the_end() -> None:
    cache, leader = new_cache()
    sid = create(leader, 4, now_ms=0)
    leader.append(tp("t", 0), 1)
    leader.append(tp("t", 2), 1)
    assert leader.fetch(incremental(sid, 1), now_ms=1).partitions == [tp("t", 0), tp("t", 2)]
    view = cache.session(sid)
    assert view is not None
    assert list(view.partitions) == [tp("t", 1), tp("t", 3), tp("t", 0), tp("t", 2)]
    # Next time every partition has data: the byte budget goes to the others first.
    for i in range(4):
        leader.append(tp("t", i), 1)
    advanced = {tp("t", 0): pf(1), tp("t", 2): pf(1)}
    context = cache.new_context(incremental(sid, 2, advanced), now_ms=2)
    assert [r.partition for r in context.to_read()] == [
        tp("t", 1),
        tp("t", 3),
        tp("t", 0),
        tp("t", 2),
    ]


def test_a_partition_cut_short_by_the_byte_budget_is_read_again_without_a_change() -> None:
    _, leader = new_cache()
    sid = create(leader, 2, now_ms=0)
    # Records a follower may read, high watermark unchanged: only the data is news.
    leader.append(tp("t", 0), 10, advance_hw=False)
    leader.append(tp("t", 1), 10, advance_hw=False)
    first = leader.fetch(incremental(sid, 1), now_ms=1, max_bytes=10 * RECORD_BYTES)
    assert first.partitions == [tp("t", 0)]
    assert first.results[tp("t", 1)].records_size == 0  # read, but no budget left
    # No append, no request change for t-1: it must still come (KIP-74, no starvation).
    second = leader.fetch(incremental(sid, 2, {tp("t", 0): pf(10)}), now_ms=2)
    assert second.partitions == [tp("t", 1)]
    assert second.results[tp("t", 1)].records_size == 10 * RECORD_BYTES


def test_changes_between_reading_and_answering_are_not_lost() -> None:
    cache, leader = new_cache()
    # Full fetch: the change lands after the reads, before the session exists.
    context = cache.new_context(full(parts(2)), now_ms=0)
    results = leader.read_all(context, 1 << 30)
    leader.append(tp("t", 1), 3)
    sid = context.build_response(results, now_ms=0).session_id
    assert leader.fetch(incremental(sid, 1), now_ms=1).partitions == [tp("t", 1)]
    # Incremental fetch: same race inside an existing session.
    context = cache.new_context(incremental(sid, 2, {tp("t", 1): pf(3)}), now_ms=2)
    results = leader.read_all(context, 1 << 30)
    leader.append(tp("t", 0), 2)
    context.build_response(results, now_ms=2)
    assert leader.fetch(incremental(sid, 3), now_ms=3).partitions == [tp("t", 0)]


def test_a_change_during_the_read_of_a_changed_partition_is_not_lost() -> None:
    cache, leader = new_cache()
    sid = create(leader, 2, now_ms=0)
    leader.change(tp("t", 0))  # a change note that turns out to say nothing new
    context = cache.new_context(incremental(sid, 1), now_ms=1)
    results = leader.read_all(context, 1 << 30)
    assert list(results) == [tp("t", 0)]
    leader.append(tp("t", 0), 2)  # while the leader was reading it
    assert context.build_response(results, now_ms=1).partitions == ()
    assert leader.fetch(incremental(sid, 2), now_ms=2).partitions == [tp("t", 0)]


def test_after_an_error_the_partition_is_sent_again_even_with_the_same_watermarks() -> None:
    cache, _ = new_cache()
    quiet = PartitionResult(high_watermark=5, log_start_offset=0)
    failed = replace(quiet, error_code=ErrorCode.kafka_storage_error)

    def answer(request: SessionRequest, result: PartitionResult) -> SessionResponse:
        context = cache.new_context(request, now_ms=0)
        return context.build_response({r.partition: result for r in context.to_read()}, now_ms=0)

    sid = answer(full(parts(1)), quiet).session_id
    assert answer(incremental(sid, 1, parts(1)), quiet).partitions == ()
    # This leader reports the error with its real high watermark, not -1.
    assert answer(incremental(sid, 2, parts(1)), failed).partitions == (tp("t", 0),)
    assert answer(incremental(sid, 3, parts(1)), quiet).partitions == (tp("t", 0),)
    assert answer(incremental(sid, 4, parts(1)), quiet).partitions == ()


def test_a_recreated_topic_replaces_the_partition_in_the_session() -> None:
    cache, leader = new_cache()
    request = full({tp("a"): pf(topic_id=T_A), tp("b"): pf(topic_id=T_B)}, uses_topic_ids=True)
    sid = leader.fetch(request, now_ms=0).session_id
    # What a v13 client sends: the partition under its new id, the old id forgotten.
    fetched = leader.fetch(
        incremental(
            sid,
            1,
            {tp("a"): pf(topic_id=T_A2)},
            [TopicIdPartition(T_A, tp("a"))],
            uses_topic_ids=True,
        ),
        now_ms=1,
    )
    # A new incarnation: nothing cached about it, so it is answered in full.
    assert fetched.partitions == [tp("a")]
    view = cache.session(sid)
    assert view is not None
    assert list(view.partitions) == [tp("b"), tp("a")]
    assert view.partitions[tp("a")].topic_id == T_A2


def test_a_forget_by_an_id_the_leader_no_longer_knows_removes_the_partition() -> None:
    """tools/sim seed 490: t1 was re-created; the follower forgets t1-0 by the old id, which
    the leader resolves to no name now. The session must not keep answering t1-0."""
    cache, leader = new_cache()
    request = full({tp("a"): pf(topic_id=T_A), tp("b"): pf(topic_id=T_B)}, uses_topic_ids=True)
    sid = leader.fetch(request, now_ms=0).session_id
    gone = TopicIdPartition(T_A, tp(unresolved_topic_name(T_A)))  # as the shell resolves it
    leader.fetch(incremental(sid, 1, forgotten=[gone], uses_topic_ids=True), now_ms=1)
    view = cache.session(sid)
    assert view is not None and list(view.partitions) == [tp("b")]
    # A forget by an id the partition was never cached with removes nothing.
    other = TopicIdPartition(T_A2, tp(unresolved_topic_name(T_A2)))
    leader.fetch(incremental(sid, 2, forgotten=[other], uses_topic_ids=True), now_ms=2)
    assert list(cache.session(sid).partitions) == [tp("b")]


def test_a_partition_sent_by_its_id_under_another_name_is_the_same_partition() -> None:
    """tools/sim seed 38067: topic a was re-created; the follower, not told yet, sends a-0
    again by its old id, which the leader now resolves to no name. Kafka keys a session's
    partitions by id and partition: it is the partition already cached, not a second one
    (the session had answered one partition more than the follower asked for)."""
    cache, leader = new_cache()
    request = full({tp("a"): pf(topic_id=T_A), tp("b"): pf(topic_id=T_B)}, uses_topic_ids=True)
    sid = leader.fetch(request, now_ms=0).session_id
    stale = tp(unresolved_topic_name(T_A))
    leader.fetch(incremental(sid, 1, {stale: pf(5, topic_id=T_A)}, uses_topic_ids=True), now_ms=1)
    view = cache.session(sid)
    assert view is not None
    assert list(view.partitions) == [tp("b"), stale]
    assert view.partitions[stale].fetch_offset == 5
    # And the reverse: cached under an unresolved name, then sent under the name the
    # leader has learnt for that id since.
    leader.fetch(incremental(sid, 2, {tp("a"): pf(6, topic_id=T_A)}, uses_topic_ids=True), now_ms=2)
    view = cache.session(sid)
    assert view is not None and list(view.partitions) == [tp("b"), tp("a")]
    assert view.partitions[tp("a")].fetch_offset == 6


def test_unresolved_topic_ids_get_a_name_no_real_topic_can_have() -> None:
    name = unresolved_topic_name(T_A)
    assert str(T_A) in name
    assert not name.replace(".", "").replace("_", "").replace("-", "").isalnum()


# -- cost -----------------------------------------------------------------------------------


def test_an_idle_incremental_fetch_over_10000_partitions_visits_none_of_them() -> None:
    cache, leader = new_cache()
    sid = create(leader, 10_000, now_ms=0, privileged=True)
    assert cache.metrics().partition_visits == 10_000  # the full fetch reads everything
    before = cache.metrics().partition_visits
    fetched = leader.fetch(incremental(sid, 1), now_ms=1)
    assert fetched.partitions == []
    assert cache.metrics().partition_visits - before == 0
    # One change costs one visit.
    leader.append(tp("t", 4321), 1)
    before = cache.metrics().partition_visits
    fetched = leader.fetch(incremental(sid, 2), now_ms=2)
    assert fetched.partitions == [tp("t", 4321)]
    assert cache.metrics().partition_visits - before == 1
    # The follower advances that partition; then idle again.
    leader.fetch(incremental(sid, 3, {tp("t", 4321): pf(1)}), now_ms=3)
    before = cache.metrics().partition_visits
    assert leader.fetch(incremental(sid, 4), now_ms=4).partitions == []
    assert cache.metrics().partition_visits - before == 0


# -- metrics --------------------------------------------------------------------------------


def test_metrics_count_sessions_cached_partitions_and_evictions() -> None:
    cache, leader = new_cache(slots=2)
    a = create(leader, 3, now_ms=0)
    create(leader, 4, now_ms=0, topic="u")
    metrics = cache.metrics()
    assert (
        metrics.num_incremental_fetch_sessions,
        metrics.num_incremental_fetch_partitions_cached,
    ) == (2, 7)
    leader.fetch(incremental(a, 1, {tp("x"): pf()}), now_ms=1)
    assert cache.metrics().num_incremental_fetch_partitions_cached == 8
    create(leader, 1, now_ms=2, privileged=True, topic="p")
    metrics = cache.metrics()
    assert metrics.num_incremental_fetch_sessions == 2
    assert metrics.incremental_fetch_session_evictions == 1
    assert metrics.num_incremental_fetch_partitions_cached in (5, 4)


def test_sessions_holding_names_the_sessions_a_change_marks() -> None:
    cache, leader = new_cache()
    a = create(leader, 2, now_ms=0)
    b = create(leader, 1, now_ms=0)
    c = create(leader, 1, now_ms=0, topic="u")
    assert sorted(cache.sessions_holding(tp("t", 0))) == sorted([a, b])
    assert cache.sessions_holding(tp("t", 1)) == [a]
    assert cache.sessions_holding(tp("u", 0)) == [c]
    leader.fetch(incremental(a, 1, forgotten=[tp("t", 1)]), now_ms=1)
    assert cache.sessions_holding(tp("t", 1)) == []
    assert cache.sessions_holding(tp("nowhere", 0)) == []


# -- property: the same answers as Kafka's scan of every partition ---------------------------


@dataclass
class ScanPartition:
    fetch: PartitionFetch
    hw: int
    lso: int


@dataclass
class KafkaScan:
    """Kafka's IncrementalFetchContext, as plainly as possible: read every partition of the
    session in session order on every fetch, filter, rotate."""

    leader: FakeLeader
    sessions: dict[int, dict[TopicPartition, ScanPartition]] = field(default_factory=dict)

    def created(
        self,
        session_id: int,
        request: SessionRequest,
        results: Mapping[TopicPartition, PartitionResult],
    ) -> None:
        self.sessions[session_id] = {
            key: ScanPartition(fetch, results[key].high_watermark, results[key].log_start_offset)
            for key, fetch in request.partitions.items()
        }

    def incremental(
        self, request: SessionRequest, max_bytes: int
    ) -> list[tuple[TopicPartition, int]] | None:
        held = self.sessions[request.session_id]
        for key, fetch in request.partitions.items():
            if key in held:
                held[key].fetch = fetch
            else:
                held[key] = ScanPartition(fetch, -1, -1)
        for forgotten in request.forgotten:
            held.pop(forgotten.partition, None)
        if not held:
            del self.sessions[request.session_id]
            return None
        budget = max_bytes
        answer = []
        for key in list(held):
            cached = held[key]
            result = self.leader.read(PartitionRead(key, cached.fetch), budget)
            budget -= result.records_size
            respond = result.has_news
            if cached.hw != result.high_watermark:
                respond, cached.hw = True, result.high_watermark
            if cached.lso != result.log_start_offset:
                respond, cached.lso = True, result.log_start_offset
            if result.error_code:
                cached.hw = -1
            if respond:
                answer.append((key, result.records_size))
                if result.records_size:
                    held[key] = held.pop(key)
        return answer


POOL = [tp(t, p) for t in ("a", "b") for p in range(4)]
log_event = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(POOL), st.integers(1, 30)),
    st.tuples(st.just("hw"), st.sampled_from(POOL)),
    st.tuples(st.just("lso"), st.sampled_from(POOL)),
    st.tuples(st.just("error"), st.sampled_from(POOL)),
    st.tuples(st.just("preferred"), st.sampled_from(POOL)),
    st.tuples(st.just("diverging"), st.sampled_from(POOL)),
)
want_event = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(POOL)),
    st.tuples(st.just("remove"), st.sampled_from(POOL)),
    st.tuples(st.just("max_bytes"), st.sampled_from(POOL), st.sampled_from([300, 1000, 1 << 20])),
)


def apply_log_event(leader: FakeLeader, event: tuple) -> None:  # type: ignore[type-arg]
    kind, key, *rest = event
    log = leader.log(key)
    if kind == "append":
        leader.append(key, rest[0], advance_hw=False)
    elif kind == "hw":
        leader.change(key, hw=log.end)
    elif kind == "lso":
        leader.change(key, lso=min(log.lso + 1, log.hw))
    elif kind == "error":
        leader.change(key, error=0 if log.error else ErrorCode.kafka_storage_error)
    elif kind == "preferred":
        leader.change(key, preferred=-1 if log.preferred >= 0 else 3)
    elif kind == "diverging":
        leader.change(key, diverging=not log.diverging)


def as_request(plan: FetchRequestPlan, *, privileged: bool = False) -> SessionRequest:
    """The request `plan` becomes on the wire, as the leader decodes it."""
    forgotten = (
        tuple(plan.forgotten_for_topic_ids())
        if plan.uses_topic_ids
        else tuple(TopicIdPartition(None, key) for key in plan.to_forget)
    )
    return SessionRequest(
        session_id=plan.session_id,
        epoch=plan.epoch,
        partitions=dict(plan.to_send),
        forgotten=forgotten,
        uses_topic_ids=plan.uses_topic_ids,
        privileged=privileged,
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rounds=st.lists(
        st.tuples(
            st.lists(log_event, max_size=4),
            st.lists(want_event, max_size=2),
            st.sampled_from([0, 250, 1000, 1 << 20]),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_skipping_unchanged_partitions_never_changes_a_response(rounds: list) -> None:  # type: ignore[type-arg]
    cache, leader = new_cache()
    scan = KafkaScan(leader)
    handler = FetchSessionHandler(node_id=1)
    offsets = {key: 0 for key in POOL}
    max_bytes_of = {key: 1 << 20 for key in POOL}
    members = [POOL[0], POOL[5]]
    for now, (log_events, want_events, response_bytes) in enumerate(rounds):
        for event in log_events:
            apply_log_event(leader, event)
        for kind, key, *rest in want_events:
            if kind == "add" and key not in members:
                members.append(key)
            elif kind == "remove" and key in members:
                members.remove(key)
            elif kind == "max_bytes":
                max_bytes_of[key] = rest[0]
        want = {key: pf(offsets[key], max_bytes=max_bytes_of[key]) for key in members}
        plan = handler.build_request(want)
        request = as_request(plan)
        context = cache.new_context(request, now_ms=now)
        results = leader.read_all(context, response_bytes)
        response = context.build_response(results, now_ms=now)
        if context.kind is ContextKind.INCREMENTAL:
            expected = scan.incremental(request, response_bytes)
            got = [(key, results[key].records_size) for key in response.partitions]
            assert got == expected
        elif context.kind is ContextKind.FULL and response.session_id:
            scan.created(response.session_id, request, results)
        verdict = handler.handle_response(
            plan,
            error_code=response.error_code,
            session_id=response.session_id,
            partitions=response.partitions,
            now_ms=now,
        )
        assert verdict.accepted
        for key in response.partitions:
            offsets[key] += results[key].records_size // RECORD_BYTES


# -- property: our client and our cache never disagree about a session -----------------------

TOPIC_IDS = {"a": [T_A, T_A2], "b": [T_B], "c": [None]}
E2E_POOL = [tp(t, p) for t in ("a", "b", "c") for p in range(3)]
e2e_step = st.tuples(
    st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.sampled_from(E2E_POOL)),
            st.tuples(st.just("remove"), st.integers(0, 8)),
            st.tuples(st.just("offset"), st.integers(0, 8)),
            st.tuples(st.just("topic_id"), st.integers(0, 8)),
        ),
        max_size=3,
    ),
    st.sampled_from(["ok", "ok", "ok", "lost_request", "lost_response", "flood", "close"]),
    st.integers(0, 2 * EVICT),  # time until this fetch
    st.lists(st.sampled_from(E2E_POOL), max_size=3),  # log changes
)


def e2e_mutate(want: dict[TopicPartition, PartitionFetch], op: tuple) -> None:  # type: ignore[type-arg]
    kind, arg = op
    if kind == "add":
        if arg not in want:
            want[arg] = pf(topic_id=TOPIC_IDS[arg.topic][0])
        return
    if not want:
        return
    key = list(want)[arg % len(want)]
    if kind == "remove":
        del want[key]
    elif kind == "offset":
        want[key] = replace(want[key], fetch_offset=want[key].fetch_offset + 1)
    elif kind == "topic_id":
        ids = TOPIC_IDS[key.topic]
        want[key] = replace(want[key], topic_id=ids[(ids.index(want[key].topic_id) + 1) % len(ids)])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(e2e_step, min_size=1, max_size=40), privileged=st.booleans())
def test_client_and_cache_never_disagree_about_a_session(steps: list, privileged: bool) -> None:  # type: ignore[type-arg]
    cache, leader = new_cache(slots=2, seed=1)
    handler = FetchSessionHandler(node_id=1)
    want: dict[TopicPartition, PartitionFetch] = {}
    now = 0
    flood = 0
    for ops, event, wait_ms, changes in steps:
        for op in ops:
            e2e_mutate(want, op)
        for key in changes:
            leader.append(key, 1)
        now += wait_ms
        if event == "flood":
            flood += 1
            create(leader, 1 + flood % 50, now_ms=now, topic=f"flood{flood}")
        if event == "close":
            plan = handler.close_request()
            if plan is not None:
                leader.fetch(as_request(plan, privileged=privileged), now_ms=now)
                assert plan.session_id not in cache.session_ids()
            continue
        held_before = handler.session_id in cache.session_ids()
        plan = handler.build_request(want)
        if event == "lost_request":
            handler.handle_send_error(now_ms=now)
            continue
        fetched = leader.fetch(as_request(plan, privileged=privileged), now_ms=now)
        if event == "lost_response":
            handler.handle_send_error(now_ms=now)
            continue
        error = fetched.response.error_code
        if not plan.is_full and held_before:
            # The session was there and the client is correct: no error of any kind.
            assert error == 0
        assert error in (0, ErrorCode.fetch_session_id_not_found)
        verdict = handler.handle_response(
            plan,
            error_code=error,
            session_id=fetched.session_id,
            partitions=fetched.partitions,
            now_ms=now,
        )
        assert verdict.accepted == (error == 0)
        if verdict.accepted and handler.is_sessionful:
            view = cache.session(handler.session_id)
            assert view is not None
            assert dict(view.partitions) == want == dict(handler.session_partitions)
            assert view.epoch == handler.epoch
