"""How soon a record is a row in a Spark stream's sink: the `replicad` stream over a replica,
then Spark's Kafka source over the broker, one query at a time, the same load.

    .venv/bin/python -m tools.bench.spark_latency [--seconds 30] [--rate 200]
        [--trigger "1 second"] [--master local[2]] [--hw-interval-ms 200]
        [--conf KEY=VALUE ...] [--only replicad[,kafka-defaults,kafka-tuned]]

A local Apache Kafka broker (tools.peers) holds three topics of 2 partitions whose records
carry the broker's append time (`message.timestamp.type` LogAppendTime). confluent-kafka
sends `--rate` records/s for `--seconds` (linger.ms 0) into one topic after another:

1. `replicad run` (`high_watermark_interval_ms` `--hw-interval-ms`) replicates the first
   topic, and the `replicad` stream reads its data directory alone in the Spark session.
   A watcher (`ReplicaArrivals`) reads the replica's segment files as they grow, every few
   ms, and notes when each offset reached them. Latency: the time its micro-batch held the
   row (foreachBatch) minus the time the record reached the replica; the same row's time
   from the broker (its LogAppendTime) is given too, replication included.
2. Spark's Kafka source (`make spark-kafka-jars`) reads the second topic from the broker
   alone, at its defaults; then a third topic, tuned as tools.bench.spark tunes it for
   throughput (`kafka_tuned`: minPartitions, larger fetches; both settings printed).
   Latency: the time its micro-batch held the row minus its LogAppendTime: from the
   record reaching the broker.

Where the time goes: each row's latency is cut where its high watermark was written (the
replica only: the watcher also reads `replication-offset-checkpoint`) and where its
micro-batch's trigger started (query progress), and each micro-batch's `durationMs` parts
are given, with the high watermark file's age when the trigger looked (the phase between
replicad's timer and Spark's trigger clock, which runs on whole multiples of the trigger).
CPU seconds of the measured part of each query: Spark's JVM and its Python processes, the
replicad daemon, the broker. `--only replicad` runs the `replicad` stream alone (A/B runs
of the source).

Each query runs with a processing-time trigger (`--trigger`) and has run its first (empty)
micro-batch before a record is sent; the issue's goal is the trigger plus 1 s. Each query
then takes `--warmup-seconds` of records that are not measured: its first micro-batches
with rows start the executors' Python workers and meet a cold JIT, and without the
warm-up whichever query ran first paid for it (session 9, load 4 to 7: the `replicad`
stream's p99 8.5 s when it ran first, 3.9 s when it ran second; the Kafka source's 2.4 s
second and 4.7 s first). One query at
a time: several at once on `local[2]` wait for each other's micro-batches, which measures
the two cores and not a source.
"""

from __future__ import annotations

import argparse
import bisect
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from tools.bench.spark import KAFKA_DEFAULTS, kafka_tuned
from tools.bench.spark_kafka import connector_jars, connector_name
from tools.bench.spark_stream_cost import stop_between_batches

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

PARTITIONS = 2
WATCH_INTERVAL_S = 0.005
LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Sink:
    """What one query's foreachBatch saw: per record, when its micro-batch held it and the
    record's timestamp (the broker's append time)."""

    name: str
    held_ms: dict[tuple[int, int], int] = field(default_factory=dict)
    timestamp_ms: dict[tuple[int, int], int] = field(default_factory=dict)
    batch_of: dict[tuple[int, int], int] = field(default_factory=dict)  # the micro-batch id
    lock: threading.Lock = field(default_factory=threading.Lock)

    def batch(self, df: DataFrame, batch_id: int) -> None:
        rows = df.selectExpr("partition", "offset", "unix_millis(timestamp) AS ts").collect()
        held = now_ms()
        with self.lock:
            for r in rows:
                key = (r.partition, r.offset)
                if key not in self.held_ms:
                    self.held_ms[key] = held
                    self.timestamp_ms[key] = r.ts
                    self.batch_of[key] = batch_id

    def count(self) -> int:
        with self.lock:
            return len(self.held_ms)

    def clear(self) -> None:
        """Forget what was held so far (the warm-up's records)."""
        with self.lock:
            self.held_ms.clear()
            self.timestamp_ms.clear()
            self.batch_of.clear()

    def latencies_from(self, arrived_ms: dict[tuple[int, int], int] | None) -> list[int]:
        """Held minus arrival (`arrived_ms`, by partition and offset), or minus the record's
        timestamp when None."""
        with self.lock:
            since = self.timestamp_ms if arrived_ms is None else arrived_ms
            return [held - since[key] for key, held in self.held_ms.items() if key in since]


class ReplicaArrivals:
    """When each offset of a replica's partitions reached its segment files: a thread reads
    what each partition's last segment gained since the last look (whole batches only); and
    when the high watermark file (what a stream may read) first covered it (`safe_ms`)."""

    def __init__(self, data_dir: Path, topic: str, interval_s: float = WATCH_INTERVAL_S) -> None:
        self.data_dir, self.topic, self.interval_s = data_dir, topic, interval_s
        self.arrived_ms: dict[tuple[int, int], int] = {}
        self.safe_ms: dict[tuple[int, int], int] = {}
        self._safe_to: dict[int, int] = {}  # partition -> the high watermark last seen
        self._read_to: dict[Path, int] = {}  # segment file -> position of its next batch
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replica-arrivals", daemon=True)

    def __enter__(self) -> ReplicaArrivals:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.look()
            self._stop.wait(self.interval_s)

    def look(self) -> None:
        from replicad.records.batch import scan_batches

        for partition in range(PARTITIONS):
            directory = self.data_dir / f"{self.topic}-{partition}"
            for segment in sorted(directory.glob("*.log")):
                at = self._read_to.get(segment, 0)
                with segment.open("rb") as f:
                    f.seek(at)
                    data = f.read()
                if not data:
                    continue
                seen = now_ms()
                scan = scan_batches(data, verify_crc=False)
                for batch in scan.batches:
                    for offset in range(batch.base_offset, batch.next_offset):
                        self.arrived_ms.setdefault((partition, offset), seen)
                self._read_to[segment] = at + scan.valid_bytes
        self._look_at_high_watermarks()

    def _look_at_high_watermarks(self) -> None:
        from replicad.errors import LogError
        from replicad.log.checkpoint import parse_offsets

        path = self.data_dir / "replication-offset-checkpoint"
        try:
            marks = parse_offsets(path.read_text(encoding="utf-8"), source=str(path))
        except (OSError, LogError):
            return  # not written yet, or replaced as it was read: the next look
        seen = now_ms()
        for tp, mark in marks.items():
            if tp.topic != self.topic:
                continue
            for offset in range(self._safe_to.get(tp.partition, 0), mark):
                self.safe_ms.setdefault((tp.partition, offset), seen)
            self._safe_to[tp.partition] = max(self._safe_to.get(tp.partition, 0), mark)


def percentile(values: list[int], p: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def produce_steadily(bootstrap: str, topic: str, rate: int, seconds: float) -> int:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "1"})
    sent = 0
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(elapsed * rate)
        while sent < due:
            producer.produce(topic, value=b"%d" % sent, partition=sent % PARTITIONS)
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
            .option("checkpointLocation", str(checkpoint / str(attempt)))
            .trigger(processingTime=trigger)
            .start()
        )
        deadline = time.monotonic() + 600
        while query.isActive and query.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if query.isActive:
            return query
        if attempt == START_ATTEMPTS or not worker_start_failed(query.exception()):
            raise RuntimeError(f"{sink.name}: {query.exception()}")
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Progress:
    """A micro-batch as its query progress tells it: when its trigger started (wall ms) and
    its `durationMs` parts."""

    batch_id: int
    started_ms: int
    duration_ms: dict[str, int]

    @classmethod
    def of(cls, progress: dict) -> Progress:
        started = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00"))
        return cls(
            progress["batchId"],
            round(started.timestamp() * 1000),
            {k: int(v) for k, v in progress.get("durationMs", {}).items()},
        )


@dataclass(frozen=True)
class Cpu:
    """CPU seconds over a query's measured records (tools/bench/spark_cpu.py): Spark's JVM,
    Spark's Python (the executors' workers, the driver-side source processes and the
    forkserver they fork from, foreachBatch's callback runs in this process: not counted),
    the replicad daemon (replicating the first topic throughout), the broker."""

    spark_jvm: float
    spark_python: float
    replicad: float
    broker: float


class CpuMeter:
    """Starts the meters of one query's measured part; `stop()` gives its Cpu."""

    def __init__(self, spark_pid: int, replicad_pid: int, broker_pid: int) -> None:
        from tools.bench.spark_cpu import TreeCpu

        self.spark_pid = spark_pid
        self.spark = TreeCpu(self._spark_roots, every_s=0.25)
        self.replicad = TreeCpu(lambda: [replicad_pid], every_s=3600)
        self.broker = TreeCpu(lambda: [broker_pid], every_s=3600)

    def _spark_roots(self) -> list[int]:
        from replicad.spark.pipeline import _forkserver

        return [self.spark_pid, *(server.pid for server in _forkserver)]

    def stop(self) -> Cpu:
        spark = self.spark.stop()
        jvm = sum(s.own for s in spark if s.pid == self.spark_pid)
        return Cpu(
            jvm,
            sum(s.total for s in spark) - jvm,
            sum(s.total for s in self.replicad.stop()),
            sum(s.total for s in self.broker.stop()),
        )


@dataclass(frozen=True)
class Measured:
    """One query's run: records sent, its progress, the CPU of its measured part."""

    sent: int
    progress: list[Progress]
    cpu: Cpu | None


def run_alone(
    df: DataFrame,
    sink: Sink,
    checkpoint: Path,
    args: argparse.Namespace,
    send: Callable[[float], int],
    meter: Callable[[], CpuMeter] | None = None,
) -> Measured:
    """One query alone in the session: started, warmed up by `send(--warmup-seconds)` (not
    measured), fed by `send(--seconds)`, stopped once its sink holds every record sent (or
    after 120 s). Returns the records sent, the query's progress (its last 100 batches:
    Spark's spark.sql.streaming.numRecentProgressUpdates) and, with `meter`, the CPU from
    the measured records' first send to the last row held."""
    query = start_query(df, sink, checkpoint, args.trigger)
    try:
        if args.warmup_seconds > 0:
            warm = send(args.warmup_seconds)
            deadline = time.monotonic() + 120
            while sink.count() < warm and time.monotonic() < deadline:
                time.sleep(0.1)
            sink.clear()
        metered = meter() if meter else None
        sent = send(args.seconds)
        deadline = time.monotonic() + 120
        while sink.count() < sent and time.monotonic() < deadline:
            time.sleep(0.1)
        cpu = metered.stop() if metered else None
        time.sleep(0.5)  # the last batch's progress is reported after foreachBatch returns
        return Measured(sent, [Progress.of(p) for p in query.recentProgress], cpu)
    finally:
        stop_between_batches(query)


def session(master: str, jars: str, conf: list[str] | None = None) -> SparkSession:
    """The session of both queries; `conf` (KEY=VALUE) applies to both alike."""
    from replicad.spark.pipeline import spark_session

    settings = {
        "spark.jars": jars,
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
    }
    settings.update(kv.split("=", 1) for kv in conf or [])  # type: ignore[misc]
    spark = spark_session(master, settings, app_name="replicad latency bench")
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@dataclass(frozen=True)
class Row:
    stream: str
    since: str
    sent: int
    held: int
    latencies_ms: list[int]


# What a record's latency is made of, in order (breakdown()).
PARTS = (
    ("reached the replica -> its high watermark written", "hw"),
    ("-> its micro-batch's trigger", "wait"),
    ("trigger -> the row in foreachBatch", "batch"),
)
# The micro-batches' own parts (query progress `durationMs`), in Spark's order.
BATCH_PARTS = ("latestOffset", "walCommit", "addBatch", "commitOffsets", "triggerExecution")
# Between a micro-batch and what came before it: the trigger before, and the high watermark
# file's last move before its trigger (a record made safe after the trigger's look waits
# for the next trigger: how old that file is when a trigger looks is the phase between
# replicad's timer and Spark's trigger clock).
BETWEEN = ("between triggers", "high watermark's age at the trigger")


@dataclass
class Breakdown:
    """Where one stream's latency goes: per record (`PARTS`: from `since`, the replica or the
    broker, to the row) and per micro-batch that held rows (`BATCH_PARTS`, and the time
    from one trigger to the next)."""

    stream: str
    records: dict[str, list[int]]
    batches: dict[str, list[int]]
    cpu: Cpu | None = None


def breakdown(
    sink: Sink,
    measured: Measured,
    since_ms: dict[tuple[int, int], int] | None,
    safe_ms: dict[tuple[int, int], int] | None,
) -> Breakdown:
    """Each held row's latency cut at its high watermark's writing (`safe_ms`, the replica
    only) and at its micro-batch's trigger; `since_ms` None: from the record's timestamp."""
    progress = measured.progress
    started = {p.batch_id: p.started_ms for p in progress}
    records: dict[str, list[int]] = {key: [] for _, key in PARTS}
    with sink.lock:
        since = sink.timestamp_ms if since_ms is None else since_ms
        for key, held in sink.held_ms.items():
            trigger = started.get(sink.batch_of[key])
            if key not in since or trigger is None:
                continue
            safe = (safe_ms or {}).get(key)
            if safe is not None:
                records["hw"].append(safe - since[key])
            records["wait"].append(trigger - (since[key] if safe is None else safe))
            records["batch"].append(held - trigger)
        held_batches = set(sink.batch_of.values())
    batches: dict[str, list[int]] = {key: [] for key in (*BATCH_PARTS, *BETWEEN)}
    writes = sorted(set((safe_ms or {}).values()))  # when the watcher saw the file move
    ordered = sorted(progress, key=lambda p: p.batch_id)
    for before, p in zip([None, *ordered], ordered, strict=False):
        if p.batch_id not in held_batches:
            continue
        for key in BATCH_PARTS:
            if key in p.duration_ms:
                batches[key].append(p.duration_ms[key])
        if before is not None and before.batch_id == p.batch_id - 1:
            batches["between triggers"].append(p.started_ms - before.started_ms)
        last_write = bisect.bisect_right(writes, p.started_ms)
        if last_write:
            batches["high watermark's age at the trigger"].append(
                p.started_ms - writes[last_write - 1]
            )
    return Breakdown(sink.name, records, batches, measured.cpu)


def breakdown_table(breakdowns: list[Breakdown]) -> str:
    """p50 / p95 of each part, records then micro-batches."""

    def cell(values: list[int]) -> str:
        if not values:
            return ""
        return f"{percentile(values, 50):,} / {percentile(values, 95):,}"

    names = [name for name, _ in PARTS] + [f"batch: {key}" for key in (*BATCH_PARTS, *BETWEEN)]
    lines = [
        "| stream | micro-batches | " + " | ".join(names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]
    for b in breakdowns:
        cells = [cell(b.records[key]) for _, key in PARTS]
        cells += [cell(b.batches[key]) for key in (*BATCH_PARTS, *BETWEEN)]
        count = len(b.batches["triggerExecution"])
        lines.append(f"| {b.stream} | {count} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cpu_table(breakdowns: list[Breakdown]) -> str:
    """Each query's CPU seconds over its measured records, and Spark's per micro-batch."""
    lines = [
        "| stream | micro-batches | Spark JVM CPU s | Spark Python CPU s | Spark CPU s a "
        "micro-batch | replicad CPU s | broker CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for b in breakdowns:
        if b.cpu is None:
            continue
        c, count = b.cpu, len(b.batches["triggerExecution"])
        each = f"{(c.spark_jvm + c.spark_python) / count:.3f}" if count else ""
        lines.append(
            f"| {b.stream} | {count} | {c.spark_jvm:.2f} | {c.spark_python:.2f} | {each} "
            f"| {c.replicad:.2f} | {c.broker:.2f} |"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace, work: Path) -> tuple[list[Row], list[Breakdown]]:
    from tools.peers.kafka import KafkaBroker
    from tools.replica import replicad_run

    jars = connector_jars()
    broker = KafkaBroker(work / "kafka")
    broker.start()
    try:
        ours, theirs = "bench-latency-replicad", "bench-latency-kafka"
        theirs_tuned = "bench-latency-kafka-tuned"
        broker.create_topics([ours, theirs, theirs_tuned], PARTITIONS, LOG_APPEND_TIME)
        data_dir = work / "replica"
        config = {"high_watermark_interval_ms": args.hw_interval_ms}
        kafka_queries = [
            (topic, tuned, settings)
            for topic, tuned, settings in (
                (theirs, "defaults", {}),
                (theirs_tuned, "tuned", kafka_tuned(args.master)),
            )
            if f"kafka-{tuned}" in args.only
        ]
        with replicad_run(broker.bootstrap, [ours], data_dir, config=config) as proc:
            proc.wait_ready()
            # A stream refuses a directory before its first high watermarks.
            proc.wait_for(
                lambda: (data_dir / "replication-offset-checkpoint").exists(),
                what="the first high watermarks",
            )
            spark = session(args.master, jars, args.conf)
            try:
                name = f"replicad stream (high_watermark_interval_ms {args.hw_interval_ms})"
                replica_sink = Sink(name)
                df = spark.readStream.format("replicad").load(str(data_dir))
                spark_pid = spark.sparkContext._gateway.proc.pid  # type: ignore[attr-defined]

                def meter() -> CpuMeter:
                    return CpuMeter(spark_pid, proc.pid, broker.pid)

                with ReplicaArrivals(data_dir, ours) as arrivals:
                    ran = run_alone(
                        df,
                        replica_sink,
                        work / "checkpoint-replicad",
                        args,
                        lambda secs: produce_steadily(broker.bootstrap, ours, args.rate, secs),
                        meter,
                    )
                kafka = []  # (sink, Measured) at the defaults, then tuned
                for topic, tuned, settings in kafka_queries:
                    sink = Sink(f"Spark Kafka source stream, {tuned} ({connector_name(jars)})")
                    kafka_df = (
                        spark.readStream.format("kafka")
                        .option("kafka.bootstrap.servers", broker.bootstrap)
                        .option("subscribe", topic)
                        .option("startingOffsets", "earliest")
                        .options(**settings)
                        .load()
                    )
                    measured = run_alone(
                        kafka_df,
                        sink,
                        work / f"checkpoint-kafka-{tuned}",
                        args,
                        lambda s, t=topic: produce_steadily(broker.bootstrap, t, args.rate, s),
                        meter,
                    )
                    kafka.append((sink, measured))
            finally:
                spark.stop()
        rows = [
            Row(
                replica_sink.name,
                "the replica",
                ran.sent,
                replica_sink.count(),
                replica_sink.latencies_from(arrivals.arrived_ms),
            ),
            Row(
                replica_sink.name,
                "the broker",
                ran.sent,
                replica_sink.count(),
                replica_sink.latencies_from(None),
            ),
            *(
                Row(sink.name, "the broker", m.sent, sink.count(), sink.latencies_from(None))
                for sink, m in kafka
            ),
        ]
        parts = [
            breakdown(replica_sink, ran, arrivals.arrived_ms, arrivals.safe_ms),
            *(breakdown(sink, m, None, None) for sink, m in kafka),
        ]
        return rows, parts
    finally:
        broker.stop()


def table(rows: list[Row]) -> str:
    lines = [
        "| stream | latency from the record reaching | rows in the sink | p50 ms | p95 ms "
        "| p99 ms | max ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        head = f"| {row.stream} | {row.since} | {row.held:,} of {row.sent:,} |"
        if not row.latencies_ms:
            lines.append(f"{head} | | | |")
            continue
        p = [percentile(row.latencies_ms, q) for q in (50, 95, 99)]
        lines.append(f"{head} {p[0]:,} | {p[1]:,} | {p[2]:,} | {max(row.latencies_ms):,} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to produce")
    parser.add_argument("--rate", type=int, default=200, help="records per second")
    parser.add_argument("--trigger", default="1 second", help="the queries' processing time")
    parser.add_argument(
        "--warmup-seconds", type=float, default=5.0, help="records first, not measured"
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--hw-interval-ms", type=int, default=200)
    parser.add_argument("--work-dir", help="where the broker and the replica go")
    parser.add_argument(
        "--conf", action="append", default=[], help="KEY=VALUE, a Spark setting of both queries"
    )
    parser.add_argument(
        "--only",
        default="replicad,kafka-defaults,kafka-tuned",
        help="the queries after the replicad stream, e.g. `replicad` alone (comma-separated)",
    )
    args = parser.parse_args()
    args.only = set(args.only.split(","))
    import replicad
    from replicad.spark.forkserver import ENV, OFF

    os.environ.setdefault(ENV, "1")  # replicad/spark/forkserver.py, unless told `0`
    forkserver = "off" if os.environ[ENV] in OFF else "on"
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-spark-latency-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        load_before = os.getloadavg()[0]
        rows, parts = run(args, work)
        load_after = os.getloadavg()[0]
        print()
        print(
            f"{args.master}, trigger {args.trigger}, {args.rate} records/s for "
            f"{args.seconds:.0f} s over {PARTITIONS} partitions (after {args.warmup_seconds:.0f} s "
            "not measured), one query at a time; "
            f"{os.cpu_count()} cores, load average {load_before:.1f} before and "
            f"{load_after:.1f} after; Spark settings {args.conf or 'the defaults'}; "
            f"forkserver {forkserver}"
        )
        for name, settings in (("defaults", KAFKA_DEFAULTS), ("tuned", kafka_tuned(args.master))):
            shown = ", ".join(f"{k}={v}" for k, v in settings.items())
            print(f"Spark Kafka source, {name}: {shown}")
        print(f"replicad from {Path(replicad.__file__).parent}")
        print()
        print(table(rows))
        print()
        print("Where it goes, p50 / p95 ms (the Kafka source's from the record at the broker):")
        print()
        print(breakdown_table(parts))
        print()
        print(cpu_table(parts))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
