"""One fetch loop per leader broker: one fetch connection, one fetch session.

The loop is a thin asyncio shell around sans-I/O parts: the session handler
decides what each request holds and what a response means, `validate_fetched`
decides what may be written, and the log store writes it. Each turn:

1. reconcile partitions that need an offset (ListOffsets) or a truncation;
2. build the request from the fetchable partitions in rotation order;
3. send it, wait for the response (the leader long-polls up to max_wait);
4. hand the response to the session handler; a rejected response is dropped
   whole (its data will be fetched again);
5. validate each partition's batches (the fetch offsets move to the end of what
   is valid); partitions that returned data move to the back of the order
   (KIP-74), so none starves;
6. append the valid batches. When nothing waits for step 1, the next request is
   sent between steps 5 and 6 (pipelined): the leader prepares it while this
   response is written. A partition whose append then fails goes back to its log
   end, and its data in that next response is dropped unread (the response
   answers an offset the log does not end at); it is fetched again.

Nothing a peer sends raises out of this loop: bad frames, CRC mismatches and
protocol errors are counted, logged (rate-limited) and refetched with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from replicad.errors import (
    DiskFullError,
    KafkaConnectionError,
    LogError,
    ProtocolError,
    RemoteProtocolError,
    ResponseTooLargeError,
)
from replicad.follower.fetch_response import (
    FetchedPartition,
    FetchResponseView,
    scan_fetch_response,
)
from replicad.follower.partition_state import PartitionPhase, PartitionState
from replicad.follower.truncation import decide_truncation
from replicad.follower.validate import FetchedData, validate_fetched
from replicad.log.epoch import EpochEndOffset
from replicad.log.manager import LogManager
from replicad.protocol.apis import ApiKey
from replicad.protocol.backoff import Backoff
from replicad.protocol.client import KafkaClient
from replicad.protocol.connection import BrokerAddress, BrokerConnection
from replicad.protocol.error_codes import error_code_of, error_name
from replicad.protocol.requests import (
    EARLIEST_TIMESTAMP,
    FETCH_SESSION_VERSION,
    FETCH_TOPIC_ID_VERSION,
    LATEST_TIMESTAMP,
    FetchPartitionSpec,
    FetchSpec,
    OffsetQuery,
    fetch_request,
    list_offsets_request,
    offset_for_leader_epoch_request,
)
from replicad.ratelimit import RateLimitedLog
from replicad.records.batch import MAGIC_V2
from replicad.session.client import FetchRequestPlan, FetchSessionHandler, PartitionFetch
from replicad.types import TopicPartition

log = structlog.get_logger("replicad.fetcher")

# Fetch v12 added LastFetchedEpoch and DivergingEpoch.
FETCH_LAST_FETCHED_EPOCH_VERSION = 12

# Errors after which the partition's leadership must be looked up again.
_METADATA_ERRORS = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.leader_not_available,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
        ErrorCode.kafka_storage_error,
        ErrorCode.unknown_topic_id,
        ErrorCode.inconsistent_topic_id,
        ErrorCode.offline_replica if hasattr(ErrorCode, "offline_replica") else ErrorCode.none,
    }
) - {ErrorCode.none}


# KIP-74's max_bytes counts record bytes only; a response also carries, per topic and per
# partition, fields it does not count. Upper bounds of those fields over the versions we
# speak (v4..v17; the flexible ones add tagged DivergingEpoch, CurrentLeader and
# SnapshotId), so a whole response -- not just its records -- fits the memory pool.
RESPONSE_OVERHEAD_BYTES = 64
PARTITION_OVERHEAD_BYTES = 96
TOPIC_OVERHEAD_BYTES = 16 + 2 + 249 + 8  # id or name (at most 249 characters), counts, tags


def response_budget(
    response_max_bytes: int, buffer_memory: int, *, partitions: int, topics: int
) -> int:
    """The max_bytes to ask for: fetch.response_max_bytes, lowered when the fields around
    the records of this many partitions and topics would push a whole response past
    fetch.buffer_memory (a response that cannot be reserved is never read: the fetch would
    stall). At least 1: the leader still returns one whole batch (KIP-74)."""
    overhead = (
        RESPONSE_OVERHEAD_BYTES
        + partitions * PARTITION_OVERHEAD_BYTES
        + topics * TOPIC_OVERHEAD_BYTES
    )
    return max(1, min(response_max_bytes, buffer_memory - overhead))


@dataclass(frozen=True, slots=True)
class FetchSettings:
    response_max_bytes: int = 10 * 1024 * 1024
    partition_max_bytes: int = 1024 * 1024
    wait_max_ms: int = 500
    min_bytes: int = 1
    backoff_ms: int = 1000
    sessions: bool = True
    replica_id: int = -1
    isolation_level: int = 0
    rack_id: str = ""
    start_from: str = "earliest"  # or "latest"
    on_gap: str = "reset"  # or "halt"
    request_timeout_ms: int = 30_000
    reconnect_backoff_ms: int = 100
    reconnect_backoff_max_ms: int = 10_000
    buffer_memory: int = 100 * 1024 * 1024  # KIP-81 pool, shared by all fetchers


@dataclass(slots=True)
class FetcherStats:
    """What a fetcher has done, for `replicad status` and metrics."""

    requests: int = 0
    responses: int = 0
    bytes_fetched: int = 0
    bytes_appended: int = 0
    batches_appended: int = 0
    crc_failures: int = 0
    partial_batches_dropped: int = 0
    connection_errors: int = 0
    rejected_responses: int = 0
    truncations: int = 0
    loop_errors: int = 0
    # Fetch frames as written to and read from the socket (size prefix included).
    last_request_bytes: int = 0
    last_response_bytes: int = 0
    request_bytes_total: int = 0
    response_bytes_total: int = 0
    last_latency_ms: float = 0.0
    last_error: str | None = None
    # Since when (monotonic ms) the connection to this leader keeps failing; None while
    # responses come back.
    failing_since_ms: int | None = None
    partition_errors: Counter[str] = field(default_factory=Counter)
    session_recoveries: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class _PendingWrite:
    """A partition's validated batches, to append (step 6)."""

    state: PartitionState
    fetched: FetchedData


@dataclass(frozen=True, slots=True)
class _ResponseOutcome:
    accepted: bool
    writes: tuple[_PendingWrite, ...] = ()


@dataclass(frozen=True, slots=True)
class _OffsetsAnswer:
    """A ListOffsets answer: the offsets found, and the partitions that got an error."""

    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    errors: dict[TopicPartition, ErrorCode] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _InFlight:
    """A Fetch request on the wire."""

    conn: BrokerConnection
    plan: FetchRequestPlan
    version: int
    response: asyncio.Future[Any]
    started: float
    sent_before: int
    received_before: int


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class LeaderFetcher:
    def __init__(
        self,
        address: BrokerAddress,
        *,
        client: KafkaClient,
        logs: LogManager,
        settings: FetchSettings,
        topic_ids: Callable[[], dict[str, Any]],
        request_metadata: Callable[[str], None],
        reserve: Any = None,
        on_partition_changed: Callable[[TopicPartition], None] | None = None,
    ) -> None:
        self.address = address
        self.client = client
        self.logs = logs
        self.settings = settings
        self._topic_ids = topic_ids
        self._request_metadata = request_metadata
        self._reserve = reserve
        # Told after every append, truncation or high-watermark move (replicad serve
        # wakes its long-polls and its session cache from it).
        self._changed = on_partition_changed or (lambda tp: None)
        self.partitions: OrderedDict[TopicPartition, PartitionState] = OrderedDict()
        # Partitions per topic, for the bound on a response's size (response_max_bytes).
        self._topic_members: dict[str, int] = {}
        self.session = FetchSessionHandler(address.node_id, sessions_enabled=settings.sessions)
        # The last build's partitions, and what changed since the one before (see _wanted).
        self._last_wanted: dict[TopicPartition, PartitionFetch] = {}
        self._wanted_changes: list[TopicPartition] = []
        # The next request, sent before the last response's data was written (step 6).
        self._in_flight: _InFlight | None = None
        self.stats = FetcherStats()
        self._conn: BrokerConnection | None = None
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._backoff = Backoff(settings.reconnect_backoff_ms, settings.reconnect_backoff_max_ms)
        self._say = RateLimitedLog(interval_ms=60_000)

    # -- membership, called by the replicator --------------------------------

    def add(self, state: PartitionState) -> None:
        if state.tp not in self.partitions:
            topic = state.tp.topic
            self._topic_members[topic] = self._topic_members.get(topic, 0) + 1
        self.partitions[state.tp] = state
        self._wakeup.set()

    def remove(self, tp: TopicPartition) -> PartitionState | None:
        state = self.partitions.pop(tp, None)
        if state is not None:
            left = self._topic_members[tp.topic] - 1
            if left:
                self._topic_members[tp.topic] = left
            else:
                del self._topic_members[tp.topic]
        self._wakeup.set()
        return state

    def response_max_bytes(self) -> int:
        """This leader's max_bytes: see response_budget (every partition it leads may be in
        one response)."""
        return response_budget(
            self.settings.response_max_bytes,
            self.settings.buffer_memory,
            partitions=len(self.partitions),
            topics=len(self._topic_members),
        )

    def stop(self) -> None:
        self._stopping = True
        self._wakeup.set()

    # -- the loop -----------------------------------------------------------

    async def run(self) -> None:
        try:
            while not self._stopping:
                try:
                    await self._turn()
                except (KafkaConnectionError, ProtocolError) as exc:
                    await self._connection_failed(exc)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # A bug or an unforeseen local failure must not silently end
                    # replication from this leader: say it loudly, back off, go on.
                    self.stats.loop_errors += 1
                    self.stats.last_error = f"{type(exc).__name__}: {exc}"
                    log.exception("fetch loop failed; retrying", leader=str(self.address))
                    await self._sleep(self._backoff.next_delay_ms())
        finally:
            await self._close_session()

    async def _turn(self) -> None:
        conn = await self._connection()
        flight, self._in_flight = self._in_flight, None
        if flight is not None and flight.conn is not conn:
            self._abandon(flight)
            flight = None
        if flight is None:
            await self._reconcile(conn)
            now = monotonic_ms()
            flight = self._send(conn, now)
            if flight is None:
                await self._idle(now)
                return
        try:
            held = await flight.response
        except (KafkaConnectionError, RemoteProtocolError) as exc:
            verdict = self.session.handle_send_error(now_ms=monotonic_ms())
            self._note_recovery(verdict)
            raise exc
        self.stats.responses += 1
        self.stats.failing_since_ms = None
        self.stats.last_latency_ms = (time.perf_counter() - flight.started) * 1000
        # Only fetches travel on this connection, one response at a time: the deltas are
        # this response's frame and the request(s) written since the last one.
        self.stats.last_request_bytes = conn.bytes_sent - flight.sent_before
        self.stats.last_response_bytes = conn.bytes_received - flight.received_before
        self.stats.request_bytes_total += self.stats.last_request_bytes
        self.stats.response_bytes_total += self.stats.last_response_bytes
        try:
            outcome = self._handle_response(flight.plan, flight.version, held.body)
            if outcome.writes and self._may_pipeline(outcome):
                self._in_flight = self._send(conn, monotonic_ms())
            for write in outcome.writes:
                self._write(write)
        finally:
            # The response's bytes are on disk (or dropped): its memory goes back.
            held.release()
            del held
        if outcome.accepted:
            self._backoff.reset()
        else:
            # A leader that keeps refusing must not be hammered: back off, growing.
            await self._sleep(self._backoff.next_delay_ms())

    def _send(self, conn: BrokerConnection, now_ms: int) -> _InFlight | None:
        """Build the next request and write it to the socket; None if nothing is wanted."""
        wanted = self._wanted(now_ms)
        if not wanted:
            return None
        plan = self.session.build_request(wanted, changed=self._wanted_changes)
        version = conn.versions.require(ApiKey.FETCH) if conn.versions else 4
        version = self._usable_fetch_version(version, plan)
        request = fetch_request(version, self._spec(plan, version))
        started = time.perf_counter()
        sent_before, received_before = conn.bytes_sent, conn.bytes_received
        self.stats.requests += 1
        response = conn.send(
            request,
            timeout_s=(self.settings.request_timeout_ms + self.settings.wait_max_ms) / 1000,
            hold=True,
            # Records stay views of the response's buffer until they are written.
            decode=functools.partial(scan_fetch_response, version=version),
        )
        return _InFlight(conn, plan, version, response, started, sent_before, received_before)

    def _may_pipeline(self, outcome: _ResponseOutcome) -> bool:
        """Whether the next request may go out before this response is written: only
        when no partition waits for step 1 (those steps truncate logs) and no write
        restarts a log."""
        if self._stopping or not outcome.accepted:
            return False
        if any(w.fetched.restart_at is not None for w in outcome.writes):
            return False
        now = monotonic_ms()
        return not any(
            s.epoch_check_pending
            or (
                s.phase in (PartitionPhase.NEEDS_OFFSET, PartitionPhase.TRUNCATING)
                and now >= s.delayed_until_ms
            )
            for s in self.partitions.values()
        )

    def _abandon(self, flight: _InFlight) -> None:
        """Give up a request (its connection is gone, or we stop): nothing stays held,
        and a failure it ended with is not left unretrieved."""
        response = flight.response
        if not response.done():
            response.cancel()  # a held response arriving later is released (connection.send)
        elif not response.cancelled() and response.exception() is None:
            response.result().release()

    def _usable_fetch_version(self, version: int, plan: FetchRequestPlan) -> int:
        if version >= FETCH_TOPIC_ID_VERSION and not plan.uses_topic_ids:
            # Some partition has no topic id (old broker, Metadata < v10): use names.
            version = FETCH_TOPIC_ID_VERSION - 1
        if version < FETCH_SESSION_VERSION and self.session.sessions_enabled:
            self.session = FetchSessionHandler(self.address.node_id, sessions_enabled=False)
        return version

    def _log(self, state: PartitionState) -> Any:
        if state.log is None:
            state.log = self.logs.get_or_create(state.tp, topic_id=state.topic_id)
        return state.log

    def _wanted(self, now_ms: int) -> dict[TopicPartition, PartitionFetch]:
        """The fetchable partitions in rotation order. Per partition this is a few
        attribute reads: the PartitionFetch object is rebuilt only when one of its
        inputs changed, and the session handler skips unchanged objects by identity."""
        wanted: dict[TopicPartition, PartitionFetch] = {}
        # What differs from the previous build, for the session handler (O(changes)).
        changed: list[TopicPartition] = []
        last = self._last_wanted
        kept = 0
        max_bytes = self.settings.partition_max_bytes
        for tp, state in self.partitions.items():
            if state.phase is PartitionPhase.PAUSED_DISK_FULL and now_ms >= state.delayed_until_ms:
                state.phase = PartitionPhase.FETCHING  # try again: space may be back
            if not state.fetchable(now_ms):
                continue
            plog = self._log(state)
            latest = plog.latest_epoch()
            if state.fetched_epoch is not None and (latest is None or state.fetched_epoch > latest):
                # Validated, not yet appended (step 6): the epoch of what was fetched.
                latest = state.fetched_epoch
            key = (
                state.fetch_offset,
                plog.log_start_offset,
                state.leader_epoch,
                latest,
                state.topic_id,
            )
            if key != state.want_key:
                state.want_key = key
                state.want = PartitionFetch(
                    fetch_offset=state.fetch_offset,
                    log_start_offset=plog.log_start_offset,
                    max_bytes=max_bytes,
                    current_leader_epoch=state.leader_epoch,
                    last_fetched_epoch=-1 if latest is None else latest,
                    topic_id=state.topic_id,
                )
            want = state.want
            wanted[tp] = want
            previous = last.get(tp)
            if previous is None:
                changed.append(tp)
            else:
                kept += 1
                if previous is not want:
                    changed.append(tp)
        if kept != len(last):
            changed.extend(tp for tp in last if tp not in wanted)
        self._last_wanted = wanted
        self._wanted_changes = changed
        return wanted

    def _spec(self, plan: FetchRequestPlan, version: int) -> FetchSpec:
        use_epochs = version >= FETCH_LAST_FETCHED_EPOCH_VERSION
        return FetchSpec(
            max_wait_ms=self.settings.wait_max_ms,
            min_bytes=self.settings.min_bytes,
            max_bytes=self.response_max_bytes(),
            isolation_level=self.settings.isolation_level,
            session_id=plan.session_id,
            session_epoch=plan.epoch,
            partitions={
                tp: FetchPartitionSpec(
                    fetch_offset=pf.fetch_offset,
                    log_start_offset=pf.log_start_offset,
                    max_bytes=pf.max_bytes,
                    current_leader_epoch=pf.current_leader_epoch,
                    last_fetched_epoch=pf.last_fetched_epoch if use_epochs else -1,
                    topic_id=pf.topic_id,
                )
                for tp, pf in plan.to_send.items()
            },
            forgotten=list(plan.to_forget),
            forgotten_ids=[
                (f.topic_id, f.partition.partition)
                for f in plan.forgotten_for_topic_ids()
                if f.topic_id is not None
            ],
            replica_id=self.settings.replica_id,
            rack_id=self.settings.rack_id,
        )

    def _handle_response(
        self, plan: FetchRequestPlan, version: int, body: FetchResponseView
    ) -> _ResponseOutcome:
        """Judge a response and validate its data (steps 4-5); what to append. Not
        accepted: the session handler rejected it, its data is dropped."""
        names = plan.topic_names
        by_id = version >= FETCH_TOPIC_ID_VERSION
        entries: list[tuple[TopicPartition, FetchedPartition]] = []
        seen_ids: list[Any] = []
        for topic in body.responses:
            if by_id:
                seen_ids.append(topic.topic_id)
                name = names.get(topic.topic_id)
            else:
                name = topic.topic
            if name is None:
                continue  # an id the plan does not know: the session handler rejects it
            for pd in topic.partitions:
                entries.append((TopicPartition(name, int(pd.partition_index)), pd))
        now = monotonic_ms()
        verdict = self.session.handle_response(
            plan,
            error_code=body.error_code,
            session_id=body.session_id,
            partitions=[tp for tp, _ in entries],
            now_ms=now,
            throttle_time_ms=body.throttle_time_ms,
            topic_ids=seen_ids,
        )
        if not verdict.accepted:
            self.stats.rejected_responses += 1
            self._note_recovery(verdict)
            if body.error_code != ErrorCode.none:
                self.stats.last_error = error_name(body.error_code)
            return _ResponseOutcome(False)
        self._note_recovery(verdict)
        writes: list[_PendingWrite] = []
        session = plan.session_partitions
        for tp, pd in entries:
            state = self.partitions.get(tp)
            asked = session.get(tp)
            if state is None or asked is None:
                continue  # moved to another leader or dropped while the request was out
            self.stats.bytes_fetched += len(pd.records or b"")
            if asked.fetch_offset != state.fetch_offset:
                # Asked before an append failed (step 6): not for where the log ends.
                continue
            write = self._process_partition(state, pd, now)
            if write is not None:
                writes.append(write)
        for write in writes:
            self.partitions.move_to_end(write.state.tp)
        return _ResponseOutcome(True, tuple(writes))

    def _process_partition(
        self, state: PartitionState, pd: FetchedPartition, now_ms: int
    ) -> _PendingWrite | None:
        """Apply one partition's answer; the batches to append if it returned any."""
        error = error_code_of(pd.error_code)
        tp = state.tp
        if error is ErrorCode.none:
            diverging = pd.diverging_epoch
            if diverging.epoch >= 0 and diverging.end_offset >= 0:
                self._truncate_on_divergence(state, diverging.epoch, diverging.end_offset)
                return None
            state.high_watermark = pd.high_watermark
            state.last_stable_offset = pd.last_stable_offset
            state.leader_log_start_offset = pd.log_start_offset
            write = self._validate(state, pd.records, now_ms)
            if write is None and self._move_high_watermark(state):
                self._changed(tp)
            return write
        self.stats.partition_errors[error.name] += 1
        if error is ErrorCode.offset_out_of_range:
            state.phase = PartitionPhase.TRUNCATING
            self._say_once(
                f"oor:{tp}",
                "offset out of range, reconciling",
                tp=str(tp),
                fetch_offset=state.fetch_offset,
            )
        elif error in _METADATA_ERRORS:
            state.delay(now_ms, self.settings.backoff_ms, error.name)
            self._request_metadata(f"{tp}: {error.name}")
        else:
            state.delay(now_ms, self.settings.backoff_ms, error.name)
            self._say_once(
                f"err:{tp}:{error.name}",
                "partition error, backing off",
                tp=str(tp),
                error=error.name,
            )
        return None

    def _move_high_watermark(self, state: PartitionState) -> bool:
        """What we serve onward: replicated here and committed upstream. Moved in memory
        now, written to replication-offset-checkpoint at the next checkpoint."""
        plog = self._log(state)
        hw = min(max(state.high_watermark, plog.log_start_offset), plog.log_end_offset)
        if hw > plog.high_watermark:
            plog.high_watermark = hw
            return True
        return False

    def _validate(
        self, state: PartitionState, records: memoryview | None, now_ms: int
    ) -> _PendingWrite | None:
        """Step 5: what of the records may be written; the fetch offset moves past it."""
        tp = state.tp
        plog = self._log(state)
        fetched = validate_fetched(
            records,
            fetch_offset=state.fetch_offset,
            log_is_empty=plog.log_end_offset == plog.log_start_offset,
        )
        if fetched.partial_dropped:
            self.stats.partial_batches_dropped += 1
        if fetched.corrupt is not None:
            state.corrupt_count += 1
            self.stats.crc_failures += 1
            state.delay(now_ms, self.settings.backoff_ms, f"corrupt data: {fetched.corrupt}")
            # Logged every time with where it was: corruption must never be silent.
            log.warning(
                "corrupt batch from leader, not written; refetching",
                tp=str(tp),
                offset=fetched.next_fetch_offset,
                leader=str(self.address),
                reason=fetched.corrupt,
            )
        if not fetched.batches:
            return None
        state.fetch_offset = fetched.next_fetch_offset
        epochs = [b.partition_leader_epoch for b in fetched.batches if b.magic >= MAGIC_V2]
        state.fetched_epoch = max(epochs) if epochs else None
        return _PendingWrite(state, fetched)

    def _write(self, write: _PendingWrite) -> None:
        """Step 6: append validated batches. A failure puts the fetch offset back at the
        log end (the next response's data for the partition is then dropped unread)."""
        state, fetched = write.state, write.fetched
        tp = state.tp
        plog = self._log(state)
        now_ms = monotonic_ms()
        state.fetched_epoch = None
        try:
            if fetched.restart_at is not None:
                plog.truncate_fully_and_start_at(fetched.restart_at)
            plog.append(fetched.data, fetched.batches, now_ms=wall_ms())
        except DiskFullError as exc:
            state.fetch_offset = plog.log_end_offset
            state.phase = PartitionPhase.PAUSED_DISK_FULL
            state.delay(now_ms, max(self.settings.backoff_ms, 5_000), "disk full")
            self._say_once(
                f"enospc:{tp}", "disk full, partition paused", tp=str(tp), error=str(exc)
            )
            return
        except LogError as exc:
            state.fetch_offset = plog.log_end_offset
            state.delay(now_ms, self.settings.backoff_ms, f"log error: {exc}")
            self._say_once(f"logerr:{tp}", "append failed", tp=str(tp), error=str(exc))
            return
        state.fetch_offset = plog.log_end_offset
        state.progress_ms = now_ms
        state.bytes_replicated += len(fetched.data)
        state.records_replicated += sum(b.record_count for b in fetched.batches)
        self.stats.bytes_appended += len(fetched.data)
        self.stats.batches_appended += len(fetched.batches)
        if fetched.corrupt is None:
            state.succeeded()
        self._move_high_watermark(state)
        self._changed(tp)

    def _truncate_on_divergence(self, state: PartitionState, epoch: int, end_offset: int) -> None:
        self._truncate(state, EpochEndOffset(epoch, end_offset), "diverging epoch")
        self.stats.partition_errors["diverging_epoch"] += 1

    def _truncate(self, state: PartitionState, leader: EpochEndOffset, why: str) -> bool:
        """Truncate where the leader's epoch end says; True when no further question is needed."""
        plog = self._log(state)
        decision = decide_truncation(
            leader,
            local_end_for=plog.end_offset_for_epoch,
            log_end_offset=plog.log_end_offset,
            high_watermark=plog.high_watermark,
        )
        if decision.offset < plog.log_end_offset:
            log.info(
                "log diverged from leader, truncating",
                tp=str(state.tp),
                why=why,
                leader_epoch=leader.epoch,
                leader_end_offset=leader.end_offset,
                local_end=plog.log_end_offset,
                truncate_to=decision.offset,
                rule=decision.rule,
            )
            plog.truncate_to(decision.offset)
            self.stats.truncations += 1
            self._changed(state.tp)
        state.fetch_offset = plog.log_end_offset
        return decision.complete

    # -- offsets: where to start, and out-of-range ----------------------------

    async def _reconcile(self, conn: BrokerConnection) -> None:
        await self._check_epochs(conn)
        todo = [
            s
            for s in self.partitions.values()
            if s.phase in (PartitionPhase.NEEDS_OFFSET, PartitionPhase.TRUNCATING)
            and monotonic_ms() >= s.delayed_until_ms
        ]
        if not todo:
            return
        control = await self.client.connection(self.address.node_id)
        latest = await self._list_offsets(control, todo, LATEST_TIMESTAMP)
        earliest = await self._list_offsets(control, todo, EARLIEST_TIMESTAMP)
        now = monotonic_ms()
        for state in todo:
            if state.tp not in self.partitions:
                continue
            lo, hi = earliest.offsets.get(state.tp), latest.offsets.get(state.tp)
            if lo is None or hi is None:
                # This partition alone waits and asks again; the others go on.
                error = latest.errors.get(state.tp) or earliest.errors.get(state.tp)
                why = f"ListOffsets {error.name}" if error is not None else "ListOffsets failed"
                state.delay(now, self.settings.backoff_ms, why)
                continue
            plog = self._log(state)
            if state.phase is PartitionPhase.NEEDS_OFFSET:
                start = lo if self.settings.start_from == "earliest" else hi
                if plog.log_end_offset != start or plog.log_start_offset != start:
                    plog.truncate_fully_and_start_at(start)
                state.fetch_offset = start
                state.phase = PartitionPhase.FETCHING
                self._changed(state.tp)
                log.info(
                    "starting partition",
                    tp=str(state.tp),
                    offset=start,
                    start_from=self.settings.start_from,
                )
                continue
            self._resolve_out_of_range(state, plog, lo, hi, now)

    async def _check_epochs(self, conn: BrokerConnection) -> None:
        """OffsetForLeaderEpoch for partitions whose leader changed, when the leader's
        Fetch cannot say DivergingEpoch itself (below v12)."""
        now = monotonic_ms()
        pending = [
            s
            for s in self.partitions.values()
            if s.epoch_check_pending and now >= s.delayed_until_ms
        ]
        if not pending:
            return
        fetch_version = conn.versions.require(ApiKey.FETCH) if conn.versions else 0
        control = await self.client.connection(self.address.node_id)
        assert control.versions is not None
        ofle_version = control.versions.get(ApiKey.OFFSET_FOR_LEADER_EPOCH)
        queries: dict[TopicPartition, tuple[int, int]] = {}
        for state in pending:
            latest = self._log(state).latest_epoch()
            if fetch_version >= FETCH_LAST_FETCHED_EPOCH_VERSION or latest is None:
                state.epoch_check_pending = False  # Fetch itself will tell, or nothing to check
            elif ofle_version is None:
                state.epoch_check_pending = False
                self._say_once(
                    "no-ofle",
                    "leader has no OffsetForLeaderEpoch; cannot check for divergence",
                    leader=str(self.address),
                )
            else:
                queries[state.tp] = (state.leader_epoch, latest)
        if not queries:
            return
        body = await control.request(
            offset_for_leader_epoch_request(
                ofle_version, queries, replica_id=self.settings.replica_id
            )
        )
        now = monotonic_ms()
        for topic in body.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.topic, int(p.partition))
                state = self.partitions.get(tp)
                if state is None or tp not in queries:
                    continue
                error = error_code_of(p.error_code)
                if error is not ErrorCode.none:
                    self.stats.partition_errors[error.name] += 1
                    state.delay(now, self.settings.backoff_ms, f"OffsetForLeaderEpoch {error.name}")
                    if error in _METADATA_ERRORS:
                        self._request_metadata(f"{tp}: OffsetForLeaderEpoch {error.name}")
                    continue
                leader = EpochEndOffset(int(p.leader_epoch), int(p.end_offset))
                state.epoch_check_pending = not self._truncate(state, leader, "leader epoch")

    def _resolve_out_of_range(
        self, state: PartitionState, plog: Any, lo: int, hi: int, now_ms: int
    ) -> None:
        end = plog.log_end_offset
        if hi < end:
            log.warning(
                "leader's log ends below ours, truncating",
                tp=str(state.tp),
                local_end=end,
                leader_end=hi,
            )
            plog.truncate_to(hi)
        elif lo > end:
            if self.settings.on_gap == "halt":
                state.phase = PartitionPhase.HALTED
                state.last_error = f"gap: leader starts at {lo}, local log ends at {end}"
                log.error(
                    "leader's log starts above ours; partition halted (on_gap=halt)",
                    tp=str(state.tp),
                    local_end=end,
                    leader_start=lo,
                )
                return
            log.warning(
                "leader's log starts above ours; skipping the gap (on_gap=reset)",
                tp=str(state.tp),
                local_end=end,
                leader_start=lo,
                skipped=lo - end,
            )
            plog.truncate_fully_and_start_at(lo)
        else:
            state.delay(now_ms, self.settings.backoff_ms, "offset out of range (transient)")
        state.fetch_offset = plog.log_end_offset
        state.phase = PartitionPhase.FETCHING
        self._changed(state.tp)

    async def _list_offsets(
        self, conn: BrokerConnection, states: Iterable[PartitionState], timestamp: int
    ) -> _OffsetsAnswer:
        assert conn.versions is not None
        version = conn.versions.require(ApiKey.LIST_OFFSETS)
        queries = {s.tp: OffsetQuery(timestamp, s.leader_epoch) for s in states}
        body = await conn.request(
            list_offsets_request(version, queries, isolation_level=self.settings.isolation_level)
        )
        answer = _OffsetsAnswer()
        for topic in body.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, int(p.partition_index))
                error = error_code_of(p.error_code)
                if error is ErrorCode.none:
                    answer.offsets[tp] = int(p.offset)
                    continue
                answer.errors[tp] = error
                self.stats.partition_errors[error.name] += 1
                if error in _METADATA_ERRORS:
                    self._request_metadata(f"{tp}: ListOffsets {error.name}")
        return answer

    # -- connection and session lifecycle -----------------------------------

    async def _connection(self) -> BrokerConnection:
        if self._conn is not None and self._conn.is_open:
            return self._conn
        if self._conn is not None:
            # Lost between requests (the peer closed it): Kafka's rule for a network
            # error applies all the same -- close the session, next request (ID, 0) --
            # or the first request on the new connection is a doomed incremental one.
            await self._conn.close()
            self._conn = None
            if self.session.is_sessionful:
                self._note_recovery(self.session.handle_send_error(now_ms=monotonic_ms()))
        conn = self.client.new_connection(self.address, reserve=self._reserve)
        await conn.connect()
        self._conn = conn
        log.info("connected to leader", leader=str(self.address))
        return self._conn

    async def _connection_failed(self, exc: Exception) -> None:
        self.stats.connection_errors += 1
        self.stats.last_error = str(exc)
        if self.stats.failing_since_ms is None:
            self.stats.failing_since_ms = monotonic_ms()
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
        delay = self._backoff.next_delay_ms()
        if isinstance(exc, ResponseTooLargeError):
            emit = self._say.should_emit("too-large", monotonic_ms())
            if emit.emit:
                log.error(
                    "a fetch response does not fit fetch.buffer_memory; raise it above the "
                    "largest record batch of the source (its message.max.bytes)",
                    leader=str(self.address),
                    error=str(exc),
                    repeats_suppressed=emit.suppressed,
                )
            await self._sleep(delay)
            return
        self._say_once(
            f"conn:{type(exc).__name__}",
            "leader connection failed, retrying",
            leader=str(self.address),
            error=str(exc),
            retry_in_ms=delay,
        )
        self._request_metadata(f"connection to {self.address} failed")
        await self._sleep(delay)

    async def _idle(self, now_ms: int) -> None:
        pending = [
            s.delayed_until_ms for s in self.partitions.values() if s.delayed_until_ms > now_ms
        ]
        timeout = min([*(d - now_ms for d in pending), 1000]) / 1000
        await self._sleep_ms(int(timeout * 1000))

    async def _sleep(self, delay_ms: int) -> None:
        await self._sleep_ms(delay_ms)

    async def _sleep_ms(self, delay_ms: int) -> None:
        self._wakeup.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), max(delay_ms, 0) / 1000)

    async def _close_session(self) -> None:
        """Tell the leader we are done with the session (FINAL_EPOCH), best effort."""
        flight, self._in_flight = self._in_flight, None
        if flight is not None:
            self._abandon(flight)
        conn = self._conn
        plan = self.session.close_request()
        if conn is not None and conn.is_open and plan is not None and conn.versions is not None:
            version = self._usable_fetch_version(conn.versions.require(ApiKey.FETCH), plan)
            with contextlib.suppress(Exception):
                spec = self._spec(plan, version)
                await conn.request(
                    fetch_request(version, replace(spec, max_wait_ms=0)), timeout_s=2.0
                )
        if conn is not None:
            await conn.close()
        self._conn = None

    def _note_recovery(self, verdict: Any) -> None:
        reason = getattr(verdict, "reason", None)
        if reason is None:
            return
        name = getattr(reason, "name", str(reason)).lower()
        self.stats.session_recoveries[name] += 1
        self._say_once(
            f"session:{name}",
            "fetch session reset",
            leader=str(self.address),
            reason=name,
            detail=getattr(verdict, "detail", ""),
        )

    def _say_once(self, key: str, event: str, **fields: Any) -> None:
        emit = self._say.should_emit(key, monotonic_ms())
        if emit.emit:
            if emit.suppressed:
                fields["repeats_suppressed"] = emit.suppressed
            log.info(event, **fields)
