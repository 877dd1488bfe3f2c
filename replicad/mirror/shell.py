"""The mirror's asyncio shell: reads the local log, produces to the destination, persists
progress. The decisions are the cores' (partition_mirror.py, producer_session.py,
chore.py, promotion.py, restamp.py, topics.py); this module performs them and waits as
they say.

- Start: the destination's metadata, the stored progress (progress_store.py), destination
  topics created like the source's (topics.py), one idempotent producer session
  (InitProducerId), then one task per mirrored partition and one that saves progress.
- A partition's task reads the local log below its high watermark on a worker thread
  (never past what the source committed), feeds the core, and sends its one batch in
  flight to the partition's leader; connections are shared per broker, so many partitions'
  requests are in flight on one connection at once.
- Before a partition's first send under a producer session it reconciles with the
  destination's log end; the log end is taken when the leader's log end equals its high
  watermark (no write of ours between append and acknowledgement), so a request of a killed
  process that is still being replicated is neither counted early nor sent twice.
- A new partition's first progress is saved before its first send: a crash right after
  could otherwise not tell our records from what the destination held before (a failed
  save is tried again when the partition's core says).
- Destination metadata is refreshed when a partition needs it, and the destination's
  topics are prepared at start and synced each interval, when their chores say (chore.py).
- Destination down: sends fail, are retried with backoff (same producer, same sequence),
  while the follower keeps filling the local log; nothing here ever stops replication.
- Local retention is held at each partition's mirrored position (PartitionLog's
  retention_floor) from before the destination first answers, unless
  `mirror.retention_waits` is false; then what retention deleted first is a counted gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import structlog

from replicad.clock import monotonic_ms as _now_ms
from replicad.clock import wall_ms as _wall_ms
from replicad.config.model import Config, GroupsConfig, MirrorConfig, defaults_of
from replicad.errors import (
    KafkaConnectionError,
    LeaderNotKnownError,
    LocalProtocolError,
    LogError,
    OffsetOutOfRangeError,
    ProtocolError,
    ReplicadError,
)
from replicad.follower.replicator import Replicator
from replicad.groups.cluster_reader import ClusterGroupsReader
from replicad.log.partition import PartitionLog
from replicad.mirror import progress_store, promotion
from replicad.mirror.chore import Chore
from replicad.mirror.coalesce import (
    SMALL_BATCH_BYTES,
    PlainReader,
    RunCut,
    coalesce,
    run_plain_bytes,
)
from replicad.mirror.destination import Destination, produce_answers
from replicad.mirror.group_sync import MirroredPartition
from replicad.mirror.group_sync_shell import GroupSyncShell
from replicad.mirror.partition_mirror import (
    Failure,
    LogEntry,
    MirrorTiming,
    PartitionMirror,
    Phase,
    Progress,
    Send,
)
from replicad.mirror.producer_session import ProducerSession
from replicad.mirror.restamp import ProducerStamp, restamped
from replicad.mirror.topics import config_changes, plan_topics
from replicad.protocol.client import ClientSettings, KafkaClient
from replicad.protocol.metadata import ClusterMetadata
from replicad.ratelimit import RateLimitedLog
from replicad.records.batch import CONTROL_FLAG_MASK, LOG_OVERHEAD, MAGIC_V2, scan_batches
from replicad.records.header import header_from
from replicad.records.records import control_marker, decode_batch
from replicad.records.run import BASE_OFFSET, LAST_OFFSET_DELTA, LENGTH
from replicad.types import TopicPartition

log = structlog.get_logger("replicad.mirror")


_MIRROR = defaults_of(MirrorConfig)


class Lane(NamedTuple):
    """One connection to a destination leader: its node id and which of its connections."""

    leader: int
    index: int


@dataclass(frozen=True, slots=True)
class MirrorSettings:
    """The mirror: section as the mirror uses it (`from_config`); its defaults are the
    config model's."""

    bootstrap_servers: tuple[str, ...]
    client: ClientSettings
    data_dir: Path
    # Source topics to mirror; empty: every replicated topic.
    topics: tuple[str, ...] = ()
    # Destination topic = prefix + source topic (MM2's DefaultReplicationPolicy uses
    # "<source alias>."); empty: the same name.
    topic_prefix: str = _MIRROR["topic_prefix"]
    replication_factor: int = _MIRROR["replication_factor"]
    produce_timeout_ms: int = _MIRROR["produce_timeout_ms"]
    progress_interval_ms: int = _MIRROR["progress_interval_ms"]
    read_bytes: int = 1 << 20
    buffer_bytes: int = _MIRROR["buffer_bytes"]
    retry_backoff_ms: int = _MIRROR["reconnect_backoff_ms"]
    retry_backoff_max_ms: int = _MIRROR["reconnect_backoff_max_ms"]
    # Batches in flight per partition (Kafka's idempotent producer allows up to 5).
    max_in_flight: int = _MIRROR["max_in_flight"]
    # Connections to each destination broker that Produce requests are spread over.
    connections_per_broker: int = _MIRROR["connections_per_broker"]
    # At most this many batch bytes in one Produce request (one batch at least).
    request_bytes: int = 1 << 20
    # Runs of small batches coalesced into one batch up to this size; 0: off.
    coalesce_bytes: int = _MIRROR["coalesce_bytes"]
    # Hold local retention at what is not mirrored yet (PartitionLog.retention_floor).
    retention_waits: bool = _MIRROR["retention_waits"]
    # How often topics and partitions new at the source are looked for.
    topic_sync_interval_ms: int = _MIRROR["topic_sync_interval_ms"]
    # Consumer groups whose offsets follow the data (group_sync.py); off unless enabled.
    groups: GroupsConfig = field(default_factory=GroupsConfig)

    @classmethod
    def from_config(cls, config: Config) -> MirrorSettings:
        """The settings of `config`'s mirror: section (ValueError if it has none)."""
        mirror = config.mirror
        if mirror is None:
            raise ValueError("the configuration has no mirror: section")
        return cls(
            bootstrap_servers=tuple(str(hp) for hp in mirror.bootstrap_servers),
            client=ClientSettings.from_config(mirror),
            data_dir=config.data_dir,
            topics=tuple(mirror.topics),
            topic_prefix=mirror.topic_prefix,
            replication_factor=mirror.replication_factor,
            produce_timeout_ms=mirror.produce_timeout_ms,
            progress_interval_ms=mirror.progress_interval_ms,
            buffer_bytes=mirror.buffer_bytes,
            max_in_flight=mirror.max_in_flight,
            connections_per_broker=mirror.connections_per_broker,
            coalesce_bytes=mirror.coalesce_bytes,
            retention_waits=mirror.retention_waits,
            topic_sync_interval_ms=mirror.topic_sync_interval_ms,
            retry_backoff_ms=mirror.reconnect_backoff_ms,
            retry_backoff_max_ms=mirror.reconnect_backoff_max_ms,
            groups=config.groups,
        )


class Mirror:
    def __init__(self, settings: MirrorSettings, replicator: Replicator) -> None:
        self.settings = settings
        self.replicator = replicator
        self.client = KafkaClient(settings.bootstrap_servers, settings.client)
        self.destination = Destination(self.client, produce_timeout_ms=settings.produce_timeout_ms)
        self.cores: dict[TopicPartition, PartitionMirror] = {}
        self.topic_errors: dict[str, str] = {}
        # Start-up problems (the destination unreachable before any partition runs).
        self.problem: str | None = None
        self.problem_since_ms: int | None = None
        # Partitions whose last send failed: error, since (ms), and whether the destination
        # answered it with a refusal (True) or did not answer at all (False).
        self._failing: dict[TopicPartition, tuple[str, int, bool]] = {}
        # The producer session every partition's batches carry (producer_session.py).
        self.session = ProducerSession(settings.retry_backoff_ms, settings.retry_backoff_max_ms)
        self.dest_cluster: ClusterMetadata | None = None
        self.started = False
        self.produce_requests = 0
        self.produce_errors = 0
        self.bytes_produced = 0
        # The driver: partitions that may have something to do, the times cores asked to
        # be woken at, and the event that wakes the loop.
        self._dirty: set[TopicPartition] = set()
        self._timers: list[tuple[int, TopicPartition]] = []
        self._wakeup = asyncio.Event()
        self._reading: set[TopicPartition] = set()
        # One sender per destination leader and connection to it (lane, see _lane).
        self._senders: dict[Lane, asyncio.Queue[list[tuple[TopicPartition, Send]]]] = {}
        # The destination's metadata, asked by partitions, at most once a back-off; its
        # topics, prepared at start and synced every interval (chore.py).
        self._metadata = Chore(
            settings.retry_backoff_ms,
            settings.retry_backoff_max_ms,
            min_gap_ms=settings.retry_backoff_ms,
        )
        self._topics = Chore(
            settings.retry_backoff_ms,
            settings.retry_backoff_max_ms,
            every_ms=settings.topic_sync_interval_ms,
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._logs: dict[TopicPartition, PartitionLog] = {}
        self._saved: dict[TopicPartition, Progress] = {}
        self._save_lock = asyncio.Lock()
        self._metadata_lock = asyncio.Lock()
        self._halt_logged: set[TopicPartition] = set()
        # Partitions whose local retention is held for the mirror (see _hold).
        self._held: set[TopicPartition] = set()
        self._said = RateLimitedLog(interval_ms=60_000)
        self.groups = GroupSyncShell(
            settings.groups,
            settings.data_dir,
            replicator.client,
            self.client,
            self._mirrored_view,
            self._identity,
        )

    # -- hooks ----------------------------------------------------------------------------

    def partition_changed(self, tp: TopicPartition) -> None:
        """The follower appended to `tp` or moved its high watermark."""
        if tp in self.cores:
            self._mark(tp)
        elif tp not in self._held:
            self._hold(tp, None)

    # -- run ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        tasks: list[asyncio.Task[None]] = []
        try:
            if not await self._start(stop):
                return
            tasks.append(asyncio.create_task(self._drive(stop), name="mirror"))
            for tp in self.cores:
                self._mark(tp)
            tasks.append(asyncio.create_task(self._save_loop(stop), name="mirror-progress"))
            tasks.append(asyncio.create_task(self._sync_loop(stop, tasks), name="mirror-sync"))
            if self.settings.groups.enabled:
                tasks.append(asyncio.create_task(self.groups.run(stop), name="mirror-groups"))
            self.started = True
            log.info(
                "mirroring",
                partitions=len(self.cores),
                destination=",".join(self.settings.bootstrap_servers),
                producer_id=self.session.stamp.producer_id if self.session.stamp else None,
            )
            await stop.wait()
        finally:
            for task in [*tasks, *self._tasks]:
                task.cancel()
            await asyncio.gather(*tasks, *self._tasks, return_exceptions=True)
            if self.cores and self.dest_cluster is not None:
                with contextlib.suppress(OSError, LogError):
                    await self._save()
            await self.client.close()

    async def _start(self, stop: asyncio.Event) -> bool:
        """Everything before the first send; False when stopped first or refused."""
        replicator = self.replicator
        await _until(stop, replicator.logs_ready.wait())
        # At once (no await between): the replicator's housekeeping, which enforces
        # retention, starts only after its first metadata answer.
        if replicator.logs is not None:
            for tp, plog in replicator.logs.partitions().items():
                self._logs[tp] = plog
                self._hold(tp, None)
        # The source's first metadata is in (the replicator's cluster).
        await _until(stop, replicator.ready.wait())
        if stop.is_set():
            return False
        try:
            stored = await asyncio.to_thread(progress_store.load, self.settings.data_dir)
        except ReplicadError as exc:
            self._set_problem(f"mirror progress unreadable, not mirroring: {exc}")
            log.error("mirror progress unreadable; not mirroring", error=str(exc))
            return False
        # Before the destination answers: retention must not delete what is not mirrored.
        self._hold_retention(stored.partitions if stored is not None else {})
        meta = await self.client.metadata_with_retry(None, stop=stop)
        if meta is None:
            return False
        self.dest_cluster = meta
        try:
            await self.groups.load()
        except ReplicadError as exc:
            self._set_problem(f"mirror groups state unreadable, not mirroring: {exc}")
            log.error("mirror groups state unreadable; not mirroring", error=str(exc))
            return False
        progress: Mapping[TopicPartition, Progress] = {}
        if stored is not None:
            if stored.destination_cluster not in (None, self._identity()):
                log.warning(
                    "mirror progress is for another destination (cluster or topic prefix); "
                    "starting afresh",
                    stored=stored.destination_cluster,
                    destination=self._identity(),
                )
            else:
                progress = stored.partitions
        self._topics.ask(_now_ms())
        if await self._topics_prepared(stop, lambda exc: self._set_problem(str(exc))):
            await _until(stop, self._ask_session())
        if stop.is_set():
            return False
        self._clear_problem()
        assert replicator.logs is not None
        logs = replicator.logs.partitions()
        for tp in sorted(self._mirrored_partitions()):
            stored_p = progress.get(tp)
            plog = logs.get(tp)
            if stored_p is not None:
                core = PartitionMirror(
                    position=stored_p.position,
                    dest_next=stored_p.dest_next,
                    points=stored_p.points,
                    timing=self._timing(),
                )
                self._saved[tp] = stored_p
            else:
                core = PartitionMirror(
                    position=plog.log_start_offset if plog else 0, timing=self._timing()
                )
            self.cores[tp] = core
            if plog is not None and self.settings.retention_waits:
                plog.retention_floor = core.position
        return True

    def _hold_retention(self, stored: Mapping[TopicPartition, Progress]) -> None:
        for tp, progress in stored.items():
            self._hold(tp, progress.position)

    def _hold(self, tp: TopicPartition, position: int | None) -> None:
        """Keep retention off `tp`'s records from `position` on (None: all it holds now)."""
        self._held.add(tp)
        wanted = set(self.settings.topics)
        if not self.settings.retention_waits or (wanted and tp.topic not in wanted):
            return
        if tp.topic in self.groups.sync.promoted:
            return  # cut over: the destination owns it, nothing waits for the mirror
        plog = self._log(tp)
        if plog is not None:
            floor = plog.log_start_offset if position is None else position
            plog.retention_floor = floor

    def _mirrored_topics(self) -> dict[str, int]:
        """Source topics to mirror -> their partition count at the source."""
        cluster = self.replicator.cluster
        assert cluster is not None
        replicated = {tp.topic for tp in self.replicator.states}
        wanted = (set(self.settings.topics) or replicated) - self.groups.sync.promoted
        for topic in sorted(set(self.settings.topics) - replicated):
            self.topic_errors[topic] = "not a replicated topic (see topics:)"
        return {
            t: len(cluster.topics[t].partitions)
            for t in sorted(wanted & replicated)
            if t in cluster.topics
        }

    def _mirrored_partitions(self) -> list[TopicPartition]:
        assert self.dest_cluster is not None
        out = []
        for topic, count in self._mirrored_topics().items():
            if topic in self.topic_errors:
                continue
            out.extend(TopicPartition(topic, p) for p in range(count))
        return out

    async def _prepare_topics(self) -> None:
        """Destination topics as the source's: created, grown (CreatePartitions), or named
        in topic_errors; recomputed on every call (at start, then every sync)."""
        self.topic_errors.clear()
        source = self._mirrored_topics()
        prefix = self.settings.topic_prefix
        # Planned under destination names; errors are said under the source topic's.
        source_of = {prefix + t: t for t in source}
        meta = await self.client.metadata(list(source_of))
        have = {
            name: len(t.partitions)
            for name, t in meta.topics.items()
            if t.partitions and t.error.name != "unknown_topic_or_partition"
        }
        missing = [t for t in source if prefix + t not in have]
        configs = {}
        if missing:
            found = await ClusterGroupsReader(self.replicator.client).topic_configs(missing)
            configs = {prefix + t: c.entries for t, c in found.items() if c.error is None}
            for t, c in found.items():
                if c.error is not None:
                    log.warning(
                        "source topic configs unreadable; created with defaults",
                        topic=t,
                        error=c.error,
                    )
        plan = plan_topics(
            {prefix + t: n for t, n in source.items()},
            have,
            configs,
            replication_factor=self.settings.replication_factor,
        )
        for dest, why in plan.errors.items():
            self.topic_errors[source_of[dest]] = why
            self._said_once(
                f"topic-{dest}", "destination topic not mirrored", topic=dest, reason=why
            )
        grown = await self.destination.create_partitions(plan.grow)
        for dest, error in grown.items():
            if error is not None:
                self.topic_errors[source_of[dest]] = f"could not add partitions: {error}"
                log.error("destination partitions not added", topic=dest, error=error)
            else:
                log.info("destination partitions added", topic=dest, partitions=plan.grow[dest])
        results = await self.destination.create_topics(plan.create)
        for dest, error in results.items():
            topic = source_of.get(dest, dest)
            if error is not None:
                self.topic_errors[topic] = f"could not create the destination topic: {error}"
                log.error("destination topic not created", topic=dest, error=error)
            else:
                created = next(t for t in plan.create if t.name == dest)
                log.info(
                    "destination topic created",
                    topic=dest,
                    source_topic=topic,
                    partitions=created.partitions,
                    configs=sorted(created.configs),
                )
        await self._refresh_metadata()

    async def _topics_prepared(
        self, stop: asyncio.Event, failed: Callable[[Exception], None]
    ) -> bool:
        """Prepare the destination's topics when their chore says, until a run succeeds;
        `failed` is told each failure. False when stopped first."""
        chore = self._topics
        while not stop.is_set():
            now = _now_ms()
            if chore.start(now):
                try:
                    await self._prepare_topics()
                except (KafkaConnectionError, ProtocolError) as exc:
                    chore.failed(_now_ms())
                    failed(exc)
                    continue
                chore.succeeded(_now_ms())
                return True
            wake = chore.next_wakeup_ms(now)
            if wake is None:
                raise LocalProtocolError("waiting for a chore nobody asked for")
            await _until(stop, asyncio.sleep((wake - now) / 1000))
        return False

    async def _sync_loop(self, stop: asyncio.Event, tasks: list[asyncio.Task[None]]) -> None:
        """Every topic_sync_interval_ms (the topics chore, asked again after a back-off
        when a round failed): topics and partitions new at the source get their
        destination and their mirror (the follower replicates them first)."""
        while await self._topics_prepared(
            stop,
            lambda exc: self._warn("sync", "destination topics not synced", error=str(exc)),
        ):
            try:
                await self._sync_configs()
            except (KafkaConnectionError, ProtocolError) as exc:
                self._warn("configs", "destination topic configs not synced", error=str(exc))
            assert self.replicator.logs is not None
            logs = self.replicator.logs.partitions()
            for tp in self._mirrored_partitions():
                plog = logs.get(tp)
                if tp in self.cores or plog is None:
                    continue  # mirrored already, or not replicated yet (next round)
                self._logs[tp] = plog
                core = PartitionMirror(position=plog.log_start_offset, timing=self._timing())
                self.cores[tp] = core
                self._hold(tp, core.position)
                self._mark(tp)
                log.info("mirroring a new partition", partition=str(tp))

    async def _sync_configs(self) -> None:
        """Topic configs changed at the source are set at the destination (topics.py)."""
        topics = sorted({tp.topic for tp in self.cores})
        if not topics:
            return
        prefix = self.settings.topic_prefix
        source = await ClusterGroupsReader(self.replicator.client).topic_configs(topics)
        dest = await ClusterGroupsReader(self.client).topic_configs(prefix + t for t in topics)
        changes = {}
        for topic in topics:
            theirs, ours = source[topic], dest[prefix + topic]
            if theirs.error is None and ours.error is None:
                changed = config_changes(theirs.entries, ours.entries)
                if changed:
                    changes[prefix + topic] = changed
        for dest_topic, error in (await self.destination.alter_topic_configs(changes)).items():
            if error is None:
                log.info(
                    "destination topic configs synced",
                    topic=dest_topic,
                    configs=changes[dest_topic],
                )
            else:
                self._said_once(
                    f"configs-{dest_topic}",
                    "destination topic configs not set",
                    topic=dest_topic,
                    error=error,
                )

    def _said_once(self, key: str, event: str, **fields: Any) -> None:
        """An error said once a minute at most (a sync repeats it every round)."""
        said = self._said.should_emit(key, _now_ms())
        if said.emit:
            log.error(event, **fields)

    # -- the driver: every partition's core, one loop ------------------------------------

    async def _drive(self, stop: asyncio.Event) -> None:
        """One loop for every partition: it wakes on an event (an append, an answer, a
        read done) or at the earliest time a core asked for, lets each partition that may
        have something to do step (`_step`), then hands the batches ready for each
        destination leader to that leader's sender. It waits on nothing else: reads,
        answers, log ends and saves are tasks that mark their partition and wake it;
        `stop` wakes it too."""
        stopping = asyncio.ensure_future(stop.wait())
        stopping.add_done_callback(lambda _: self._wakeup.set())
        try:
            await self._driven(stop)
        finally:
            stopping.cancel()

    async def _driven(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            now, wall = _now_ms(), _wall_ms()
            while self._timers and self._timers[0][0] <= now:
                self._dirty.add(heapq.heappop(self._timers)[1])
            dirty, self._dirty = self._dirty, set()
            if self._metadata.start(now):
                self._spawn(self._refresh())
            ready: dict[Lane, list[tuple[TopicPartition, Send]]] = {}
            for tp in sorted(dirty):
                core = self.cores.get(tp)
                if core is not None:
                    self._step(tp, core, now, wall, ready)
            for lane, sends in ready.items():
                self._sender(lane).put_nowait(sends)
            self._wakeup.clear()
            if self._dirty:
                continue
            wakes = [self._timers[0][0]] if self._timers else []
            metadata_wake = self._metadata.next_wakeup_ms(now)
            if metadata_wake is not None:
                wakes.append(metadata_wake)
            timeout = (min(wakes) - _now_ms()) / 1000 if wakes else None
            await self._woken(timeout)

    async def _woken(self, timeout_s: float | None) -> None:
        """Until the driver's event is set, or `timeout_s` passed (None: no limit; a timer
        already due: after one turn of the loop). The wait is a coroutine awaited where it
        is made: asyncio.wait_for with a timeout already past cancels the task it wraps
        before that task starts, and the waits passed to it were then never awaited (under
        load, a timer due before the wait began: "coroutine 'Event.wait' was never
        awaited")."""
        if timeout_s is not None and timeout_s <= 0:
            await asyncio.sleep(0)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._wakeup.wait()

    def _mark(self, tp: TopicPartition) -> None:
        self._dirty.add(tp)
        self._wakeup.set()

    def _step(
        self,
        tp: TopicPartition,
        core: PartitionMirror,
        now: int,
        wall: int,
        ready: dict[Lane, list[tuple[TopicPartition, Send]]],
    ) -> None:
        """Perform what `tp`'s core decides now (`now` the monotonic clock, `wall` the
        wall clock that timestamps are judged by); nothing here decides."""
        if core.phase is Phase.HALTED:
            if tp not in self._halt_logged:
                self._halt_logged.add(tp)
                log.error("mirror halted for partition", partition=str(tp), reason=core.error)
            return
        plog = self._log(tp)
        if plog is None:
            return
        if self.settings.retention_waits:
            plog.retention_floor = core.position
        lost = core.expire(now)
        if lost is not None:
            self._renew(lost, "an expiring batch got no answer")
        self._read(tp, core, plog)
        if core.first_save_due(now):
            self._spawn(self._save_first(tp, core))
        stamp = self.session.usable
        if stamp is not None:
            if core.log_end_wanted(now):
                self._spawn(self._log_end(tp, core, stamp))
            try:
                lane = Lane(self._leader(tp), self._lane(tp))
            except LeaderNotKnownError as exc:
                # Nothing is sent, so nothing failed (no back-off grows, as it did when a
                # send was failed for it): the metadata is asked again, and every
                # partition steps once it is in.
                if not core.idle:
                    self._mark_failing(tp, str(exc))
                    self._refresh_soon()
            else:
                while (send := core.next_send(now, stamp, wall)) is not None:
                    ready.setdefault(lane, []).append((tp, send))
        wake = core.next_wakeup_ms(now)
        if wake is not None:
            heapq.heappush(self._timers, (wake, tp))

    def _read(self, tp: TopicPartition, core: PartitionMirror, plog: PartitionLog) -> None:
        """Read ahead of the sends: the next stored batches below the high watermark, on a
        worker thread, while the core wants more."""
        if tp in self._reading:
            return
        lost = core.local_log_starts_at(plog.log_start_offset)
        if lost:
            log.error(
                "local log deleted records not mirrored yet (retention): a gap",
                partition=str(tp),
                offsets_lost=lost,
                now_at=plog.log_start_offset,
            )
        budget = self.settings.buffer_bytes
        if core.scanned_to < plog.high_watermark and core.wants_more(budget):
            self._reading.add(tp)
            self._spawn(self._read_more(tp, core, plog))

    async def _read_more(
        self, tp: TopicPartition, core: PartitionMirror, plog: PartitionLog
    ) -> None:
        try:
            offset = core.scanned_to
            # Beyond the budget (a transaction waiting for its marker, a reconcile walking
            # the log) only headers are kept; their bytes are read again when sent.
            keep = core.buffered_bytes < self.settings.buffer_bytes
            high_watermark = plog.high_watermark
            data = await asyncio.to_thread(read_stored, plog, offset, self.settings.read_bytes)
            if core.scanned_to == offset and self.cores.get(tp) is core:
                entries = entries_of(data, offset, high_watermark, keep)
                if entries:
                    core.feed(entries)
        except (OSError, LogError) as exc:
            self._warn(
                "read", "local log unreadable, trying again", partition=str(tp), error=str(exc)
            )
        finally:
            self._reading.discard(tp)
            self._mark(tp)

    async def _save_first(self, tp: TopicPartition, core: PartitionMirror) -> None:
        """A new partition's first progress, saved before its first send (tried again
        when the core says, after a failure)."""
        saved = False
        try:
            await self._save()
            saved = True
        except (OSError, LogError) as exc:
            self._warn("save", "mirror progress not saved", error=str(exc))
        finally:
            # Whatever went wrong (a bug included), the core hears of it and asks again.
            if saved:
                core.first_progress_saved()
            else:
                core.first_save_failed(_now_ms())
            self._mark(tp)

    async def _log_end(
        self, tp: TopicPartition, core: PartitionMirror, stamp: ProducerStamp
    ) -> None:
        try:
            dest = self._dest(tp)
            end = (await self.destination.log_ends(self._leader(tp), [dest]))[dest]
            if end.error is not None:
                raise ProtocolError(f"{tp}: destination log end unavailable: {end.error}")
        except (KafkaConnectionError, ProtocolError, TimeoutError, OSError) as exc:
            core.log_end_failed(_now_ms())
            self._note_failing(tp, exc)
            self._refresh_soon()
            self._mark(tp)
            return
        result = core.on_log_end(stamp, end.log_end, end.high_watermark, _now_ms())
        if result.done and result.batches_found:
            log.info(
                "mirror reconciled with the destination",
                partition=str(tp),
                batches_already_there=result.batches_found,
                position=core.position,
            )
        self._mark(tp)

    # -- sending: one sender per destination leader ----------------------------------

    def _lane(self, tp: TopicPartition) -> int:
        return lane_of(tp, self.settings.connections_per_broker)

    def _sender(self, lane: Lane) -> asyncio.Queue[list[tuple[TopicPartition, Send]]]:
        queue = self._senders.get(lane)
        if queue is None:
            queue = self._senders[lane] = asyncio.Queue()
            self._spawn(self._send_loop(lane, queue))
        return queue

    async def _send_loop(
        self, lane: Lane, queue: asyncio.Queue[list[tuple[TopicPartition, Send]]]
    ) -> None:
        """Sends to one leader over one connection, in the order the cores gave them (a
        partition's sequences must reach the broker in order): as few Produce requests as
        Kafka allows, one batch per partition per request, each at most `request_bytes`
        (one batch at least); the answers are taken by `_answered` when they come."""
        while True:
            sends = await queue.get()
            while not queue.empty():
                sends += queue.get_nowait()
            try:
                # Sends rewound before they left (an older batch failed) are not sent.
                sends = self._current(sends)
                if any(s.entry.data is None for _, s in sends):
                    sends = await self._with_data(sends)
                sends, coalesced = self._coalesced(sends, await self._coalesce(sends))
                if not sends:
                    continue
                conn = await self.client.lane_connection(lane.leader, lane.index)
            except (KafkaConnectionError, ProtocolError, TimeoutError, OSError, LogError) as exc:
                for tp, send in sends:
                    self._failed_send(tp, self.cores.get(tp), send, exc)
                continue
            # Checked again with no await before the writes: a send rewound meanwhile is
            # not written (the core counts on it).
            for request in pack_requests(self._current(sends), self.settings.request_bytes):
                batches = {self._dest(tp): produced_batch(s, coalesced.get(s)) for tp, s in request}
                # Each send's batch bytes, counted when it is acknowledged: one length a
                # send (a run coalesced), not one a stored batch.
                sizes = [len(header) + len(records) for header, records in batches.values()]
                call = self.destination.produce_many(conn, batches)
                self.produce_requests += 1
                call.future.add_done_callback(
                    lambda future, request=request, sizes=sizes: self._answered(
                        request, future, sizes
                    )
                )

    def _current(
        self, sends: list[tuple[TopicPartition, Send]]
    ) -> list[tuple[TopicPartition, Send]]:
        """Sends rewound before they left (an older batch failed) are not sent."""
        out = []
        for tp, send in sends:
            core = self.cores.get(tp)
            if core is not None and core.current(send):
                out.append((tp, send))
            elif core is not None:
                core.unsent(send)
                self._mark(tp)
        return out

    async def _coalesce(
        self, sends: list[tuple[TopicPartition, Send]]
    ) -> dict[Send, bytes | RunCut]:
        """Each run of `sends` still in flight coalesced (or where it must be cut), here on
        the event loop, one run at a time with a turn of the loop between runs.

        Not on a worker thread: the work is Python under the GIL either way, so a thread
        bought no parallelism, only a second thread taking the GIL from the loop (each
        LZ4 frame's call releases it), which cost 2-3x the context switches and about a
        tenth more CPU a record on the tiny-batch bench (docs/benchmarks.md, session 13).
        A run is bounded (coalesce.py: RUN_RECORDS, run_plain_bytes), so is the loop's
        wait on one."""
        made: dict[Send, bytes | RunCut] = {}
        reader: PlainReader | None = None
        plain_limit = run_plain_bytes(self.settings.coalesce_bytes)
        for tp, send in sends:
            if not send.more:
                continue
            core = self.cores.get(tp)
            if core is None or not core.current(send):
                continue  # rewound meanwhile: not written (_current says so to its core)
            if reader is None:
                reader = PlainReader(plain_limit)
            else:
                await asyncio.sleep(0)  # answers and the driver go between runs
            made[send] = coalesced_run(send, plain_limit, reader)
        return made

    def _coalesced(
        self,
        sends: list[tuple[TopicPartition, Send]],
        made: Mapping[Send, bytes | RunCut],
    ) -> tuple[list[tuple[TopicPartition, Send]], dict[Send, bytes]]:
        """`sends` and their coalesced runs, less the runs that could not be coalesced
        whole (a batch over the run's decompressed bound, or records that do not
        decompress or rewrite): each goes again cut where that batch starts (see
        PartitionMirror.run_cut)."""
        out = []
        coalesced: dict[Send, bytes] = {}
        for tp, send in sends:
            run = made.get(send)
            if isinstance(run, RunCut):
                core = self.cores.get(tp)
                if core is not None:
                    core.run_cut(send, run.joined)
                    self._mark(tp)
                self._warn(
                    "coalesce", "a run cut short; the rest goes in later runs", partition=str(tp),
                    batches=len(send.entries), joined=run.joined, reason=run.reason,
                )  # fmt: skip
                continue
            if run is not None:
                coalesced[send] = run
            out.append((tp, send))
        return out, coalesced

    async def _with_data(
        self, sends: list[tuple[TopicPartition, Send]]
    ) -> list[tuple[TopicPartition, Send]]:
        """Batches whose bytes were not kept, read again from the local log."""
        out = []
        for tp, send in sends:
            core = self.cores.get(tp)
            plog = self._log(tp)
            if core is None or not core.current(send):
                if core is not None:
                    core.unsent(send)
                continue
            if send.entry.data is None and plog is not None:
                data = await asyncio.to_thread(read_batch, plog, send.entry.header.base_offset)
                again = core.with_data(send, data)
                if again is None:
                    core.unsent(send)
                    continue
                send = again
            out.append((tp, send))
        return out

    def _answered(
        self,
        request: list[tuple[TopicPartition, Send]],
        future: asyncio.Future[Any],
        sizes: Sequence[int],
    ) -> None:
        """A Produce's answer (or its failure), partition by partition, to the cores;
        `sizes`: the bytes of each send's batch as produced, in `request`'s order."""
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            for tp, send in request:
                self._failed_send(tp, self.cores.get(tp), send, exc)
            return
        answers = produce_answers(future.result(), [self._dest(tp) for tp, _ in request])
        now = _now_ms()
        for (tp, send), size in zip(request, sizes, strict=True):
            core = self.cores.get(tp)
            answer = answers[self._dest(tp)]
            if core is None:
                continue
            failure = answer.failure
            if failure is None:
                if not core.acked(send, answer.base_offset, now).stale:
                    self.bytes_produced += size
                self._failing.pop(tp, None)
            else:
                self.produce_errors += 1
                result = core.failed(send, failure, now, reason=answer.reason)
                if result.new_session:
                    self._renew(send.stamp, answer.error_name or "")
                elif failure is Failure.TOO_LARGE and not result.stale and not result.halted:
                    self._warn(
                        "too-large",
                        "destination refused a coalesced batch as too large; "
                        "sent again in smaller runs",
                        partition=str(tp),
                        error=answer.reason,
                    )
                elif failure is Failure.RETRY and not result.stale:
                    # Said in status too: a destination refusing every batch (for example
                    # NOT_ENOUGH_REPLICAS) otherwise shows only as growing lag.
                    self._mark_failing(
                        tp,
                        f"destination refused a batch ({answer.error_name}); retrying",
                        refused=True,
                    )
                    self._warn(
                        f"produce-{answer.error_name}",
                        "destination refused a batch, retrying",
                        partition=str(tp),
                        error=answer.error_name,
                    )
                    self._refresh_soon()
            self._mark(tp)

    def _failed_send(
        self, tp: TopicPartition, core: PartitionMirror | None, send: Send, exc: BaseException
    ) -> None:
        """No answer for `send` (connection lost, timed out, no leader known): resent."""
        if core is None:
            return
        result = core.failed(send, Failure.RETRY, _now_ms())
        if result.new_session:  # an expiring batch: reconciled, not resent (see the core)
            self._renew(send.stamp, f"an expiring batch got no answer: {exc}")
        if not result.stale:
            self._note_failing(tp, exc)
            self._refresh_soon()
        self._mark(tp)

    def _note_failing(self, tp: TopicPartition, exc: BaseException) -> None:
        self._mark_failing(tp, str(exc))
        key, event = failure_event(exc)
        self._warn(key, event, error=str(exc))

    def _mark_failing(self, tp: TopicPartition, error: str, *, refused: bool = False) -> None:
        """`tp` is not getting through, and why (status names the oldest such partition);
        `refused`: the destination answered with an error (it is reachable)."""
        since = self._failing.get(tp, ("", _wall_ms(), refused))[1]
        self._failing[tp] = (error, since, refused)

    def _renew(self, old: ProducerStamp, why: str) -> None:
        """A new producer session for the whole mirror (once, whoever lost it first: the
        session core decides)."""
        if self.session.lost(old):
            log.warning("destination producer session lost; starting a new one", error=why)
            self._spawn(self._renewed())

    async def _renewed(self) -> None:
        try:
            await self._ask_session()
        finally:
            for tp in self.cores:
                self._mark(tp)

    async def _ask_session(self) -> None:
        """InitProducerId as the session core says (at once, then after each refusal a
        back-off) until a session is granted."""
        session = self.session
        while session.usable is None:
            now = _now_ms()
            if session.ask_wanted(now):
                try:
                    stamp = await self.destination.init_producer_id()
                except (KafkaConnectionError, ProtocolError, TimeoutError, OSError) as exc:
                    session.refused(_now_ms())
                    if not self.started:
                        self._set_problem(str(exc))
                    self._warn("session", "producer session refused, retrying", error=str(exc))
                    continue
                session.granted(stamp)
                return
            wake = session.next_wakeup_ms(now)
            await asyncio.sleep(max(0, (wake if wake is not None else now) - now) / 1000)

    def _refresh_soon(self) -> None:
        """Destination metadata again (a leader may have moved): asked of its chore, which
        the driver starts when it is due (at most once a back-off)."""
        self._metadata.ask(_now_ms())
        self._wakeup.set()

    async def _refresh(self) -> None:
        """One metadata refresh the chore started; every partition steps once it is in."""
        refreshed = False
        try:
            await self._refresh_metadata()
            refreshed = True
        except (KafkaConnectionError, ProtocolError, TimeoutError, OSError):
            pass  # asked again after the chore's back-off
        finally:
            # Whatever went wrong (a bug included), the chore is not left running.
            if refreshed:
                self._metadata.succeeded(_now_ms())
            else:
                self._metadata.failed(_now_ms())
            for tp in self.cores:
                self._mark(tp)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("mirror task failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)

    # -- destination metadata -------------------------------------------------------------

    def _identity(self) -> str | None:
        """What the saved progress is valid for: the destination cluster's id, and the
        topic prefix when there is one (other names are other destination topics)."""
        cluster = self.dest_cluster.cluster_id if self.dest_cluster else None
        prefix = self.settings.topic_prefix
        return f"{cluster} prefix={prefix}" if prefix and cluster else cluster

    def _dest(self, tp: TopicPartition) -> TopicPartition:
        """The destination partition of source partition `tp`."""
        return TopicPartition(self.settings.topic_prefix + tp.topic, tp.partition)

    def _leader(self, tp: TopicPartition) -> int:
        """The destination leader of source partition `tp`'s copy."""
        meta = self.dest_cluster
        leader = meta.leader_of(self._dest(tp)) if meta is not None else None
        if leader is None or leader.leader_id < 0:
            raise LeaderNotKnownError(
                f"no leader known yet for {self._dest(tp)} at the destination (metadata refresh)"
            )
        return leader.leader_id

    async def _refresh_metadata(self) -> None:
        async with self._metadata_lock:
            source = {tp.topic for tp in self.cores} or set(self._mirrored_topics())
            prefix = self.settings.topic_prefix
            self.dest_cluster = await self.client.metadata(sorted(prefix + t for t in source))

    # -- progress ---------------------------------------------------------------------------

    async def _save_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await _until(stop, asyncio.sleep(self.settings.progress_interval_ms / 1000))
            try:
                await self._save()
            except (OSError, LogError) as exc:
                self._warn("save", "mirror progress not saved", error=str(exc))

    async def _save(self) -> None:
        async with self._save_lock:
            now = {tp: core.progress() for tp, core in self.cores.items()}
            if now == self._saved:
                return
            await asyncio.to_thread(
                progress_store.save, self.settings.data_dir, self._identity(), now
            )
            self._saved = now

    # -- helpers ----------------------------------------------------------------------------

    def _log(self, tp: TopicPartition) -> PartitionLog | None:
        plog = self._logs.get(tp)
        if plog is None and self.replicator.logs is not None:
            plog = self.replicator.logs.partitions().get(tp)
            if plog is not None:
                self._logs[tp] = plog
        return plog

    def _warn(self, key: str, event: str, **fields: Any) -> None:
        said = self._said.should_emit(key, _now_ms())
        if said.emit:
            log.warning(
                event, **fields, **({"repeated": said.suppressed} if said.suppressed else {})
            )

    def _timing(self) -> MirrorTiming:
        settings = self.settings
        return MirrorTiming(
            produce_timeout_ms=settings.produce_timeout_ms,
            request_timeout_ms=int(settings.client.request_timeout_s * 1000),
            retry_backoff_ms=settings.retry_backoff_ms,
            retry_backoff_max_ms=settings.retry_backoff_max_ms,
            max_in_flight=settings.max_in_flight,
            coalesce_bytes=settings.coalesce_bytes,
        )

    def _set_problem(self, text: str) -> None:
        if self.problem_since_ms is None:
            self.problem_since_ms = _wall_ms()
        self.problem = text

    def _current_problem(self) -> tuple[str | None, int | None, str | None]:
        """The mirror's problem, since when, and its kind: "unreachable" (no answer) or
        "refusing" (the destination answers every send of a partition with an error)."""
        unreachable = self.client.problem
        if self.problem is None and not self.started and unreachable is not None:
            return unreachable.error, unreachable.since_ms, "unreachable"
        if self.problem is not None or not self._failing:
            kind = "unreachable" if self.problem is not None else None
            return self.problem, self.problem_since_ms, kind
        tp, (error, since, refused) = min(self._failing.items(), key=lambda item: item[1][1])
        others = len(self._failing) - 1
        more = f" (and {others} more partition{'s' if others > 1 else ''})" if others else ""
        return f"{tp}: {error}{more}", since, "refusing" if refused else "unreachable"

    def _clear_problem(self) -> None:
        self.problem = None
        self.problem_since_ms = None

    # -- groups (group_sync_shell.py) ----------------------------------------------------

    def _mirrored_view(self) -> dict[TopicPartition, MirroredPartition]:
        """What the mirror has written of each partition, for the group sync."""
        return {
            tp: MirroredPartition(
                self._dest(tp),
                core.position,
                core.dest_next,
                core.offset_map,
                core.error if core.phase is Phase.HALTED else None,
            )
            for tp, core in self.cores.items()
        }

    # -- cut-over (promotion.py) ---------------------------------------------------------

    async def promote(
        self, topics: list[str] | None, timeout_s: float, force: bool
    ) -> dict[str, Any]:
        """Cut `topics` (None: every mirrored topic) over to the destination; see
        promotion.py for the rules. Raises ReplicadError for what cannot be promoted."""
        if not self.started:
            raise ReplicadError("the mirror has not started yet")
        mirrored = sorted({tp.topic for tp in self.cores})
        chosen = sorted(set(topics)) if topics else mirrored
        unknown = [t for t in chosen if t not in mirrored]
        if unknown:
            raise ReplicadError(
                f"not mirrored: {', '.join(unknown)} (mirrored: {', '.join(mirrored) or 'none'})"
            )
        tps = sorted(tp for tp in self.cores if tp.topic in chosen)
        wait = promotion.PromotionWait(_now_ms(), int(timeout_s * 1000), force=force)
        while (look := wait.look(self._figures(tps), _now_ms())).wake_ms is not None:
            for tp in tps:
                self._mark(tp)
            await asyncio.sleep(max(0, look.wake_ms - _now_ms()) / 1000)
        waiting = look.waiting
        if look.verdict is promotion.Verdict.TIMED_OUT:
            log.warning("promotion timed out; nothing promoted", topics=chosen, waiting=waiting)
            return {"promoted": False, "topics": chosen, "waiting": waiting}
        if self.settings.groups.enabled:
            try:
                await self.groups.sync_once()
            except (KafkaConnectionError, ProtocolError, TimeoutError) as exc:
                log.warning("last group sync before promotion failed", error=str(exc))
        at_ms = _wall_ms()
        await self.groups.promote(chosen, at_ms)
        figures = self._figures(tps)
        # The driver steps only the partitions in self.cores; answers still out for
        # these (only with --force) are ignored.
        for tp in tps:
            self.cores.pop(tp, None)
            plog = self._log(tp)
            if plog is not None:
                plog.retention_floor = None
        ends = await self._destination_ends([f.destination for f in figures])
        report = {
            "promoted": True,
            "forced": force,
            "topics": chosen,
            "promoted_at_ms": at_ms,
            "left_behind": waiting,
            "partitions": [promotion.partition_report(f, ends.get(f.destination)) for f in figures],
            "groups": self.groups.final_offsets({f.destination for f in figures}),
        }
        log.warning(
            "topics promoted: no longer mirrored, their groups no longer synced",
            topics=chosen,
            forced=force,
            left_behind=waiting or None,
        )
        return report

    def _figures(self, tps: list[TopicPartition]) -> list[promotion.PartitionFigures]:
        out = []
        for tp in tps:
            core = self.cores[tp]
            state = self.replicator.states.get(tp)
            plog = self._log(tp)
            out.append(
                promotion.PartitionFigures(
                    source=tp,
                    destination=self._dest(tp),
                    source_high_watermark=state.high_watermark if state is not None else -1,
                    local_high_watermark=plog.high_watermark if plog is not None else 0,
                    mirrored_offset=core.position,
                    in_flight=core.in_flight > 0,
                    halted=core.error if core.phase is Phase.HALTED else None,
                )
            )
        return out

    async def _destination_ends(self, tps: list[TopicPartition]) -> dict[TopicPartition, Any]:
        """Each destination partition's log end, or why it could not be read."""
        out: dict[TopicPartition, Any] = {}
        by_leader: dict[int, list[TopicPartition]] = {}
        try:
            meta = await self.client.metadata(sorted({tp.topic for tp in tps}))
        except (KafkaConnectionError, ProtocolError) as exc:
            return dict.fromkeys(tps, f"unreachable: {exc}")
        for tp in tps:
            leader = meta.leader_of(tp)
            if leader is None or leader.leader_id < 0:
                out[tp] = "no leader known"
            else:
                by_leader.setdefault(leader.leader_id, []).append(tp)
        for leader_id, group in by_leader.items():
            try:
                ends = await self.destination.log_ends(leader_id, group)
            except (KafkaConnectionError, ProtocolError) as exc:
                out.update(dict.fromkeys(group, f"unreachable: {exc}"))
                continue
            for tp, end in ends.items():
                out[tp] = end.error if end.error is not None else end.log_end
        return out

    # -- status -----------------------------------------------------------------------------

    def snapshot(self, *, problems_only: bool = False) -> dict[str, Any]:
        """The mirror's status (`replicad status`, metrics); `problems_only`: only the rows
        of halted partitions, the one row health reads (the status loop's, every 2 s: a
        row of every mirrored partition is about 1 KB each), the same totals."""
        partitions = []
        lag = 0
        for tp, core in sorted(self.cores.items()):
            plog = self._logs.get(tp)
            hw = plog.high_watermark if plog is not None else None
            if hw is not None:
                lag += max(0, hw - core.position)
            if problems_only and core.phase is not Phase.HALTED:
                continue
            partitions.append(
                {
                    "topic": tp.topic,
                    "partition": tp.partition,
                    "destination_topic": self._dest(tp).topic,
                    "local_log_end": plog.log_end_offset if plog is not None else None,
                    "local_high_watermark": hw,
                    "mirrored_offset": core.position,
                    "destination_next_offset": core.dest_next,
                    "lag": max(0, hw - core.position) if hw is not None else None,
                    "state": core.phase.value,
                    "offsets_kept": core.offset_map.offsets_kept,
                    "records_mirrored": core.records_mirrored,
                    "batches_skipped": core.batches_skipped,
                    "held_transactions": core.held_transactions,
                    "gap_offsets": core.gap_offsets,
                    "error": core.error or self._failing.get(tp, (None,))[0],
                }
            )
        problem, since, kind = self._current_problem()
        return {
            "destination": ",".join(self.settings.bootstrap_servers),
            "destination_cluster": self.dest_cluster.cluster_id if self.dest_cluster else None,
            "running": self.started,
            "producer_id": self.session.stamp.producer_id if self.session.stamp else None,
            "problem": problem,
            "problem_since_ms": since,
            "problem_kind": kind,
            "topic_errors": dict(self.topic_errors),
            "produce_requests": self.produce_requests,
            "produce_errors": self.produce_errors,
            "bytes_produced": self.bytes_produced,
            "session_resets": self.session.renewals,
            "lag": lag,
            "partitions": partitions,
            "groups": self.groups.snapshot(),
        }


def failure_event(exc: BaseException) -> tuple[str, str]:
    """The warning (its rate-limit key and text) for a send that got no answer: what is
    true, a leader not known yet is not an unreachable destination."""
    if isinstance(exc, LeaderNotKnownError):
        return "no-leader", "no leader known yet at the destination, refreshing metadata"
    return "unreachable", "destination unreachable, retrying"


def produced_batch(
    send: Send, coalesced: bytes | None = None
) -> tuple[bytearray, bytes | memoryview]:
    """What goes to the destination for `send`: its batch (or its run, coalesced: pass
    `coalesced_run(send, ...)`), restamped with our producer and
    sequence, as its new header and its records (a view of the bytes read from the local
    log: never copied on the way to the socket)."""
    data: bytes | memoryview
    if not send.more:
        data = send.entry.data or b""
    elif coalesced is None:
        raise LocalProtocolError("a run produced before it was coalesced")
    else:
        data = coalesced
    return restamped(data, send.stamp, send.base_sequence)


def coalesced_run(
    send: Send, plain_limit: int, reader: PlainReader | None = None
) -> bytes | RunCut:
    """`send`'s run as one batch, its records decompressed within `plain_limit` bytes, or
    where it must be cut (coalesce.py)."""
    entries = send.entries
    batches = []
    for e in entries:
        if e.data is None:
            raise LocalProtocolError("a coalesced run with a batch whose bytes were not kept")
        batches.append(e.data)
    return coalesce(batches, [e.header for e in entries], plain_limit, reader)


def coalesced_runs(sends: Sequence[Send], plain_limit: int) -> dict[Send, bytes | RunCut]:
    """Each run of `sends` coalesced, or where it must be cut: one PlainReader for them
    all."""
    reader = PlainReader(plain_limit)
    return {send: coalesced_run(send, plain_limit, reader) for send in sends}


def lane_of(tp: TopicPartition, lanes: int) -> int:
    """Which of the `lanes` connections to its leader `tp`'s Produce requests take: always
    the same one (its sequences must reach the broker in order), a topic's partitions
    spread over them (a broker reads one request at a time per connection, and holds an
    acks=all one until its replicas have it)."""
    return (zlib.crc32(tp.topic.encode()) + tp.partition) % lanes


def pack_requests(
    sends: Sequence[tuple[TopicPartition, Send]], request_bytes: int
) -> list[list[tuple[TopicPartition, Send]]]:
    """`sends` as Produce requests: one batch per partition per request (Kafka's rule), a
    partition's batches in order across requests, each request at most `request_bytes`
    of batches (one at least)."""
    queues: dict[TopicPartition, list[Send]] = {}
    for tp, send in sends:
        queues.setdefault(tp, []).append(send)
    out = []
    while queues:
        request: list[tuple[TopicPartition, Send]] = []
        size = 0
        for tp in list(queues):
            send = queues[tp][0]
            length = send_bytes(send)
            if request and size + length > request_bytes:
                continue
            request.append((tp, send))
            size += length
            queues[tp].pop(0)
            if not queues[tp]:
                del queues[tp]
        out.append(request)
    return out


def send_bytes(send: Send) -> int:
    """The stored bytes of the batches `send` produces: of its first and, for a coalesced
    run, of the run's others too (the run coalesced into one batch holds their records:
    no more than their batches' bytes). Counted by its first batch alone, a request could
    hold a 1 MiB run for every partition, past `request_bytes`."""
    return sum(
        len(entry.data) if entry.data is not None else LOG_OVERHEAD + entry.header.batch_length
        for entry in send.entries
    )


def read_entries(
    plog: PartitionLog, offset: int, high_watermark: int, max_bytes: int, keep_data: bool
) -> list[LogEntry]:
    """Whole batches from `offset` up to the high watermark (blocking): `read_stored`
    then `entries_of`, which the shell runs apart (the read on a worker thread, the rest
    on the event loop)."""
    return entries_of(read_stored(plog, offset, max_bytes), offset, high_watermark, keep_data)


def read_stored(plog: PartitionLog, offset: int, max_bytes: int) -> bytes:
    """The stored bytes from the batch holding `offset` on, about `max_bytes` (blocking:
    the log's index and segment are read, so a worker thread)."""
    region = plog.read(offset, max_bytes).region
    return b"" if region is None else region.read_bytes()


def entries_of(data: bytes, offset: int, high_watermark: int, keep_data: bool) -> list[LogEntry]:
    """The whole batches of `data` (read_stored's) from `offset` up to the high
    watermark. Nothing is decompressed here: a run's records are, when it is coalesced.
    No disk: the shell runs it on the event loop (Python work under the GIL either way:
    on the reading thread it took the GIL from the loop, as coalescing did, session 13),
    and its work is bounded by a read's bytes."""
    view = memoryview(data)
    run = scan_batches(view, verify_crc=False).run
    entries: list[LogEntry] = []
    append = entries.append
    end = run.start
    # The run's entries one after another (BatchRun's iteration, inline: once a batch).
    for fields in run.fields:
        start = end
        end = start + LOG_OVERHEAD + fields[LENGTH]
        base = fields[BASE_OFFSET]
        if base < offset:
            continue
        if base + fields[LAST_OFFSET_DELTA] >= high_watermark:  # its next offset above it
            break
        h = header_from((start, *fields))
        marker = None
        if h.magic >= MAGIC_V2 and h.attributes & CONTROL_FLAG_MASK:  # h.is_control
            records = decode_batch(data, h).records
            marker = control_marker(records[0]).type if records else None
        if not keep_data:
            append(LogEntry(h, marker))
        elif end - start <= SMALL_BATCH_BYTES:
            # A small batch is copied: a bytes object is not tracked by the cyclic
            # collector, a view is (the collector's passes were about a sixth of the
            # mirror's path on one-record batches: one object a batch fewer for them),
            # and the read's buffer is not held by its last small batch.
            append(LogEntry(h, marker, data[start:end]))
        else:
            # A view, not a copy: the read's bytes stay alive while a batch of them is
            # held, and go to the socket as they are.
            append(LogEntry(h, marker, view[start:end]))
    return entries


def read_batch(plog: PartitionLog, base_offset: int) -> memoryview:
    region = plog.read(base_offset, 0).region
    if region is None:
        raise OffsetOutOfRangeError(f"batch at {base_offset} is no longer in the local log")
    view = memoryview(region.read_bytes())
    scan = scan_batches(view, verify_crc=False)
    for h in scan.batches:
        if h.base_offset == base_offset:
            return view[h.position : h.end_position]
    raise OffsetOutOfRangeError(f"batch at {base_offset} not found in the local log")


async def _first(*aws: Any) -> None:
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


async def _until(stop: asyncio.Event, aw: Any) -> None:
    """Await `aw` unless `stop` is set first."""
    await _first(stop.wait(), aw)
