"""The follower under simulation: the real core (`PartitionTable`, one per leader, and
`ActionPerformer`) and the real log store (`LogManager`, on a temporary directory).

What stands in for the asyncio shell is small and synchronous: routing partitions to
their leader's table from metadata (as `Replicator._apply` does), the questions and the
Fetch request of a turn, and a crash that loses what was not fsynced.

The durability thread is its real queue (replicad/follower/disk_queue.py) without the
thread: the log store hands it flushes, leader-epoch files and unlinks as it does in the
daemon, checkpoints are asked there, and the simulation runs the next job when it draws a
`disk` event. A crash loses the jobs not run: the leader-epoch files are what the jobs
(or the appends that write them at once) last wrote. What was fsynced is watched on its
own (`FsyncWitness`): a checkpoint may never name a recovery point past it.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from replicad.errors import DiskFullError
from replicad.follower.assignment import LeaderInfo, LocalFacts, assign, place_all
from replicad.follower.disk_queue import DiskQueue
from replicad.follower.fetch_settings import FetchSettings
from replicad.follower.partition_state import PartitionState
from replicad.follower.partition_table import PartitionTable
from replicad.follower.perform import ActionPerformer
from replicad.log.checkpoint import parse_offsets
from replicad.log.config import LogConfig
from replicad.log.layout import LEADER_EPOCH_CHECKPOINT, RECOVERY_POINT_CHECKPOINT
from replicad.log.manager import LogManager
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.sim.invariants import FsyncWitness, InvariantError


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
        self,
        data_dir: Path,
        settings: FetchSettings,
        clock: Any,
        rng: random.Random,
        *,
        durability_queue: bool = True,
    ) -> None:
        # False: disk work runs where it is asked, as without a durability thread.
        self.durability_queue = durability_queue
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
        # The durability thread's queue (its jobs run at the simulation's `disk` events).
        self.jobs = DiskQueue()
        self.witness = FsyncWitness()
        # Crashes that found a partition truncated below its checkpointed recovery point.
        self.stale_recovery_points = 0
        self.open()

    # -- life ----------------------------------------------------------------------------

    def open(self) -> None:
        self.logs = LogManager.open(self.data_dir, self.log_config, now_ms=self.clock.wall_ms)
        if self.durability_queue:  # as Replicator.run hands them to its durability thread
            self.logs.flush_later = lambda p: self.jobs.ask(
                p.flush, f"flush of {p.topic_partition}"
            )
            self.logs.disk_later = self.jobs.ask
        # A clean stop wrote checkpoint files too: they are what a later crash leaves.
        self._checkpoint_files = self._top_files()
        self.tables, self.performers, self.states = {}, {}, {}
        self.metadata_wanted = True

    def checkpoint(self) -> None:
        """What the replicator's housekeeping does every checkpoint interval."""
        self.logs.checkpoint()
        self._checkpoint_files = self._top_files()

    def run_disk_job(self) -> str | None:
        """The durability thread's next job, run now; what it was (None: nothing queued)."""
        job = self.jobs.next()
        if job is None:
            return None
        job.run()
        return job.what

    def drain_disk_jobs(self) -> None:
        while self.run_disk_job() is not None:
            pass

    def checkpointed_recovery_points(self) -> dict[TopicPartition, int]:
        """The recovery points of the checkpoint file a crash would leave."""
        data = self._checkpoint_files.get(RECOVERY_POINT_CHECKPOINT)
        if data is None:
            return {}
        return parse_offsets(data.decode(), source=RECOVERY_POINT_CHECKPOINT)

    def check_checkpoint(self) -> None:
        """Rule 7: the checkpoint just written names no recovery point past what was
        fsynced (the witness saw the bytes of every batch below it on disk)."""
        for tp, point in self.checkpointed_recovery_points().items():
            plog = self.logs.partitions().get(tp)
            if plog is None:
                continue
            durable = self.witness.durable_end(plog)
            if min(point, plog.log_end_offset) > durable:
                raise InvariantError(
                    f"{tp}: the checkpoint names recovery point {point}, but only the data "
                    f"below {durable} was fsynced (log [{plog.log_start_offset}, "
                    f"{plog.log_end_offset}))"
                )

    def _top_files(self) -> dict[str, bytes]:
        return {
            p.name: p.read_bytes()
            for p in self.data_dir.iterdir()
            if p.is_file() and not p.name.startswith(".lock")
        }

    def restart(self, *, crash: bool, cut: Any, lose_write: Any = None, tear: Any = None) -> None:
        """Stop and start again. A crash loses what was not fsynced: each partition keeps
        its log up to somewhere between its recovery point and its end (`cut` chooses,
        maybe inside a batch: a torn write), and the checkpoint files are the last ones.
        `lose_write`, given a partition's batches not yet fsynced ((file, position, size),
        in any segment), names those whose write the disk lost while later ones were kept
        (unsynced pages reach the disk in any order): their bytes read back as zeros.
        `tear`, given a segment file left behind by a roll whose tail the witness never saw
        fsynced ((file, durable bytes, size)), says how many bytes of it the disk kept: each
        file's unsynced tail is lost on its own, whatever later segments kept (a roll fsyncs
        the segment it leaves, so with the log store as it is no file is ever torn so)."""
        cuts = {}
        lost: list[tuple[Path, int, int]] = []
        torn: list[tuple[Path, int]] = []
        epoch_files: dict[Path, bytes | None] = {}
        if crash:
            self.jobs.discard()  # the thread's jobs not run die with the process
            checkpointed = self.checkpointed_recovery_points()
            for tp, plog in self.logs.partitions().items():
                cuts[plog.directory] = cut(plog.recovery_point, plog.log_end_offset)
                path = plog.directory / LEADER_EPOCH_CHECKPOINT
                epoch_files[path] = path.read_bytes() if path.exists() else None
                if checkpointed.get(tp, 0) > plog.recovery_point:
                    # Truncated below what the checkpoint file names since it was written:
                    # loading trusts that stale recovery point (log/partition.py says why
                    # that is safe).
                    self.stale_recovery_points += 1
                if lose_write is not None:
                    lost.extend(lose_write(self._unsynced_batches(plog)))
                if tear is not None:
                    for segment in plog.segments[:-1]:
                        path = Path(segment.log_path)
                        size = path.stat().st_size
                        durable = self.witness.durable_bytes(path)
                        if durable < size:
                            torn.append((path, tear(path, durable, size)))
        else:
            self.drain_disk_jobs()
        self.logs.close()
        for path, text in epoch_files.items():  # what close wrote was never durable
            if text is not None and path.parent.exists():
                path.write_bytes(text)
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
            for path, position, size in lost:  # before the cuts: positions of now
                _lose_write(path, position, size)
            for path, keep in torn:
                with path.open("r+b") as f:
                    f.truncate(keep)
            for directory, (offset, torn) in cuts.items():
                _cut_partition(directory, offset, torn)
        self.witness.settle_on_disk(self.data_dir)
        self.open()

    def _unsynced_batches(self, plog: Any) -> list[tuple[Path, int, int]]:
        """The batches of `plog` whose bytes the witness never saw fsynced."""
        out = []
        for segment in plog.segments:
            path = Path(segment.log_path)
            data = path.read_bytes()
            synced = self.witness.synced.get(str(path), b"")
            for batch in scan_batches(memoryview(data)).batches:
                at, to = batch.position, batch.position + batch.size
                if synced[at:to] != data[at:to]:
                    out.append((path, at, batch.size))
        return out

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
        place_all(plan, self.states, place=self._assign, unplace=self._unassign, touch=self._touch)

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

    def _touch(self, state: PartitionState) -> None:
        for table in self.tables.values():
            table.touched(state.tp)

    def _unassign(self, state: PartitionState) -> None:
        for table in self.tables.values():
            table.remove(state.tp)

    def _changed(self, tp: TopicPartition) -> None:
        state = self.states.get(tp)
        if state is not None and state.log is not None:
            self.changes.append((tp, state.log.log_end_offset, state.log.log_start_offset))

    def _want_metadata(self, reason: str) -> None:
        self.metadata_wanted = True


def _lose_write(path: Path, position: int, size: int) -> None:
    """A write the disk lost: its bytes read back as zeros (the file keeps its length)."""
    with path.open("r+b") as f:
        f.seek(position)
        f.write(bytes(size))


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
