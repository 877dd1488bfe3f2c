"""The follower under simulation: the real core (`PartitionTable`, one per leader, and
`ActionPerformer`) and the real log store (`LogManager`, on a temporary directory).

What stands in for the asyncio shell is small and synchronous: routing partitions to
their leader's table from metadata (as `Replicator._apply` does), the questions and the
Fetch request of a turn, and a crash that loses what was not fsynced.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from replicad.errors import DiskFullError
from replicad.follower.assignment import LeaderInfo, LocalFacts, assign, place_all
from replicad.follower.fetch_settings import FetchSettings
from replicad.follower.partition_state import PartitionState
from replicad.follower.partition_table import PartitionTable
from replicad.follower.perform import ActionPerformer
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition


class SimDisk:
    """Whether the simulated disk is full."""

    def __init__(self) -> None:
        self.full = False


class DiskLog:
    """A PartitionLog whose appends fail with DiskFullError while the simulated disk is
    full (before anything is written, as the real log leaves a full disk: valid)."""

    __slots__ = ("_disk", "_log")

    def __init__(self, log: Any, disk: SimDisk) -> None:
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_disk", disk)

    def append(self, data: Any, batches: Any, *, now_ms: int) -> Any:
        if self._disk.full:
            raise DiskFullError(f"{self._log.topic_partition}: no space left (simulated)")
        return self._log.append(data, batches, now_ms=now_ms)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._log, name, value)


class SimFollower:
    def __init__(
        self, data_dir: Path, settings: FetchSettings, clock: Any, rng: random.Random
    ) -> None:
        self.data_dir = data_dir
        self.rng = rng
        self.settings = settings
        self.clock = clock
        self.disk = SimDisk()
        self.log_config = LogConfig(
            segment_bytes=4096, index_interval_bytes=256, segment_index_bytes=4096
        )
        self.logs: LogManager
        self.tables: dict[int, PartitionTable] = {}
        self.performers: dict[int, ActionPerformer] = {}
        self.states: dict[TopicPartition, PartitionState] = {}
        self.metadata_wanted = True
        # (partition, log end, log start) after every change the shell reports.
        self.changes: list[tuple[TopicPartition, int, int]] = []
        # The checkpoint files as of the last checkpoint: what a crash leaves.
        self._checkpoint_files: dict[str, bytes] = {}
        self.open()

    # -- life ----------------------------------------------------------------------------

    def open(self) -> None:
        self.logs = LogManager.open(self.data_dir, self.log_config, now_ms=self.clock.wall_ms)
        # A clean stop wrote checkpoint files too: they are what a later crash leaves.
        self._checkpoint_files = self._top_files()
        self.tables, self.performers, self.states = {}, {}, {}
        self.metadata_wanted = True

    def checkpoint(self) -> None:
        """What the replicator's housekeeping does every checkpoint interval."""
        self.logs.checkpoint()
        self._checkpoint_files = self._top_files()

    def _top_files(self) -> dict[str, bytes]:
        return {
            p.name: p.read_bytes()
            for p in self.data_dir.iterdir()
            if p.is_file() and not p.name.startswith(".lock")
        }

    def restart(self, *, crash: bool, cut: Any) -> None:
        """Stop and start again. A crash loses what was not fsynced: each partition keeps
        its log up to somewhere between its recovery point and its end (`cut` chooses,
        maybe inside a batch: a torn write), and the checkpoint files are the last ones."""
        cuts = {}
        if crash:
            for plog in self.logs.partitions().values():
                cuts[plog.directory] = cut(plog.recovery_point, plog.log_end_offset)
        self.logs.close()
        if crash:
            for path in self.data_dir.iterdir():
                if (
                    path.is_file()
                    and path.name not in self._checkpoint_files
                    and not (path.name.startswith(".lock"))
                ):
                    path.unlink()
            for name, data in self._checkpoint_files.items():
                (self.data_dir / name).write_bytes(data)
            for directory, (offset, torn) in cuts.items():
                _cut_partition(directory, offset, torn)
        self.open()

    def close(self) -> None:
        self.logs.close()

    # -- metadata (Replicator._apply's rules) --------------------------------------------

    def apply_metadata(self, leaders: dict[TopicPartition, LeaderInfo], now_ms: int) -> None:
        """What Replicator._apply does, through the same rules (follower/assignment.py)."""
        self.metadata_wanted = False
        plan = assign(
            self.states,
            leaders,
            {
                tp: LocalFacts(plog.topic_id, plog.log_end_offset)
                for tp, plog in self.logs.partitions().items()
            },
            now_ms=now_ms,
            is_placed=lambda s: any(s.tp in t.partitions for t in self.tables.values()),
        )
        for state, topic_id in plan.topic_ids:
            state.log.set_topic_id(topic_id)
        place_all(plan, self.states, place=self._assign, unplace=self._unassign)

    def _assign(self, state: PartitionState) -> None:
        table = self.tables.get(state.leader_id)
        if table is None:
            table = PartitionTable(
                state.leader_id, self.settings, rng=random.Random(self.rng.random())
            )
            self.tables[state.leader_id] = table
            self.performers[state.leader_id] = ActionPerformer(
                table,
                request_metadata=self._want_metadata,
                changed=self._changed,
                wall_ms=lambda: self.clock.wall_ms,
            )
        local = state.log
        if local is None:
            local = DiskLog(self.logs.get_or_create(state.tp, topic_id=state.topic_id), self.disk)
        table.add(state, local)

    def _unassign(self, state: PartitionState) -> None:
        for table in self.tables.values():
            table.remove(state.tp)

    def _changed(self, tp: TopicPartition) -> None:
        state = self.states.get(tp)
        if state is not None and state.log is not None:
            self.changes.append((tp, state.log.log_end_offset, state.log.log_start_offset))

    def _want_metadata(self, reason: str) -> None:
        self.metadata_wanted = True


def _cut_partition(directory: Path, offset: int, torn: int) -> None:
    """Keep the partition's batches below `offset` (plus `torn` bytes of the next one)."""
    logs = sorted(p for p in directory.iterdir() if p.suffix == ".log")
    cut_done = False
    for path in logs:
        base = int(path.stem)
        if cut_done:
            for sibling in directory.glob(f"{path.stem}.*"):
                sibling.unlink()
            continue
        data = path.read_bytes()
        scan = scan_batches(memoryview(data))
        for batch in scan.batches:
            if batch.next_offset > offset:
                keep = batch.position + (torn % batch.size if torn else 0)
                with path.open("r+b") as f:
                    f.truncate(keep)
                cut_done = True
                break
        if not cut_done and base >= offset:
            cut_done = True
