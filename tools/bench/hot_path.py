"""CPU seconds per GB of the follower's own path from a response frame to the file.

In one process, no network: a Fetch v12 response frame (PARTITIONS partitions of
PARTITION_KIB of producer batches of about BATCH_KIB each, incompressible values) is read
as the follower reads it -- scan_fetch_response, validate_fetched (length, magic, CRC32C,
offsets) per partition, PartitionLog.append (one write per partition, index entries) --
again and again until TOTAL_MIB were appended. Only that work is timed, in CPU seconds of
this process (time.process_time: user and system, the kernel's copy into the page cache
included), so the figure holds on a shared machine where wall time does not. Restamping
the offsets between rounds (a new response brings new offsets) is not timed.

    .venv/bin/python -m tools.bench.hot_path [--total-mib 512] [--batch-kib 16]
        [--partitions 8] [--partition-kib 1024] [--dir DIR] [--repeat 3] [--baseline DIR]

`--baseline DIR` runs another checkout's path (its own copy of this module, with its
replicad) in turn with this one, pass after pass, each in a fresh process: a before/after
from the same minutes of a shared machine. The table gives every pass and the medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import structlog

from replicad.follower.fetch_response import scan_fetch_response
from replicad.follower.validate import validate_fetched
from replicad.log.config import LogConfig
from replicad.log.partition import PartitionLog
from replicad.records.batch import scan_batches
from replicad.records.varint import uvarint
from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch

KIB = 1024
MIB = 1024 * KIB
GB = 1_000_000_000
TOPIC = "bench"
VALUE_BYTES = 1000


def records_for(batch_kib: int, partition_kib: int) -> tuple[bytes, int, int]:
    """One partition's records: (bytes, batches, records per batch)."""
    count = max(batch_kib * KIB // (VALUE_BYTES + 20), 1)
    template = producer_batch(0, [os.urandom(VALUE_BYTES) for _ in range(count)])
    copies = max(partition_kib * KIB // len(template), 1)
    return template * copies, copies, count


def response_frame(partitions: int, records: bytes) -> tuple[bytearray, list[int]]:
    """A Fetch v12 response frame (correlation id first) and where each partition's
    records start in it."""
    out = bytearray(struct.pack(">i", 1) + uvarint(0))  # correlation id, header tags
    out += struct.pack(">ihi", 0, 0, 0) + uvarint(2)  # throttle, error, session; 1 topic
    name = TOPIC.encode()
    out += uvarint(len(name) + 1) + name + uvarint(partitions + 1)
    starts = []
    for p in range(partitions):
        out += struct.pack(">ihqqq", p, 0, 1 << 40, 1 << 40, 0)
        out += uvarint(0) + struct.pack(">i", -1)  # no aborted list; preferred replica
        out += uvarint(len(records) + 1)
        starts.append(len(out))
        out += records + uvarint(0)  # partition tags
    out += uvarint(0) + uvarint(0)  # topic tags, response tags
    return out, starts


def restamp(
    frame: bytearray, starts: list[int], batches: int, batch_size: int, step: int, first_offset: int
) -> None:
    for start in starts:
        for i in range(batches):
            pos = start + i * batch_size
            frame[pos : pos + 8] = (first_offset + i * step).to_bytes(8, "big")


def run(
    directory: Path, total: int, batch_kib: int, partitions: int, partition_kib: int
) -> tuple[float, int, float]:
    """(CPU seconds, bytes appended, wall seconds)."""
    records, batches, per_batch = records_for(batch_kib, partition_kib)
    batch_size = len(records) // batches
    frame, starts = response_frame(partitions, records)
    logs = [
        PartitionLog.create(
            directory / f"{TOPIC}-{p}", TopicPartition(TOPIC, p), LogConfig(), now_ms=0
        )
        for p in range(partitions)
    ]
    cpu = wall = 0.0
    appended = 0
    offset = 0
    try:
        while appended < total:
            restamp(frame, starts, batches, batch_size, per_batch, offset)
            c0, w0 = time.process_time(), time.perf_counter()
            view = scan_fetch_response(memoryview(frame), 12)
            for pd, plog in zip(view.responses[0].partitions, logs, strict=True):
                fetched = validate_fetched(
                    pd.records,
                    fetch_offset=plog.log_end_offset,
                    log_is_empty=plog.log_end_offset == plog.log_start_offset,
                )
                assert fetched.corrupt is None and fetched.batches
                plog.append(fetched.data, fetched.batches, now_ms=0)
                appended += len(fetched.data)
            cpu += time.process_time() - c0
            wall += time.perf_counter() - w0
            offset += batches * per_batch
    finally:
        for plog in logs:
            plog.close()
    assert scan_batches(records).stop.name == "END"
    return cpu, appended, wall


def one_pass(args: argparse.Namespace) -> tuple[float, int, float]:
    """This checkout's path, in this process: (CPU seconds, bytes appended, wall seconds)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    work = Path(tempfile.mkdtemp(prefix="replicad-hot-path-", dir=args.dir))
    try:
        return run(work, args.total_mib * MIB, args.batch_kib, args.partitions, args.partition_kib)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def child_pass(args: argparse.Namespace, checkout: Path | None) -> tuple[float, int, float]:
    """One pass in a fresh process, of this checkout or of `checkout` (its own hot_path
    module and replicad). Reads the row every version of this module prints."""
    argv = [
        sys.executable,
        "-m",
        "tools.bench.hot_path",
        f"--total-mib={args.total_mib}",
        f"--batch-kib={args.batch_kib}",
        f"--partitions={args.partitions}",
        f"--partition-kib={args.partition_kib}",
    ]
    if args.dir is not None:
        argv.append(f"--dir={args.dir}")
    root = checkout or Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(argv, env=env, cwd=root, capture_output=True, text=True, check=True)
    row = out.stdout.strip().splitlines()[-1].strip("|").split("|")
    mb, cpu, _, wall = (cell.strip() for cell in row[1:5])
    return float(cpu), int(float(mb.split()[0].replace(",", "")) * MB), float(wall)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--total-mib", type=int, default=512)
    parser.add_argument("--batch-kib", type=int, default=16)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--partition-kib", type=int, default=1024)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=1, help="passes of each checkout")
    parser.add_argument("--baseline", type=Path, help="another checkout, run in turn")
    args = parser.parse_args(argv)
    shape = f"{args.batch_kib} KiB batches, {args.partitions} x {args.partition_kib} KiB a response"
    if args.repeat == 1 and args.baseline is None:
        cpu, appended, wall = one_pass(args)
        print(
            f"| {shape} | {appended / MB:,.0f} MB | {cpu:.2f} | {cpu / (appended / GB):.2f} "
            f"| {wall:.2f} |"
        )
        return 0
    checkouts: list[tuple[str, Path | None]] = [("this checkout", None)]
    if args.baseline is not None:
        checkouts.append((f"baseline ({args.baseline})", args.baseline.resolve()))
    load = os.getloadavg()[0]
    print(f"{shape}; load average {load:.1f} at the start; {args.repeat} pass(es) each\n")
    print("| checkout | pass | MB | CPU s | CPU s per GB | wall s |")
    print("|---|---:|---:|---:|---:|---:|")
    per_gb: dict[str, list[float]] = {label: [] for label, _ in checkouts}
    for i in range(args.repeat):
        for label, checkout in checkouts:
            cpu, appended, wall = child_pass(args, checkout)
            per_gb[label].append(cpu / (appended / GB))
            print(
                f"| {label} | {i + 1} | {appended / MB:,.0f} | {cpu:.2f} "
                f"| {per_gb[label][-1]:.2f} | {wall:.2f} |",
                flush=True,
            )
    print()
    for label, values in per_gb.items():
        print(
            f"{label}: median {statistics.median(values):.2f} CPU s per GB "
            f"(range {min(values):.2f}-{max(values):.2f})"
        )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


MB = 1_000_000

if __name__ == "__main__":
    sys.exit(main())
