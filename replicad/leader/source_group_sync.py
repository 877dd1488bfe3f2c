"""The source's consumer-group offsets synced into serve's coordinator: `replicad run` with a
`serve:` section and `groups.enabled` (the asyncio shell around groups/offset_sync.py's plan
and the coordinator's `sync_offsets` rule), so an application fails over to serve with its
group id and resumes where it committed at the source.

Where it runs, and why there: in `replicad run`'s own process, beside the `serve:` section's
server, feeding that server's coordinator directly -- not as a second process writing the
store on disk.
- One process per data directory: the log store holds an exclusive flock, so a standalone
  `replicad serve` cannot open a data directory a running `run` replicates into (and two
  writers of the append-only store would interleave records).
- "No members here, never the replica's own" is the coordinator's knowledge, in memory. Asked
  on the same event loop, the sync's decision and a JoinGroup or OffsetCommit never
  interleave: a group a member joins is never written after the join, and the synced
  offsets go through the same durable writer, in the same order, as the clients' commits.
- A standalone `replicad serve` started on the data directory later (the source gone, `run`
  stopped) restores the synced offsets and the owned marks from the store as they were.

One round, every groups.sync_interval_ms:
1. ListGroups at the source (every broker); the groups groups.include/exclude choose whose
   protocol type is the consumer's or none (groups that only commit). Groups that are the
   replica's own (a member joined or a client committed here: never synced again) or have
   members here now are not read.
2. The others' committed offsets (FindCoordinator, OffsetFetch) through ClusterGroupsReader,
   the reader the mirror's group sync uses too.
3. Per group: plan_group_sync against the replica's high watermarks now (replicated
   partitions only, as they are: our offsets are the source's; an offset beyond the high
   watermark held there and counted), then the coordinator takes what changed and it is
   written to the store (GroupService.take_synced).
A group whose sync stops because it became the replica's own is logged once. The loop, and
what a failed round does (logged, named in status, tried again next interval; replication
and serving never wait for it), are the mirror's group sync's too: groups/sync_rounds.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from replicad.clock import wall_ms
from replicad.config.model import GroupsConfig
from replicad.groups.cluster_reader import ClusterGroupsReader
from replicad.groups.offset_sync import plan_group_sync
from replicad.groups.sync_rounds import SyncRounds
from replicad.leader.groups import GroupService
from replicad.protocol.client import KafkaClient

log = structlog.get_logger("replicad.leader.group_sync")


def read_only_groups(config: GroupsConfig) -> Callable[[str], bool] | None:
    """groups.read_only: which groups serve refuses OffsetCommit for -- those the sync
    chooses (include/exclude); None when no group is read-only."""
    if not (config.enabled and config.read_only):
        return None
    return config.selects


class SourceGroupSync:
    """See the module docstring."""

    def __init__(self, config: GroupsConfig, source: KafkaClient, groups: GroupService) -> None:
        self.config = config
        self.reader = ClusterGroupsReader(source)
        self.groups = groups
        self.rounds = 0
        self.last_round_ms: int | None = None
        self.loop = SyncRounds(config, log, "serve's group sync")
        self.errors_total = 0
        self.offsets_synced_total = 0
        # As of the last round: groups whose offsets were taken, partitions held at the
        # replica's end, partitions of topics the replica does not hold.
        self.synced: set[str] = set()
        self.held = 0
        self.not_replicated = 0
        # Groups whose sync has stopped for good (logged once each).
        self.stopped: set[str] = set()

    @property
    def problem(self) -> str | None:
        return self.loop.problem

    async def run(self, stop: asyncio.Event) -> None:
        await self.loop.run(self.sync_once, stop, self._failed)

    async def sync_once(self) -> None:
        """One round (see the module docstring)."""
        _, chosen = await self.loop.chosen(self.reader)
        coordinator = self.groups.coordinator
        for group_id in chosen:
            if group_id in coordinator.owned:
                self._stop(group_id)
        wanted = [g for g in chosen if g not in coordinator.owned and not self._has_members(g)]
        synced: set[str] = set()
        held = not_replicated = 0
        for group_id, read in (await self.reader.committed_offsets(wanted)).items():
            if read.error is not None:
                self.errors_total += 1
                self.loop.warn(
                    f"group:{group_id}",
                    "source group's offsets unreadable; not synced this round",
                    group=group_id,
                    error=read.error,
                )
                continue
            # The high watermarks as they are now, after the source was read: never older
            # than the commits they are held to.
            plan = plan_group_sync(read.offsets, self.groups.readable_ends(read.offsets))
            outcome = await self.groups.take_synced(group_id, plan.offsets)
            if outcome.stopped:
                # A member joined while the source was read: over for good if that made the
                # group the replica's own (a read-only group waits for its members to leave).
                if group_id in coordinator.owned:
                    self._stop(group_id)
                continue
            self.offsets_synced_total += len(outcome.applied)
            held += len(plan.held)
            not_replicated += len(plan.not_replicated)
            if plan.offsets:
                synced.add(group_id)
            if outcome.applied:
                log.debug("group offsets synced", group=group_id, partitions=len(outcome.applied))
        self.synced, self.held, self.not_replicated = synced, held, not_replicated
        self.rounds += 1
        self.last_round_ms = wall_ms()

    def _has_members(self, group_id: str) -> bool:
        group = self.groups.coordinator.groups.get(group_id)
        return group is not None and bool(group.members)

    def _stop(self, group_id: str) -> None:
        if group_id not in self.stopped:
            self.stopped.add(group_id)
            self.synced.discard(group_id)
            log.info(
                "group failed over to the replica: its offsets are no longer synced from "
                "the source (its own commits on serve win)",
                group=group_id,
            )

    def _failed(self, problem: str) -> None:
        self.errors_total += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "rounds_total": self.rounds,
            "last_round_ms": self.last_round_ms,
            # How old serve's copy of the source's offsets may be: since the last round ended.
            "sync_lag_ms": None if self.last_round_ms is None else wall_ms() - self.last_round_ms,
            "problem": self.problem,
            "errors_total": self.errors_total,
            "groups_synced": len(self.synced),
            "groups_failed_over": len(self.stopped),
            "offsets_synced_total": self.offsets_synced_total,
            "held_offsets": self.held,
            "not_replicated_offsets": self.not_replicated,
        }
