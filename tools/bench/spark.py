"""Reading a topic with Spark, batch and streaming, as a markdown table: rows/s and MB/s.

    .venv/bin/python -m tools.bench.spark [--gb 2] [--partitions 4] [--value-bytes 1000]
        [--codec none] [--master local[2]] [--repeat 1] [--work-dir DIR] [--keep]

One run, the same data for all three:
1. A local Apache Kafka broker (tools.peers) gets >= `--gb` GB of records (keys, ~1 KB text
   values, a header on every fourth record) from confluent-kafka, and `replicad run`
   replicates the topic into a data directory.
2. In one Spark session (`--master`, default local[2]), each read is forced in full with
   Spark's `noop` sink (every row and column materialised, nothing written), timed:
   - `replicad` source over the replicated segments (no broker involved);
   - Spark's own Kafka source (spark-sql-kafka-0-10, `make spark-kafka-jars`: the version
     tools/kafka/spark-kafka-pom.xml names, given as spark.jars) reading the topic from the
     broker, twice: at its defaults, and tuned for throughput as its integration guide and
     the Kafka consumer's docs offer (`KAFKA_TUNED`: `minPartitions`, so each Kafka
     partition is read by several tasks, and larger consumer fetches); both printed;
   - `spark.read.parquet` of the same records, exported first with `replicad pipeline
     export` (its time is shown too): the ceiling of a columnar file format;
   - streaming, Trigger.AvailableNow into Spark's `noop` sink (a fresh checkpoint each
     time): `spark.readStream` of the `replicad` source, and of Spark's Kafka source from
     the broker (no maxOffsetsPerTrigger, so one micro-batch each), default and tuned;
     and Spark's own file stream over the exported parquet (`spark.readStream.parquet`):
     beside `spark.read.parquet`, what the streaming engine adds to a read of any source.
     Each streaming run prints where its time went (`phases`): its micro-batches, by
     Spark's own `durationMs`, and outside them (starting and stopping the query).
   A small read first warms the Python workers and the JVM, and a small stream of each
   source (the last WARM_RECORDS of each partition) the streaming engine, so no row pays
   for start-up and neither source's stream for the JIT compiling Spark's micro-batches.
MB/s is given over each source's own input and over the log bytes (the same volume for
all three). CPU seconds are the Spark JVM's and its Python workers' (the process trees,
/proc polled through the read, so a Python worker that ends during it still counts:
tools/bench/spark_cpu.py), and the broker's apart: a Kafka source read costs the broker's
CPU too, a replica read none. A read whose CPU is far below its wall time was waiting, not working.
Everything sits in the page cache (the data was just written): this measures
the readers, not the disk.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tools.bench.spark_kafka import connector_jars, connector_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from tools.bench.spark_cpu import TreeCpu
    from tools.bench.spark_stream_cost import ThreadSampler

GB = 1_000_000_000
MB = 1_000_000
WORDS = [
    b"order", b"payment", b"refund", b"invoice", b"customer", b"account", b"session",
    b"click", b"view", b"cart", b"checkout", b"shipment", b"warehouse", b"region",
]  # fmt: skip
DISTINCT_VALUES = 4096
HEADER_EVERY = 4
WARM_RECORDS = 500  # a partition's records read by each warm-up stream


@dataclass(frozen=True)
class Timing:
    source: str
    rows: int
    input_bytes: int
    seconds: float
    spark_cpu_s: float = float("nan")
    broker_cpu_s: float = float("nan")
    jvm_cpu_s: float = float("nan")  # of spark_cpu_s, the JVM's own threads
    load: str = ""  # the 1-minute load average when the read started
    threads: str = ""  # the Spark JVM's threads, CPU s by name (spark_stream_cost.ThreadSampler)


# Spark's Kafka source tuned for a throughput read, each from its own docs: the integration
# guide's `minPartitions` (Kafka partitions split across more Spark tasks, set to the
# master's cores times two in `kafka_tuned`), and the consumer's fetch sizes (Kafka's
# consumer configs: max.partition.fetch.bytes 1 MiB and fetch.max.bytes 50 MiB by
# default; a larger per-partition fetch means fewer round trips per task).
# What the default rows run with (printed next to the tuned settings): Spark's one task per
# Kafka partition, the consumer's fetch sizes, and the 64 KiB receive buffer Spark's source
# sets when none is given (KafkaSourceProvider, KAFKA-3135).
KAFKA_DEFAULTS = {
    "minPartitions": "unset (one task per Kafka partition)",
    "kafka.max.partition.fetch.bytes": str(1024 * 1024),
    "kafka.fetch.max.bytes": str(50 * 1024 * 1024),
    "kafka.receive.buffer.bytes": str(64 * 1024),
}
KAFKA_TUNED = {
    "kafka.max.partition.fetch.bytes": str(16 * 1024 * 1024),
    "kafka.fetch.max.bytes": str(64 * 1024 * 1024),
    "kafka.receive.buffer.bytes": str(4 * 1024 * 1024),
}


def master_cores(master: str) -> int:
    """The cores of a `local[N]` / `local[*]` master (the machine's for anything else)."""
    inside = master[master.find("[") + 1 : master.find("]")] if "[" in master else ""
    return int(inside) if inside.isdigit() else os.cpu_count() or 1


def kafka_tuned(master: str) -> dict[str, str]:
    return {**KAFKA_TUNED, "minPartitions": str(2 * master_cores(master))}


class Meter:
    """CPU seconds of the Spark JVM's process tree (with the forkserver's, whose forks
    are the driver-side Python workers: replicad/spark/forkserver.py) and of the broker
    over one read, the processes that end during it too (tools/bench/spark_cpu.py)."""

    def __init__(self, spark_pid: int, broker_pid: int | None) -> None:
        self.spark_pid = spark_pid
        self.broker_pid = broker_pid

    def spark_roots(self) -> list[int]:
        from replicad.spark.pipeline import _forkserver

        return [self.spark_pid, *(server.pid for server in _forkserver)]

    def start(self) -> MeteredRead:
        from tools.bench.spark_cpu import TreeCpu
        from tools.bench.spark_stream_cost import ThreadSampler

        broker_pid = self.broker_pid
        # The broker starts no process: its two readings suffice. Spark's trees are polled
        # 4 times a second and its threads twice (a poll of 150 threads is about 10 ms of
        # the bench's own CPU, beside Spark's on two cores); a worker that ends is an idle
        # one, and a thread that ends (a stream's) loses at most its last half second.
        broker = TreeCpu(lambda: [broker_pid], every_s=3600) if broker_pid else None
        threads = ThreadSampler(self.spark_pid, every_s=0.5)
        spark = TreeCpu(self.spark_roots, every_s=0.25)
        return MeteredRead(self.spark_pid, spark, broker, threads)


@dataclass
class MeteredRead:
    spark_pid: int
    spark: TreeCpu
    broker: TreeCpu | None
    threads: ThreadSampler

    def stop(self) -> tuple[float, float, float, str]:
        """(Spark's trees, the broker's, the Spark JVM's own threads, those threads by
        name): Spark's less the JVM's own is Python (the executors' workers, the
        driver-side processes)."""
        spark = self.spark.stop()
        broker = sum(s.total for s in self.broker.stop()) if self.broker else float("nan")
        jvm = sum(s.own for s in spark if s.pid == self.spark_pid)
        # Python processes that started or ended in the read (a worker's start is its
        # imports: about 1-2 CPU-s on this machine).
        started = sum(s.started for s in spark)
        ended = sum(s.ended for s in spark)
        threads = f"{self.threads.stop()}; processes started {started}, ended {ended}"
        return sum(s.total for s in spark), broker, jvm, threads


def load_average() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


NO_CPU = (float("nan"), float("nan"), float("nan"), "")


def produce(bootstrap: str, topic: str, *, target_bytes: int, value_bytes: int, codec: str) -> int:
    """Records into `topic` until about `target_bytes` of values and keys were sent."""
    from confluent_kafka import Producer

    rng = random.Random(7)
    values = []
    for _ in range(DISTINCT_VALUES):
        text = b" ".join(rng.choice(WORDS) for _ in range(value_bytes // 5))
        values.append(text[:value_bytes])
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": codec,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 1_000_000,
            "acks": "1",
        }
    )
    sent = count = 0
    while sent < target_bytes:
        key = b"key-%d" % count
        value = values[count % DISTINCT_VALUES]
        headers = [("trace", b"%08x" % count)] if count % HEADER_EVERY == 0 else None
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
        sent += len(key) + len(value)
        count += 1
        if count % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("records left unsent")
    return count


def replicate(bootstrap: str, topic: str, data_dir: Path, work: Path, expected: int) -> None:
    from tools.replica import replicad_run

    with replicad_run(bootstrap, topic, data_dir, log_path=work / "replicad.log") as proc:
        proc.wait_for(
            lambda: sum(proc.end_offsets().values()) >= expected,
            timeout_s=1800,
            interval_s=2,
            what="replicad to catch up",
        )


def spark_version() -> str:
    import pyspark

    return pyspark.__version__


def tree_bytes(path: Path, suffix: str = "") -> int:
    return sum(p.stat().st_size for p in path.rglob(f"*{suffix}") if p.is_file())


def timed(
    source: str,
    rows: int,
    input_bytes: int,
    action: Callable[[], object],
    repeat: int = 1,
    meter: Meter | None = None,
) -> Timing:
    """The fastest of `repeat` runs (on a shared machine the others' load only slows
    down), with that run's CPU seconds."""
    best = Timing(source, rows, input_bytes, float("inf"))
    for _ in range(repeat):
        load = load_average()
        metered = meter.start() if meter else None
        started = time.perf_counter()
        action()
        seconds = time.perf_counter() - started
        cpu = metered.stop() if metered else NO_CPU
        print(f"{source}: {seconds:.2f} s, {cpu_line(cpu, load)}", flush=True)
        if seconds < best.seconds:
            best = metered_timing(source, rows, input_bytes, seconds, cpu, load)
    return best


def cpu_line(cpu: tuple[float, float, float, str], load: str) -> str:
    """One read's CPU as printed while the bench runs (every repeat, not only the best)."""
    spark, broker, jvm, threads = cpu
    split = f"JVM {jvm:.2f}, Python {spark - jvm:.2f}"
    return f"CPU s {spark:.2f} ({split}), broker {broker:.2f}, load {load}; {threads}"


def metered_timing(
    source: str,
    rows: int,
    input_bytes: int,
    seconds: float,
    cpu: tuple[float, float, float, str],
    load: str,
) -> Timing:
    spark, broker, jvm, threads = cpu
    return Timing(source, rows, input_bytes, seconds, spark, broker, jvm, load, threads)


def run(args: argparse.Namespace, work: Path) -> list[Timing]:
    from tools.peers.kafka import KafkaBroker

    broker = KafkaBroker(work / "kafka", heap="2g")
    broker.start()
    try:
        topic = "bench-spark"
        broker.create_topic(topic, args.partitions)
        started = time.perf_counter()
        rows = produce(
            broker.bootstrap,
            topic,
            target_bytes=int(args.gb * GB),
            value_bytes=args.value_bytes,
            codec=args.codec,
        )
        print(f"produced {rows:,} records in {time.perf_counter() - started:.0f} s", flush=True)
        data_dir = work / "replica"
        started = time.perf_counter()
        replicate(broker.bootstrap, topic, data_dir, work, rows)
        log_bytes = tree_bytes(data_dir, ".log")
        print(
            f"replicated {log_bytes / GB:.2f} GB of segments in "
            f"{time.perf_counter() - started:.0f} s",
            flush=True,
        )
        if log_bytes < args.gb * GB:
            print(f"note: {log_bytes / GB:.2f} GB of segments, below --gb (compression)")
        return read_three_ways(
            args, broker.bootstrap, topic, data_dir, work, rows, log_bytes, broker.pid
        )
    finally:
        broker.stop()


def read_three_ways(
    args: argparse.Namespace,
    bootstrap: str,
    topic: str,
    data_dir: Path,
    work: Path,
    rows: int,
    log_bytes: int,
    broker_pid: int | None = None,
) -> list[Timing]:
    from replicad.spark.pipeline import export, spark_session

    spark = spark_session(
        args.master,
        {
            "spark.jars": args.kafka_jars,
            "spark.driver.memory": "4g",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            **dict(kv.split("=", 1) for kv in args.conf),
        },
        app_name="replicad bench",
    )
    spark.sparkContext.setLogLevel("WARN")
    meter = Meter(spark.sparkContext._gateway.proc.pid, broker_pid)  # type: ignore[attr-defined]
    tuned = kafka_tuned(args.master)
    for name, settings in (("default", KAFKA_DEFAULTS), ("tuned", tuned)):
        print(f"Spark Kafka source, {name}: " + ", ".join(f"{k}={v}" for k, v in settings.items()))

    def noop(df: DataFrame) -> None:
        df.write.format("noop").mode("overwrite").save()

    replicad_df = spark.read.format("replicad").load(str(data_dir))
    kafka_read = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")  # the same columns as the replicad source
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
    )
    kafka_df = kafka_read.load()
    kafka_tuned_df = kafka_read.options(**tuned).load()
    # Warm-up: Python workers, the Kafka consumer classes, the JIT.
    noop(spark.read.format("replicad").option("endingOffsets", "2000").load(str(data_dir)))
    noop(kafka_df.limit(2000))
    # ... and the streaming engine, for both sources alike: the first stream of a session
    # pays for the JIT compiling Spark's micro-batch code (spark_stream_cost's threads: the
    # compiler threads spent as much CPU as the executors' in a session's first reads).
    warm = json.dumps({topic: near_end(data_dir, topic, WARM_RECORDS)})
    for source, options in (
        ("replicad", {"path": str(data_dir)}),
        ("kafka", {"kafka.bootstrap.servers": bootstrap, "subscribe": topic}),
    ):
        small = spark.readStream.format(source).options(**options, includeHeaders="true")
        query = (
            small.option("startingOffsets", warm)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(work / "checkpoints" / f"warm-{source}"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    repeat = args.repeat
    timings = [
        timed(
            "replicad source (segments)", rows, log_bytes, lambda: noop(replicad_df), repeat, meter
        ),
        timed(
            "Spark Kafka source (broker), defaults",
            rows,
            log_bytes,
            lambda: noop(kafka_df),
            repeat,
            meter,
        ),
        timed(
            "Spark Kafka source (broker), tuned",
            rows,
            log_bytes,
            lambda: noop(kafka_tuned_df),
            repeat,
            meter,
        ),
    ]
    parquet = work / "parquet"
    exported = timed(
        "replicad pipeline export (to parquet)",
        rows,
        log_bytes,
        lambda: export(str(data_dir), "parquet", str(parquet), mode="overwrite", spark=spark),
        meter=meter,
    )
    parquet_bytes = tree_bytes(parquet, ".parquet")
    parquet_df = spark.read.parquet(str(parquet))
    timings.append(
        timed(
            "spark.read.parquet (ceiling)",
            rows,
            parquet_bytes,
            lambda: noop(parquet_df),
            repeat,
            meter,
        )
    )
    timings.append(exported)
    checkpoints = iter(range(1_000_000))

    def stream_noop(source: str, df: DataFrame, input_bytes: int = log_bytes) -> Timing:
        """One Trigger.AvailableNow run into `noop`, timed from its start to its end; a start
        whose Python source process did not connect back in time (follow.py) is started
        again and its lost seconds not counted."""
        from replicad.spark.follow import START_ATTEMPTS, worker_start_failed

        best = Timing(source, rows, input_bytes, float("inf"))
        for _ in range(repeat):
            load = load_average()
            for attempt in range(1, START_ATTEMPTS + 1):
                checkpoint = work / "checkpoints" / str(next(checkpoints))
                metered = meter.start()
                started = time.perf_counter()
                query = (
                    df.writeStream.format("noop")
                    .option("checkpointLocation", str(checkpoint))
                    .trigger(availableNow=True)
                    .start()
                )
                try:
                    query.awaitTermination()
                    break
                except Exception as exc:
                    metered.stop()
                    if attempt == START_ATTEMPTS or not worker_start_failed(exc):
                        raise
            seconds = time.perf_counter() - started
            cpu = metered.stop()
            print(f"{source}: {phases(query.recentProgress, seconds)}", flush=True)
            print(f"{source}: {cpu_line(cpu, load)}", flush=True)
            if seconds < best.seconds:
                best = metered_timing(source, rows, input_bytes, seconds, cpu, load)
        return best

    replicad_stream = spark.readStream.format("replicad").load(str(data_dir))
    kafka_stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .option("startingOffsets", "earliest")
    )
    timings.append(stream_noop("replicad stream, AvailableNow (segments)", replicad_stream))
    timings.append(
        stream_noop("Spark Kafka source stream, AvailableNow, defaults", kafka_stream.load())
    )
    timings.append(
        stream_noop(
            "Spark Kafka source stream, AvailableNow, tuned", kafka_stream.options(**tuned).load()
        )
    )
    parquet_stream = spark.readStream.schema(parquet_df.schema).parquet(str(parquet))
    timings.append(
        stream_noop(
            "spark.readStream.parquet (Spark's file stream), AvailableNow",
            parquet_stream,
            parquet_bytes,
        )
    )
    counted = replicad_df.count()
    if counted != rows:
        raise RuntimeError(f"replicad source counted {counted:,} rows, {rows:,} were produced")
    spark.stop()
    return timings


def near_end(data_dir: Path, topic: str, records: int) -> dict[str, int]:
    """Offsets `records` before each partition's end, by the replica's high watermarks."""
    from replicad.spark.stream import high_watermarks

    return {
        str(tp.partition): max(0, end - records)
        for tp, end in high_watermarks(str(data_dir)).items()
        if tp.topic == topic
    }


def phases(progress: list[dict], seconds: float) -> str:
    """Where a streaming run's time went: its micro-batches (Spark's own `durationMs`: the
    source's offsets, planning, the read, the checkpoint's writes) and the rest, which is
    starting and stopping the query (for a Python source, the process that hosts it on the
    driver starts with the query)."""
    batches = [p for p in progress if p["numInputRows"] > 0]
    total_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in progress)
    parts: dict[str, int] = {}
    for p in progress:
        for key, ms in p["durationMs"].items():
            if key != "triggerExecution":
                parts[key] = parts.get(key, 0) + ms
    detail = ", ".join(f"{key} {ms / 1000:.2f}" for key, ms in sorted(parts.items()))
    return (
        f"{seconds:.2f} s: {len(batches)} micro-batches with rows ({len(progress)} in all) "
        f"{total_ms / 1000:.2f} s ({detail}); outside them {seconds - total_ms / 1000:.2f} s"
    )


def table(timings: list[Timing], log_bytes: int) -> str:
    lines = [
        "| read | rows | input | seconds | rows/s | MB/s (input) | MB/s (log bytes) "
        "| Spark CPU s | JVM | Python | broker CPU s | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in timings:
        lines.append(
            f"| {t.source} | {t.rows:,} | {t.input_bytes / MB:,.0f} MB | {t.seconds:.1f} | "
            f"{t.rows / t.seconds:,.0f} | {t.input_bytes / MB / t.seconds:,.1f} | "
            f"{log_bytes / MB / t.seconds:,.1f} | {t.spark_cpu_s:.1f} | {t.jvm_cpu_s:.1f} | "
            f"{t.spark_cpu_s - t.jvm_cpu_s:.1f} | {t.broker_cpu_s:.1f} | {t.load} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=2.0, help="GB of records to produce")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument(
        "--codec", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"]
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--repeat", type=int, default=1, help="time each read this many times, keep the fastest"
    )
    parser.add_argument(
        "--conf", action="append", default=[], help="KEY=VALUE for the Spark session"
    )
    parser.add_argument("--work-dir", help="where the broker, replica and parquet go")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    args.kafka_jars = connector_jars()
    # The driver-side Python forked warm (replicad/spark/forkserver.py) unless told `0`.
    from replicad.spark.forkserver import ENV, OFF

    os.environ.setdefault(ENV, "1")
    args.forkserver = "off" if os.environ[ENV] in OFF else "on"
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-spark-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        print(f"load average at the start: {load_average()}", flush=True)
        timings = run(args, work)
        print(f"load average at the end: {load_average()}")
        log_bytes = timings[0].input_bytes
        print()
        print(
            f"{args.master}, {os.cpu_count()} cores, {args.partitions} partitions, "
            f"best of {args.repeat}, "
            f"{args.value_bytes}-byte values, codec {args.codec}, "
            f"{log_bytes / GB:.2f} GB of segments; Spark {spark_version()}, "
            f"Kafka source {connector_name(args.kafka_jars)}; forkserver {args.forkserver}; "
            f"conf {args.conf or 'none'}"
        )
        print()
        print(table(timings, log_bytes))
        print("\nThe Spark JVM's threads, CPU s by name (digits as #), in each row's read:")
        for t in timings:
            print(f"- {t.source}: {t.threads}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
