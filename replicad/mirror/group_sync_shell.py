"""The asyncio shell of the group sync: every `groups.sync_interval_ms` it reads the source's
groups and the destination's, asks group_sync.py what to commit, commits it
(group_writer.py) and keeps what must survive a restart (group_store.py).

One round:
1. Source: ListGroups (every broker), the groups `groups.include`/`exclude` choose whose
   protocol is a consumer's (or none: groups that only commit), then their committed
   offsets (FindCoordinator, OffsetFetch batched) -- `ClusterGroupsReader`.
2. Destination: the groups worth writing (not failed over, with an offset on a mirrored
   topic), and the groups long absent at the source that may be forgotten
   (group_sync.py): DescribeGroups (members) and OffsetFetch, through a second reader over
   the mirror's own client.
3. The mirror's partitions as they stand now (taken after the reads, so never older than
   what the destination was asked about), the plan, the state saved (the commits about
   to be sent included), then one OffsetCommit per group; the state saved again.
The loop, and what a failed round does (logged, rate-limited, named in status, tried again
next interval; replication and mirroring never wait for it), are serve's group sync's too:
groups/sync_rounds.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from replicad.clock import wall_ms as _wall_ms
from replicad.config.model import GroupsConfig
from replicad.groups.cluster_reader import ClusterGroupsReader
from replicad.groups.sync_rounds import SyncRounds
from replicad.mirror import group_store
from replicad.mirror.group_store import StoredGroups
from replicad.mirror.group_sync import DestinationGroup, GroupSync, MirroredPartition, Said
from replicad.mirror.group_writer import GroupOffsetWriter
from replicad.protocol.client import KafkaClient
from replicad.types import OffsetAndMetadata, TopicPartition

log = structlog.get_logger("replicad.mirror.groups")

GROUP_ID_NOT_FOUND = "group_id_not_found"


class GroupSyncShell:
    def __init__(
        self,
        config: GroupsConfig,
        data_dir: Path,
        source: KafkaClient,
        destination: KafkaClient,
        partitions: Callable[[], Mapping[TopicPartition, MirroredPartition]],
        identity: Callable[[], str | None],
    ) -> None:
        self.config = config
        self.data_dir = data_dir
        self.source = ClusterGroupsReader(source)
        self.destination = ClusterGroupsReader(destination)
        self.writer = GroupOffsetWriter(destination, self.destination)
        self.partitions = partitions
        self.identity = identity
        self.sync = GroupSync(sync_interval_ms=config.sync_interval_ms)
        self.promoted_at: dict[str, int] = {}
        self.rounds = 0
        self.last_round_ms: int | None = None
        self.loop = SyncRounds(config, log, "group sync")
        self._saved: StoredGroups | None = None
        self._save_lock = asyncio.Lock()
        self._round_lock = asyncio.Lock()

    @property
    def problem(self) -> str | None:
        return self.loop.problem

    # -- state across restarts --------------------------------------------------------------

    async def load(self) -> None:
        """The failed-over groups and promoted topics saved for this destination."""
        stored = await asyncio.to_thread(group_store.load, self.data_dir)
        if stored is None:
            return
        if stored.destination_cluster not in (None, self.identity()):
            log.warning(
                "mirror groups state is for another destination; not used",
                stored=stored.destination_cluster,
                destination=self.identity(),
            )
            return
        self.sync = GroupSync(
            stored.failed_over,
            stored.promoted,
            stored.written,
            stored.sent,
            sync_interval_ms=self.config.sync_interval_ms,
        )
        self.promoted_at = dict(stored.promoted)
        self._saved = stored
        for group, why in sorted(stored.failed_over.items()):
            log.info("group failed over earlier; not synced", group=group, reason=why.reason)

    async def save(self) -> None:
        async with self._save_lock:
            now = StoredGroups(
                self.identity(),
                dict(self.sync.failed_over),
                dict(self.promoted_at),
                self.sync.written,
                self.sync.sent,
            )
            if now == self._saved:
                return
            await asyncio.to_thread(group_store.save, self.data_dir, now)
            self._saved = now

    # -- the loop -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        await self.loop.run(self.sync_once, stop)

    async def sync_once(self) -> None:
        """One round (see the module docstring); also the promotion's last sync."""
        async with self._round_lock:
            await self._round()
            self.rounds += 1
            self.last_round_ms = _wall_ms()
            await self.save()

    async def _round(self) -> None:
        listing, chosen = await self.loop.chosen(self.source)
        source: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}
        unreadable = []
        for group_id, offsets in (await self.source.committed_offsets(chosen)).items():
            if offsets.error is not None:
                self.sync.failed(group_id, f"source: {offsets.error}")
                unreadable.append(group_id)
                continue
            source[group_id] = dict(offsets.offsets)
        mirrored = {tp.topic for tp in self.partitions()} | self.sync.promoted
        absent = self.sync.absent(
            _wall_ms(), source, mirrored, complete=listing.complete, unreadable=unreadable
        )
        wanted = self.sync.wanted(source, mirrored)
        asked = wanted + absent
        if not asked:
            return
        described = await self.destination.describe(asked)
        committed = await self.destination.committed_offsets(asked)
        destination = {}
        for g in asked:
            d, o = described[g], committed[g]
            destination[g] = DestinationGroup(
                members=len(d.members),
                state=d.state,
                offsets={tp: c.offset for tp, c in o.offsets.items()},
                error=_unless_absent(d.error) or _unless_absent(o.error),
            )
        plan = self.sync.plan(_wall_ms(), source, destination, self.partitions())
        self._say(plan.said)
        self._say(self.sync.forget(_wall_ms(), {g: destination[g] for g in absent}))
        if plan.commits:
            # Saved before they are sent: after a stop, what we sent is not taken for
            # someone else's commit (group_sync.py).
            await self.save()
        for group, commits in plan.commits.items():
            answers = await self.writer.commit(group, commits)
            self._say(self.sync.committed(_wall_ms(), group, commits, answers))
            taken = [tp for tp, error in answers.items() if error is None]
            if taken:
                log.debug("group offsets synced", group=group, partitions=len(taken))

    # -- operators ----------------------------------------------------------------------------

    async def resume(self, group: str) -> dict[str, Any]:
        said = self.sync.resume(group, _wall_ms())
        if said is None:
            return {"group": group, "resumed": False, "state": self.sync.state(group).value}
        self._say([said])
        await self.save()
        return {"group": group, "resumed": True, "state": self.sync.state(group).value}

    async def promote(self, topics: list[str], at_ms: int) -> None:
        self.sync.promote(topics)
        for t in topics:
            self.promoted_at.setdefault(t, at_ms)
        await self.save()

    def final_offsets(self, partitions: set[TopicPartition]) -> dict[str, dict[str, int]]:
        return self.sync.written_on(partitions)

    def snapshot(self) -> dict[str, Any]:
        snap = self.sync.snapshot()
        snap["enabled"] = self.config.enabled
        snap["rounds"] = self.rounds
        snap["last_round_ms"] = self.last_round_ms
        snap["problem"] = self.problem
        snap["promoted_topics"] = dict(sorted(self.promoted_at.items()))
        return snap

    # -- helpers ------------------------------------------------------------------------------

    def _say(self, said: list[Said] | tuple[Said, ...]) -> None:
        for s in said:
            getattr(log, s.level)(s.event, group=s.group, **s.fields)


def _unless_absent(error: str | None) -> str | None:
    # Kafka 4's coordinator answers GROUP_ID_NOT_FOUND for a group it never had (older
    # ones describe it as Dead): no members and no offsets, free to write.
    return None if error == GROUP_ID_NOT_FOUND else error
