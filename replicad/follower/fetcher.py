"""One fetch loop per leader broker: the asyncio shell around the follower's core.

`PartitionTable` (partition_table.py) decides everything about the partitions; this
shell owns the connections and the clock and performs what the table decides
(perform.py). Each turn:

1. ask the questions the table has (OffsetForLeaderEpoch, ListOffsets) and hand it the
   answers; perform the truncations and starts it decides;
2. send the next Fetch request the table builds (fetchable partitions in rotation
   order, through the KIP-227 session handler);
3. wait for the response (the leader long-polls up to max_wait);
4. hand the parsed response to the table; a response the session handler rejects is
   dropped whole (its data will be fetched again);
5. perform the table's truncations and high-watermark moves; when the table allows it
   (nothing waits for step 1), send the next request now (pipelined): the leader
   prepares it while this response is written;
6. perform the appends. A partition whose append fails goes back to its log end, and
   its data in the pipelined response is dropped unread; it is fetched again.

Nothing a peer sends raises out of this loop: bad frames, CRC mismatches and
protocol errors are counted, logged (rate-limited) and refetched with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from replicad.clock import monotonic_ms, wall_ms
from replicad.errors import (
    DiskFullError,
    KafkaConnectionError,
    LogError,
    ProtocolError,
    RemoteProtocolError,
    RequestTimeoutError,
)
from replicad.follower.actions import (
    Action,
    EpochAnswer,
    NextFetch,
    OffsetAnswer,
    OffsetsAnswer,
)
from replicad.follower.fetch_response import scan_fetch_response
from replicad.follower.fetch_settings import (
    FetchSettings,
)
from replicad.follower.fetcher_stats import FetcherStats
from replicad.follower.partition_phase import PhaseEvent
from replicad.follower.partition_state import PartitionState
from replicad.follower.partition_table import PartitionTable
from replicad.follower.perform import ActionPerformer
from replicad.log.manager import LogManager
from replicad.log.partition import PartitionLog
from replicad.protocol.apis import ApiKey
from replicad.protocol.client import KafkaClient
from replicad.protocol.connection import BrokerAddress, BrokerConnection
from replicad.protocol.fetch_request import fetch_request
from replicad.protocol.metadata import ClusterMetadata
from replicad.protocol.requests import (
    OffsetQuery,
    list_offsets_request,
    metadata_request,
    offset_for_leader_epoch_request,
)
from replicad.ratelimit import RateLimitedLog
from replicad.session.client import FetchSessionHandler
from replicad.types import TopicPartition
from replicad.wire import (
    EARLIEST_TIMESTAMP,
    FETCH_LAST_FETCHED_EPOCH_VERSION,
    FETCH_TOPIC_ID_VERSION,
    LATEST_TIMESTAMP,
)

__all__ = ["LeaderFetcher"]

log = structlog.get_logger("replicad.fetcher")


@dataclass(frozen=True, slots=True)
class _InFlight:
    """A Fetch request on the wire."""

    conn: BrokerConnection
    fetch: NextFetch
    response: asyncio.Future[Any]
    started: float
    sent_before: int
    received_before: int


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
        self.table = PartitionTable(address.node_id, settings)
        # Told after every append, truncation or high-watermark move (replicad serve
        # wakes its long-polls and its session cache from it).
        self._performer = ActionPerformer(
            self.table,
            request_metadata=request_metadata,
            changed=on_partition_changed or (lambda tp: None),
            wall_ms=wall_ms,
        )
        # The next request, sent before the last response's data was written (step 6).
        self._in_flight: _InFlight | None = None
        self._conn: BrokerConnection | None = None
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._say = RateLimitedLog(interval_ms=60_000)

    # -- views kept for status, metrics and the replicator ------------------------------

    @property
    def partitions(self) -> OrderedDict[TopicPartition, PartitionState]:
        return self.table.partitions

    @property
    def stats(self) -> FetcherStats:
        return self.table.stats

    @property
    def session(self) -> FetchSessionHandler:
        return self.table.session

    # -- membership, called by the replicator --------------------------------

    def add(self, state: PartitionState) -> None:
        self.table.add(state, state.log)
        self._wakeup.set()

    def remove(self, tp: TopicPartition) -> PartitionState | None:
        state = self.table.remove(tp)
        self._wakeup.set()
        return state

    def touched(self, tp: TopicPartition) -> None:
        """The replicator changed this partition's state in place (the table's R13)."""
        self.table.touched(tp)

    def response_max_bytes(self) -> int:
        return self.table.response_max_bytes()

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
                    delay = self.table.loop_failed(f"{type(exc).__name__}: {exc}")
                    log.exception("fetch loop failed; retrying", leader=str(self.address))
                    await self._sleep(delay)
        finally:
            await self._close_session()

    async def _turn(self) -> None:
        conn = await self._connection()
        flight, self._in_flight = self._in_flight, None
        if flight is not None and flight.conn is not conn:
            self._abandon(flight)
            flight = None
        if flight is None:
            await self._open_logs()
            await self._ask_questions(conn)
            now = monotonic_ms()
            flight = self._send(conn, now)
            if flight is None:
                await self._sleep(self.table.next_wakeup_ms(now) - now)
                return
        try:
            held = await flight.response
        except (KafkaConnectionError, RemoteProtocolError) as exc:
            # The leader had it and failed it (R14), or it was lost with the connection.
            failed = isinstance(exc, (RequestTimeoutError, RemoteProtocolError))
            self.table.send_failed(monotonic_ms(), leader_failed_it=failed)
            raise exc
        self.stats.last_latency_ms = (time.perf_counter() - flight.started) * 1000
        # Only fetches travel on this connection, one response at a time: the deltas are
        # this response's frame and the request(s) written since the last one.
        self.stats.last_request_bytes = conn.bytes_sent - flight.sent_before
        self.stats.last_response_bytes = conn.bytes_received - flight.received_before
        self.stats.request_bytes_total += self.stats.last_request_bytes
        self.stats.response_bytes_total += self.stats.last_response_bytes
        accepted, retry_in_ms = True, 0
        try:
            now = monotonic_ms()
            outcome = self.table.on_response(flight.fetch, held.body, now)
            accepted, retry_in_ms = outcome.accepted, outcome.retry_in_ms
            if flight.fetch.version < FETCH_TOPIC_ID_VERSION:
                # R9: an answer by name may be a re-created topic's.
                ids = await self._confirming_ids([*outcome.actions, *outcome.appends])
                if ids is not None:
                    outcome = self.table.confirm_outcome(outcome, ids)
                now = monotonic_ms()
            if outcome.appends:
                self.stats.last_data_latency_ms = self.stats.last_latency_ms
            self._performer.perform(outcome.actions, now)
            if (
                outcome.appends
                and not self._stopping
                and self.table.may_pipeline(outcome, monotonic_ms())
            ):
                self._in_flight = self._send(conn, monotonic_ms())
            self._performer.perform(outcome.appends, monotonic_ms())
        finally:
            # The response's bytes are on disk (or dropped): its memory goes back. Every
            # view of it goes first: the pool may free this very buffer at once to make
            # room for a larger one, and a buffer still viewed is not freed, so a view
            # kept past the release is memory over fetch.buffer_memory (VmHWM 11 MiB over
            # it at 2,000 partitions: the outcome and the answered request outlived it).
            # The held response itself outlives this step (the loop's handle that resumed
            # us holds its task): its release drops its body first (connection.py).
            release = held.release
            outcome = flight = held = None  # type: ignore[assignment]
            release()
        if not accepted:
            await self._sleep(retry_in_ms)

    def _send(self, conn: BrokerConnection, now_ms: int) -> _InFlight | None:
        """Write the table's next request to the socket; None if nothing is wanted."""
        max_version = conn.versions.require(ApiKey.FETCH) if conn.versions else 4
        fetch = self.table.next_fetch(now_ms, max_version=max_version)
        if fetch is None:
            return None
        request = fetch_request(fetch.version, fetch.request)
        started = time.perf_counter()
        sent_before, received_before = conn.bytes_sent, conn.bytes_received
        response = conn.send(
            request,
            # The request's own wait: a sessionless share's may be longer (R11).
            timeout_s=(self.settings.request_timeout_ms + fetch.request.max_wait_ms) / 1000,
            hold=True,
            # Records stay views of the response's buffer until they are written.
            decode=functools.partial(scan_fetch_response, version=fetch.version),
        )
        return _InFlight(conn, fetch, response, started, sent_before, received_before)

    async def _open_logs(self) -> None:
        """Open (or create) the logs of partitions added since the last turn: here, with no
        request in flight, and on a worker thread: a new partition's directory and files
        cost about six fsyncs, so a thousand new partitions kept the loop (and with it
        every other leader, the control socket and serve) blocked for 1.2 to 6.7 s
        (measured with control/loop_watch.py against Tansu; tools/sim opens them inline).
        LogManager's map takes one insert at a time (the GIL), the file handle cache has
        its own lock, and the table is touched here only, on the loop."""
        pending = list(self.table.without_log(monotonic_ms()))
        if not pending:
            return
        opened = await asyncio.to_thread(self._open_many, pending)
        full = [
            (s.tp, r) for s, r in zip(pending, opened, strict=True) if isinstance(r, DiskFullError)
        ]
        if full:
            # Left unopened and made again later (the table decides when): raised out of
            # the turn, one partition's full disk stopped the whole leader's loop (session
            # 13's soak).
            self.table.logs_not_opened([tp for tp, _ in full], str(full[0][1]), monotonic_ms())
        for state, result in zip(pending, opened, strict=True):
            if isinstance(result, DiskFullError):
                continue
            if isinstance(result, LogError):
                # The directory holds another topic id (re-created upstream) or cannot be
                # created: this partition stops (status shows why), the others go on.
                state.move(PhaseEvent.LOG_UNUSABLE, f"opening the log failed: {result}")
                log.error("partition halted", tp=str(state.tp), error=str(result))
            else:
                state.log = result
            self.table.touched(state.tp)  # R13: changed outside the table

    def _open_many(self, states: list[PartitionState]) -> list[PartitionLog | LogError]:
        """On a worker thread: each partition's log, or why it could not be opened."""
        results: list[PartitionLog | LogError] = []
        for state in states:
            try:
                results.append(self.logs.get_or_create(state.tp, topic_id=state.topic_id))
            except LogError as exc:
                results.append(exc)
        return results

    def _abandon(self, flight: _InFlight) -> None:
        """Give up a request (its connection is gone, or we stop): nothing stays held,
        and a failure it ended with is not left unretrieved."""
        response = flight.response
        if not response.done():
            response.cancel()  # a held response arriving later is released (connection.send)
        elif not response.cancelled() and response.exception() is None:
            response.result().release()

    # -- questions: divergence and offsets ------------------------------------

    async def _ask_questions(self, conn: BrokerConnection) -> None:
        await self._check_epochs(conn)
        todo = self.table.offset_questions(monotonic_ms())
        if not todo:
            return
        control = await self.client.connection(self.address.node_id)
        try:
            latest = await self._list_offsets(control, todo, LATEST_TIMESTAMP)
            earliest = await self._list_offsets(control, todo, EARLIEST_TIMESTAMP)
        except RequestTimeoutError:
            self.table.offsets_not_answered()  # R15: fewer next time
            raise
        now = monotonic_ms()
        actions = self.table.on_offsets([s.tp for s in todo], earliest, latest, now)
        ids = await self._confirming_ids(actions)  # R9: ListOffsets names topics
        if ids is not None:
            actions = self.table.confirm_topic_ids(actions, ids)
        self._performer.perform(actions, monotonic_ms())

    async def _confirming_ids(
        self, actions: Sequence[Action]
    ) -> dict[str, uuid.UUID | None] | None:
        """The partition table's R9: the ids of the topics `actions` (from answers by name)
        change, from a Metadata answer asked now; None if none needs confirming."""
        topics = self.table.topics_to_confirm(actions)
        if not topics:
            return None
        control = await self.client.connection(self.address.node_id)
        assert control.versions is not None
        version = control.versions.require(ApiKey.METADATA)
        cluster = ClusterMetadata.from_response(
            await control.request(metadata_request(version, topics))
        )
        return {
            name: meta.topic_id
            for name, meta in cluster.topics.items()
            if meta.error is ErrorCode.none
        }

    async def _check_epochs(self, conn: BrokerConnection) -> None:
        """OffsetForLeaderEpoch for the partitions the table asks about."""
        if not self.table.epoch_check_due(monotonic_ms()):
            return
        fetch_version = conn.versions.require(ApiKey.FETCH) if conn.versions else 0
        ofle_version = None
        if fetch_version < FETCH_LAST_FETCHED_EPOCH_VERSION:
            # Only older leaders need the control connection for this.
            control = await self.client.connection(self.address.node_id)
            assert control.versions is not None
            ofle_version = control.versions.get(ApiKey.OFFSET_FOR_LEADER_EPOCH)
        questions = self.table.epoch_questions(
            monotonic_ms(), fetch_version=fetch_version, ofle_version=ofle_version
        )
        if not questions or ofle_version is None:
            return
        body = await control.request(
            offset_for_leader_epoch_request(
                ofle_version,
                {tp: (q.current_leader_epoch, q.leader_epoch) for tp, q in questions.items()},
                replica_id=self.settings.replica_id,
            )
        )
        answers = [
            EpochAnswer(
                TopicPartition(topic.topic, int(p.partition)),
                int(p.error_code),
                int(p.leader_epoch),
                int(p.end_offset),
            )
            for topic in body.topics
            for p in topic.partitions
        ]
        actions = self.table.on_epoch_answers(questions, answers, monotonic_ms())
        ids = await self._confirming_ids(actions)  # R9: OffsetForLeaderEpoch names topics
        if ids is not None:
            actions = self.table.confirm_topic_ids(actions, ids)
        self._performer.perform(actions, monotonic_ms())

    async def _list_offsets(
        self, conn: BrokerConnection, states: list[PartitionState], timestamp: int
    ) -> OffsetsAnswer:
        assert conn.versions is not None
        version = conn.versions.require(ApiKey.LIST_OFFSETS)
        queries = {s.tp: OffsetQuery(timestamp, s.leader_epoch) for s in states}
        body = await conn.request(
            list_offsets_request(version, queries, isolation_level=self.settings.isolation_level)
        )
        answer, actions = self.table.offsets_answer(
            OffsetAnswer(
                TopicPartition(topic.name, int(p.partition_index)), int(p.error_code), int(p.offset)
            )
            for topic in body.topics
            for p in topic.partitions
        )
        self._performer.perform(actions, monotonic_ms())
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
            self.table.connection_lost(monotonic_ms())
        conn = self.client.new_connection(self.address, reserve=self._reserve)
        await conn.connect()
        self._conn = conn
        log.info("connected to leader", leader=str(self.address))
        return self._conn

    async def _connection_failed(self, exc: Exception) -> None:
        delay = self.table.connection_failed(str(exc), monotonic_ms())
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
        self._say_once(
            f"conn:{type(exc).__name__}",
            "leader connection failed, retrying",
            leader=str(self.address),
            error=str(exc),
            retry_in_ms=delay,
        )
        self._request_metadata(f"connection to {self.address} failed")
        await self._sleep(delay)

    async def _sleep(self, delay_ms: int) -> None:
        """Wait delay_ms, or less when a partition is added or we stop."""
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
            version = self.table.usable_fetch_version(conn.versions.require(ApiKey.FETCH), plan)
            with contextlib.suppress(Exception):
                closing = self.table.request(plan, version)
                await conn.request(
                    fetch_request(version, replace(closing, max_wait_ms=0)), timeout_s=2.0
                )
        if conn is not None:
            await conn.close()
        self._conn = None

    def _say_once(self, key: str, event: str, **fields: Any) -> None:
        emit = self._say.should_emit(key, monotonic_ms())
        if emit.emit:
            if emit.suppressed:
                fields["repeats_suppressed"] = emit.suppressed
            log.info(event, **fields)
