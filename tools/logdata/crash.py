"""Crash testing of the log store: a writer process SIGKILLed at random points, then checked.

    python -m tools.logdata --cycles 5000 --seed 7 --dir /tmp/crash   # the long run

Each cycle forks a writer (from this process, modules loaded, so a cycle costs
milliseconds) that opens the data directory -- recovering whatever the previous kill left --
and appends real producer batches to three partitions in fetch-sized groups, rolling often
(small segments, small indexes) and checkpointing at random moments. After a random delay
it is killed with SIGKILL, possibly mid-recovery, mid-roll or mid-write. Then the checker:

1. reads the recovery points the last checkpoint recorded,
2. opens the directory with LogManager (recovery) and checks every partition: its bytes are
   exactly a prefix of the stream, ending on a batch boundary (nothing torn kept), its log
   end is at or after the checkpointed recovery point (nothing checkpointed lost), and
   `verify` finds its indexes consistent,
3. closes it -- or, every other cycle, leaves it as a crash would, so the next writer's own
   open does the unclean recovery.
The batch streams are fixed per seed, so "a prefix of what was appended" is byte equality.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from replicad.clock import wall_ms
from replicad.log.checkpoint import parse_offsets, read_text
from replicad.log.config import LogConfig
from replicad.log.layout import CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_CHECKPOINT
from replicad.log.manager import LogManager
from replicad.log.verify import verify_partition
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.logdata.batches import batch_stream

PARTITIONS = (TopicPartition("crash", 0), TopicPartition("crash", 1), TopicPartition("crash.b", 7))
CONFIG = LogConfig(segment_bytes=96 * 1024, index_interval_bytes=1024, segment_index_bytes=512)
STREAM_BATCHES = 1500


def _quiet() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))


def writer(data_dir: str, stream_dir: str, seed: int, ready: Any = None) -> None:
    """The process that gets killed: recover, then append and checkpoint until done.
    `ready` (an Event) is set just before the first append, so the kill timer of the
    driver measures time spent writing, however long start-up took on a busy machine."""
    _quiet()
    rng = random.Random(seed)
    streams = {tp: _load_stream(Path(stream_dir), tp) for tp in PARTITIONS}
    manager = LogManager.open(Path(data_dir), CONFIG, now_ms=wall_ms())
    cursors = {}
    for tp, (_blob, headers) in streams.items():
        log = manager.get_or_create(tp)
        cursors[tp] = next(
            (i for i, h in enumerate(headers) if h.base_offset >= log.log_end_offset), len(headers)
        )
    appends = 0
    if ready is not None:
        ready.set()
    while any(cursors[tp] < len(streams[tp][1]) for tp in PARTITIONS):
        tp = rng.choice(PARTITIONS)
        blob, headers = streams[tp]
        start = cursors[tp]
        if start >= len(headers):
            continue
        # Mostly fetch-sized groups; now and then a big one, so kills land inside long writes.
        size = rng.randint(1, 8) if rng.random() < 0.9 else rng.randint(32, 128)
        group = headers[start : start + size]
        view = memoryview(blob)[group[0].position : group[-1].end_position]
        manager.partitions()[tp].append(view, group, now_ms=wall_ms())
        cursors[tp] = start + len(group)
        appends += 1
        if rng.random() < 0.05:
            manager.checkpoint({p: log.log_end_offset for p, log in manager.partitions().items()})
    manager.close()


def _stream_path(stream_dir: Path, tp: TopicPartition) -> Path:
    return stream_dir / f"{tp.topic}-{tp.partition}.stream"


def _load_stream(stream_dir: Path, tp: TopicPartition) -> tuple[bytes, list]:  # type: ignore[type-arg]
    blob = _stream_path(stream_dir, tp).read_bytes()
    return blob, scan_batches(blob).batches


def write_streams(stream_dir: Path, seed: int) -> None:
    stream_dir.mkdir(parents=True, exist_ok=True)
    for i, tp in enumerate(PARTITIONS):
        batches = batch_stream(seed * 31 + i, STREAM_BATCHES, max_records=12, epoch_every=300)
        _stream_path(stream_dir, tp).write_bytes(b"".join(batches))


@dataclass
class CrashReport:
    kills: int = 0
    finished_writers: int = 0
    recovered_segments: int = 0
    truncated_bytes: int = 0
    torn_tails: int = 0
    violations: list[str] = field(default_factory=list)


def check(
    data_dir: Path, blobs: dict[TopicPartition, bytes], report: CrashReport, *, close: bool
) -> None:
    """Recover the directory and check every partition against its stream."""
    text = read_text(data_dir / RECOVERY_POINT_CHECKPOINT)
    recovery_points = parse_offsets(text, source="recovery points") if text else {}
    manager = LogManager.open(data_dir, CONFIG, now_ms=wall_ms())
    try:
        for recovery in manager.recoveries:
            report.recovered_segments += len(recovery.recovered_segments)
            report.truncated_bytes += recovery.truncated_bytes
            report.torn_tails += int(recovery.truncated_bytes > 0)
        for tp, log in manager.partitions().items():
            blob = blobs[tp]
            on_disk = b"".join(s.log_path.read_bytes() for s in log.segments)
            if not blob.startswith(on_disk):
                report.violations.append(f"kill {report.kills}: {tp} is not a prefix of its stream")
            scan = scan_batches(blob[: len(on_disk) + 1])
            boundaries = {0} | {b.end_position for b in scan.batches}
            if len(on_disk) not in boundaries:
                report.violations.append(f"kill {report.kills}: {tp} ends inside a batch")
            if log.log_end_offset < recovery_points.get(tp, 0):
                report.violations.append(
                    f"kill {report.kills}: {tp} ends at {log.log_end_offset}, below the "
                    f"checkpointed recovery point {recovery_points[tp]}"
                )
    finally:
        manager.close()
    for tp in PARTITIONS:
        directory = data_dir / f"{tp.topic}-{tp.partition}"
        if directory.exists():
            problems = verify_partition(directory, in_use=False).problems
            if problems:
                report.violations.append(f"kill {report.kills}: {tp}: {problems}")
    if not close:
        (data_dir / CLEAN_SHUTDOWN_FILE).unlink()


def run(work_dir: Path, *, seed: int, cycles: int, max_delay_s: float = 0.25) -> CrashReport:
    _quiet()
    rng = random.Random(seed)
    stream_dir = work_dir / "streams"
    data_dir = work_dir / "data"
    write_streams(stream_dir, seed)
    blobs = {tp: _stream_path(stream_dir, tp).read_bytes() for tp in PARTITIONS}
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    report = CrashReport()
    while report.kills < cycles:
        ready = ctx.Event()
        child = ctx.Process(
            target=writer, args=(str(data_dir), str(stream_dir), rng.getrandbits(32), ready)
        )
        child.start()
        delay = rng.uniform(0, max_delay_s)
        # Start-up (recovery) is not what we kill: wait until the writer writes.
        while not ready.wait(0.05) and child.is_alive():
            pass
        time.sleep(delay)
        if child.is_alive():
            child.kill()
            child.join()
            report.kills += 1
        else:
            child.join()
            if child.exitcode != 0:
                report.violations.append(f"writer exited with {child.exitcode}")
                break
            report.finished_writers += 1
            shutil.rmtree(data_dir)  # the streams are exhausted: start over
            continue
        check(data_dir, blobs, report, close=report.kills % 2 == 0)
        if report.violations:
            break
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-delay", type=float, default=0.25, help="seconds before the kill")
    parser.add_argument("--dir", type=Path, required=True, help="work directory (emptied)")
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    started = time.monotonic()
    report = run(args.dir, seed=args.seed, cycles=args.cycles, max_delay_s=args.max_delay)
    print(
        f"{report.kills} kills, {report.finished_writers} writers finished, "
        f"{report.recovered_segments} segments recovered, {report.torn_tails} torn tails "
        f"({report.truncated_bytes} bytes) in {time.monotonic() - started:.0f} s"
    )
    for violation in report.violations:
        print(f"VIOLATION {violation}", file=sys.stderr)
    return 1 if report.violations else 0
