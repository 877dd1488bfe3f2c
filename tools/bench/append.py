"""Append throughput of the log store next to `dd` on the same disk, as a markdown table.

    .venv/bin/python -m tools.bench.append [--dir DIR] [--total-mb 256] [--sizes 1024,...]

For each batch size, the same volume is written three ways into DIR:
- replicad, one batch per append: scan_batches + PartitionLog.append per batch (worst case);
- replicad, fetch-sized appends: the batches of one 1 MiB partition fetch per append (what
  a follower does with replica.fetch.max.bytes = 1 MiB);
- dd with bs = the batch size, from /dev/zero.
All three use the default flush policy (no fsync per write, 1 GiB segments) and end with one
fsync (dd conv=fsync; PartitionLog.flush), so each number is "written and durable".
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import structlog

from replicad.log.config import LogConfig
from replicad.log.partition import PartitionLog
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch

KIB = 1024
MIB = 1024 * KIB
DEFAULT_SIZES = (KIB, 4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB)
FETCH_BYTES = MIB
RECORD_VALUE = 1000


def _batch_of_about(size: int) -> bytes:
    """One uncompressed producer batch of roughly `size` bytes (random, incompressible values)."""
    count = max(size // (RECORD_VALUE + 20), 1)
    value_size = max(min(RECORD_VALUE, size - 100), 1)
    return producer_batch(0, [os.urandom(value_size) for _ in range(count)])


def _restamped(template: bytes, copies: int, first_offset: int) -> bytes:
    """`copies` of the batch with consecutive offsets (the base offset is outside the CRC)."""
    records = scan_batches(template).batches[0].last_offset_delta + 1
    out = bytearray(template * copies)
    for i in range(copies):
        out[i * len(template) : i * len(template) + 8] = (first_offset + i * records).to_bytes(
            8, "big"
        )
    return bytes(out)


def bench_replicad(directory: Path, size: int, total: int, *, per_append: int) -> float:
    template = _batch_of_about(size)
    batches_total = max(total // len(template), 1)
    chunk_batches = max(per_append // len(template), 1)
    chunk = _restamped(template, chunk_batches, 0)
    records_per_chunk = scan_batches(chunk).next_offset or 0
    shutil.rmtree(directory, ignore_errors=True)
    log = PartitionLog.create(directory, TopicPartition("bench", 0), LogConfig(), now_ms=0)
    written = 0
    offset = 0
    started = time.perf_counter()
    done = 0
    while done < batches_total:
        # Offsets must grow: patch the base offsets in place, as a fetch would bring new ones.
        data = bytearray(chunk)
        for i in range(chunk_batches):
            pos = i * len(template)
            base = int.from_bytes(chunk[pos : pos + 8], "big") + offset
            data[pos : pos + 8] = base.to_bytes(8, "big")
        scan = scan_batches(data)
        log.append(data, scan.batches, now_ms=0)
        written += len(data)
        offset += records_per_chunk
        done += chunk_batches
    log.flush()
    elapsed = time.perf_counter() - started
    log.close()
    shutil.rmtree(directory, ignore_errors=True)
    return written / elapsed / MIB


def bench_dd(directory: Path, size: int, total: int) -> float:
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "dd.out"
    count = max(total // size, 1)
    started = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", f"bs={size}", f"count={count}", "conv=fsync"],
        check=True,
        capture_output=True,
    )
    elapsed = time.perf_counter() - started
    target.unlink()
    return count * size / elapsed / MIB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (a disk to test)")
    parser.add_argument("--total-mb", type=int, default=256, help="MiB written per measurement")
    parser.add_argument(
        "--sizes",
        default=",".join(str(s) for s in DEFAULT_SIZES),
        help="batch sizes in bytes, comma-separated",
    )
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    base = Path(tempfile.mkdtemp(prefix="replicad-bench-", dir=args.dir))
    total = args.total_mb * MIB
    try:
        print(f"Append throughput, {args.total_mb} MiB per cell, into {base} (MB/s = MiB/s)\n")
        print("| batch size | replicad, 1 batch/append | replicad, 1 MiB/append | dd bs=batch |")
        print("|---:|---:|---:|---:|")
        for size in (int(s) for s in args.sizes.split(",")):
            one = bench_replicad(base / "one", size, total, per_append=1)
            fetch = bench_replicad(base / "fetch", size, total, per_append=FETCH_BYTES)
            dd = bench_dd(base / "dd", size, total)
            label = f"{size // MIB} MiB" if size >= MIB else f"{size // KIB} KiB"
            print(f"| {label} | {one:,.0f} | {fetch:,.0f} | {dd:,.0f} |", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
