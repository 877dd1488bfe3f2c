"""The leader side of KIP-227 fetch sessions: Kafka's FetchSession, FetchSessionCache and
FetchManager in one sans-I/O module. The follower-side counterpart is `replicad.session.client`.

Interface (what `replicad serve` does per Fetch request):

1. Decode the request and resolve topic ids to names (a v13+ id the leader does not know
   gets `unresolved_topic_name(id)`, so it still has a stable key). Build a
   `SessionRequest`: (session_id, epoch), the partitions in request order as
   `PartitionFetch`, the forgotten partitions (with the topic id they were sent with,
   v13+), `uses_topic_ids` (request version >= 13) and `privileged` (replica_id >= 0
   AND an allowed follower -- the leader decides).
2. `context = cache.new_context(request, now_ms=...)`. `context.kind` says what it is;
   `context.error_code` is non-zero for a session error (70, 71, 106): answer it with
   that top-level error, session id 0 and no partitions (`build_response` says so).
3. `context.to_read()` gives the partitions to read, in order, each with the fetch
   offset / max bytes / epochs to use. Read them front to back under the response's
   `max_bytes` (KIP-74). For a full or sessionless request that is every partition of
   the request; for an incremental one it is only the partitions that may have
   something to say (see "cost"). If the leader waits (long-poll) and reads again,
   it calls `to_read()` again and reads what that returns.
4. `context.build_response(results, now_ms=...)` with one `PartitionResult` per partition
   read. It returns the top-level error code, the session id to put in the response,
   and which partitions to include, in order. Call it once.
5. Whenever anything a fetch of partition P would report changes -- records appended,
   high watermark, log start offset, truncation, deletion, leadership or leader epoch --
   the log layer calls `cache.partition_changed(P)`.

Rules (Kafka's, unless marked "beyond Kafka"):
- Full request (epoch 0 or -1) naming a session id removes that session first.
  Epoch -1: sessionless, nothing is created. Epoch 0: a session is created at response
  time from the request's partitions (order kept) and the results, if a slot is free
  or one can be evicted; otherwise session id 0 (a valid sessionless full response).
- Incremental request: unknown id -> FETCH_SESSION_ID_NOT_FOUND (70); epoch other than
  the session's -> INVALID_FETCH_SESSION_EPOCH (71); a request whose use of topic ids
  differs from the session's (the v13 boundary) -> FETCH_SESSION_TOPIC_ID_ERROR (106).
  Otherwise the request's partitions are added (at the end of the session order) or
  updated, then the forgotten ones removed; if none are left the session is removed
  and the answer is sessionless. Else the session is touched and its epoch advances.
  A partition sent with another topic id than the cached one is a recreated topic: it
  replaces the cached one (moved to the end, cached high watermark reset); a forget
  naming the old id does not remove the new one. A forget naming an id the leader no
  longer resolves to the cached name (the topic deleted or re-created) removes the
  partition cached with that id (Kafka keys a session's partitions by topic id). For the
  same reason a partition added with an id the session holds under another name (the
  name the id resolved to before, or an unresolved one) replaces that entry: one
  partition, under the name it resolves to now.
- Ids: random, positive, non-zero 31-bit, unique, from the injected `random.Random`.
- Evictability is refreshed whenever a session is touched (created or used): an
  unprivileged session is evictable by a privileged newcomer at once, and by anyone
  once older than `eviction_ms` since creation; a privileged session is evictable
  only by a privileged newcomer, once older than `eviction_ms`.
- Making room: if the least recently used session has been idle more than
  `eviction_ms`, evict it. Otherwise take the smallest evictable session by
  (privileged, partition count, id); the newcomer evicts it only if it is privileged
  and the other is not, or with equal privilege has strictly more partitions.
- An incremental response carries a partition only if it has records, or its high
  watermark, log start offset, error, preferred read replica or diverging epoch says
  something; after an error the cached high watermark becomes -1 so the partition is
  sent again once the error clears.
- Rotation: partitions that returned records move to the end of the session order,
  so the next response's byte budget goes to others first (KIP-74).
- Epoch race: if the session's epoch moved between `new_context` and
  `build_response` (a duplicate request), the response is INVALID_FETCH_SESSION_EPOCH.

Cost (beyond Kafka): Kafka reads every partition of a session on every fetch. Here an
incremental fetch reads only (a) partitions named in the request, (b) partitions
changed (`partition_changed`) since this session last read them, and (c) partitions
whose last read said something (records, error, diverging epoch, preferred replica) or
was cut short by the byte limits (`PartitionResult.more_data`). Any other partition
would read exactly as last time -- nothing new, same watermarks -- and be left out of
the response, so skipping it changes nothing but the CPU spent. An idle fetch costs
O(1); `partition_changed` costs O(sessions holding that partition).
"""

from __future__ import annotations

import abc
import enum
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from kio.schema.errors import ErrorCode
from sortedcontainers import SortedSet

from replicad.errors import LocalProtocolError
from replicad.session.metadata import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    MAX_SESSION_ID,
    PartitionFetch,
    TopicIdPartition,
    is_full_epoch,
    next_epoch,
)
from replicad.types import TopicPartition
from replicad.wire import NO_PREFERRED_READ_REPLICA, UNKNOWN_OFFSET

# Kafka's `max.incremental.fetch.session.cache.slots` default.
DEFAULT_MAX_SLOTS = 1000
# Kafka's minimum idle time / age before a session may be evicted.
DEFAULT_EVICTION_MS = 120_000
# Not a legal Kafka topic name character, so no real topic can collide.
_UNRESOLVED_PREFIX = "?"


def unresolved_topic_name(topic_id: uuid.UUID) -> str:
    """The name to key a partition by when a v13+ request names a topic id the leader lacks."""
    return f"{_UNRESOLVED_PREFIX}{topic_id}"


@dataclass(frozen=True, slots=True)
class SessionRequest:
    """The session-relevant part of one Fetch request, names resolved by the leader."""

    session_id: int
    epoch: int
    # Request order (KIP-74: it is the order partitions are filled in a full fetch).
    partitions: Mapping[TopicPartition, PartitionFetch]
    forgotten: Sequence[TopicIdPartition] = ()
    # Request version >= 13: topics are named by id.
    uses_topic_ids: bool = False
    # A follower the leader allows (replica_id >= 0 and permitted).
    privileged: bool = False


@dataclass(frozen=True, slots=True)
class PartitionRead:
    """One partition the leader must read for this response, with the fetch state to use."""

    partition: TopicPartition
    fetch: PartitionFetch


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """What reading one partition produced (the leader's per-partition response, in short)."""

    high_watermark: int
    log_start_offset: int
    records_size: int = 0
    error_code: int = ErrorCode.none
    preferred_read_replica: int = NO_PREFERRED_READ_REPLICA
    diverging_epoch: bool = False
    # The read stopped before the end of what this fetcher may read (response or
    # partition byte limit), so there is more to send next time even if nothing changes.
    more_data: bool = False

    @property
    def has_news(self) -> bool:
        """Included in an incremental response whatever the cached watermarks say."""
        return (
            self.records_size > 0
            or self.error_code != ErrorCode.none
            or self.preferred_read_replica != NO_PREFERRED_READ_REPLICA
            or self.diverging_epoch
        )


class ContextKind(enum.Enum):
    SESSION_ERROR = "session_error"
    SESSIONLESS = "sessionless"
    FULL = "full"
    INCREMENTAL = "incremental"


@dataclass(frozen=True, slots=True)
class SessionResponse:
    """The session part of a Fetch response: top-level error, session id, partitions in order."""

    error_code: int
    session_id: int
    partitions: Sequence[TopicPartition]


@dataclass(frozen=True, slots=True)
class CacheMetrics:
    # Kafka's NumIncrementalFetchSessions.
    num_incremental_fetch_sessions: int
    # Kafka's NumIncrementalFetchPartitionsCached (sizes as of each session's last touch).
    num_incremental_fetch_partitions_cached: int
    # Total evictions; the shell turns it into IncrementalFetchSessionEvictionsPerSec.
    incremental_fetch_session_evictions: int
    # Partition entries looked at while choosing what to read (the cost measure).
    partition_visits: int


@dataclass(frozen=True, slots=True)
class SessionView:
    """A read-only picture of one cached session (status, tests)."""

    session_id: int
    epoch: int
    privileged: bool
    uses_topic_ids: bool
    creation_ms: int
    last_used_ms: int
    # Session order (rotation applied).
    partitions: Mapping[TopicPartition, PartitionFetch]


@dataclass(eq=False, slots=True)
class _CachedPartition:
    fetch: PartitionFetch
    # Position in the session order; rotation gives a fresh, larger one.
    order: int
    high_watermark: int = UNKNOWN_OFFSET
    local_log_start_offset: int = UNKNOWN_OFFSET

    def must_respond(self, result: PartitionResult) -> bool:
        """Kafka's maybeUpdateResponseData: include it? Updates the cached watermarks."""
        respond = result.has_news
        if self.high_watermark != result.high_watermark:
            respond = True
            self.high_watermark = result.high_watermark
        if self.local_log_start_offset != result.log_start_offset:
            respond = True
            self.local_log_start_offset = result.log_start_offset
        if result.error_code != ErrorCode.none:
            self.high_watermark = UNKNOWN_OFFSET
        return respond


# Identity equality: sessions are kept in sets (watchers) and compared by object.
@dataclass(eq=False, slots=True)
class _Session:
    id: int
    privileged: bool
    uses_topic_ids: bool
    creation_ms: int
    last_used_ms: int
    epoch: int
    # Session order = insertion order of this dict = increasing `order`.
    partitions: dict[TopicPartition, _CachedPartition] = field(default_factory=dict)
    # Partitions changed since this session last read them, with the change seq.
    dirty: dict[TopicPartition, int] = field(default_factory=dict)
    # Partitions whose last read said something or was cut short: read them again.
    sticky: set[TopicPartition] = field(default_factory=set)
    next_order: int = 0
    # Partition count as of the last touch (-1: not in the cache's trees yet).
    cached_size: int = -1

    def append(self, tp: TopicPartition, cached: _CachedPartition) -> None:
        cached.order = self.next_order
        self.next_order += 1
        self.partitions.pop(tp, None)
        self.partitions[tp] = cached

    def lru_key(self) -> tuple[int, int]:
        return (self.last_used_ms, self.id)

    def evictable_key(self) -> tuple[bool, int, int]:
        return (self.privileged, self.cached_size, self.id)


class FetchSessionCache:
    """The leader's fetch sessions; see the module docstring for the interface and rules."""

    def __init__(
        self,
        *,
        rng: random.Random,
        max_slots: int = DEFAULT_MAX_SLOTS,
        eviction_ms: int = DEFAULT_EVICTION_MS,
    ) -> None:
        if max_slots < 0 or eviction_ms < 0:
            raise ValueError("max_slots and eviction_ms must be >= 0")
        self._rng = rng
        self._max_slots = max_slots
        self._eviction_ms = eviction_ms
        self._sessions: dict[int, _Session] = {}
        self._lru: SortedSet = SortedSet()
        self._evictable_by_all: SortedSet = SortedSet()
        self._evictable_by_privileged: SortedSet = SortedSet()
        self._num_partitions = 0
        self._evictions = 0
        self._visits = 0
        # Change sequence: the last change of every partition, and who holds it.
        self._seq = 0
        self._last_change: dict[TopicPartition, int] = {}
        self._watchers: dict[TopicPartition, set[_Session]] = {}

    # -- the log layer's side -------------------------------------------------

    def partition_changed(self, tp: TopicPartition) -> int:
        """Note that a fetch of `tp` may now say something new; returns the change seq."""
        self._seq += 1
        self._last_change[tp] = self._seq
        for session in self._watchers.get(tp, ()):
            session.dirty[tp] = self._seq
        return self._seq

    def sessions_holding(self, tp: TopicPartition) -> list[int]:
        """Ids of the sessions `partition_changed(tp)` marks: the leader wakes their waiting
        (long-polling) fetches. O(sessions holding `tp`)."""
        return [session.id for session in self._watchers.get(tp, ())]

    # -- requests -------------------------------------------------------------

    def new_context(self, request: SessionRequest, *, now_ms: int) -> FetchContext:
        if is_full_epoch(request.epoch):
            if request.session_id != INVALID_SESSION_ID:
                self._remove(request.session_id)
            if request.epoch == FINAL_EPOCH:
                return _SessionlessContext(self, request.partitions)
            return _FullContext(self, request)
        session = self._sessions.get(request.session_id)
        if session is None:
            return _SessionErrorContext(ErrorCode.fetch_session_id_not_found)
        if session.epoch != request.epoch:
            return _SessionErrorContext(ErrorCode.invalid_fetch_session_epoch)
        if session.uses_topic_ids != request.uses_topic_ids:
            return _SessionErrorContext(ErrorCode.fetch_session_topic_id_error)
        touched = self._update(session, request)
        if not session.partitions:
            self._remove(session.id)
            return _SessionlessContext(self, request.partitions)
        self._touch(session, now_ms)
        session.epoch = next_epoch(session.epoch)
        return _IncrementalContext(self, session, request.epoch, touched)

    # -- read-only state ------------------------------------------------------

    def metrics(self) -> CacheMetrics:
        return CacheMetrics(
            num_incremental_fetch_sessions=len(self._sessions),
            num_incremental_fetch_partitions_cached=self._num_partitions,
            incremental_fetch_session_evictions=self._evictions,
            partition_visits=self._visits,
        )

    def session(self, session_id: int) -> SessionView | None:
        session = self._sessions.get(session_id)
        if session is None:
            return None
        return SessionView(
            session_id=session.id,
            epoch=session.epoch,
            privileged=session.privileged,
            uses_topic_ids=session.uses_topic_ids,
            creation_ms=session.creation_ms,
            last_used_ms=session.last_used_ms,
            partitions=MappingProxyType({tp: c.fetch for tp, c in session.partitions.items()}),
        )

    def session_ids(self) -> list[int]:
        return list(self._sessions)

    # -- session contents -----------------------------------------------------

    def _update(self, session: _Session, request: SessionRequest) -> list[TopicPartition]:
        """Apply an incremental request: adds/updates, then forgets. Returns those it named."""
        by_id: dict[tuple[uuid.UUID, int], TopicPartition] | None = None
        for tp, fetch in request.partitions.items():
            cached = session.partitions.get(tp)
            if cached is None and fetch.topic_id is not None:
                # Kafka keys a session's partitions by topic id and partition: the same id
                # under another name (resolved when cached, unresolved now that its topic
                # was re-created, or the reverse) is the same partition, kept once under
                # the name it resolves to now (found by tools/sim, seed 38067: the session
                # held it twice and answered one partition more than the follower asked
                # for, past its response budget).
                if by_id is None:
                    by_id = _by_topic_id(session)
                old = by_id.get((fetch.topic_id, tp.partition))
                if old is not None:
                    cached = session.partitions[old]
                    self._drop_partition(session, old)
                    cached.fetch = fetch
                    session.append(tp, cached)
                    self._watch(session, tp)
                    by_id[(fetch.topic_id, tp.partition)] = tp
                    continue
            if cached is None:
                session.append(tp, _CachedPartition(fetch=fetch, order=0))
                self._watch(session, tp)
                if by_id is not None and fetch.topic_id is not None:
                    by_id[(fetch.topic_id, tp.partition)] = tp
            elif _replaced(cached.fetch.topic_id, fetch.topic_id):
                session.append(tp, _CachedPartition(fetch=fetch, order=0))
            else:
                cached.fetch = fetch
        for forgotten in request.forgotten:
            tp = forgotten.partition
            cached = session.partitions.get(tp)
            if cached is None and forgotten.topic_id is not None:
                # An id the leader no longer resolves to this name (its topic deleted or
                # re-created since): the partition cached with that id, as Kafka keys a
                # session's partitions by topic id and partition (found by tools/sim, seed
                # 490: the session kept answering a forgotten partition of a re-created
                # topic, past the follower's response budget).
                tp = _cached_with_id(session, forgotten.topic_id, tp.partition) or tp
                cached = session.partitions.get(tp)
            if cached is None or _replaced(forgotten.topic_id, cached.fetch.topic_id):
                continue
            self._drop_partition(session, tp)
        return list(request.partitions)

    def _drop_partition(self, session: _Session, tp: TopicPartition) -> None:
        del session.partitions[tp]
        session.dirty.pop(tp, None)
        session.sticky.discard(tp)
        watchers = self._watchers.get(tp)
        if watchers is not None:
            watchers.discard(session)
            if not watchers:
                del self._watchers[tp]

    def _watch(self, session: _Session, tp: TopicPartition) -> None:
        self._watchers.setdefault(tp, set()).add(session)

    def _create_session(
        self,
        request: SessionRequest,
        results: Mapping[TopicPartition, PartitionResult],
        read_seq: int,
        now_ms: int,
    ) -> int:
        """Kafka's maybeCreateSession: a session for a full request, or INVALID_SESSION_ID."""
        size = len(request.partitions)
        if len(self._sessions) >= self._max_slots and not self._try_evict(
            request.privileged, size, now_ms
        ):
            return INVALID_SESSION_ID
        session = _Session(
            id=self._new_session_id(),
            privileged=request.privileged,
            uses_topic_ids=request.uses_topic_ids,
            creation_ms=now_ms,
            last_used_ms=now_ms,
            epoch=next_epoch(INITIAL_EPOCH),
        )
        for tp, fetch in request.partitions.items():
            result = results[tp]
            cached = _CachedPartition(
                fetch=fetch,
                order=0,
                high_watermark=result.high_watermark,
                local_log_start_offset=result.log_start_offset,
            )
            if result.error_code != ErrorCode.none:
                cached.high_watermark = UNKNOWN_OFFSET
            session.append(tp, cached)
            self._watch(session, tp)
            if result.has_news or result.more_data:
                session.sticky.add(tp)
            changed_at = self._last_change.get(tp, 0)
            if changed_at > read_seq:
                session.dirty[tp] = changed_at
        self._sessions[session.id] = session
        self._touch(session, now_ms)
        return session.id

    def _new_session_id(self) -> int:
        while True:
            candidate = self._rng.randint(1, MAX_SESSION_ID)
            if candidate not in self._sessions:
                return candidate

    # -- eviction (Kafka's FetchSessionCacheShard) ---------------------------

    def _touch(self, session: _Session, now_ms: int) -> None:
        self._lru.discard(session.lru_key())
        session.last_used_ms = now_ms
        self._lru.add(session.lru_key())
        if session.cached_size != -1:
            self._evictable_by_all.discard(session.evictable_key())
            self._evictable_by_privileged.discard(session.evictable_key())
            self._num_partitions -= session.cached_size
        session.cached_size = len(session.partitions)
        old_enough = now_ms - session.creation_ms > self._eviction_ms
        if not session.privileged or old_enough:
            self._evictable_by_privileged.add(session.evictable_key())
        if old_enough:
            self._evictable_by_all.add(session.evictable_key())
        self._num_partitions += session.cached_size

    def _try_evict(self, privileged: bool, size: int, now_ms: int) -> bool:
        if not self._lru:
            return False
        last_used_ms, oldest_id = self._lru[0]
        if now_ms - last_used_ms > self._eviction_ms:
            self._evict(oldest_id)
            return True
        evictable = self._evictable_by_privileged if privileged else self._evictable_by_all
        if not evictable:
            return False
        candidate = evictable[0]
        # Id 0 sorts below every real id: equal (privilege, size) does not evict.
        if (privileged, size, 0) < candidate:
            return False
        self._evict(candidate[2])
        return True

    def _evict(self, session_id: int) -> None:
        self._remove(session_id)
        self._evictions += 1

    def _remove(self, session_id: int) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        self._lru.discard(session.lru_key())
        self._evictable_by_all.discard(session.evictable_key())
        self._evictable_by_privileged.discard(session.evictable_key())
        if session.cached_size != -1:
            self._num_partitions -= session.cached_size
        for tp in session.partitions:
            watchers = self._watchers.get(tp)
            if watchers is not None:
                watchers.discard(session)
                if not watchers:
                    del self._watchers[tp]

    def _count_visits(self, n: int) -> None:
        self._visits += n


def _cached_with_id(
    session: _Session, topic_id: uuid.UUID, partition: int
) -> TopicPartition | None:
    """The session's partition `partition` cached with `topic_id`, whatever its name (a scan:
    only for a forget whose id no longer resolves to the cached name, which is rare)."""
    for tp, cached in session.partitions.items():
        if tp.partition == partition and cached.fetch.topic_id == topic_id:
            return tp
    return None


def _by_topic_id(session: _Session) -> dict[tuple[uuid.UUID, int], TopicPartition]:
    """(topic id, partition) -> the name the session holds it under (built once per
    incremental request that adds a partition with a topic id)."""
    return {
        (cached.fetch.topic_id, tp.partition): tp
        for tp, cached in session.partitions.items()
        if cached.fetch.topic_id is not None
    }


def _replaced(old: uuid.UUID | None, new: uuid.UUID | None) -> bool:
    """Both topic ids known and different: the topic was deleted and created again."""
    return old is not None and new is not None and old != new


def _require_results(
    reads: Sequence[PartitionRead], results: Mapping[TopicPartition, PartitionResult]
) -> None:
    missing = [str(r.partition) for r in reads if r.partition not in results]
    if missing:
        raise LocalProtocolError(f"no read result for {', '.join(missing[:5])}")


class FetchContext(abc.ABC):
    """One Fetch request's view of the session cache (Kafka's FetchContext)."""

    kind: ContextKind
    error_code: int = ErrorCode.none

    def __init__(self) -> None:
        self._built = False

    @abc.abstractmethod
    def to_read(self) -> Sequence[PartitionRead]:
        """The partitions to read for this response, in order."""

    def build_response(
        self, results: Mapping[TopicPartition, PartitionResult], *, now_ms: int
    ) -> SessionResponse:
        """The response's session fields and partitions, given what reading produced."""
        if self._built:
            raise LocalProtocolError("build_response called twice for one fetch")
        # Every _build checks its inputs before it changes anything, so a refused call
        # leaves the context usable.
        response = self._build(results, now_ms)
        self._built = True
        return response

    @abc.abstractmethod
    def _build(
        self, results: Mapping[TopicPartition, PartitionResult], now_ms: int
    ) -> SessionResponse: ...


class _SessionErrorContext(FetchContext):
    kind = ContextKind.SESSION_ERROR

    def __init__(self, error_code: int) -> None:
        super().__init__()
        self.error_code = error_code

    def to_read(self) -> Sequence[PartitionRead]:
        return ()

    def _build(
        self, results: Mapping[TopicPartition, PartitionResult], now_ms: int
    ) -> SessionResponse:
        return SessionResponse(self.error_code, INVALID_SESSION_ID, ())


class _SessionlessContext(FetchContext):
    kind = ContextKind.SESSIONLESS

    def __init__(
        self, cache: FetchSessionCache, partitions: Mapping[TopicPartition, PartitionFetch]
    ) -> None:
        super().__init__()
        self._cache = cache
        self._reads = tuple(PartitionRead(tp, pf) for tp, pf in partitions.items())

    def to_read(self) -> Sequence[PartitionRead]:
        self._cache._count_visits(len(self._reads))
        return self._reads

    def _build(
        self, results: Mapping[TopicPartition, PartitionResult], now_ms: int
    ) -> SessionResponse:
        _require_results(self._reads, results)
        return SessionResponse(
            ErrorCode.none, INVALID_SESSION_ID, tuple(r.partition for r in self._reads)
        )


class _FullContext(FetchContext):
    kind = ContextKind.FULL

    def __init__(self, cache: FetchSessionCache, request: SessionRequest) -> None:
        super().__init__()
        self._cache = cache
        self._request = request
        self._reads = tuple(PartitionRead(tp, pf) for tp, pf in request.partitions.items())
        self._read_seq: int | None = None

    def to_read(self) -> Sequence[PartitionRead]:
        # Changes after this point reach the new session as dirty partitions.
        self._read_seq = self._cache._seq
        self._cache._count_visits(len(self._reads))
        return self._reads

    def _build(
        self, results: Mapping[TopicPartition, PartitionResult], now_ms: int
    ) -> SessionResponse:
        if self._read_seq is None:
            raise LocalProtocolError("build_response before to_read")
        _require_results(self._reads, results)
        session_id = self._cache._create_session(self._request, results, self._read_seq, now_ms)
        return SessionResponse(ErrorCode.none, session_id, tuple(r.partition for r in self._reads))


class _IncrementalContext(FetchContext):
    kind = ContextKind.INCREMENTAL

    def __init__(
        self,
        cache: FetchSessionCache,
        session: _Session,
        request_epoch: int,
        touched: list[TopicPartition],
    ) -> None:
        super().__init__()
        self._cache = cache
        self._session = session
        self._request_epoch = request_epoch
        self._touched = touched
        self._reads: tuple[PartitionRead, ...] | None = None
        self._dirty_seen: dict[TopicPartition, int] = {}

    def to_read(self) -> Sequence[PartitionRead]:
        session = self._session
        self._dirty_seen = dict(session.dirty)
        self._cache._count_visits(len(self._touched) + len(session.sticky) + len(self._dirty_seen))
        wanted = {*self._touched, *session.sticky, *self._dirty_seen}
        cached = session.partitions
        present = sorted((tp for tp in wanted if tp in cached), key=lambda tp: cached[tp].order)
        self._reads = tuple(PartitionRead(tp, cached[tp].fetch) for tp in present)
        return self._reads

    def _build(
        self, results: Mapping[TopicPartition, PartitionResult], now_ms: int
    ) -> SessionResponse:
        session = self._session
        if session.epoch != next_epoch(self._request_epoch):
            return SessionResponse(ErrorCode.invalid_fetch_session_epoch, session.id, ())
        if self._reads is None:
            raise LocalProtocolError("build_response before to_read")
        _require_results(self._reads, results)
        included: list[TopicPartition] = []
        for read in self._reads:
            tp = read.partition
            cached = session.partitions[tp]
            result = results[tp]
            if cached.must_respond(result):
                included.append(tp)
                if result.records_size > 0:
                    session.append(tp, cached)
            if result.has_news or result.more_data:
                session.sticky.add(tp)
            else:
                session.sticky.discard(tp)
        for tp, seq in self._dirty_seen.items():
            if session.dirty.get(tp) == seq:
                del session.dirty[tp]
        return SessionResponse(ErrorCode.none, session.id, tuple(included))
