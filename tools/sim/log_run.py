"""One seeded crash simulation of the log store: the real LogManager and PartitionLogs on a
temporary directory, crashed where a roll, a truncation or a checkpoint left them, losing
exactly what was not durable.

    python -m tools.sim.log_run --seed N [-v] | --seeds N [--first S] [--events E]

The follower's simulation (run.py) drives the log store through the follower's core, where
a truncation below a checkpointed recovery point is rare (it needs an unclean election the
follower had fetched past); here the log store is driven directly, as the follower's
performer drives it, so that the windows between a truncation, a roll and the next
checkpoint are common: one or two partitions with small segments (a roll every few
batches).

Events, drawn with weights from the seed: appends at the log end (a new leader epoch now
and then), truncations (anywhere at or above the log start, as at a divergence; half of
them followed by batches of the epoch that ended there, as when the leader's log went on
in it), flushes, checkpoints (the recovery-point file names each partition's recovery
point), log start moves (DeleteRecords, retention), clean restarts and crashes; and, drawn
from a Random of their own after any event (so that each seed's other events are those it
drew before they existed), StartAts (the follower's `truncate_fully_and_start_at`: mostly
at or past the log end, half the time twice in a row, so that an empty log's StartAt
comes). The log store hands its deferred disk work (a truncation's fsyncs and unlinks, a
roll's fsyncs, leader-epoch files) to the real durability queue
(replicad/follower/disk_queue.py), whose jobs run at `disk` events and before most
checkpoints (asked of the same thread; now and then a job was asked after the checkpoint's
turn began, as the event loop may while the thread runs it); a crash loses the jobs not
run.

A crash loses exactly what was not durable. Every fsync of a segment file is witnessed
(invariants.FsyncWitness); per `.log` file, what its last fsync covered stays, and its
unsynced tail is lost on its own at a random point (maybe inside a batch), whatever the
other files kept (unsynced pages reach the disk in any order). A truncation since the last
fsync may be lost too (`resurrect`): the filesystem had not committed the shorter length,
so the old, synced bytes past what was written since come back. The checkpoint files, the
leader-epoch file and the partition metadata are written atomically (durable once
written). Index files are kept as they were (loading rebuilds what it scans). Names are
durable only when their directory is fsynced (`lose_names`, on by default): a crash loses,
half the time, every name change in a partition's directory since its last fsync -- a file
created since is gone, a file renamed since is back under its old name, and so is a file
such a rename replaced -- as a filesystem that does not order metadata across files may
(btrfs's fsync log tree; ext4 and xfs journal it in order). An unlink stays done (its
bytes are gone: the model cannot bring them back).

After every crash the log store loads, and for each partition:
1. the log scans whole: every batch intact, each starting where the one before it ends;
2. every batch is one the log held at that offset at some time (no zeros, no mixture);
3. what the log store reported durable is there: every batch below the lower of the
   recovery point the checkpoint file named and every truncation since is the batch the
   log held there before the crash, and so is every batch below the recovery point it
   loads (it claims them durable again);
4. from its first entry on, the leader-epoch cache it loads says what its batches carry:
   each batch the epoch of the entry covering it, each later entry starting at a batch of
   its epoch (the epoch file may be written late: log/partition.py's epoch-file rules);
5. it starts at or above the log start the checkpoint file named (or at its end, if that
   is lower). Below a log start no checkpoint named yet, what a move deleted may come
   back, whole segments whose renames were lost as the batches below a start inside a
   segment do (the log held them there: rule 3 counts them as it held them).
A clean restart loses nothing: each log is exactly what it was.
"""

from __future__ import annotations

import random
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

from replicad.follower.disk_queue import DiskQueue
from replicad.log.config import LogConfig
from replicad.log.layout import LOCK_FILE
from replicad.log.manager import LogManager
from replicad.log.partition import PartitionLog
from replicad.records.batch import ScanStop, scan_batches
from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch
from tools.sim.invariants import FsyncWitness, local_bytes
from tools.sim.seeds import SCRATCH, InvariantError, SimResult, seed_main, stepped
from tools.sim.seeds import run_seeds as seeds_run

REPLAY = "python -m tools.sim.log_run --seed {seed}"

WEIGHTS: dict[str, int] = {
    "append": 12,
    "truncate": 3,
    "flush": 2,
    "checkpoint": 3,
    "start_move": 1,
    "restart": 1,
    "crash": 2,
    "tick": 2,
    "disk": 3,
}
# After each event, a StartAt of one partition this often (drawn from its own Random).
START_AT_RATE = 0.08


class LogSimulation:
    def __init__(
        self,
        seed: int,
        data_dir: Path,
        witness: FsyncWitness,
        *,
        resurrect: bool = True,
        lose_names: bool = True,
        start_at_rate: float = START_AT_RATE,
        weights: Mapping[str, int] = WEIGHTS,
    ) -> None:
        self.rng = random.Random(seed)
        rng = self.rng
        # The StartAts and the directory names a crash loses are drawn from Randoms of their
        # own: the events the main one draws stay those each seed drew before they existed
        # (a seeded test's planted defect is found by the seeds it was found by).
        self.start_rng = random.Random(f"start_at-{seed}")
        self.names_rng = random.Random(f"names-{seed}")
        self.order_rng = random.Random(f"order-{seed}")
        self.start_at_rate = start_at_rate
        self.data_dir = data_dir
        # False: a truncation is always durable at once (the crash keeps what the file holds
        # now, up to its unsynced tail); True: a crash may lose a truncation not yet synced.
        self.resurrect = resurrect
        # True: a crash may lose every name change in a partition's directory since its last
        # fsync (files created, renamed); False: they are all durable at once.
        self.lose_names = lose_names
        self.weights = dict(weights)
        self.config = LogConfig(
            segment_bytes=rng.choice((300, 600, 1_200)),
            index_interval_bytes=rng.choice((64, 256)),
            segment_index_bytes=4_096,
        )
        self.tps = [TopicPartition("t", p) for p in range(rng.randint(1, 2))]
        self.now_ms = 1_700_000_000_000
        self.witness = witness  # installed: it sees every fsync from here on
        self.log: list[str] = []
        self.counts: Counter[str] = Counter()
        # Every batch each partition's log ever held, by base offset (rule 2).
        self.written: dict[TopicPartition, dict[int, set[bytes]]] = {tp: {} for tp in self.tps}
        # The batch the log held at each offset a log start move passed, when it passed it
        # (what rule 5 lets a crash bring back from a `.deleted` segment).
        self.moved_past: dict[TopicPartition, dict[int, bytes]] = {tp: {} for tp in self.tps}
        self.epoch = {tp: 0 for tp in self.tps}
        self.top_epoch = {tp: 0 for tp in self.tps}
        self.serial = 0
        # What the log store reported durable: the recovery point the checkpoint file names,
        # lowered by every truncation since (rule 3); and the log start it names (rule 5).
        self.durable: dict[TopicPartition, int] = {}
        self.durable_start: dict[TopicPartition, int] = {}
        # The durability thread's queue, without the thread: its jobs (truncations' disk
        # work, leader-epoch files, unlinks) run at `disk` events; a crash loses those not run.
        self.jobs = DiskQueue()
        self.logs = self._open()
        for tp in self.tps:
            self.logs.get_or_create(tp)

    def _open(self) -> LogManager:
        logs = LogManager.open(self.data_dir, self.config, now_ms=self.now_ms)
        logs.disk_later = self.jobs.ask  # as Replicator.run hands them to its thread
        return logs

    # -- events --------------------------------------------------------------------------

    def event(self) -> None:
        kind = self.rng.choices(list(self.weights), list(self.weights.values()))[0]
        tp = self.rng.choice(self.tps)
        plog = self.logs.partitions()[tp]
        if kind == "append":
            self._append(tp, plog)
        elif kind == "truncate" and plog.log_end_offset > plog.log_start_offset:
            offset = self.rng.randint(plog.log_start_offset, plog.log_end_offset - 1)
            plog.truncate_to(offset)
            if tp in self.durable:
                self.durable[tp] = min(self.durable[tp], plog.log_end_offset)
            latest = plog.latest_epoch()
            if latest is not None and self.rng.random() < 0.5:
                # The leader's log goes on in the epoch that ended where ours diverged: the
                # next batches carry it again, below the epochs the truncation removed.
                self.epoch[tp] = latest
            self._note(f"truncate {tp} to {offset}: log ends at {plog.log_end_offset}")
        elif kind == "flush":
            plog.flush()
            self._note(f"flush {tp}: recovery point {plog.recovery_point}")
        elif kind == "checkpoint":
            # Asked of the durability thread, it runs after the jobs asked before it; now and
            # then a job was asked while it ran (after its turn began, before its flushes).
            if self.order_rng.random() < 0.7:
                self._drain()
            self.logs.checkpoint()
            self.durable = {t: p.recovery_point for t, p in self.logs.partitions().items()}
            self.durable_start = {t: p.log_start_offset for t, p in self.logs.partitions().items()}
            self._note(f"checkpoint {sorted(self.durable.items())}")
        elif kind == "start_move" and plog.log_end_offset > plog.log_start_offset:
            offset = self.rng.randint(plog.log_start_offset + 1, plog.log_end_offset)
            data = local_bytes(plog)
            for b in scan_batches(memoryview(data)).batches:
                if b.next_offset <= offset:
                    self.moved_past[tp][b.base_offset] = data[b.position : b.position + b.size]
            plog.maybe_increment_log_start_offset(offset)
            self._note(f"start_move {tp} to {offset}")
        elif kind in ("restart", "crash"):
            self._restart(crash=kind == "crash")
        elif kind == "tick":
            self.now_ms += self.rng.choice((1, 1_000, 60_000))
            self._note("tick")
        elif kind == "disk":
            job = self.jobs.next()
            if job is not None:
                job.run()
                self._note(f"disk {job.what}")
        if self.start_rng.random() < self.start_at_rate:
            tp = self.start_rng.choice(self.tps)
            self._start_at(tp, self.logs.partitions()[tp])

    def _start_at(self, tp: TopicPartition, plog: PartitionLog) -> None:
        """The follower's StartAt: the leader's log starts past ours (mostly), or a reset
        below our end; half the time the leader's start moves on again before anything was
        fetched (a StartAt of an empty log: the one whose disk work may wait)."""
        rng = self.start_rng
        end = plog.log_end_offset
        if rng.random() < 0.8:
            offset = end + rng.randint(0, 40)
        else:
            offset = rng.randint(plog.log_start_offset, end)
        for _ in range(2 if rng.random() < 0.5 else 1):
            plog.truncate_fully_and_start_at(offset)
            if tp in self.durable:
                self.durable[tp] = min(self.durable[tp], offset)
            later = plog._flushing.dir_dirty  # its directory fsync left to the queue
            self._note(f"start_at {tp} {offset}" + (" (disk work later)" if later else ""))
            self.counts["start_at_later"] += later
            offset += rng.randint(0, 40)

    def _drain(self) -> None:
        while (job := self.jobs.next()) is not None:
            job.run()

    def _append(self, tp: TopicPartition, plog: PartitionLog) -> None:
        rng = self.rng
        if rng.random() < 0.15:
            # A new leader: its batches start a new epoch, above every epoch there was.
            self.top_epoch[tp] += 1
            self.epoch[tp] = self.top_epoch[tp]
        data = bytearray()
        offset = plog.log_end_offset
        for _ in range(rng.randint(1, 3)):
            self.serial += 1
            values = [b"%d-%d" % (self.serial, i) for i in range(rng.randint(1, 4))]
            if rng.random() < 0.2:
                values[0] += b"." * rng.randint(100, 500)
            raw = producer_batch(offset, values, leader_epoch=self.epoch[tp])
            self.written[tp].setdefault(offset, set()).add(raw)
            data += raw
            offset += len(values)
        view = memoryview(bytes(data))
        checkpointed = plog.checkpointed_recovery_point
        result = plog.append(view, scan_batches(view).batches, now_ms=self.now_ms)
        for base in result.rolled_segments:
            # Above the checkpointed recovery point a roll's fsyncs are the queue's.
            self.counts["roll_later" if base > checkpointed else "roll_at_once"] += 1
        rolled = f", rolled {list(result.rolled_segments)}" if result.rolled_segments else ""
        self._note(f"append {tp} [{result.first_offset}, {result.log_end_offset}){rolled}")

    def _note(self, what: str) -> None:
        self.log.append(what)
        self.counts[what.split(" ", 1)[0]] += 1

    # -- restarts ------------------------------------------------------------------------

    def _restart(self, *, crash: bool) -> None:
        if crash:
            self.jobs.discard()  # the thread's jobs not run die with the process
        else:
            self._drain()  # a clean stop waits for them
        before = {tp: local_bytes(p) for tp, p in self.logs.partitions().items()}
        below_start = {
            tp: _deleted_below_start(p, self.moved_past[tp])
            for tp, p in self.logs.partitions().items()
        }
        outcome = self._crash_outcome() if crash else {}
        self.logs.close()
        if crash:
            # What close wrote (checkpoints, trimmed indexes, the clean-stop marker) never
            # happened: the disk holds what the crash left.
            for path in sorted(self.data_dir.rglob("*"), reverse=True):
                if path.is_file() and path not in outcome and path.name != LOCK_FILE:
                    path.unlink()
            for path, data in outcome.items():
                path.write_bytes(data)
        self.witness.settle_on_disk(self.data_dir)
        self.logs = self._open()
        self._note(("crash" if crash else "restart") + self._loaded())
        for tp, plog in self.logs.partitions().items():
            if crash:
                self._check_crash(tp, plog, before[tp], below_start[tp])
            elif local_bytes(plog) != before[tp]:
                raise InvariantError(f"{tp}: a clean restart changed the log")
            _check_epochs(tp, plog)
            latest = plog.latest_epoch()
            if crash and latest is not None and latest > self.epoch[tp]:
                # The crash undid a truncation whose disk work had not run (its cut, or with
                # the names lost the whole of one across segments): its old tail is back. A
                # follower goes on from there only in the newest epoch the log holds (its
                # OffsetForLeaderEpoch truncates first whatever the leader lacks), never
                # appending an older epoch's batches after it.
                self.epoch[tp] = latest
        if not crash:
            self.durable = {t: p.recovery_point for t, p in self.logs.partitions().items()}
            self.durable_start = {t: p.log_start_offset for t, p in self.logs.partitions().items()}

    def _loaded(self) -> str:
        return "".join(
            f" {tp}: [{p.log_start_offset}, {p.log_end_offset}) recovery point {p.recovery_point}"
            for tp, p in sorted(self.logs.partitions().items())
        )

    def _crash_outcome(self) -> dict[Path, bytes]:
        """Every file's bytes after a crash now (see the module's rules)."""
        rng = self.rng
        outcome: dict[Path, bytes] = {}
        for path in sorted(self.data_dir.rglob("*")):
            if not path.is_file() or path.name == LOCK_FILE:
                continue
            data = path.read_bytes()
            if path.suffix != ".log":
                outcome[path] = data
                continue
            synced = self.witness.synced_bytes(path)
            durable = self.witness.durable_bytes(path)
            keep = durable if durable == len(data) else rng.randint(durable, len(data))
            if rng.random() < 0.4:
                keep = len(data)  # nothing lost: the pages had reached the disk
            kept = data[:keep]
            if keep < len(data) or synced[keep:]:
                self.counts["lost_tail"] += 1
            if self.resurrect and len(synced) > keep and rng.random() < 0.5:
                # The truncation (or a shorter rewrite) was not committed: the synced bytes
                # past what survived of the new writes come back.
                kept += synced[keep:]
                self.counts["resurrected"] += 1
            outcome[path] = kept
        if self.lose_names:
            for directory in sorted(d for d in self.data_dir.iterdir() if d.is_dir()):
                if self.names_rng.random() < 0.5:
                    self._names_as_synced(directory, outcome)
        return outcome

    def _names_as_synced(self, directory: Path, outcome: dict[Path, bytes]) -> None:
        """A crash that kept none of `directory`'s name changes since its last fsync: a
        file created since is gone, a file renamed since is back under its old name (its
        bytes as the crash left them), and so is a file such a rename replaced (as it was
        when replaced: session 14's seed 78 of a StartAt twice at one offset lost both
        segments without this). An unlink stays (its bytes are gone: the model
        cannot bring them back)."""
        synced = self.witness.names_synced(directory)
        if synced is None:
            return
        by_inode = {inode: name for name, inode in synced.items()}
        now = {p: p.stat().st_ino for p in outcome if p.parent == directory}
        changed = {p: inode for p, inode in now.items() if synced.get(p.name) != inode}
        kept = {p: outcome.pop(p) for p in changed}  # every change undone first, then ...
        for path, inode in changed.items():
            old = by_inode.get(inode)
            if old is not None:
                outcome[directory / old] = kept[path]  # ... the renames back
        # ... and a file a rename replaced, back under its name.
        for name, inode in synced.items():
            path = directory / name
            if path not in outcome and inode in self.witness.replaced:
                outcome[path] = self.witness.replaced[inode]
                changed[path] = inode
                self.counts["replaced_back"] += 1
        if changed:
            self.counts["names_lost"] += 1

    # -- invariants ----------------------------------------------------------------------

    def _check_crash(
        self, tp: TopicPartition, plog: PartitionLog, before: bytes, below_start: dict[int, bytes]
    ) -> None:
        data = local_bytes(plog)
        scan = scan_batches(memoryview(data))
        if scan.stop is not ScanStop.END:
            raise InvariantError(
                f"{tp}: the loaded log does not scan to its end ({scan.stop}: {scan.error}, "
                f"at byte {scan.valid_bytes} of {len(data)})"
            )
        previous = {b.base_offset: data[b.position : b.position + b.size] for b in scan.batches}
        was = {
            b.base_offset: before[b.position : b.position + b.size]
            for b in scan_batches(memoryview(before)).batches
        }
        # Segments a log start move renamed, back when the crash lost the renames: as the
        # batches below a log start inside a segment, they are the log's until a checkpoint
        # names the new start (rule 5 then hides them).
        for base, raw in below_start.items():
            was.setdefault(base, raw)
        start = min(self.durable_start.get(tp, 0), plog.log_end_offset)
        if plog.log_start_offset < start:
            raise InvariantError(
                f"{tp}: the loaded log starts at {plog.log_start_offset}, below {start}, the "
                "log start the checkpoint file named"
            )
        expected = None
        durable = self.durable.get(tp, 0)
        claimed = plog.recovery_point
        for batch in scan.batches:
            base = batch.base_offset
            raw = previous[base]
            if expected is not None and base != expected:
                raise InvariantError(f"{tp}: batch at {base} follows one ending at {expected}")
            expected = batch.next_offset
            if raw not in self.written[tp].get(base, ()):
                raise InvariantError(f"{tp}: batch at {base} is none the log ever held there")
            if base < max(durable, claimed) and was.get(base) != raw:
                why = "reported durable" if base < durable else "claimed durable on loading"
                raise InvariantError(
                    f"{tp}: batch at {base} is below the recovery point {claimed} (the "
                    f"checkpoint's, lowered by truncations: {durable}) and was {why}, but it "
                    "is not the batch the log held there before the crash"
                )
        if plog.log_end_offset < durable:
            raise InvariantError(
                f"{tp}: the loaded log ends at {plog.log_end_offset}, below {durable}, which "
                "was reported durable"
            )

    def check(self) -> None:
        for tp, plog in self.logs.partitions().items():
            if not plog.log_start_offset <= plog.high_watermark <= plog.log_end_offset:
                raise InvariantError(f"{tp}: high watermark outside the log")
            if plog.recovery_point > plog.log_end_offset:
                raise InvariantError(f"{tp}: recovery point past the log end")

    def close(self) -> None:
        self.logs.close()


def _check_epochs(tp: TopicPartition, plog: PartitionLog) -> None:
    """Rule 4: from its first entry on, the loaded leader-epoch cache says what the loaded
    batches carry: each batch there carries the epoch of the entry covering it, and each
    later entry starts at a batch of its epoch. Below its first entry it may know less (a
    late file after a log start move, with an older log start checkpoint: epoch rule 4),
    and its first entry may start at the log start with no batch of its own there (the
    epoch of batches a start move removed), never something else."""
    entries = plog.epoch_entries()
    if not entries:
        return
    batches = scan_batches(memoryview(local_bytes(plog))).batches
    starts = {(b.base_offset, b.partition_leader_epoch) for b in batches}
    for entry in entries[1:]:
        if (entry.start_offset, entry.epoch) not in starts:
            raise InvariantError(
                f"{tp}: the loaded leader-epoch cache {entries} has epoch {entry.epoch} "
                f"starting at {entry.start_offset}, where no batch of that epoch starts"
            )
    for batch in batches:
        covering = [e for e in entries if e.start_offset <= batch.base_offset]
        if covering and covering[-1].epoch != batch.partition_leader_epoch:
            raise InvariantError(
                f"{tp}: the loaded leader-epoch cache {entries} says epoch "
                f"{covering[-1].epoch} at {batch.base_offset}, where the batch carries "
                f"epoch {batch.partition_leader_epoch}"
            )


def _deleted_below_start(plog: PartitionLog, moved_past: dict[int, bytes]) -> dict[int, bytes]:
    """The batches of the segments a log start move renamed for deletion and has not
    unlinked yet (wholly below the log start), by base offset: as the log held them when a
    move passed them (`moved_past`). Not as a `.deleted` file holds them: a segment a
    deferred truncation cut in memory keeps its old tail in its file until the truncation's
    job, and a move may rename it before that (the later segment's file then holds the
    log's batch at the same offset: seed 55)."""
    found = {}
    for path in plog.directory.glob("*.log.deleted"):
        data = path.read_bytes()
        for b in scan_batches(memoryview(data)).batches:
            if b.next_offset <= plog.log_start_offset and b.base_offset in moved_past:
                found[b.base_offset] = moved_past[b.base_offset]
    return found


def run_seed(
    seed: int,
    *,
    events: int = 200,
    resurrect: bool = True,
    lose_names: bool = True,
    start_at_rate: float = START_AT_RATE,
    weights: Mapping[str, int] = WEIGHTS,
    setup: Callable[[LogSimulation], None] | None = None,
) -> SimResult:
    with (
        tempfile.TemporaryDirectory(prefix=f"log-sim-{seed}-", dir=SCRATCH) as tmp,
        FsyncWitness() as witness,
    ):
        sim = LogSimulation(
            seed,
            Path(tmp) / "data",
            witness,
            resurrect=resurrect,
            lose_names=lose_names,
            start_at_rate=start_at_rate,
            weights=weights,
        )
        if setup is not None:
            setup(sim)
        try:
            return stepped(seed, sim, events=events, replay=REPLAY)
        finally:
            sim.close()


# run_seeds(seeds, *, stop_at_first=False, **run_seed's options)
def run_seeds(seeds, **options):  # type: ignore[no-untyped-def]
    return seeds_run(run_seed, seeds, **options)


def main(argv: list[str] | None = None) -> int:
    return seed_main("python -m tools.sim.log_run", __doc__, run_seed, events=200, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
