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
4. With Hadoop's S3A jars fetched (`make s3a-jars`: hadoop-aws 3.5.0, PySpark's Hadoop,
   and the AWS SDK v2 bundle, into .cache/s3a): the same records as parquet (the
   `replicad` source's rows written by Spark to a local directory, snappy, then each file
   PUT into the same bucket under `parquet/`), read by `spark.read.parquet("s3a://...")`;
   its GETs (and S3A's HEADs and LISTs) from the access log. Without the jars the row says
   how to get them.
The server, the uploader and Spark share this machine's two cores: the figures are of this
machine under its load (printed with them).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replicad.archive.store import ObjectStore
from replicad.archive.uploader import Archiver, ArchiverSettings
from replicad.clock import wall_ms
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.bench.measure import cpu_seconds
from tools.logdata.batches import producer_batch
from tools.peers.s3 import ACCESS_KEY, REGION, SECRET_KEY, S3Server, bucket_settings, client_environ

MB = 1024 * 1024
TP = TopicPartition("bench", 0)
ROOT = Path(__file__).resolve().parents[2]
S3A_LIB = ROOT / ".cache" / "s3a" / "lib"


def s3a_jars() -> list[Path]:
    """Hadoop's S3A and the AWS SDK bundle (`make s3a-jars`); none when not fetched."""
    if not (S3A_LIB / ".fetched").exists():
        return []
    return sorted(S3A_LIB.glob("*.jar"))


def s3a_conf(endpoint: str) -> dict[str, str]:
    """S3A against the benchmark's versitygw: path-style, plain HTTP, its root keys."""
    return {
        "spark.hadoop.fs.s3a.endpoint": endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": REGION,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.access.key": ACCESS_KEY,
        "spark.hadoop.fs.s3a.secret.key": SECRET_KEY,
        "spark.hadoop.fs.s3a.aws.credentials.provider": (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        ),
    }


def operations(server: S3Server) -> Counter[str]:
    """S3 requests by operation in the server's access log so far."""
    if server.access_log is None or not server.access_log.exists():
        return Counter()
    text = server.access_log.read_text(errors="replace")
    return Counter(re.findall(r" s3_(\w+) ", text))


def write_replica(data_dir: Path, *, total_bytes: int, segment_bytes: int, value_bytes: int) -> int:
    """A one-partition replica of about `total_bytes`; its record count."""
    manager = LogManager.open(data_dir, LogConfig(segment_bytes=segment_bytes), now_ms=wall_ms())
    log = manager.get_or_create(TP, topic_id=uuid.uuid4())
    offset, per_batch = 0, 100
    while log.size_in_bytes < total_bytes:
        # Every value its own: parquet's dictionary would shrink repeated ones to nothing.
        values = [os.urandom(value_bytes // 2).hex().encode() for _ in range(per_batch)]
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
    if args.work_dir is not None:
        run(args, args.work_dir)
        return
    # A work directory of its own is removed at the end: it holds the replica, the
    # bucket's copy of it and the parquet files (three times --mb).
    work = Path(tempfile.mkdtemp(prefix="bench-archive-"))
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> None:
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
            bucket_settings(server.endpoint, bucket, "replica", max_attempts=1)
        )
        archiver = Archiver(settings)
        manager = LogManager.open(
            data_dir, LogConfig(segment_bytes=args.segment_mb * MB), now_ms=wall_ms()
        )
        s3_cpu_before = cpu_seconds(server.pid) if server.pid else None
        started, cpu_before = time.perf_counter(), time.process_time()
        archiver.round(manager)
        upload_s = time.perf_counter() - started
        upload_cpu_s = time.process_time() - cpu_before  # every thread of this process
        s3_cpu_s = (
            (cpu_seconds(server.pid) or 0.0) - s3_cpu_before
            if server.pid and s3_cpu_before is not None
            else None
        )
        manager.close()
        snap = archiver.snapshot()
        uploaded_gb = snap["uploaded_bytes"] / 1024**3
        puts_per_gb = snap["requests"]["PUT"] / uploaded_gb

        os.environ.update(client_environ())
        from replicad.spark.pipeline import spark_session

        jars = s3a_jars()
        conf = {"spark.ui.enabled": "false"}
        if jars:
            conf |= {"spark.jars": ",".join(map(str, jars)), **s3a_conf(server.endpoint)}
        spark = spark_session(args.master, conf, app_name="bench")

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
        parquet = parquet_row(spark, server, bucket, data_dir, work, args.repeat) if jars else None
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
    if parquet is None:
        print("| `spark.read.parquet`, `s3a://` bucket | not measured: `make s3a-jars` | | |")
    else:
        print(
            f"| `spark.read.parquet`, `s3a://` bucket ({parquet.mb:.0f} MB of parquet, "
            f"{parquet.files} files) | {parquet.seconds:.1f} | "
            f"{log_bytes / MB / parquet.seconds:.0f} | "
            f"{parquet.puts / gb:.1f} PUT, {parquet.gets / gb:.1f} GET, "
            f"{parquet.others / gb:.1f} HEAD/LIST |"
        )
    print(
        f"\nupload CPU: the uploader {upload_cpu_s / gb:.2f} CPU s per GB"
        + ("" if s3_cpu_s is None else f", versitygw {s3_cpu_s / gb:.2f}")
        + f" ({settings.upload_threads} upload threads, payload "
        + ("signed" if settings.bucket.signs_payload else "unsigned")
        + ")"
    )
    print(f"bucket / local: {local_s / bucket_s:.2f}x")
    if parquet is not None:
        print(
            f"replicad from the bucket / parquet from the bucket: {parquet.seconds / bucket_s:.2f}x"
        )
    print("MB/s and requests per GB are per MB and GB of the replica's log, for every row.")


@dataclass(frozen=True)
class ParquetRow:
    seconds: float
    mb: float
    files: int
    puts: int
    gets: float
    others: float


def parquet_row(
    spark: Any, server: S3Server, bucket: str, data_dir: Path, work: Path, repeat: int
) -> ParquetRow:
    """The same records as parquet in the same bucket, read by S3A (see the module doc)."""
    local = work / "parquet"
    shutil.rmtree(local, ignore_errors=True)
    spark.read.format("replicad").load(str(data_dir)).write.parquet(str(local))
    files = sorted(p for p in local.glob("*.parquet"))
    store = ObjectStore(bucket_settings(server.endpoint, bucket))
    for path in files:
        store.put_file(f"parquet/{path.name}", path)
    url = f"s3a://{bucket}/parquet"
    spark.read.parquet(url).write.format("noop").mode("overwrite").save()  # S3A's classes
    before = operations(server)
    best = float("inf")
    for _ in range(repeat):
        begin = time.perf_counter()
        spark.read.parquet(url).write.format("noop").mode("overwrite").save()
        best = min(best, time.perf_counter() - begin)
    used = operations(server) - before
    gets = used.pop("GetObject", 0) / repeat
    return ParquetRow(
        seconds=best,
        mb=sum(p.stat().st_size for p in files) / MB,
        files=len(files),
        puts=store.requests["PUT"],
        gets=gets,
        others=sum(used.values()) / repeat,
    )


if __name__ == "__main__":
    main()
