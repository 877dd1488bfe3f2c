"""The archive, measured: upload throughput and requests per GB, and Spark reading the
bucket against Spark reading the same replica on local disk, as a markdown table.

    .venv/bin/python -m tools.bench.archive [--mb 256] [--segment-mb 64] [--value-bytes 1000]
        [--master local[2]] [--repeat 1] [--work-dir DIR]

One run, the same data for every row:
1. A replica written by replicad's own log store (PartitionLog: real segments and indexes)
   from real producer batches (kafka-python's builder, tools.logdata), `--mb` MB in one
   partition, rolled at `--segment-mb` (the issue's goal is stated for the default 1 GiB).
2. versitygw (tools/peers/s3.py, its posix backend on the same disk) behind nothing; the
   archive's uploader (replicad/archive/uploader.py) uploads every closed segment: MB/s and
   PUTs per GB uploaded.
3. One Spark session, each read forced in full into Spark's `noop` sink, timed: the
   `replicad` source over the local directory, then over `s3://bucket/prefix` (ranged GETs
   through boto3 on the executors); GET requests per GB read from versitygw's access log.
`spark.read.parquet` of the same records in the same bucket (the issue's third row) needs
Hadoop's S3A jars on the classpath and is not measured yet. The server, the uploader and
Spark share this machine's two cores: the figures are of this machine under its load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from replicad.archive.store import BucketSettings
from replicad.archive.uploader import Archiver, ArchiverSettings
from replicad.clock import wall_ms
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch
from tools.peers.s3 import ACCESS_KEY, REGION, SECRET_KEY, S3Server, client_environ

MB = 1024 * 1024
TP = TopicPartition("bench", 0)


def write_replica(data_dir: Path, *, total_bytes: int, segment_bytes: int, value_bytes: int) -> int:
    """A one-partition replica of about `total_bytes`; its record count."""
    manager = LogManager.open(data_dir, LogConfig(segment_bytes=segment_bytes), now_ms=wall_ms())
    log = manager.get_or_create(TP, topic_id=uuid.uuid4())
    offset, per_batch = 0, 100
    values = [os.urandom(value_bytes // 2).hex().encode() for _ in range(per_batch)]
    while log.size_in_bytes < total_bytes:
        raw = producer_batch(offset, values)
        log.append(raw, scan_batches(raw).batches, now_ms=wall_ms())
        offset += per_batch
    log.high_watermark = log.log_end_offset
    log.roll_if_idle(now_ms=wall_ms() + 10**10)
    manager.checkpoint()
    manager.close()
    return offset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--segment-mb", type=int, default=64)
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--work-dir", type=Path)
    args = parser.parse_args()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-archive-"))
    data_dir = work / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    shutil.rmtree(work / "s3", ignore_errors=True)
    rows = write_replica(
        data_dir,
        total_bytes=args.mb * MB,
        segment_bytes=args.segment_mb * MB,
        value_bytes=args.value_bytes,
    )
    log_bytes = sum(p.stat().st_size for p in data_dir.rglob("*.log"))
    server = S3Server(work / "s3", access_log=True)
    with server:
        bucket = server.create_bucket("bench")
        settings = ArchiverSettings(
            BucketSettings(
                bucket,
                "replica",
                endpoint=server.endpoint,
                region=REGION,
                access_key_id=ACCESS_KEY,
                secret_access_key=SECRET_KEY,
                max_attempts=1,
            )
        )
        archiver = Archiver(settings)
        manager = LogManager.open(
            data_dir, LogConfig(segment_bytes=args.segment_mb * MB), now_ms=wall_ms()
        )
        started = time.perf_counter()
        archiver.round(manager)
        upload_s = time.perf_counter() - started
        manager.close()
        snap = archiver.snapshot()
        uploaded_gb = snap["uploaded_bytes"] / 1024**3
        puts_per_gb = snap["requests"]["PUT"] / uploaded_gb

        os.environ.update(client_environ())
        from replicad.spark.pipeline import spark_session

        spark = spark_session(args.master, {"spark.ui.enabled": "false"}, app_name="bench")

        def noop(path: str, **options: str) -> float:
            reader = spark.read.format("replicad").option("s3Endpoint", server.endpoint)
            for key, value in options.items():
                reader = reader.option(key, value)
            best = float("inf")
            for _ in range(args.repeat):
                begin = time.perf_counter()
                reader.load(path).write.format("noop").mode("overwrite").save()
                best = min(best, time.perf_counter() - begin)
            return best

        url = f"s3://{bucket}/replica"
        noop(str(data_dir), endingOffsets="1000")  # warm the workers and the JVM
        local_s = noop(str(data_dir))
        gets_before = server.requests("GetObject")
        bucket_s = noop(url)
        gets = (server.requests("GetObject") - gets_before) / args.repeat  # per read
        spark.stop()
    gb = log_bytes / 1024**3
    print(
        f"{rows:,} records, {log_bytes / MB:.0f} MB of log in {args.segment_mb} MB segments, "
        f"Spark {args.master}, best of {args.repeat}; machine shared (load: "
        f"{os.getloadavg()[0]:.1f})\n"
    )
    print("| what | seconds | MB/s | requests per GB |")
    print("|---|---:|---:|---:|")
    print(
        f"| upload (archive uploader -> versitygw) | {upload_s:.1f} | "
        f"{log_bytes / MB / upload_s:.0f} | {puts_per_gb:.1f} PUT |"
    )
    local_mbs = log_bytes / MB / local_s
    print(f"| Spark `replicad`, local directory | {local_s:.1f} | {local_mbs:.0f} | - |")
    print(
        f"| Spark `replicad`, `s3://` bucket | {bucket_s:.1f} | {log_bytes / MB / bucket_s:.0f} | "
        f"{gets / gb:.1f} GET |"
    )
    print(f"\nbucket / local: {local_s / bucket_s:.2f}x")


if __name__ == "__main__":
    main()
