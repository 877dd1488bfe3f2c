"""The follower as a whole: local logs, cluster metadata, one fetcher per leader.

Rules:
- Nothing is fetched before the local logs are recovered: the fetch offset of
  every partition is its recovered log end.
- Partitions are grouped by leader broker; a partition whose leader changes
  moves to the new leader's fetcher (the old one forgets it in its session).
- A partition that leaves the selection (topic deleted, dropped from the
  config) stops being fetched; its local data is kept.
- Metadata is refreshed periodically (new partitions of chosen topics appear)
  and whenever a fetcher reports a leadership or connection problem.
- High watermarks and recovery points are checkpointed every
  `checkpoint_interval_ms` and at shutdown, after the last append, on the durability
  thread (durability.py): the event loop never waits on those fsyncs. The high watermark
  checkpointed is the partition log's own: raised by the fetchers as leaders report it,
  lowered only by truncation -- never reset by a partition whose leader has not answered
  yet (after a restart with part of the source down, that partition keeps serving what it
  had).
- With `high_watermark_interval_ms`, the high watermarks alone are written that often in
  between, unflushed and only when one moved (LogManager.write_high_watermarks), also on
  the durability thread: a Spark stream over the replica reads no further than that file.
  They are written a moment before the wall clock's whole multiples of the interval, where
  Spark's processing-time triggers fire (_next_high_watermarks).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from replicad.clock import monotonic_ms, wall_ms
from replicad.config.model import Config, SourceConfig, defaults_of
from replicad.errors import KafkaConnectionError, LogError, ProtocolError
from replicad.follower.assignment import LeaderInfo, LocalFacts, assign, place_all
from replicad.follower.durability import DurabilityThread
from replicad.follower.fetch_settings import FetchSettings
from replicad.follower.fetcher import LeaderFetcher
from replicad.follower.memory_pool import MemoryPool
from replicad.follower.partition_phase import PhaseEvent
from replicad.follower.partition_state import PartitionState
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.log.partition import PartitionLog
from replicad.protocol.backoff import Backoff
from replicad.protocol.client import ClientSettings, KafkaClient
from replicad.protocol.metadata import ClusterMetadata, TopicSelection
from replicad.ratelimit import RateLimitedLog
from replicad.types import TopicPartition

log = structlog.get_logger("replicad.replicator")

# A listed topic the source does not have yet is looked for again this soon.
MISSING_TOPIC_RETRY_MS = 10_000
# With high_watermark_interval_ms, the high watermarks alone are written this long before
# the wall clock's whole multiples of the interval (_next_high_watermarks): time for the
# write (two fsyncs) to be done before a Spark trigger on such a multiple looks.
HIGH_WATERMARKS_LEAD_MS = 50


@dataclass(frozen=True, slots=True)
class ReplicatorSettings:
    bootstrap_servers: tuple[str, ...]
    data_dir: Path
    selection: TopicSelection
    client: ClientSettings = field(default_factory=ClientSettings)
    fetch: FetchSettings = field(default_factory=FetchSettings)
    log: LogConfig = field(default_factory=LogConfig)
    metadata_max_age_ms: int = defaults_of(SourceConfig)["metadata_max_age_ms"]
    checkpoint_interval_ms: int = defaults_of(Config)["checkpoint_interval_ms"]
    high_watermark_interval_ms: int | None = defaults_of(Config)["high_watermark_interval_ms"]
    # Lower bound between two on-demand metadata refreshes, so an error storm
    # across many partitions costs one Metadata request, not thousands.
    metadata_min_interval_ms: int = 500
    # `archive:` is on: local retention waits for the uploads (LogManager.hold_for_archive).
    hold_for_archive: bool = False

    @classmethod
    def from_config(cls, config: Config) -> ReplicatorSettings:
        """The replicator's settings from the validated configuration."""
        return cls(
            bootstrap_servers=tuple(str(hp) for hp in config.source.bootstrap_servers),
            data_dir=config.data_dir,
            selection=TopicSelection.from_config(config.topics),
            client=ClientSettings.from_config(config.source),
            fetch=FetchSettings.from_config(config),
            log=config.log,
            metadata_max_age_ms=config.source.metadata_max_age_ms,
            checkpoint_interval_ms=config.checkpoint_interval_ms,
            high_watermark_interval_ms=config.high_watermark_interval_ms,
            hold_for_archive=config.archive is not None,
        )


class Replicator:
    def __init__(self, settings: ReplicatorSettings) -> None:
        self.settings = settings
        self.states: dict[TopicPartition, PartitionState] = {}
        self.fetchers: dict[int, LeaderFetcher] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self.cluster: ClusterMetadata | None = None
        self.logs: LogManager | None = None
        self.client = KafkaClient(settings.bootstrap_servers, settings.client)
        self._refresh = asyncio.Event()
        self._refresh_reasons: list[str] = []
        self._topic_ids: dict[str, uuid.UUID | None] = {}
        self.ready = asyncio.Event()
        self.started_at_ms = wall_ms()
        self.on_ready: Callable[[], None] | None = None
        # KIP-81: one bound on fetch-response memory shared by every leader's fetcher.
        self.pool = MemoryPool(settings.fetch.buffer_memory)
        # Set once the local logs are recovered (replicad serve starts on it).
        self.logs_ready = asyncio.Event()
        # Called with a partition after it changed locally (see LeaderFetcher).
        self.partition_listener: Callable[[TopicPartition], None] | None = None
        # Checkpoints, time-based flushes and retention: off the event loop.
        self.durability = DurabilityThread()
        self.checkpoint_failures = 0
        self.housekeeping_errors = 0
        # Listed topics the source did not have at the last metadata refresh.
        self.missing_topics: tuple[str, ...] = ()

    # -- lifecycle ---------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        self.logs = await asyncio.to_thread(LogManager.open, s.data_dir, s.log, now_ms=wall_ms())
        if s.hold_for_archive:
            self.logs.hold_for_archive()
        # log.flush_messages' flushes: on the durability thread, not in the appending loop.
        self.logs.flush_later = self._flush_later
        # Their leader-epoch files and unlinks too (log/partition.py's epoch-file rules).
        self.logs.disk_later = self.durability.submit
        log.info(
            "local logs recovered", data_dir=str(s.data_dir), partitions=len(self.logs.partitions())
        )
        self.logs_ready.set()
        try:
            cluster = await self.client.metadata_with_retry(
                s.selection.metadata_topics(), stop=stop
            )
            if cluster is None:
                return
            self._apply(cluster)
            self.ready.set()
            if self.on_ready is not None:
                self.on_ready()
            housekeeping = asyncio.create_task(self._housekeeping(stop), name="housekeeping")
            await stop.wait()
            housekeeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await housekeeping
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        for fetcher in self.fetchers.values():
            fetcher.stop()
        # A fetcher stops between turns: an append in progress always completes,
        # because appends run without awaiting.
        if self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        await self.client.close()
        if self.logs is not None:
            # After any checkpoint still running (jobs run in order on one thread).
            try:
                await self.durability.run(self.logs.checkpoint)
                log.info("logs flushed and checkpointed", partitions=len(self.states))
            except (OSError, LogError) as exc:
                # The last good checkpoint stays; recovery rescans from it at start.
                log.error(
                    "final checkpoint failed; the next start recovers from the previous one",
                    error=str(exc),
                )
            try:
                await self.durability.run(self.logs.close)
            except (OSError, LogError) as exc:
                log.error("closing the logs failed; the next start recovers them", error=str(exc))
        self.durability.close()

    # -- metadata and assignment -------------------------------------------

    def _partition_changed(self, tp: TopicPartition) -> None:
        if self.partition_listener is not None:
            self.partition_listener(tp)

    def reconfigure_topics(self, selection: TopicSelection) -> None:
        """Replicate another set of topics from now on (SIGHUP reload). Partitions that
        leave become forgotten in their leader's session; new ones are added."""
        self.settings = replace(self.settings, selection=selection)
        self.request_metadata("topic selection changed")

    def request_metadata(self, reason: str) -> None:
        self._refresh_reasons.append(reason)
        self._refresh.set()

    def _apply(self, cluster: ClusterMetadata) -> list[str]:
        """Adopt new metadata; returns the listed topics the cluster lacks."""
        assert self.logs is not None
        self.cluster = cluster
        selection = self.settings.selection
        chosen = selection.partitions(cluster)
        missing = selection.missing(cluster)
        self.missing_topics = tuple(missing)
        for name in missing:
            log.warning("topic not found on the source cluster", topic=name)
        for topic in {tp.topic for tp in chosen}:
            self._topic_ids[topic] = cluster.topic_id(topic)
        plan = assign(
            self.states,
            {
                tp: LeaderInfo(leader.leader_id, leader.leader_epoch, cluster.topic_id(tp.topic))
                for tp, leader in chosen.items()
            },
            {
                tp: LocalFacts(plog.topic_id, plog.log_end_offset)
                for tp, plog in self.logs.partitions().items()
            },
            now_ms=monotonic_ms(),
            is_placed=self._is_assigned,
        )
        for state in plan.halted:
            log.error(
                "topic recreated upstream; partition halted, local data kept",
                tp=str(state.tp),
                local_topic_id=str(state.topic_id),
                source_topic_id=str(cluster.topic_id(state.tp.topic)),
            )
        for state, topic_id in plan.topic_ids:
            try:
                state.log.set_topic_id(topic_id)
            except LogError as exc:  # assign() compared the ids: a failing disk
                state.move(PhaseEvent.LOG_UNUSABLE, f"storing the topic id failed: {exc}")
        place_all(plan, self.states, place=self._assign, unplace=self._unassign, touch=self._touch)
        for state in plan.removed:
            log.info("partition no longer replicated; local data kept", tp=str(state.tp))
        return missing

    def _touch(self, state: PartitionState) -> None:
        """A state changed in place: its fetcher's table examines it again (R13)."""
        fetcher = self.fetchers.get(state.leader_id)
        if fetcher is not None:
            fetcher.touched(state.tp)

    def _is_assigned(self, state: PartitionState) -> bool:
        fetcher = self.fetchers.get(state.leader_id)
        return fetcher is not None and state.tp in fetcher.partitions

    def _assign(self, state: PartitionState) -> None:
        assert self.cluster is not None and self.logs is not None
        address = self.cluster.brokers.get(state.leader_id)
        if address is None:
            state.last_error = f"no leader (leader id {state.leader_id})"
            self.request_metadata(f"{state.tp}: no leader")
            return
        fetcher = self.fetchers.get(state.leader_id)
        if fetcher is not None and fetcher.address != address:
            fetcher.stop()  # the broker id moved to another address
            fetcher = None
        if fetcher is None:
            fetcher = LeaderFetcher(
                address,
                client=self.client,
                logs=self.logs,
                settings=self.settings.fetch,
                topic_ids=lambda: self._topic_ids,
                request_metadata=self.request_metadata,
                reserve=self.pool.reserve,
                on_partition_changed=self._partition_changed,
            )
            self.fetchers[state.leader_id] = fetcher
            self._tasks[state.leader_id] = asyncio.create_task(
                fetcher.run(), name=f"fetcher-{state.leader_id}"
            )
        fetcher.add(state)

    def _unassign(self, state: PartitionState) -> None:
        for fetcher in self.fetchers.values():
            fetcher.remove(state.tp)

    async def _housekeeping(self, stop: asyncio.Event) -> None:
        """Metadata refreshes and checkpoints; survives any failure of either."""
        while not stop.is_set():
            try:
                await self._housekeeping_loop(stop)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("housekeeping failed; restarting it")
                self.housekeeping_errors += 1
                await asyncio.sleep(1)

    async def _housekeeping_loop(self, stop: asyncio.Event) -> None:
        s = self.settings
        next_metadata = monotonic_ms() + s.metadata_max_age_ms
        next_checkpoint = monotonic_ms() + s.checkpoint_interval_ms
        next_high_watermarks = _next_high_watermarks(monotonic_ms(), wall_ms(), s)
        last_refresh = -s.metadata_min_interval_ms
        # Failed refreshes back off like reconnects; logged once a minute with a count.
        retry = Backoff(s.client.reconnect_backoff_ms, s.client.reconnect_backoff_max_ms)
        retry_at = 0
        say = RateLimitedLog(interval_ms=60_000)
        while not stop.is_set():
            now = monotonic_ms()
            deadline = min(next_metadata, next_checkpoint, next_high_watermarks)
            if self._refresh.is_set():
                deadline = min(
                    deadline, max(now, last_refresh + s.metadata_min_interval_ms, retry_at)
                )
                await asyncio.sleep(max(0, deadline - now) / 1000)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._refresh.wait(), max(0, deadline - now) / 1000)
            now = monotonic_ms()
            on_demand = (
                self._refresh.is_set()
                and now >= last_refresh + s.metadata_min_interval_ms
                and now >= retry_at
            )
            if on_demand or now >= next_metadata:
                reasons, self._refresh_reasons = self._refresh_reasons, []
                self._refresh.clear()
                last_refresh = now
                next_metadata = now + s.metadata_max_age_ms
                try:
                    # self.settings, not `s`: a reload may have replaced the selection.
                    topics = self.settings.selection.metadata_topics()
                    if self._apply(await self.client.metadata(topics)):
                        next_metadata = now + MISSING_TOPIC_RETRY_MS
                    retry.reset()
                    if reasons:
                        log.debug("metadata refreshed", reasons=reasons[:5])
                except (KafkaConnectionError, ProtocolError) as exc:
                    delay = retry.next_delay_ms()
                    retry_at = now + delay
                    emit = say.should_emit("metadata", now)
                    if emit.emit:
                        log.warning(
                            "metadata refresh failed; retrying with backoff",
                            error=str(exc),
                            retry_in_ms=delay,
                            failures_suppressed=emit.suppressed,
                        )
                    self._refresh.set()
            due_checkpoint = now >= next_checkpoint
            if now >= next_high_watermarks:
                next_high_watermarks = _next_high_watermarks(now, wall_ms(), s)
                if not due_checkpoint:
                    try:
                        await self.durability.run(_high_watermarks_job, self.logs)
                    except (OSError, LogError) as exc:
                        self.checkpoint_failures += 1
                        if say.should_emit("checkpoint", now).emit:
                            log.error("high watermarks not written; retrying", error=str(exc))
            if due_checkpoint:
                next_checkpoint = now + s.checkpoint_interval_ms
                # Idle fetch buffers a caught-up follower no longer needs (memory_pool.py).
                self.pool.trim()
                try:
                    await self._checkpoint()
                except (OSError, LogError) as exc:
                    # A full or failing disk must not end housekeeping: the previous
                    # checkpoint files are intact (written atomically); try again later.
                    self.checkpoint_failures += 1
                    emit = say.should_emit("checkpoint", now)
                    if emit.emit:
                        log.error(
                            "checkpoint failed; keeping the previous one, retrying",
                            error=str(exc),
                            failures_suppressed=emit.suppressed,
                        )

    def _flush_later(self, partition: PartitionLog) -> None:
        self.durability.submit(partition.flush, what=f"flush of {partition.topic_partition}")

    async def _checkpoint(self) -> None:
        """One checkpoint, a time-based flush and a retention pass, on the durability
        thread; fetchers keep appending meanwhile (durability.py says why that is safe)."""
        assert self.logs is not None
        await self.durability.run(_checkpoint_job, self.logs)

    # -- read-only views ----------------------------------------------------

    def lag(self) -> int:
        return sum(s.lag for s in self.states.values())


def _next_high_watermarks(now: int, wall: int, s: ReplicatorSettings) -> float:
    """When the high watermarks alone are next written (never without the setting), on the
    monotonic clock that reads `now` when the wall clock reads `wall`: HIGH_WATERMARKS_LEAD_MS
    before the wall clock's next whole multiple of the interval. Spark's processing-time
    triggers fire on whole multiples of their interval (epoch milliseconds), so a trigger
    whose interval is a multiple of this one finds the file written a moment before it
    looks. A period counted from replicad's start left the file anywhere from 0 to a whole
    interval old when a trigger looked, by the phase between the two processes: a record
    made safe just after the look waits for the next trigger, so a stream's latency moved
    by up to the interval from one run to the next."""
    interval = s.high_watermark_interval_ms
    if interval is None:
        return float("inf")
    return now + interval - (wall + HIGH_WATERMARKS_LEAD_MS) % interval


def _high_watermarks_job(logs: LogManager | None) -> None:
    if logs is not None:
        logs.write_high_watermarks()


def _checkpoint_job(logs: LogManager) -> None:
    """Runs on the durability thread: the clock is read when the job starts, not queued."""
    logs.checkpoint()
    logs.maybe_flush(wall_ms())
    logs.enforce_retention(wall_ms())
