"""How soon a produced record is a row in a Spark stream's sink: the `replicad` stream over a
replica next to Spark's Kafka source reading the broker, one run, the same records.

    .venv/bin/python -m tools.bench.spark_latency [--seconds 30] [--rate 200]
        [--trigger "1 second"] [--master local[2]] [--hw-interval-ms 200]

A local Apache Kafka broker (tools.peers) gets `--rate` records/s for `--seconds` from
confluent-kafka (linger.ms 0, each record stamped with its CreateTime). Two `replicad run`
replicate the topic at once into two data directories: one as configured by default (the
high watermarks reach `replication-offset-checkpoint` with the checkpoint, every 5 s), one
with `high_watermark_interval_ms` (`--hw-interval-ms`). Three streaming queries run in one
Spark session with a processing-time trigger (`--trigger`): the `replicad` source over each
data directory and Spark's Kafka source over the broker (`make spark-kafka-jars`), each into
a foreachBatch sink that notes, per record, the time its micro-batch held it minus the
record's CreateTime. The table gives percentiles of that latency per query: it counts the
whole way, producer -> broker -> replicad -> file -> Spark, so a replica's figure includes
replication (a fetch returns as soon as the leader has data).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tools.bench.spark_kafka import connector_jars, connector_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass
class Sink:
    """What one query's foreachBatch saw: a latency in ms per record, by offset."""

    name: str
    latencies_ms: dict[tuple[int, int], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def batch(self, df: DataFrame, batch_id: int) -> None:
        rows = df.selectExpr("partition", "offset", "unix_millis(timestamp) AS ts").collect()
        held_ms = int(time.time() * 1000)
        with self.lock:
            for r in rows:
                self.latencies_ms.setdefault((r.partition, r.offset), held_ms - r.ts)

    def count(self) -> int:
        with self.lock:
            return len(self.latencies_ms)


def percentile(values: list[int], p: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def produce_steadily(bootstrap: str, topic: str, partitions: int, rate: int, seconds: float) -> int:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "1"})
    sent = 0
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(elapsed * rate)
        while sent < due:
            producer.produce(topic, value=b"%d" % sent, partition=sent % partitions)
            sent += 1
        producer.poll(0)
        time.sleep(0.005)
    if producer.flush(60):
        raise RuntimeError("records left unsent")
    return sent


def start_query(df: DataFrame, sink: Sink, checkpoint: Path, trigger: str):
    """The query, once its first (empty) micro-batch ran; started again when its Python
    source process did not connect back in time (follow.py's rule)."""
    from replicad.spark.follow import START_ATTEMPTS, worker_start_failed

    for attempt in range(1, START_ATTEMPTS + 1):
        query = (
            df.writeStream.foreachBatch(sink.batch)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime=trigger)
            .start()
        )
        deadline = time.monotonic() + 600
        while query.isActive and query.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.5)
        if query.isActive:
            return query
        if attempt == START_ATTEMPTS or not worker_start_failed(query.exception()):
            raise RuntimeError(f"{sink.name}: {query.exception()}")
    raise AssertionError("unreachable")


def session(master: str, jars: str) -> SparkSession:
    from replicad.spark.pipeline import spark_session

    spark = spark_session(
        master,
        {"spark.jars": jars, "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
        app_name="replicad latency bench",
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run(args: argparse.Namespace, work: Path) -> tuple[list[Sink], int]:
    from tools.peers.kafka import KafkaBroker
    from tools.replica import replicad_run

    jars = connector_jars()
    broker = KafkaBroker(work / "kafka")
    broker.start()
    try:
        topic, partitions = "bench-latency", 2
        broker.create_topic(topic, partitions)
        hw_config = {"high_watermark_interval_ms": args.hw_interval_ms}
        runs = [
            ("replicad stream, high watermarks with the checkpoint (5 s)", work / "a", None),
            (
                f"replicad stream, high_watermark_interval_ms {args.hw_interval_ms}",
                work / "b",
                hw_config,
            ),
        ]
        procs = [replicad_run(broker.bootstrap, [topic], d / "data", config=c) for _, d, c in runs]
        try:
            for proc, (_, directory, _) in zip(procs, runs, strict=True):
                proc.wait_ready()
                # A stream refuses a directory before its first high watermarks (5 s for a).
                proc.wait_for(
                    lambda d=directory: (d / "data" / "replication-offset-checkpoint").exists(),
                    what="the first high watermarks",
                )
            spark = session(args.master, jars)
            sinks: list[Sink] = []
            queries = []
            for name, directory, _ in runs:
                sink = Sink(name)
                df = spark.readStream.format("replicad").load(str(directory / "data"))
                queries.append(start_query(df, sink, directory / "checkpoint", args.trigger))
                sinks.append(sink)
            kafka = Sink(f"Spark Kafka source stream ({connector_name(jars)})")
            kafka_df = (
                spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", broker.bootstrap)
                .option("subscribe", topic)
                .option("startingOffsets", "earliest")
                .load()
            )
            queries.append(start_query(kafka_df, kafka, work / "kafka-checkpoint", args.trigger))
            sinks.append(kafka)
            # Each query has run a first (empty) micro-batch before a record is produced.
            sent = produce_steadily(broker.bootstrap, topic, partitions, args.rate, args.seconds)
            deadline = time.monotonic() + 120
            while any(s.count() < sent for s in sinks) and time.monotonic() < deadline:
                time.sleep(0.5)
            for query in queries:
                query.stop()
            spark.stop()
            return sinks, sent
        finally:
            for proc in procs:
                proc.stop()
    finally:
        broker.stop()


def table(sinks: list[Sink], sent: int) -> str:
    lines = [
        "| stream | records in the sink | p50 ms | p95 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for sink in sinks:
        values = list(sink.latencies_ms.values())
        if not values:
            lines.append(f"| {sink.name} | 0 of {sent:,} | | | | |")
            continue
        p = [percentile(values, q) for q in (50, 95, 99)]
        lines.append(
            f"| {sink.name} | {len(values):,} of {sent:,} | {p[0]:,} | {p[1]:,} | {p[2]:,} | "
            f"{max(values):,} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to produce")
    parser.add_argument("--rate", type=int, default=200, help="records per second")
    parser.add_argument("--trigger", default="1 second", help="the queries' processing time")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--hw-interval-ms", type=int, default=200)
    parser.add_argument("--work-dir", help="where the broker and the replicas go")
    args = parser.parse_args()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-spark-latency-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        load_before = os.getloadavg()[0]
        sinks, sent = run(args, work)
        load_after = os.getloadavg()[0]
        print()
        print(
            f"{args.master}, trigger {args.trigger}, {args.rate} records/s for "
            f"{args.seconds:.0f} s over 2 partitions; {os.cpu_count()} cores, load average "
            f"{load_before:.1f} before and {load_after:.1f} after"
        )
        print()
        print(table(sinks, sent))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
