"""The log store's crash simulation (tools/sim/log_run.py) in the suite: its seeds hold every
rule, a seed replays exactly, and each durability rule of the log store, planted back
broken, is found by a suite seed (as tests/sim/test_sim_run.py does for the follower's)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from replicad.log import partition as partition_module
from replicad.log.partition import PartitionLog
from replicad.log.segment import LogSegment
from replicad.records.batch import scan_batches
from tests.sim.seeded import assert_replays_exactly, planted_found
from tests.sim.test_sim_run import flush_without_fsync
from tools.logdata.batches import producer_batch
from tools.sim.invariants import FsyncWitness
from tools.sim.log_run import LogSimulation, run_seed, run_seeds
from tools.sim.seeds import InvariantError, quiet_logs

# Each planted defect below is found within these (by about half the seeds each).
SUITE_SEEDS = range(20)


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logs()  # conftest restores the logging configuration


def test_suite_seeds_hold_every_rule_and_reach_every_kind_of_loss():
    counts: dict[str, int] = {}
    failed = []
    for seed in SUITE_SEEDS:
        result = run_seed(seed)
        failed += [] if result.ok else [result]
        for kind, n in result.counts.items():
            counts[kind] = counts.get(kind, 0) + n
    assert not failed, "\n".join(r.summary() for r in failed)
    kinds = {"append", "truncate", "flush", "checkpoint", "start_move", "start_at", "restart"}
    kinds |= {"crash", "start_at_later", "lost_tail", "resurrected", "names_lost"}
    kinds |= {"roll_later", "roll_at_once"}  # a roll's fsyncs left to the queue, or not
    assert {kind for kind in kinds if counts.get(kind)} == kinds, counts


def test_a_seed_replays_exactly():
    assert_replays_exactly(run_seed, 7, longer_than=50, events=80)


def _without_segment_fsyncs(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """PartitionLog.<name> planted back as it would be without its segment's fsync."""
    real, real_flush = getattr(PartitionLog, name), LogSegment.flush

    def planted(self, *args, **kwargs):
        monkeypatch.setattr(LogSegment, "flush", lambda segment: None)
        try:
            return real(self, *args, **kwargs)
        finally:
            monkeypatch.setattr(LogSegment, "flush", real_flush)

    monkeypatch.setattr(PartitionLog, name, planted)


def test_a_roll_that_leaves_its_segment_unsynced_is_found_by_a_suite_seed(monkeypatch):
    """The roll rule (log/partition.py): a roll at or below the checkpointed recovery point
    fsyncs the segment it leaves before it returns. Without it, a truncation below the
    recovery point the checkpoint file names (stale until the next checkpoint), appends
    past a roll and a crash: loading trusts the stale point and scans from its segment on,
    so the segment rolled before it comes back torn, unscanned."""
    _without_segment_fsyncs(monkeypatch, "_roll")
    error = planted_found(run_seeds, SUITE_SEEDS, "roll without fsync")
    assert "does not scan to its end" in error or "durable" in error


def test_a_roll_at_or_below_the_checkpointed_recovery_point_left_to_later_is_found(
    monkeypatch,
):
    """The roll rule's condition (log/partition.py): only a roll above the recovery point
    the last checkpoint named leaves its fsyncs to the durability thread. Deferred at or
    below it too (after a truncation below that stale point), a crash before the job tears
    the segment left, which loading, trusting the stale point, does not scan."""
    real = PartitionLog._roll

    def planted(self, *args, **kwargs):
        saved = self.checkpointed_recovery_point
        self.checkpointed_recovery_point = -1
        try:
            return real(self, *args, **kwargs)
        finally:
            self.checkpointed_recovery_point = saved

    monkeypatch.setattr(PartitionLog, "_roll", planted)
    # The first seed that finds it is 9.
    error = planted_found(run_seeds, range(10), "roll left to later below the checkpoint")
    assert "does not scan to its end" in error or "follows one ending at" in error


def test_loading_that_keeps_segments_past_a_lost_tail_is_found(monkeypatch):
    """A segment a deferred roll left unsynced may lose its tail at a batch boundary while
    the later segments' bytes reached the disk (log/partition.py: loading ends the log where
    a scanned segment ends at or above the recovery point, below the next one's base).
    Without it the loaded log goes on past the hole."""
    monkeypatch.setattr(partition_module, "_lost_tail", lambda segment, after, point: False)
    # Its window (a roll's job not run, a crash losing the tail just at a batch) is rare:
    # the first seed that finds it is 97, without StartAts.
    error = planted_found(run_seeds, range(90, 98), "lost tail kept", start_at_rate=0)
    assert "follows one ending at" in error


def test_loading_that_cuts_whole_batches_only_past_the_next_base_is_found(monkeypatch):
    """Loading cuts the segment before the first it scans where the next begins, torn bytes
    too (LogSegment.cut_from): a deferred roll left it unsynced, a deferred truncation at the
    checkpointed recovery point cut it in memory and made the next segment there, and the
    crash tore the old tail. Cutting whole batches only, the torn bytes stay in the log."""

    def planted(self, offset):
        if self.next_offset <= offset:
            return None
        return self.truncate_to(offset)

    monkeypatch.setattr(LogSegment, "cut_from", planted)
    # The first seed that finds it is 51, without StartAts.
    error = planted_found(run_seeds, range(45, 52), "whole batches only", start_at_rate=0)
    assert "does not scan to its end" in error


def test_a_truncation_left_unsynced_is_found_by_a_suite_seed(monkeypatch):
    """The truncation rule (log/partition.py): a truncation fsyncs the segment it
    shortened. Without it, a crash that loses the shorter length brings the removed batches
    back below the stale recovery point the checkpoint file names: loaded as durable."""
    _without_segment_fsyncs(monkeypatch, "truncate_to")
    error = planted_found(run_seeds, SUITE_SEEDS, "truncation without fsync")
    assert "claimed durable on loading" in error


def test_a_flush_that_claims_what_it_did_not_sync_is_found_by_a_suite_seed(monkeypatch):
    """Rule 3 itself: a flush that raises the recovery point without fsyncing, so the next
    checkpoint names data a crash can lose."""
    monkeypatch.setattr(PartitionLog, "flush", flush_without_fsync)
    error = planted_found(run_seeds, SUITE_SEEDS, "flush without fsync")
    assert "which was reported durable" in error


def test_a_truncation_below_the_checkpointed_recovery_point_left_to_later_is_found(monkeypatch):
    """The truncation rule's condition (log/partition.py): only a truncation at or above the
    recovery point the last checkpoint named may leave its disk work to the durability
    thread. Deferred below it too, a crash before the job brings the removed batches back
    below the stale recovery point the checkpoint file names: loaded as durable."""
    real = PartitionLog.truncate_to

    def planted(self, offset):
        saved = self.checkpointed_recovery_point
        self.checkpointed_recovery_point = 0
        try:
            return real(self, offset)
        finally:
            self.checkpointed_recovery_point = saved

    monkeypatch.setattr(PartitionLog, "truncate_to", planted)
    error = planted_found(run_seeds, SUITE_SEEDS, "deferred below the checkpoint")
    assert "durable" in error


class _KeepsAll:
    """A crash's Random that keeps every byte written (no unsynced tail lost) and every
    name, so that what a scripted crash tests is the rule at hand."""

    def random(self) -> float:
        return 0.0

    def randint(self, low: int, high: int) -> int:
        return high


class _KeepsNames:
    def random(self) -> float:
        return 1.0


def _crash_with_a_late_epoch_file(tmp_path) -> None:
    """The log simulation, scripted: epoch 1, a checkpoint, a batch of epoch 2 whose epoch
    file the queue writes, a truncation of it (deferred: its epoch file is written late),
    the leader's log going on in epoch 1 there, and a crash before the truncation's job that
    keeps every byte: the epoch file on disk says epoch 2 where a batch of epoch 1 is."""
    with FsyncWitness() as witness:
        sim = LogSimulation(5, tmp_path / "data", witness, start_at_rate=0, resurrect=False)
        sim.names_rng = _KeepsNames()
        tp = sim.tps[0]
        plog = sim.logs.partitions()[tp]

        def put(epoch: int) -> int:
            offset = plog.log_end_offset
            raw = producer_batch(offset, [b"%d-a" % offset, b"%d-b" % offset], leader_epoch=epoch)
            sim.written[tp].setdefault(offset, set()).add(raw)
            plog.append(raw, scan_batches(raw).batches, now_ms=sim.now_ms)
            return offset

        sim.epoch[tp] = sim.top_epoch[tp] = 2
        put(1)
        put(1)
        sim._drain()
        sim.logs.checkpoint()
        sim.durable = {t: p.recovery_point for t, p in sim.logs.partitions().items()}
        at = put(2)
        sim._drain()  # the epoch file says epoch 2 from `at`
        plog.truncate_to(at)
        put(1)
        sim.rng = _KeepsAll()
        sim._restart(crash=True)
        sim.close()


def test_loading_that_trusts_a_late_epoch_file_past_its_rescan_is_found(monkeypatch, tmp_path):
    """Epoch rule 3 (log/partition.py): a deferred truncation's epoch file is written late,
    so a crash may leave one holding entries of the removed batches; loading drops the
    file's entries from the first segment it rescans. Without that, rule 4 of the crash
    simulation finds an epoch the batches do not carry. (Scripted: its window is rare, and
    the seeds that found it, 25, 59 and 147, drew differently once rolls left their fsyncs
    to the queue, session 17: none of seeds 0..199 finds it now.)"""
    _crash_with_a_late_epoch_file(tmp_path / "as built")
    monkeypatch.setattr(partition_module, "_forget_epochs_from", lambda epochs, offset: None)
    with pytest.raises(InvariantError, match="leader-epoch cache"):
        _crash_with_a_late_epoch_file(tmp_path / "planted")


class _Always:
    def random(self) -> float:
        return 0.0  # every directory loses its unsynced names


def _crash_after_a_deferred_truncation_across_segments(tmp_path) -> None:
    """The log simulation, scripted: segments rolled past the checkpointed recovery point,
    all of it flushed (names and bytes durable), a truncation into the segment before the
    last (deferred: at or above that point, across a segment start), then a crash before
    its job that loses the directory's unsynced names: the removed segments come back
    under their names. Raises InvariantError when a rule breaks."""
    with FsyncWitness() as witness:
        sim = LogSimulation(5, tmp_path / "data", witness, start_at_rate=0, resurrect=False)
        sim.names_rng = _Always()
        tp = sim.tps[0]
        plog = sim.logs.partitions()[tp]
        for _ in range(3):
            sim._append(tp, plog)
        sim.logs.checkpoint()
        sim.durable = {t: p.recovery_point for t, p in sim.logs.partitions().items()}
        checkpointed = plog.recovery_point
        while sum(s.base_offset > checkpointed for s in plog.segments) < 2:
            sim._append(tp, plog)
        plog.flush()
        left = next(s for s in plog.segments if s.base_offset > checkpointed)
        while len(left.headers()) < 2:  # a batch of it stays
            sim._append(tp, plog)
            plog.flush()
            left = next(s for s in plog.segments[:-1] if s.base_offset > checkpointed)
        plog.truncate_to(left.headers()[1].base_offset)
        assert [j.what for j in sim.jobs._jobs][-1] == f"truncation of {tp}"
        sim._restart(crash=True)
        sim.close()


def test_a_truncation_across_segments_that_cuts_before_its_renames_are_synced_is_found(
    monkeypatch, tmp_path
):
    """The truncation rule for whole segments (log/partition.py): their renames are made
    durable (the directory fsynced) before the segment left is cut. Planted back broken the
    way a move of that fsync to the durability thread would break it -- the segment left
    cut at once, the fsync left to the job -- a crash before the job that loses the unsynced
    names keeps the shorter segment and brings the removed ones back beyond a gap. Since
    session 17 loading ends a log at such a gap above the recovery point (a deferred roll's
    lost tail looks the same), which covers this plant too when the segment left is scanned;
    found with that rule planted away as well (scripted: the seeds that found it drew
    differently once rolls left their fsyncs to the queue)."""
    _crash_after_a_deferred_truncation_across_segments(tmp_path / "as built")
    real = LogSegment.truncate_to

    def planted(self, offset, *, files=True):
        return real(self, offset, files=True)  # the file cut now, whatever was asked

    monkeypatch.setattr(LogSegment, "truncate_to", planted)
    _crash_after_a_deferred_truncation_across_segments(tmp_path / "cut at once")  # covered
    monkeypatch.setattr(partition_module, "_lost_tail", lambda segment, after, point: False)
    with pytest.raises(InvariantError, match="follows one ending at"):
        _crash_after_a_deferred_truncation_across_segments(tmp_path / "and no lost-tail rule")


def test_a_truncation_across_segments_at_once_that_cuts_before_its_fsync_is_found(
    monkeypatch,
):
    """The same rule for a truncation across segments below the checkpointed recovery
    point, done at once on the calling thread: rename, fsync the directory, cut. Without
    that directory fsync, a crash that loses the names keeps the shorter segment."""
    real = PartitionLog.truncate_to
    real_fsync_dir = partition_module.fsync_dir

    def planted(self, offset):
        partition_module.fsync_dir = lambda path: None
        try:
            return real(self, offset)
        finally:
            partition_module.fsync_dir = real_fsync_dir

    monkeypatch.setattr(PartitionLog, "truncate_to", planted)
    # Rarer still (below the checkpointed recovery point): the first seed that finds it is 33.
    error = planted_found(run_seeds, range(40), "cut before the renames are durable, at once")
    assert "follows one ending at" in error or "durable" in error


def test_loading_that_keeps_batches_past_the_next_segments_base_is_found(monkeypatch):
    """A deferred truncation across segments rolls to a new segment before the segment left
    is cut on disk (log/partition.py): a crash that keeps the names but not that cut leaves
    the old batches under the new segment's. Loading cuts them; without it, the loaded log
    goes back in offsets where the new segment starts."""
    monkeypatch.setattr(partition_module, "_cut_at_next_base", lambda before, after, e: None)
    # Since rolls leave their fsyncs to the queue (session 17) the crashes draw differently:
    # the first seeds that find it are 62 (the epochs of the uncut batches) and 83.
    error = planted_found(run_seeds, range(80, 84), "batches past the next segment's base kept")
    assert "follows one ending at" in error


def test_a_start_at_left_to_later_though_the_log_holds_batches_is_found(monkeypatch):
    """A StartAt leaves its disk work to the durability thread only when the log's files
    hold no batch and its epoch file is empty (log/partition.py). Left to it whatever the
    log holds, a crash before the job brings the old segments (or the old epoch file) back
    beside what the log store reported durable since."""
    monkeypatch.setattr(
        PartitionLog, "_may_start_later", lambda self, offset: self.disk_later is not None
    )
    error = planted_found(run_seeds, SUITE_SEEDS, "start at later with batches")
    assert "durable" in error or "follows one ending at" in error or "epoch" in error


def test_a_flush_that_claims_a_start_ats_segment_before_its_name_is_durable_is_found(
    monkeypatch,
):
    """A StartAt left to later makes a segment the directory has not synced: a flush fsyncs
    the directory before it raises the recovery point past the new start. Without it, a
    checkpoint names data in a segment a crash can lose whole."""
    real = PartitionLog.flush

    def planted(self):
        self._flushing.dir_dirty = False  # the flush no longer syncs the directory
        return real(self)

    monkeypatch.setattr(PartitionLog, "flush", planted)
    error = planted_found(run_seeds, SUITE_SEEDS, "flush without the directory")
    assert "reported durable" in error


def test_a_crash_that_loses_a_rename_over_a_file_brings_that_file_back(tmp_path):
    """The crash model: StartAts at one offset, the first at once (the log held batches),
    the next two left to later: the second renames the first's new segment over the
    `.deleted` name the first left. A crash that loses the directory's unsynced names puts
    back what its last fsync named (the empty segment at that offset), not nothing: the
    model without the replaced file lost both segments and blamed the log store ("ends at
    0, below 21", session 14's seed 78)."""

    class Always:
        def random(self) -> float:
            return 0.0  # every directory loses its unsynced names

    with FsyncWitness() as witness:
        sim = LogSimulation(5, tmp_path / "data", witness, start_at_rate=0)
        sim.names_rng = Always()
        tp = sim.tps[0]
        plog = sim.logs.partitions()[tp]
        for _ in range(5):
            sim._append(tp, plog)
        sim.logs.checkpoint()
        sim.durable = {t: p.recovery_point for t, p in sim.logs.partitions().items()}
        start = plog.log_end_offset + 10
        for _ in range(3):
            plog.truncate_fully_and_start_at(start)
        sim._restart(crash=True)  # raises InvariantError if a rule breaks
        loaded = sim.logs.partitions()[tp]
        assert sim.counts["replaced_back"] and sim.counts["names_lost"]
        assert loaded.log_end_offset == start
        sim.close()


def test_the_command_line_replays_a_seed():
    one = subprocess.run(
        [sys.executable, "-m", "tools.sim.log_run", "--seed", "3", "--events", "60", "-v"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert one.returncode == 0, one.stdout + one.stderr
    assert one.stdout.strip().endswith("seed 3: ok (60 events)")
    assert "append t-" in one.stdout
