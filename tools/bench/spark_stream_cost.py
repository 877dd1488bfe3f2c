"""Where a `replicad` stream's time goes, beside the batch read of the same segments: a
profile, with no broker (a synthetic replica), for A/B runs on a shared machine.

    .venv/bin/python -m tools.bench.spark_stream_cost [--mb 200] [--partitions 4]
        [--repeat 3] [--steady-batches 15] [--max-offsets 400] [--trigger "1 second"]
        [--sink foreachBatch|noop] [--conf KEY=VALUE ...] [--jfr FILE] [--py-spy PREFIX] [--no-peer]

1. A replica of `--partitions` partitions written by replicad's log store (real segments and
   indexes, producer batches of 1000-byte values from tools.logdata) and its
   `replication-offset-checkpoint`: `--mb` MB of records, static, the last segment's indexes
   preallocated as a running replicad leaves them.
2. One Spark session (pipeline.spark_session, `--master`), warmed up by a small batch read
   and a small stream. The same records are written once as parquet (not timed), the peer:
   Spark's own batch and stream over its own columnar files. Then `--repeat` times, in
   turn: the batch read into `noop`, the stream with Trigger.AvailableNow into `noop` (a
   fresh checkpoint each time), `spark.read.parquet` of the same records into `noop`, and
   Spark's file stream source over that parquet with Trigger.AvailableNow (its defaults:
   no maxFilesPerTrigger, so one micro-batch) into `noop`; each with its wall time and CPU
   seconds (the JVM's process tree with the driver-side Python processes and the
   forkserver's, forkserver.py), split into the JVM's own threads and the Python
   processes, and per GB of the replica's segments. A stream's time is split as Spark's
   query progress tells: before its first micro-batch (the query's start: for ours, the
   source's Python process), its micro-batches by `durationMs`, and after (stopping).
3. Steady micro-batches: the stream with a processing-time trigger, `--max-offsets` records
   a micro-batch (maxOffsetsPerTrigger), into `--sink` (foreachBatch collecting the rows,
   as tools.bench.spark_latency, or noop), for `--steady-batches` micro-batches after two
   not counted; the median and p95 of each `durationMs` part and the CPU per micro-batch.
Each read's CPU is split three ways: the JVM's own threads, the executors' Python workers
(the `pyspark.daemon` tree), and the driver-side Python (the planner, a stream's source and
its fork); and the JVM's threads by name (`ThreadSampler`: the executors' task threads, the
JIT's compiler threads, a stream's execution thread, which ends with its query).
`--conf` settings go to the session (both parts); `--jfr FILE` records the driver JVM with
Java Flight Recorder (the `profile` settings with every JIT compilation recorded) and writes
each read's window to FILE.windows.json, for `tools.bench.spark_jfr FILE` (what the JVM ran
and compiled in each read); `--py-spy PREFIX` records the
executors' Python workers and the forkserver's forks (a stream's source) with py-spy (idle
samples left out) during each of our batch reads and streams and the steady part, one
collapsed-stacks file per read and process. It runs with the
forkserver (replicad/spark/forkserver.py) unless REPLICAD_SPARK_FORKSERVER=0 is in the
environment (the A/B of a warm start).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tools.bench.spark_cpu import Spent, TreeCpu

MB = 1_000_000
VALUE_BYTES = 1000
RECORDS_PER_BATCH = 200
# Each partition's records read by the warm-up stream (and batch read, 2,000 at least) before
# anything is timed.
WARM_RECORDS = 500


def stop_between_batches(query, timeout_s: float = 10.0) -> None:
    """Stop the query once no micro-batch runs (or after `timeout_s`). Stopped inside
    foreachBatch, Spark 4.3's stream thread dies of a StackOverflowError: it matches the
    interrupted callback's long Py4J message against a backtracking regular expression
    (StreamExecution.isInterruptionException), and prints a thousand-line trace."""
    deadline = time.monotonic() + timeout_s
    while query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.01)
    query.stop()


def write_replica(data_dir: Path, partitions: int, mb: float) -> int:
    """A static replica of about `mb` MB; its record count."""
    from replicad.log.config import LogConfig
    from replicad.log.partition import PartitionLog
    from replicad.records.batch import scan_batches
    from replicad.types import TopicPartition
    from tools.logdata.batches import producer_batch

    per_partition = max(RECORDS_PER_BATCH, int(mb * MB / VALUE_BYTES / partitions))
    per_partition -= per_partition % RECORDS_PER_BATCH
    values = [(b"v%05d-" % i).ljust(VALUE_BYTES, b"x") for i in range(RECORDS_PER_BATCH)]
    config = LogConfig(segment_bytes=64 * 1024 * 1024, index_interval_bytes=4096)
    ends = []
    for p in range(partitions):
        tp = TopicPartition("cost", p)
        log = PartitionLog.create(data_dir / f"cost-{p}", tp, config, now_ms=0)
        try:
            for base in range(0, per_partition, RECORDS_PER_BATCH):
                keys = [b"k%d" % (base + i) for i in range(RECORDS_PER_BATCH)]
                raw = producer_batch(base, values, keys=keys, timestamps=[base] * len(keys))
                log.append(raw, scan_batches(raw).batches, now_ms=0)
        finally:
            log.close()
        # As a running replicad leaves them: the last segment's indexes preallocated (sparse).
        last = sorted((data_dir / f"cost-{p}").glob("*.index"))[-1]
        for index in (last, last.with_suffix(".timeindex")):
            os.truncate(index, config.segment_index_bytes)
        ends.append(f"cost {p} {per_partition}")
    checkpoint = "\n".join(["0", str(partitions), *ends]) + "\n"
    (data_dir / "replication-offset-checkpoint").write_text(checkpoint)
    return per_partition * partitions


class Meter:
    """CPU seconds of the JVM's process tree and of the forkserver's (its forked workers)
    over one read, the processes that end during it too (tools/bench/spark_cpu.py), and of
    it the JVM's own threads: the rest is Python (the executors' workers and their daemon,
    the driver-side processes Spark starts, the forks that host a stream's source)."""

    def __init__(self, spark: SparkSession) -> None:
        self.jvm = spark.sparkContext._gateway.proc.pid  # type: ignore[attr-defined]

    def roots(self) -> list[int]:
        from replicad.spark.pipeline import _forkserver

        return [self.jvm, *(server.pid for server in _forkserver)]

    def start(self) -> TreeCpu:
        from tools.bench.spark_cpu import TreeCpu

        return TreeCpu(self.roots)

    def split(self, spent: list[Spent]) -> list[float]:
        """[all, the JVM's own threads, the executors' Python workers and their daemon
        (the processes running `pyspark.daemon`: the executors' workers are its forks)]."""
        return [
            sum(s.total for s in spent),
            sum(s.own for s in spent if s.pid == self.jvm),
            sum(s.total for s in spent if b"pyspark.daemon" in s.cmdline),
        ]


def process_label(cmdline: bytes) -> str:
    """A short name for a process: the module after `-m` (its argument too for
    pyspark.daemon, whose argument says executors' or a planner's), else the program's file."""
    argv = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
    if "-m" in argv[:-1]:
        at = argv.index("-m") + 1
        return " ".join(argv[at : at + 2]) if argv[at] == "pyspark.daemon" else argv[at]
    return Path(argv[1] if len(argv) > 1 and argv[0].endswith(("sh", "python")) else argv[0]).name


def python_by_process(spent: list[Spent], jvm: int, servers: Sequence[int] = ()) -> str:
    """CPU s of the read's processes other than the JVM's own threads, by process_label;
    what the JVM reaped (its simple workers that ended: a stream's stand-in) and what a
    forkserver reaped (its forks that ended: a stream's source) apart from their own."""
    totals: dict[str, float] = {}

    def add(label: str, cpu: float) -> None:
        totals[label] = totals.get(label, 0.0) + cpu

    for s in spent:
        if s.pid == jvm:
            add("reaped by the JVM", s.reaped)
        elif s.pid in servers:
            add("forkserver", s.own)
            add("forkserver's forks, reaped", s.reaped)
        else:
            label = process_label(s.cmdline) if s.cmdline else str(s.pid)
            if label == "replicad.spark.forkserver":
                label = "forkserver's forks, live"
            add(label, s.total)
    top = sorted(((v, k) for k, v in totals.items() if abs(v) >= 0.005), reverse=True)
    return ", ".join(f"{k} {v:.3f}" for v, k in top)


def thread_cpu_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """Each live thread of a process: its name with digits as # ("Executor task launch
    worker for task 3.0" and its peers are one) and its CPU seconds."""
    found: dict[int, tuple[str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        name = re.sub(r"[0-9]+", "#", stat[stat.index("(") + 1 : stat.rindex(")")])
        fields = stat[stat.rindex(")") + 2 :].split()
        found[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return found


class ThreadSampler:
    """The JVM's threads' CPU over a read, those that end during it too (a stream's
    execution thread ends with its query): /proc polled every `every_s` on a thread of
    ours, each thread's last value kept. A thread's CPU after its last poll is missed."""

    def __init__(self, pid: int, every_s: float = 0.1) -> None:
        import threading

        self.pid, self.every_s = pid, every_s
        self.before = thread_cpu_seconds(pid)
        self.last = dict(self.before)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.last.update(thread_cpu_seconds(self.pid))

    def stop(self) -> str:
        """The read's threads by name, busiest first."""
        self._stop.set()
        self._thread.join()
        self.last.update(thread_cpu_seconds(self.pid))
        spent: dict[str, float] = {}
        for tid, (name, cpu) in self.last.items():
            spent[name] = spent.get(name, 0.0) + cpu - self.before.get(tid, (name, 0.0))[1]
        top = sorted(((v, k) for k, v in spent.items() if v >= 0.02), reverse=True)
        return ", ".join(f"{k} {v:.2f}" for v, k in top)


def own_cpu_seconds(pid: int) -> float:
    """A process's own CPU seconds, without the children it has reaped."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def jfr_settings(path: Path) -> Path:
    """The JDK's `profile` settings with every JIT compilation recorded (its threshold is
    100 ms): what the compiler threads spend their CPU on, per read (tools.bench.spark_jfr)."""
    java = Path(shutil.which("java") or "java").resolve()
    profile = (java.parent.parent / "lib" / "jfr" / "profile.jfc").read_text()
    compilation = re.compile(r'(<event name="jdk.Compilation">.*?"threshold"[^>]*>)[^<]*', re.S)
    path.write_text(compilation.sub(r"\g<1>0 ms", profile, count=1))
    return path


def progress_ms(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000


def stream_phases(progress: list[dict], started_ms: float, ended_ms: float) -> dict[str, float]:
    """Seconds before the first micro-batch, in micro-batches (by durationMs key), after."""
    first, last = progress[0], progress[-1]
    phases = {"start": (progress_ms(first["timestamp"]) - started_ms) / 1000}
    for p in progress:
        for key, ms in p["durationMs"].items():
            phases[key] = phases.get(key, 0.0) + ms / 1000
    last_end = progress_ms(last["timestamp"]) + last["durationMs"].get("triggerExecution", 0)
    phases["stop"] = (ended_ms - last_end) / 1000
    return phases


def noop(df: DataFrame) -> None:
    df.write.format("noop").mode("overwrite").save()


def available_now(df: DataFrame, checkpoint: Path) -> tuple[list[dict], float, float]:
    started_ms = time.time() * 1000
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query.recentProgress, started_ms, time.time() * 1000


def write_parquet(spark: SparkSession, data_dir: Path, out: Path) -> int:
    """The replica's records as parquet (the peer's input); its bytes."""
    spark.read.format("replicad").load(str(data_dir)).write.parquet(str(out))
    return sum(p.stat().st_size for p in out.rglob("*.parquet"))


class PySpy:
    """`py-spy record` of the executors' Python workers (their daemon, following its forks)
    and of the forkserver (a stream's source process on the driver is its fork) for one
    read, into PREFIX-NAME-PID.txt (collapsed stacks, idle samples left out)."""

    def __init__(self, spark: SparkSession, prefix: str | None) -> None:
        self.jvm = spark.sparkContext._gateway.proc.pid  # type: ignore[attr-defined]
        self.prefix = prefix

    def daemons(self) -> list[int]:
        from tools.bench.measure import _descendants

        found = []
        for pid in _descendants(self.jvm):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"pyspark.daemon" in cmdline and b"sql.worker" not in cmdline:
                found.append(pid)
        return found

    def driver_side(self) -> list[int]:
        """The forkserver (pipeline.spark_session's): a stream's source process is its fork."""
        from replicad.spark.pipeline import _forkserver

        return [server.pid for server in _forkserver]

    @contextlib.contextmanager
    def recording(self, name: str) -> Iterator[None]:
        if self.prefix is None:
            yield
            return
        import shutil as sh
        import signal
        import subprocess

        py_spy = sh.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        procs = []
        for daemon in [*self.daemons(), *self.driver_side()]:
            out = f"{self.prefix}-{name}-{daemon}.txt"
            argv = [py_spy, "record", "--pid", str(daemon), "--subprocesses", "--nonblocking"]
            argv += ["--rate", "200", "--format", "raw", "-o", out]
            procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL))
        time.sleep(1.0)  # py-spy attaches
        try:
            yield
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGINT)
                proc.wait(60)


def throughput(
    spark: SparkSession,
    data_dir: Path,
    parquet: Path | None,
    work: Path,
    rows: int,
    repeat: int,
    py_spy: str | None = None,
    windows: list[dict] | None = None,
    warm_records: int = WARM_RECORDS,
) -> None:
    """`windows` gets each read's wall-clock window (epoch seconds), for --jfr;
    `warm_records`: each partition's records read by the warm-up stream (and batch read,
    2,000 at least)."""
    windows = [] if windows is None else windows
    spy = PySpy(spark, py_spy)
    meter = Meter(spark)
    replica_bytes = sum(p.stat().st_size for p in data_dir.rglob("*.log"))
    gb = replica_bytes / 1e9
    checkpoints = iter(range(1_000_000))
    # Warm-up: the executors' Python workers, the JIT, the first forks.
    warm = spark.read.format("replicad").option("endingOffsets", str(max(2000, warm_records)))
    noop(warm.load(str(data_dir)))
    # ... and a small stream: the last `warm_records` of each partition, one micro-batch.
    checkpoint = (data_dir / "replication-offset-checkpoint").read_text().split("\n")[2:]
    near_end = {
        line.split()[1]: max(0, int(line.split()[2]) - warm_records) for line in checkpoint if line
    }
    small = spark.readStream.format("replicad").option(
        "startingOffsets", json.dumps({"cost": near_end})
    )
    available_now(small.load(str(data_dir)), work / "cp" / "warm")
    if parquet is not None:
        schema = spark.read.parquet(str(parquet)).schema
        noop(spark.read.parquet(str(parquet)).limit(2000))

    def row(run: int, name: str, seconds: float, cpu: list[float], shown: str) -> None:
        total, jvm, executors = cpu
        print(
            f"| {run} | {name} | {seconds:.2f} | {rows / seconds:,.0f} | {total:.2f} | "
            f"{jvm:.2f} | {executors:.2f} | {total - jvm - executors:.2f} | {total / gb:.2f} "
            f"| {shown} |",
            flush=True,
        )

    threads: list[str] = []

    def noted(
        run: int, name: str, sampler: ThreadSampler, began: float, spent: list[Spent]
    ) -> None:
        """The read's JVM threads and Python processes (printed after the table) and its
        window (for --jfr)."""
        threads.append(
            f"{run} {name}: {sampler.stop()}; "
            f"Python: {python_by_process(spent, meter.jvm, meter.roots()[1:])}"
        )
        windows.append({"run": run, "read": name, "start": began, "end": time.time()})

    def batch(run: int, name: str, df: DataFrame) -> None:
        sampler, began = ThreadSampler(meter.jvm), time.time()
        metered, started = meter.start(), time.perf_counter()
        noop(df)
        seconds, spent = time.perf_counter() - started, metered.stop()
        noted(run, name, sampler, began, spent)
        row(run, name, seconds, meter.split(spent), "")

    def stream(run: int, name: str, df: DataFrame) -> None:
        sampler, began = ThreadSampler(meter.jvm), time.time()
        metered, started = meter.start(), time.perf_counter()
        progress, started_ms, ended_ms = available_now(df, work / "cp" / str(next(checkpoints)))
        seconds, spent = time.perf_counter() - started, metered.stop()
        noted(run, name, sampler, began, spent)
        phases = stream_phases(progress, started_ms, ended_ms)
        shown = ", ".join(f"{k} {v:.2f}" for k, v in phases.items() if v >= 0.005)
        shown += f"; {len(progress)} micro-batches"
        row(run, name, seconds, meter.split(spent), shown)

    print(
        f"CPU s: the JVM's process tree and the forkserver's; of it the JVM's own threads, "
        f"the executors' Python workers, and the driver-side Python processes (the planner, "
        f"a stream's source, their forks); CPU s/GB of the replica's {replica_bytes / 1e9:.3f} GB"
    )
    print(
        "| run | read | seconds | rows/s | CPU s | JVM | Python, executors | Python, driver "
        "| CPU s/GB | phases (s) |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for run in range(1, repeat + 1):
        with spy.recording(f"batch{run}"):
            batch(run, "replicad batch", spark.read.format("replicad").load(str(data_dir)))
        with spy.recording(f"stream{run}"):
            stream(run, "replicad stream", spark.readStream.format("replicad").load(str(data_dir)))
        if parquet is not None:
            batch(run, "spark.read.parquet (peer)", spark.read.parquet(str(parquet)))
            peer = spark.readStream.schema(schema).parquet(str(parquet))
            stream(run, "parquet file stream (peer)", peer)
    print(
        "\nThe JVM's threads, CPU s by thread name (digits as #), and the Python processes by "
        "command, each read:"
    )
    for line in threads:
        print(f"- {line}")


def steady(spark: SparkSession, data_dir: Path, work: Path, args: argparse.Namespace) -> None:

    meter = Meter(spark)
    df = (
        spark.readStream.format("replicad")
        .option("maxOffsetsPerTrigger", args.max_offsets)
        .load(str(data_dir))
    )
    writer = df.writeStream.option("checkpointLocation", str(work / "cp" / "steady"))
    if args.sink == "noop":
        writer = writer.format("noop")
    else:
        writer = writer.foreachBatch(
            lambda batch, _id: batch.selectExpr("partition", "offset").collect()
        )
    for key, value in args.sink_option:
        writer = writer.option(key, value)
    query = writer.trigger(processingTime=args.trigger).start()
    try:
        skip = 2
        while len([p for p in query.recentProgress if p["numInputRows"] > 0]) < skip:
            time.sleep(0.05)
        metered = meter.start()
        counted_from = query.lastProgress["batchId"]
        while query.lastProgress["batchId"] < counted_from + args.steady_batches:
            time.sleep(0.05)
        cpu = sum(s.total for s in metered.stop())
        batches = [
            p
            for p in query.recentProgress
            if counted_from < p["batchId"] <= counted_from + args.steady_batches
        ]
    finally:
        stop_between_batches(query)
    keys = sorted({k for p in batches for k in p["durationMs"]})
    print(f"\n{len(batches)} steady micro-batches of {args.max_offsets} records into {args.sink}:")
    print("| durationMs | median ms | p95 ms |")
    print("|---|---:|---:|")
    for key in keys:
        values = sorted(p["durationMs"].get(key, 0) for p in batches)
        p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
        print(f"| {key} | {statistics.median(values):,.0f} | {p95:,} |")
    print(f"CPU per micro-batch: {cpu / max(1, len(batches)):.3f} s (JVM tree and forkserver)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=200.0)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steady-batches", type=int, default=15, help="0: no steady part")
    parser.add_argument("--max-offsets", type=int, default=400)
    parser.add_argument("--trigger", default="1 second")
    parser.add_argument("--sink", choices=["foreachBatch", "noop"], default="foreachBatch")
    parser.add_argument(
        "--sink-option",
        action="append",
        default=[],
        type=lambda kv: tuple(kv.split("=", 1)),
        help="KEY=VALUE, an option of the steady query's writer",
    )
    parser.add_argument("--conf", action="append", default=[], help="KEY=VALUE for the session")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--jfr", help="record the driver JVM into this file")
    parser.add_argument(
        "--no-peer", action="store_true", help="our reads only (no parquet written or read)"
    )
    parser.add_argument(
        "--py-spy",
        metavar="PREFIX",
        help="py-spy the executors' Python workers for each of our reads: PREFIX-READ-PID.txt",
    )
    parser.add_argument(
        "--warm-records",
        type=int,
        default=WARM_RECORDS,
        help="each partition's records read by the warm-up stream (and read, at least 2,000)",
    )
    parser.add_argument("--work-dir", help="kept, its replica reused by the next run")
    args = parser.parse_args()
    from replicad.spark.forkserver import ENV, OFF
    from replicad.spark.pipeline import spark_session

    os.environ.setdefault(ENV, "1")
    forks = "without" if os.environ[ENV] in OFF else "with"
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-spark-cost-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        data_dir = work / "replica"
        if (data_dir / "replication-offset-checkpoint").exists():  # --work-dir's, kept
            ends = (data_dir / "replication-offset-checkpoint").read_text().split("\n")[2:]
            rows = sum(int(line.split()[2]) for line in ends if line)
        else:
            data_dir.mkdir()
            rows = write_replica(data_dir, args.partitions, args.mb)
        conf = {"spark.ui.enabled": "false", "spark.driver.memory": "2g"}
        if args.jfr:
            settings = jfr_settings(Path(f"{args.jfr}.jfc"))
            conf["spark.driver.extraJavaOptions"] = (
                "-XX:FlightRecorderOptions=stackdepth=256 "
                f"-XX:StartFlightRecording=filename={args.jfr},settings={settings},"
                "dumponexit=true"
            )
        conf.update(kv.split("=", 1) for kv in args.conf)  # type: ignore[arg-type]
        load = os.getloadavg()[0]
        spark = spark_session(args.master, conf, app_name="replicad stream cost")
        spark.sparkContext.setLogLevel("ERROR")
        print(
            f"{rows:,} records of {VALUE_BYTES} bytes in {args.partitions} partitions, "
            f"{args.master}, {forks} the forkserver, conf {args.conf or 'none'}, warm-up "
            f"{args.warm_records:,} records a partition; "
            f"load average {load:.1f} at the start"
        )
        checkpoints = Path(tempfile.mkdtemp(prefix="run-", dir=work))  # this run's alone
        try:
            if args.repeat:
                parquet = None if args.no_peer else checkpoints / "parquet"
                if parquet is not None:
                    parquet_bytes = write_parquet(spark, data_dir, parquet)
                    print(
                        f"peer: the same records as parquet ({parquet_bytes / MB:,.0f} MB, "
                        "Spark's defaults), read by spark.read.parquet and by Spark's file "
                        "stream source (Trigger.AvailableNow, no maxFilesPerTrigger: one "
                        "micro-batch)"
                    )
                windows: list[dict] = []
                throughput(
                    spark,
                    data_dir,
                    parquet,
                    checkpoints,
                    rows,
                    args.repeat,
                    args.py_spy,
                    windows,
                    args.warm_records,
                )
                if args.jfr:
                    Path(f"{args.jfr}.windows.json").write_text(json.dumps(windows))
            if args.steady_batches:
                with PySpy(spark, args.py_spy).recording("steady"):
                    steady(spark, data_dir, checkpoints, args)
        finally:
            spark.stop()
            shutil.rmtree(checkpoints, ignore_errors=True)
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
