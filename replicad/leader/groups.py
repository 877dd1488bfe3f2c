"""The group coordinator in `replicad serve` (the shell around replicad/groups/coordinator.py).

Rules:
- The coordinator decides; this shell waits. A JoinGroup or SyncGroup hands the coordinator
  a future as its token and waits on it; whichever call answers it (that one, another
  member's, or the timer) sets it. A future whose connection went away is simply never
  read.
- One timer task feeds time to the coordinator: it sleeps until the coordinator's next
  deadline (at most `MAX_TIMER_WAIT_S`), or until a request may have moved that deadline
  earlier, then polls. Every offsets_retention_check_interval_ms it expires offsets.
- Time is the wall clock in milliseconds, as Kafka's coordinator keeps it: commit
  timestamps are compared with the retention across restarts.
- Committed offsets are durable (with a store directory, as serve runs it): an
  OffsetCommit is answered only once its offsets are fsynced (groups/offset_store.py),
  written on the store's own thread; commits arriving while a write runs go together in
  the next one (one fsync for all). Deleted groups, deleted and expired offsets are written
  as removals. A write that fails answers the commit COORDINATOR_NOT_AVAILABLE (the client
  retries); the offsets stay in memory meanwhile. At start the store's offsets are restored
  as Empty groups, and the groups that are the replica's own as such.
- A group that becomes the replica's own (a member joined, a client committed) is marked so
  on disk before the request that made it so is answered -- with the commit's own offsets,
  in the same fsync: a restart never syncs the source's offsets into a group an application
  failed over to. A mark whose write failed is written with the next write.
- A read-only group's OffsetCommit (the coordinator refuses it) is logged, once a minute
  per group at most, and counted.
- ConsumerGroupHeartbeat and ConsumerGroupDescribe (KIP-848) are answered at once (a
  member of the consumer protocol never waits on the others); the coordinator is given
  every topic this node holds with its partition count, and the catalog's topic ids name
  the topics both ways.
- Nothing here blocks the loop: the coordinator is in memory and answers at once, the
  disk is the store thread's.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from replicad.clock import wall_ms
from replicad.groups.classic_group import NO_DEADLINE
from replicad.groups.coordinator import (
    CommitResult,
    CoordinatorConfig,
    GroupCoordinator,
    MemberRef,
    Reply,
    Step,
    SyncOutcome,
)
from replicad.groups.offset_store import (
    Change,
    Commit,
    GroupOwned,
    GroupRemoval,
    OffsetRemoval,
    OffsetStore,
)
from replicad.leader import group_wire
from replicad.leader.catalog import Catalog
from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import DecodedRequest
from replicad.ratelimit import RateLimitedLog
from replicad.types import OffsetAndMetadata, TopicPartition

log = structlog.get_logger("replicad.leader.groups")

# The longest the timer sleeps without looking (a deadline moved later needs no wake-up).
MAX_TIMER_WAIT_S = 1.0
# Kafka's offsets.retention.check.interval.ms.
RETENTION_CHECK_INTERVAL_MS = 600_000


class GroupService:
    """Answers the group APIs for `LeaderServer`; see the module docstring."""

    def __init__(
        self,
        catalog: Catalog,
        node: Callable[[], group_wire.Node],
        *,
        config: CoordinatorConfig | None = None,
        now_ms: Callable[[], int] = wall_ms,
        coordinator: GroupCoordinator | None = None,
        store_dir: Path | None = None,
        read_only: Callable[[str], bool] | None = None,
    ) -> None:
        self.catalog = catalog
        self._node = node
        self._now_ms = now_ms
        self.coordinator = coordinator or GroupCoordinator(config, read_only=read_only)
        self._timer: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._next_retention_check_ms = 0
        self._store_dir = store_dir
        self.store: OffsetStore | None = None
        self._writer: _DurableWriter | None = None
        # Owned marks not on disk yet (see the rules).
        self._owned_unsaved: set[str] = set()
        self.write_failures_total = 0
        self.read_only_refusals_total = 0
        self._said = RateLimitedLog(interval_ms=60_000)

    async def start(self) -> None:
        if self._store_dir is not None:
            self.store = await asyncio.to_thread(OffsetStore.open, self._store_dir)
            self.coordinator.restore(
                self.store.offsets(), now_ms=self._now_ms(), owned=self.store.owned_groups()
            )
            self._writer = _DurableWriter(self.store)
            log.info(
                "committed offsets restored",
                groups=len(self.store.state),
                offsets=self.store.live_offsets,
                path=str(self.store.path),
            )
        self._next_retention_check_ms = self._now_ms() + RETENTION_CHECK_INTERVAL_MS
        self._timer = asyncio.create_task(self._run_timer(), name="group-timer")

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
            self._timer = None
        if self._writer is not None:
            await self._writer.close()
            self._writer = None
        self.store = None

    def poke(self) -> None:
        """Have the timer look again now (something may have timed out, or a deadline moved
        earlier)."""
        self._wake.set()

    # -- requests ----------------------------------------------------------------------------

    async def answer(self, request: DecodedRequest, client_host: str) -> Any:
        """The kio response to a group API request."""
        api, version = request.head.api_key, request.head.api_version
        body = request.body
        now_ms = self._now_ms()
        try:
            response = await self._answer(
                api, version, body, request.client_id, client_host, now_ms
            )
            await self._write([])  # an owned mark this request made, if any
            return response
        finally:
            self._wake.set()

    async def _answer(
        self,
        api: int,
        version: int,
        body: Any,
        client_id: str | None,
        client_host: str,
        now_ms: int,
    ) -> Any:
        coordinator = self.coordinator
        if api == ApiKey.FIND_COORDINATOR:
            return group_wire.find_coordinator_response(version, body, self._node())
        if api == ApiKey.JOIN_GROUP:
            join = group_wire.join_request(version, body, client_id, client_host)
            result = await self._wait(lambda token: coordinator.join(join, token, now_ms=now_ms))
            return group_wire.join_response(version, result)
        if api == ApiKey.SYNC_GROUP:
            sync = group_wire.sync_request(body)
            result = await self._wait(lambda token: coordinator.sync(sync, token, now_ms=now_ms))
            return group_wire.sync_response(version, result)
        if api == ApiKey.HEARTBEAT:
            who = MemberRef(body.member_id, getattr(body, "group_instance_id", None))
            step = coordinator.heartbeat(
                str(body.group_id), int(body.generation_id), who, now_ms=now_ms
            )
            return group_wire.heartbeat_response(version, self._deliver(step))
        if api == ApiKey.LEAVE_GROUP:
            leaving = group_wire.leaving_members(version, body)
            step = coordinator.leave(str(body.group_id), leaving, now_ms=now_ms)
            return group_wire.leave_response(version, self._deliver(step))
        if api == ApiKey.OFFSET_COMMIT:
            ids = self._topic_ids(now_ms)
            ask = group_wire.commit_request(body, self._holds(now_ms), ids)
            step = coordinator.commit(
                ask.group_id,
                ask.generation_id,
                ask.member,
                ask.offsets,
                now_ms=now_ms,
                version=version,
            )
            result = await self._made_durable(ask.group_id, self._deliver(step))
            if coordinator.read_only(ask.group_id):
                self._refused_read_only(ask.group_id, client_host)
            return group_wire.commit_response(version, body, ask, result, ids)
        if api == ApiKey.OFFSET_FETCH:
            ids = self._topic_ids(now_ms)
            asks = group_wire.fetch_requests(version, body, ids)
            answers = tuple(
                (
                    a,
                    coordinator.fetch_offsets(
                        a.group_id,
                        a.partitions,
                        member_id=a.member_id,
                        member_epoch=a.member_epoch,
                    ),
                )
                for a in asks
            )
            return group_wire.fetch_response(version, answers, ids)
        if api == ApiKey.LIST_GROUPS:
            groups = coordinator.list_groups(
                getattr(body, "states_filter", ()) or (), getattr(body, "types_filter", ()) or ()
            )
            return group_wire.list_groups_response(version, groups)
        if api == ApiKey.DESCRIBE_GROUPS:
            described = tuple((str(g), coordinator.describe(str(g))) for g in body.groups)
            return group_wire.describe_groups_response(version, described)
        if api == ApiKey.DELETE_GROUPS:
            errors = coordinator.delete_groups((str(g) for g in body.groups_names), now_ms=now_ms)
            await self._write([GroupRemoval(g) for g, e in errors.items() if e == ErrorCode.none])
            return group_wire.delete_groups_response(version, errors)
        if api == ApiKey.OFFSET_DELETE:
            return await self._offset_delete(body, now_ms)
        if api == ApiKey.CONSUMER_GROUP_HEARTBEAT:
            beat = group_wire.consumer_heartbeat_request(
                body,
                client_id,
                client_host,
                lambda topic_id: self.catalog.topic_name(topic_id, now_ms=now_ms),
                lambda: str(uuid.uuid4()),
            )
            result = coordinator.consumer_heartbeat(beat, self.topic_sizes(now_ms), now_ms=now_ms)
            return group_wire.consumer_heartbeat_response(version, result, self._topic_id(now_ms))
        if api == ApiKey.CONSUMER_GROUP_DESCRIBE:
            described = tuple(coordinator.describe_consumer_group(str(g)) for g in body.group_ids)
            return group_wire.consumer_describe_response(version, described, self._topic_id(now_ms))
        raise AssertionError(f"not a group api: {api}")

    def topic_sizes(self, now_ms: int) -> dict[str, int]:
        """Each topic this node holds and how many of its partitions, from 0 on without a
        gap, it holds (what a consumer group's assignor may give out)."""
        sizes = {}
        for name, entry in self.catalog.topics(now_ms=now_ms).items():
            count = 0
            while count in entry.partitions:
                count += 1
            if count:
                sizes[name] = count
        return sizes

    def _topic_id(self, now_ms: int) -> Callable[[str], uuid.UUID | None]:
        return lambda name: self.catalog.topic_id(name, now_ms=now_ms)

    def _topic_ids(self, now_ms: int) -> group_wire.TopicIds:
        return group_wire.TopicIds(
            lambda topic_id: self.catalog.topic_name(topic_id, now_ms=now_ms),
            self._topic_id(now_ms),
        )

    # -- offsets synced from the source (leader/source_group_sync.py) ------------------------

    def readable_ends(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The high watermark of each of `partitions` this node holds (what a consumer
        can read here); the others are left out."""
        now_ms = self._now_ms()
        ends = {}
        for tp in partitions:
            partition = self.catalog.partition(tp, now_ms=now_ms)
            if partition is not None:
                ends[tp] = partition.high_watermark
        return ends

    async def take_synced(
        self, group_id: str, offsets: Mapping[TopicPartition, OffsetAndMetadata]
    ) -> SyncOutcome:
        """A source group's planned offsets, taken by the coordinator's rule and written to
        the store. A failed write leaves them in memory only (logged, counted); after a
        restart a round brings them again, unless the group became the replica's own."""
        outcome = self.coordinator.sync_offsets(group_id, offsets, now_ms=self._now_ms())
        if outcome.applied:
            await self._write([Commit(group_id, tp, o) for tp, o in outcome.applied.items()])
        return outcome

    def _refused_read_only(self, group_id: str, client_host: str) -> None:
        self.read_only_refusals_total += 1
        if self._said.should_emit(group_id, self._now_ms()).emit:
            log.warning(
                "OffsetCommit refused: the group is read-only on this replica "
                "(groups.read_only); its offsets come from the source",
                group=group_id,
                client=client_host,
            )

    async def _offset_delete(self, body: Any, now_ms: int) -> Any:
        holds = self._holds(now_ms)
        group_id = str(body.group_id)
        partitions = group_wire.offset_delete_partitions(body)
        refused = {tp: ErrorCode.unknown_topic_or_partition for tp in partitions if not holds(tp)}
        wanted = [tp for tp in partitions if tp not in refused]
        result = self.coordinator.delete_offsets(group_id, wanted, now_ms=now_ms)
        await self._write([OffsetRemoval(group_id, tp) for tp in result.deleted])
        return group_wire.offset_delete_response(body, result, refused)

    async def _made_durable(self, group_id: str, result: CommitResult) -> CommitResult:
        """`result` once its commits are on disk; if the write failed, every partition it
        committed is COORDINATOR_NOT_AVAILABLE (the client commits again)."""
        changes = [Commit(group_id, tp, offset) for tp, offset in result.committed.items()]
        if await self._write(changes):
            return result
        errors = dict(result.errors)
        for tp in result.committed:
            errors[tp] = ErrorCode.coordinator_not_available
        return CommitResult(errors)

    async def _write(self, changes: Sequence[Change]) -> bool:
        """Whether `changes` are durable (True without a store: nothing to make durable),
        written with the owned marks not yet on disk."""
        self._owned_unsaved.update(self.coordinator.take_newly_owned())
        if self._writer is None or not (changes or self._owned_unsaved):
            return True
        marks = sorted(self._owned_unsaved)
        self._owned_unsaved.clear()
        try:
            await self._writer.write([*(GroupOwned(g) for g in marks), *changes])
        except OSError as exc:
            self._owned_unsaved.update(marks)
            self.write_failures_total += 1
            log.error("committed offsets could not be written", error=str(exc))
            return False
        return True

    def _holds(self, now_ms: int) -> Callable[[Any], bool]:
        return lambda tp: self.catalog.partition(tp, now_ms=now_ms) is not None

    async def _wait(self, call: Callable[[asyncio.Future[Any]], Step]) -> Any:
        """Ask the coordinator with a future as the token; wait for its answer."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._deliver(call(future))
        return await future

    @staticmethod
    def _deliver(step: Step) -> Any:
        _settle(step.replies)
        return step.result

    # -- time --------------------------------------------------------------------------------

    async def _run_timer(self) -> None:
        while True:
            deadline = self.coordinator.next_deadline_ms()
            wait_s = MAX_TIMER_WAIT_S
            if deadline != NO_DEADLINE:
                wait_s = min(wait_s, max(0.0, (deadline - self._now_ms()) / 1000))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._wake.wait()
            now_ms = self._now_ms()
            try:
                _settle(self.coordinator.poll(now_ms=now_ms).replies)
                if now_ms >= self._next_retention_check_ms:
                    self._next_retention_check_ms = now_ms + RETENTION_CHECK_INTERVAL_MS
                    self._expire(now_ms)
            except Exception:  # a bug of ours must not stop every group's clock
                log.exception("group coordinator timer failed")

    def _expire(self, now_ms: int) -> None:
        removed = self.coordinator.expire_offsets(now_ms=now_ms)
        changes = [OffsetRemoval(g, tp) for g, tps in removed.items() for tp in tps]
        if changes:
            task = asyncio.ensure_future(self._write(changes))
            task.add_done_callback(_background.discard)
            _background.add(task)
        if removed:
            log.info(
                "committed offsets expired",
                groups=len(removed),
                offsets=sum(len(v) for v in removed.values()),
            )

    def metrics(self) -> dict[str, Any]:
        store = self.store
        return {
            "groups": self.coordinator.states(),
            "group_rebalances_total": self.coordinator.rebalances_total,
            "offset_commits_total": self.coordinator.commits_total,
            "offset_store_write_failures_total": self.write_failures_total,
            "read_only_commit_refusals_total": self.read_only_refusals_total,
            "offset_store_records": store.records if store is not None else 0,
            "offset_store_compactions_total": store.compactions if store is not None else 0,
        }


# Expiry writes run in the background; held here so none is collected before it ends.
_background: set[asyncio.Future[Any]] = set()


class _DurableWriter:
    """Appends to the store on a thread of its own, one write at a time; whatever arrives
    during a write goes in the next, together (one fsync)."""

    def __init__(self, store: OffsetStore) -> None:
        self._store = store
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="group-offsets")
        self._pending: list[tuple[Sequence[Change], asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def write(self, changes: Sequence[Change]) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((changes, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="group-offsets-flush")
        await future

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending, []
            changes = [change for part, _ in batch for change in part]
            try:
                await loop.run_in_executor(self._executor, self._store.append, changes)
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
            else:
                for _, future in batch:
                    if not future.done():
                        future.set_result(None)

    async def close(self) -> None:
        if self._flusher is not None:
            with contextlib.suppress(Exception):
                await self._flusher
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._store.close)
        self._executor.shutdown(wait=True)


def _settle(replies: Iterable[Reply]) -> None:
    for reply in replies:
        future = reply.token
        assert isinstance(future, asyncio.Future)
        if not future.done():
            future.set_result(reply.result)
