"""One Fetch on the leader: a legacy request in the one shape (the others' are
tests/protocol/test_fetch_request.py's), who may read what,
sessions through the cache, and when an answer is due (the long-poll decision)."""

from __future__ import annotations

import random
import uuid

import pytest
from kio.schema.errors import ErrorCode

from replicad.leader.catalog import Catalog
from replicad.leader.fetch import FetchHandling, Role, legacy_fetch_request
from replicad.leader.legacy_codec import (
    LegacyFetchPartition,
    LegacyFetchRequest,
    LegacyFetchTopic,
)
from replicad.leader.reads import Isolation, TransactionTracker
from replicad.leader.settings import ServeSettings
from replicad.protocol.fetch_request import (
    FetchRequest,
    RequestedPartition,
    fetch_request,
    read_fetch_request,
)
from replicad.session.cache import ContextKind, FetchSessionCache
from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)
TOPIC_ID = uuid.UUID("11111111-2222-4333-8444-555555555555")
FOLLOWER = 7


def part(fetch_offset: int, partition_max_bytes: int, **fields: object) -> tuple:
    """A partition's fetch fields, named by the dict key `spec` is given."""
    return fetch_offset, partition_max_bytes, fields


def spec(
    *,
    replica_id: int = -1,
    session_id: int = 0,
    epoch: int = -1,
    partitions: dict | None = None,
    min_bytes: int = 1,
    max_wait_ms: int = 500,
    max_bytes: int = 1 << 20,
    isolation: int = 0,
) -> FetchRequest:
    if partitions is None:
        partitions = {
            T0: part(0, 1 << 20, topic_id=TOPIC_ID),
            T1: part(0, 1 << 20, topic_id=TOPIC_ID),
        }
    return FetchRequest(
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=isolation,
        session_id=session_id,
        session_epoch=epoch,
        partitions=tuple(
            RequestedPartition.of(tp, offset, max_bytes, **fields)  # type: ignore[arg-type]
            for tp, (offset, max_bytes, fields) in partitions.items()
        ),
        replica_id=replica_id,
    )


Versioned = tuple[int, FetchRequest]


def view(version: int = 12, **kwargs: object) -> Versioned:
    """A request as serve reads it off the wire, with its version."""
    request = spec(**kwargs)  # type: ignore[arg-type]
    return version, read_fetch_request(version, fetch_request(version, request))


@pytest.fixture
def served(logs, fill):
    fill(
        logs,
        T0,
        [producer_batch(0, [b"a" * 100]), producer_batch(1, [b"b" * 100])],
        topic_id=TOPIC_ID,
    )
    fill(logs, T1, [], topic_id=TOPIC_ID)
    catalog = Catalog(logs, rng=random.Random(0))
    cache = FetchSessionCache(rng=random.Random(0), max_slots=10)
    return catalog, cache


def handle(served, request: Versioned, **kwargs) -> FetchHandling:
    catalog, cache = served
    return FetchHandling(
        *request,
        cache=cache,
        catalog=catalog,
        transactions=TransactionTracker(),
        settings=kwargs.pop("settings", ServeSettings()),
        allowed_followers=frozenset({FOLLOWER}),
        now_ms=kwargs.pop("now_ms", 0),
    )


# -- requests of every version ------------------------------------------------------------


def test_a_legacy_request_reads_into_the_same_shape() -> None:
    legacy = LegacyFetchRequest(
        2, -1, 100, 5, 2**31 - 1, (LegacyFetchTopic("t", (LegacyFetchPartition(0, 3, 64),)),)
    )
    got = legacy_fetch_request(legacy)
    assert got.partitions == (RequestedPartition("t", None, 0, 3, 64),)
    assert (got.max_wait_ms, got.min_bytes, got.session_epoch) == (100, 5, -1)


# -- who reads what -------------------------------------------------------------------------


def test_consumers_read_to_the_high_watermark_followers_to_the_log_end(served) -> None:
    consumer = handle(served, view(replica_id=-1))
    follower = handle(served, view(replica_id=FOLLOWER))
    committed = handle(served, view(replica_id=-1, isolation=1))
    assert (consumer.role, consumer.limits.isolation) == (Role.CONSUMER, Isolation.HIGH_WATERMARK)
    assert (follower.role, follower.limits.isolation) == (Role.FOLLOWER, Isolation.LOG_END)
    assert committed.limits.isolation is Isolation.TXN_COMMITTED


def test_a_replica_id_that_is_not_an_allowed_follower_is_refused_without_a_session(served) -> None:
    _, cache = served
    with_epoch = {T0: part(0, 100, current_leader_epoch=0)}
    without = {T1: part(0, 100)}
    handling = handle(served, view(replica_id=3, epoch=0, partitions={**with_epoch, **without}))
    assert handling.role is Role.REFUSED_FOLLOWER
    last = handling.read(now_ms=0)
    assert last.complete
    outcome = handling.finish(last, now_ms=0)
    assert [(a.partition, a.error_code, a.records) for a in outcome.answers] == [
        (T0, ErrorCode.unknown_leader_epoch, None),
        (T1, ErrorCode.not_leader_or_follower, None),
    ]
    assert outcome.session_id == 0
    assert cache.metrics().num_incremental_fetch_sessions == 0


def test_an_allowed_follower_gets_a_privileged_session(served) -> None:
    _, cache = served
    handling = handle(served, view(replica_id=FOLLOWER, epoch=0))
    outcome = handling.finish(handling.read(now_ms=0), now_ms=0)
    session = cache.session(outcome.session_id)
    assert session is not None and session.privileged


def test_limits_are_capped_by_the_servers_fetch_max_bytes(served) -> None:
    handling = handle(
        served,
        view(max_bytes=1 << 30, min_bytes=1 << 29),
        settings=ServeSettings(fetch_max_bytes=1000),
    )
    assert (handling.limits.max_bytes, handling.min_bytes) == (1000, 1000)

    def legacy(version: int) -> Versioned:
        topic = LegacyFetchTopic("t", (LegacyFetchPartition(0, 0, 64),))
        request = LegacyFetchRequest(version, -1, 0, 1, 2**31 - 1, (topic,))
        return version, legacy_fetch_request(request)

    assert handle(served, legacy(2)).limits.hard_max_bytes_limit
    assert not handle(served, legacy(3)).limits.hard_max_bytes_limit


# -- sessions -------------------------------------------------------------------------------


def test_a_session_is_created_then_incremental_fetches_read_only_what_changed(served) -> None:
    _, cache = served
    first = handle(served, view(epoch=0))
    outcome = first.finish(first.read(now_ms=0), now_ms=0)
    assert outcome.session_id != 0
    assert [a.partition for a in outcome.answers] == [T0, T1]
    idle = handle(served, view(session_id=outcome.session_id, epoch=1, partitions={}))
    assert idle.context is not None and idle.context.kind is ContextKind.INCREMENTAL
    # T0 answered records: it is read again (the client has not moved); T1 is quiet.
    assert set(idle.read(now_ms=1).answers) == {T0}
    idle.finish(idle.read(now_ms=1), now_ms=1)
    cache.partition_changed(T1)
    changed = handle(
        served,
        view(
            session_id=outcome.session_id,
            epoch=2,
            partitions={T0: part(2, 1 << 20)},
        ),
    )
    assert set(changed.read(now_ms=2).answers) == {T0, T1}


def test_an_unknown_session_is_a_top_level_error(served) -> None:
    handling = handle(served, view(session_id=12345, epoch=3))
    last = handling.read(now_ms=0)
    assert last.complete
    outcome = handling.finish(last, now_ms=0)
    assert (outcome.error_code, outcome.session_id, outcome.answers) == (
        ErrorCode.fetch_session_id_not_found,
        0,
        (),
    )


def test_an_unknown_topic_id_is_answered_unknown_topic_id(served) -> None:
    stranger = uuid.UUID(int=99)
    handling = handle(
        served,
        view(13, partitions={TopicPartition("x", 0): part(0, 9, topic_id=stranger)}),
    )
    outcome = handling.finish(handling.read(now_ms=0), now_ms=0)
    [answer] = outcome.answers
    assert answer.error_code == ErrorCode.unknown_topic_id
    assert outcome.topic_ids[answer.partition] == stranger


def test_a_session_partition_of_a_re_created_topic_is_inconsistent_not_the_new_data(
    served, logs, fill
) -> None:
    """A v13 session caches t-0 and t-1 by name with the topic's id; the replica's topic is
    then re-created (the follower copies the source's new incarnation). Read by name, the
    cached partitions would answer the new topic's records for the old id: Kafka answers
    INCONSISTENT_TOPIC_ID, and so does serve (tools/sim found this in its leader model)."""
    catalog, cache = served
    first = handle(served, view(13, epoch=0))
    outcome = first.finish(first.read(now_ms=0), now_ms=0)
    assert outcome.session_id != 0
    renewed = uuid.UUID(int=7)
    for tp in (T0, T1):
        logs.remove(tp)
        catalog.note_changed(tp)  # as the log layer says each removal and creation
        fill(logs, tp, [producer_batch(0, [b"new" * 30])], topic_id=renewed)
        catalog.note_changed(tp)
        cache.partition_changed(tp)
    again = handle(served, view(13, session_id=outcome.session_id, epoch=1, partitions={}))
    later = again.finish(again.read(now_ms=5_000), now_ms=5_000)
    assert {a.partition: a.error_code for a in later.answers} == {
        T0: ErrorCode.inconsistent_topic_id,
        T1: ErrorCode.inconsistent_topic_id,
    }
    assert all(a.records_size == 0 for a in later.answers)


# -- when an answer is due ------------------------------------------------------------------


def test_an_answer_is_due_once_min_bytes_are_readable(served) -> None:
    assert handle(served, view(min_bytes=1)).read(now_ms=0).complete
    waiting = handle(served, view(min_bytes=1 << 20))
    last = waiting.read(now_ms=0)
    assert not last.complete and last.bytes_readable > 0
    assert handle(served, view(min_bytes=1 << 20, max_wait_ms=0)).read(now_ms=0).complete


def test_an_error_or_an_empty_request_is_answered_at_once(served) -> None:
    missing = {TopicPartition("nope", 0): part(0, 10)}
    assert handle(served, view(min_bytes=1 << 20, partitions=missing)).read(now_ms=0).complete
    assert handle(served, view(min_bytes=1 << 20, partitions={})).read(now_ms=0).complete


def test_an_idle_incremental_fetch_reads_nothing_and_waits(served) -> None:
    first = handle(served, view(epoch=0, partitions={T1: part(0, 100)}))
    session_id = first.finish(first.read(now_ms=0), now_ms=0).session_id
    idle = handle(served, view(session_id=session_id, epoch=1, partitions={}))
    last = idle.read(now_ms=1)
    assert (dict(last.answers), last.complete) == ({}, False)
    assert idle.session_id == session_id
