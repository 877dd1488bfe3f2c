"""The Python side of a `replicad` read, in one process, without Spark: what an executor's
Python worker spends on a split, for A/B runs of the reader on a loaded machine.

    .venv/bin/python -m tools.bench.spark_read_cpu [--mb 100] [--partitions 4]
        [--codec none|gzip|snappy|lz4|zstd] [--repeat 5] [--work-dir DIR] [--py-spy FILE]

1. A static replica written by replicad's log store: `--mb` MB of records like
   tools.bench.spark's (1000-byte values of words, 4,096 distinct, `key-N` keys, a `trace`
   header on every fourth record, producer batches of about 1 MB, `--codec`).
2. The read planned as Spark would (`ReplicadReader.partitions()`), then each split read by
   `ReplicadReader.read` and every Arrow batch written as PySpark's data source worker
   hands it to the JVM (an Arrow IPC stream into a buffered file, /dev/null here).
3. `--repeat` passes, each timed by this process's CPU seconds (user and system apart) and
   its minor page faults; the table gives each pass and the median. Wall time is not
   printed: on a shared machine it says nothing. The replica's files are read once before
   timing, so the page cache holds them (as it does for a read right after replication).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

MB = 1_000_000
VALUE_BYTES = 1000
DISTINCT_VALUES = 4096
HEADER_EVERY = 4
BATCH_BYTES = 1_000_000  # about what the bench's producer (batch.size 1 MB) sends
WORDS = [
    b"order", b"payment", b"refund", b"invoice", b"customer", b"account", b"session",
    b"click", b"view", b"cart", b"checkout", b"shipment", b"warehouse", b"region",
]  # fmt: skip
# PySpark's worker writes to its socket through a buffered file of this size.
WRITE_BUFFER = 65536


def write_replica(data_dir: Path, partitions: int, mb: float, codec: str) -> int:
    """A static replica of about `mb` MB of keys and values; its record count."""
    from replicad.log.config import LogConfig
    from replicad.log.partition import PartitionLog
    from replicad.records.batch import Compression, scan_batches
    from replicad.types import TopicPartition
    from tools.logdata.batches import producer_batch

    rng = random.Random(7)
    values = []
    for _ in range(DISTINCT_VALUES):
        text = b" ".join(rng.choice(WORDS) for _ in range(VALUE_BYTES // 5))
        values.append(text[:VALUE_BYTES])
    per_batch = BATCH_BYTES // VALUE_BYTES
    per_partition = max(per_batch, int(mb * MB / VALUE_BYTES / partitions))
    config = LogConfig(segment_bytes=1024**3, index_interval_bytes=4096)
    ends = []
    for p in range(partitions):
        log = PartitionLog.create(
            data_dir / f"bench-{p}", TopicPartition("bench", p), config, now_ms=0
        )
        try:
            for base in range(0, per_partition, per_batch):
                offsets = range(base, base + min(per_batch, per_partition - base))
                # Headers on a batch's records, as the bench's producer adds on some.
                with_header = base % (per_batch * HEADER_EVERY) == 0
                raw = producer_batch(
                    base,
                    [values[(p + o) % DISTINCT_VALUES] for o in offsets],
                    keys=[b"key-%d" % o for o in offsets],
                    codec=Compression[codec.upper()],
                    headers=[("trace", b"%08x" % base)] if with_header else (),
                )
                log.append(raw, scan_batches(raw).batches, now_ms=0)
        finally:
            log.close()
        ends.append(f"bench {p} {per_partition}")
    checkpoint = "\n".join(["0", str(partitions), *ends]) + "\n"
    (data_dir / "replication-offset-checkpoint").write_text(checkpoint)
    return per_partition * partitions


def batches(data_dir: Path) -> Iterator[pa.RecordBatch]:
    """Every Arrow batch a batch read of the replica hands Spark, split by split."""
    from replicad.spark.options import parse_options
    from replicad.spark.source import ReplicadReader

    reader = ReplicadReader(parse_options({"path": str(data_dir)}))
    for partition in reader.partitions():
        yield from reader.read(partition)


def one_pass(data_dir: Path) -> tuple[float, float, int, int]:
    """(user CPU s, system CPU s, minor faults, rows) of one read written as PySpark does."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    rows = 0
    with open("/dev/null", "wb", buffering=WRITE_BUFFER) as out:
        writer = None
        for batch in batches(data_dir):
            if writer is None:
                writer = pa.ipc.new_stream(out, batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
        if writer is not None:
            writer.close()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (
        after.ru_utime - before.ru_utime,
        after.ru_stime - before.ru_stime,
        after.ru_minflt - before.ru_minflt,
        rows,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--codec", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"]
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--work-dir", help="keep the replica here (made once, reused)")
    parser.add_argument("--py-spy", help="record the passes with py-spy into this file")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.work_dir:
            data_dir = Path(args.work_dir)
        else:
            data_dir = Path(tempfile.mkdtemp(prefix="replicad-read-cpu-"))
            stack.callback(shutil.rmtree, data_dir, ignore_errors=True)
        if not (data_dir / "replication-offset-checkpoint").exists():
            data_dir.mkdir(parents=True, exist_ok=True)
            records = write_replica(data_dir, args.partitions, args.mb, args.codec)
            print(f"wrote {records:,} records", file=sys.stderr)
        log_bytes = sum(f.stat().st_size for f in data_dir.glob("*/*.log"))
        for path in data_dir.glob("*/*.log"):
            path.read_bytes()  # into the page cache
        one_pass(data_dir)  # warm: imports, the allocator's pools
        if args.py_spy:
            py_spy = str(Path(sys.executable).with_name("py-spy"))
            spy = subprocess.Popen(
                [py_spy, "record", "--pid", str(os.getpid()), "--format", "raw",
                 "--output", args.py_spy, "--rate", "200", "--nonblocking"],
            )  # fmt: skip
            stack.callback(spy.wait)
            stack.callback(spy.send_signal, 2)
            time.sleep(1.0)  # py-spy attaches
        print(f"load average at the start: {Path('/proc/loadavg').read_text().split()[0]}")
        print("| pass | rows | log MB | user CPU s | system CPU s | CPU s/GB | minor faults |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        totals = []
        for i in range(args.repeat):
            user, system, faults, rows = one_pass(data_dir)
            totals.append(user + system)
            print(
                f"| {i + 1} | {rows:,} | {log_bytes / MB:.0f} | {user:.3f} | {system:.3f} | "
                f"{(user + system) / (log_bytes / 1e9):.2f} | {faults:,} |"
            )
        print(f"median CPU s a pass: {statistics.median(totals):.3f}")
        print(f"load average at the end: {Path('/proc/loadavg').read_text().split()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
