"""One Fetch request on the leader, any version, from the decoded request to the answer:
through the session cache (KIP-227), the log reads (KIP-74) and the long-poll decision.
The connection (server.py) does the waiting; this module decides.

Rules (Kafka's KafkaApis.handleFetchRequest / ReplicaManager.fetchMessages):
- Who asks: replica_id >= 0 (in the body up to v14, in replica_state from v15) claims to be
  a follower. A follower in `allowed_followers` gets a privileged session and reads up to
  the log end. Any other claimed follower is refused: every partition it names is answered
  UNKNOWN_LEADER_EPOCH if it names a leader epoch, else NOT_LEADER_OR_FOLLOWER -- Kafka's
  answer to a replica it does not recognise -- and the session cache is not touched.
  A connection whose principal may not follow at all (`follower_authorized` false, see
  leader/security.py) gets TOPIC_AUTHORIZATION_FAILED for every partition instead, Kafka's
  answer to a follower fetch without CLUSTER_ACTION; no session either.
  Consumers read up to the high watermark (READ_UNCOMMITTED) or the last stable offset
  (READ_COMMITTED, v4+).
- Limits: max_bytes = min(the request's, the server's fetch.max.bytes); min_bytes =
  min(the request's, max_bytes). Fetch v0-v2 have no max_bytes (no limit) and a hard
  partition limit (see reads.py).
- Sessions: v0-v6 are sessionless; v7+ go through the cache. v13+ name topics by id; an
  id the server does not know is kept under `unresolved_topic_name(id)` and answered
  UNKNOWN_TOPIC_ID. A partition named twice counts once, at its first place, with its last
  values.
- Long-poll: answer at once when max_wait <= 0, the request has no partitions, the bytes
  read reach min_bytes, a partition has an error or a diverging epoch, or the session
  lookup failed. Otherwise the connection waits (woken by a change to a partition the
  fetch reads, or to its session) and reads again; when max_wait has passed it answers
  with whatever the last read found. An incremental fetch of an idle session reads nothing
  and still waits: its session has partitions, they just have nothing new.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from replicad.leader.catalog import Catalog
from replicad.leader.legacy_codec import LegacyFetchRequest
from replicad.leader.reads import (
    Isolation,
    PartitionAnswer,
    PlannedReads,
    ReadLimits,
    TransactionTracker,
    plan_reads,
)
from replicad.leader.settings import ServeSettings
from replicad.protocol.fetch_request import (
    FETCH_SESSION_VERSION,
    FetchRequest,
    ForgottenPartition,
    RequestedPartition,
)
from replicad.session.cache import (
    ContextKind,
    FetchContext,
    FetchSessionCache,
    PartitionResult,
    SessionRequest,
    unresolved_topic_name,
)
from replicad.session.metadata import (
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    PartitionFetch,
    TopicIdPartition,
)
from replicad.types import TopicPartition
from replicad.wire import FETCH_TOPIC_ID_VERSION, READ_COMMITTED

# Fetch v3 added max_bytes (KIP-74, soft limits); v4 isolation (v7 sessions:
# FETCH_SESSION_VERSION).
SOFT_LIMITS_VERSION = 3
ISOLATION_VERSION = 4


class Role(enum.Enum):
    CONSUMER = "consumer"
    FOLLOWER = "follower"
    REFUSED_FOLLOWER = "refused-follower"
    UNAUTHORIZED_FOLLOWER = "unauthorized-follower"


# Fetches answered without the session cache.
_SESSIONLESS_ROLES = frozenset({Role.REFUSED_FOLLOWER, Role.UNAUTHORIZED_FOLLOWER})


def legacy_fetch_request(request: LegacyFetchRequest) -> FetchRequest:
    """A v0-v3 request decoded by legacy_codec.py, in the one shape."""
    return FetchRequest(
        replica_id=request.replica_id,
        max_wait_ms=request.max_wait_ms,
        min_bytes=request.min_bytes,
        max_bytes=request.max_bytes,
        isolation_level=0,
        session_id=INVALID_SESSION_ID,
        session_epoch=FINAL_EPOCH,
        partitions=tuple(
            RequestedPartition(
                topic=t.topic,
                topic_id=None,
                partition=p.partition,
                fetch_offset=p.fetch_offset,
                partition_max_bytes=p.partition_max_bytes,
            )
            for t in request.topics
            for p in t.partitions
        ),
    )


@dataclass(frozen=True, slots=True)
class FetchRound:
    """What one read of the fetch's partitions found."""

    answers: Mapping[TopicPartition, PartitionAnswer]
    bytes_readable: int
    # Answer now (see the module rules); otherwise the connection may wait and read again.
    complete: bool


@dataclass(frozen=True, slots=True)
class FetchOutcome:
    """The answer to send: top-level error, session id, partitions in response order."""

    error_code: int
    session_id: int
    answers: tuple[PartitionAnswer, ...]
    role: Role
    # How each answered partition was named in the request (topic id for v13+).
    topic_ids: Mapping[TopicPartition, uuid.UUID | None]


class FetchHandling:
    """One Fetch request: read (again, after a wait), then finish once."""

    def __init__(
        self,
        version: int,
        request: FetchRequest,
        *,
        cache: FetchSessionCache,
        catalog: Catalog,
        transactions: TransactionTracker,
        settings: ServeSettings,
        allowed_followers: frozenset[int],
        now_ms: int,
        follower_authorized: bool = True,
    ) -> None:
        self.version = version
        self.request = view = request
        self._catalog = catalog
        self._transactions = transactions
        max_bytes = min(view.max_bytes, settings.fetch_max_bytes)
        self.min_bytes = min(view.min_bytes, max_bytes)
        if view.replica_id < 0:
            self.role = Role.CONSUMER
        elif not follower_authorized:
            self.role = Role.UNAUTHORIZED_FOLLOWER
        elif view.replica_id in allowed_followers:
            self.role = Role.FOLLOWER
        else:
            self.role = Role.REFUSED_FOLLOWER
        if self.role is Role.FOLLOWER:
            isolation = Isolation.LOG_END
        elif version >= ISOLATION_VERSION and view.isolation_level == READ_COMMITTED:
            isolation = Isolation.TXN_COMMITTED
        else:
            isolation = Isolation.HIGH_WATERMARK
        self.limits = ReadLimits(max_bytes, isolation, version < SOFT_LIMITS_VERSION)
        self.partitions = self._resolve(view.partitions, now_ms)
        self.topic_ids = {tp: fetch.topic_id for tp, fetch in self.partitions.items()}
        self.context: FetchContext | None = None
        # The partitions the last read() read, with their fetch fields (an incremental
        # session's come from the session): what a remote read (remote_fetch.py) needs.
        self.last_reads: list[tuple[TopicPartition, PartitionFetch]] = []
        if self.role not in _SESSIONLESS_ROLES:
            self.context = cache.new_context(
                SessionRequest(
                    session_id=view.session_id if version >= FETCH_SESSION_VERSION else 0,
                    epoch=view.session_epoch if version >= FETCH_SESSION_VERSION else FINAL_EPOCH,
                    partitions=self.partitions,
                    forgotten=self._forgotten(view.forgotten, now_ms),
                    uses_topic_ids=version >= FETCH_TOPIC_ID_VERSION,
                    privileged=self.role is Role.FOLLOWER,
                ),
                now_ms=now_ms,
            )

    # -- what the connection waits on ------------------------------------------------------

    @property
    def session_id(self) -> int | None:
        """The session an incremental fetch reads (its changes wake the wait)."""
        if self.context is not None and self.context.kind is ContextKind.INCREMENTAL:
            return self.request.session_id
        return None

    # -- reading ---------------------------------------------------------------------------

    def read(self, *, now_ms: int) -> FetchRound:
        """One read of the fetch's partitions, both steps on the calling thread."""
        return self.round(self.plan_read(now_ms=now_ms).read_records())

    def plan_read(self, *, now_ms: int) -> PlannedReads:
        """A read's first step, on the thread that owns the session cache and the catalog
        (serve's loop); its records are read by `PlannedReads.read_records` on any thread,
        and `round` makes the result."""
        if self.context is None:
            refused = [
                PartitionAnswer(tp, fetch.fetch_offset, error_code=self._refusal(fetch))
                for tp, fetch in self.partitions.items()
            ]
            return PlannedReads(refused, [], self.limits)
        if self.context.kind is ContextKind.SESSION_ERROR:
            return PlannedReads([], [], self.limits)
        reads = [(r.partition, r.fetch) for r in self.context.to_read()]
        self.last_reads = reads
        for tp, fetch in reads:
            if fetch.topic_id is not None:
                self.topic_ids.setdefault(tp, fetch.topic_id)
        return plan_reads(
            self._catalog,
            reads,
            self.limits,
            self._transactions,
            now_ms=now_ms,
            refuse=lambda tp, fetch: _topic_id_error(self._catalog, tp, fetch, now_ms),
        )

    def round(self, answer_list: list[PartitionAnswer]) -> FetchRound:
        """What a read found, from its answers with their records (`plan_read`)."""
        answers = {a.partition: a for a in answer_list}
        if self.context is None or self.context.kind is ContextKind.SESSION_ERROR:
            return FetchRound(answers, 0, complete=True)
        readable = sum(a.records_size for a in answer_list)
        complete = (
            self.request.max_wait_ms <= 0
            or (self.context.kind is not ContextKind.INCREMENTAL and not self.partitions)
            or readable >= self.min_bytes
            or any(a.error_code != ErrorCode.none or a.diverging for a in answer_list)
        )
        return FetchRound(answers, readable, complete)

    def finish(self, last: FetchRound, *, now_ms: int) -> FetchOutcome:
        """The answer to send, from the last read; tells the session cache. Call once."""
        if self.context is None:
            return FetchOutcome(
                ErrorCode.none,
                INVALID_SESSION_ID,
                tuple(last.answers.values()),
                self.role,
                self.topic_ids,
            )
        results = {tp: _result(a) for tp, a in last.answers.items()}
        session = self.context.build_response(results, now_ms=now_ms)
        answers = tuple(last.answers[tp] for tp in session.partitions)
        return FetchOutcome(
            session.error_code, session.session_id, answers, self.role, self.topic_ids
        )

    def _refusal(self, fetch: PartitionFetch) -> int:
        if self.role is Role.UNAUTHORIZED_FOLLOWER:
            return ErrorCode.topic_authorization_failed
        return _refusal(fetch)

    # -- request names -> partitions -------------------------------------------------------

    def _resolve(
        self, requested: Iterable[RequestedPartition], now_ms: int
    ) -> dict[TopicPartition, PartitionFetch]:
        resolved: dict[TopicPartition, PartitionFetch] = {}
        for r in requested:
            tp = TopicPartition(self._topic_name(r.topic, r.topic_id, now_ms), r.partition)
            resolved[tp] = PartitionFetch(
                fetch_offset=r.fetch_offset,
                log_start_offset=r.log_start_offset,
                max_bytes=r.partition_max_bytes,
                current_leader_epoch=r.current_leader_epoch,
                last_fetched_epoch=r.last_fetched_epoch,
                topic_id=r.topic_id,
            )
        return resolved

    def _forgotten(
        self, forgotten: Sequence[ForgottenPartition], now_ms: int
    ) -> tuple[TopicIdPartition, ...]:
        return tuple(
            TopicIdPartition(
                f.topic_id,
                TopicPartition(self._topic_name(f.topic, f.topic_id, now_ms), f.partition),
            )
            for f in forgotten
        )

    def _topic_name(self, topic: str | None, topic_id: uuid.UUID | None, now_ms: int) -> str:
        if topic_id is None:
            return topic or ""
        name = self._catalog.topic_name(topic_id, now_ms=now_ms)
        return name if name is not None else unresolved_topic_name(topic_id)


def _refusal(fetch: PartitionFetch) -> int:
    """Kafka's answer to a fetch from a replica id it does not know (followerReplicaOrThrow)."""
    if fetch.current_leader_epoch >= 0:
        return ErrorCode.unknown_leader_epoch
    return ErrorCode.not_leader_or_follower


_UNRESOLVED_MARK = unresolved_topic_name(uuid.UUID(int=0))[:1]


def _topic_id_error(
    catalog: Catalog, tp: TopicPartition, fetch: PartitionFetch, now_ms: int
) -> int:
    """A v13+ partition's topic id against the replica's: unknown, or another incarnation
    of the topic of that name. A session's partition cached under its name before the
    topic was re-created is read by name: Kafka answers INCONSISTENT_TOPIC_ID where the
    log's id differs from the one the fetch names, never the new topic's records for the
    old id (found by tools/sim in its leader model, seed 78948; serve did the same)."""
    if fetch.topic_id is None:
        return ErrorCode.none
    # A name the leader made for an id it lacks; no topic's name starts so (Kafka's names
    # are [a-zA-Z0-9._-]), so nearly every partition is told apart without formatting the
    # uuid (3% of a 200-partition Fetch).
    if tp.topic[:1] == _UNRESOLVED_MARK and tp.topic == unresolved_topic_name(fetch.topic_id):
        return ErrorCode.unknown_topic_id
    current = catalog.topic_id(tp.topic, now_ms=now_ms)
    if current is not None and current != fetch.topic_id:
        return ErrorCode.inconsistent_topic_id
    return ErrorCode.none


def _result(answer: PartitionAnswer) -> PartitionResult:
    return PartitionResult(
        high_watermark=answer.high_watermark,
        log_start_offset=answer.log_start_offset,
        records_size=answer.records_size,
        error_code=answer.error_code,
        diverging_epoch=answer.diverging is not None,
        more_data=answer.more_data,
    )
