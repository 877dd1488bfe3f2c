"""Replication throughput: replicad next to the consumers people use, same topic, same run.

Produces N GiB (default 2) into a local Apache Kafka topic of P partitions: 1 KiB records
whose values compress about 2:1 (half random bytes, half zeros, drawn from a pool so
batches don't collapse), lz4. Then each reader goes from the start of the topic to its end,
`--repeat` times, the readers taking turns:

- replicad (`replicad run`, into segments on disk);
- replicad from `replicad serve`: a second `replicad run` (a privileged follower, replica
  id 7) copies the first one's replica, served by `replicad serve`;
- the ceiling of a Python follower: a plain Python process copying the same segment bytes
  from a loopback socket into a file (tools/bench/ceiling.py);
- confluent-kafka, kafka-python, aiokafka and `kcat -C > file`, each as it comes and tuned
  for throughput as its own documentation says (tools/bench/consumers.py, where the
  settings and their sources are; they are printed under the table).

For each: records/s and MB/s (record batches as stored) from start to end, the same
between 10% and 90% of the records (steady state: start-up and the last stragglers left
out), CPU seconds and peak RSS (from the kernel, of the child process). A reader whose CPU
seconds are under half its wall seconds is flagged: it mostly waited, usually on its own
configuration. This machine's limits are measured in the same run: loopback TCP copy and
sequential disk write. The figures of issue 16's targets close the output.

replicad runs as installed for production: the `test` extra's hypothesis, which kio
imports at start-up only when it is installed (for its own strategies), is kept out of
the replicad processes (about half a second of CPU at start-up, nothing after).

    .venv/bin/python -m tools.bench.replicate [--gib 2] [--partitions 8] [--repeat 3]
        [--only replicad,serve,ceiling,confluent-kafka,...] [--with-memory]
        [--baseline DIR]   # also the replicad of another checkout, in the same run

Prints markdown tables (docs/benchmarks.md holds one run's output).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.bench import consumers
from tools.bench.kafka_settings import kafka_settings
from tools.bench.measure import STEADY_FROM, STEADY_TO, Measured, installed_env, run_measured
from tools.peers.kafka import KafkaBroker
from tools.peers.kcat import kcat_binary
from tools.replica import end_offsets, replicad_argv, run_args

RECORD = 1024
MB = 1_000_000
GB = 1_000_000_000
FOLLOWER_ID = 7
# CPU seconds under this share of wall seconds: the reader mostly waited.
IDLE_SHARE = 0.5
REPLICAD = "replicad"
SERVE_READER = "replicad from replicad serve"
# `--baseline DIR`: replicad as another checkout has it, a reader in the same run.
BASELINE = "baseline"
CEILING = "Python socket->file copy"
# What --only names.
CHOICES = ("replicad", "serve", "ceiling", *dict.fromkeys(s.client for s in consumers.SETUPS))

# Issue 16's targets, the first raised by issue 32 (>= 2.5x at >= 2 GiB; issue 16 asked 2x).
TARGET_VS_CONSUMER = 2.5
TARGET_OF_CEILING = 0.70
TARGET_SERVE_VS_KAFKA = 1.2
# Issue 32's (issue 16 asked for 2).
TARGET_CPU_S_PER_GB = 1.0
TARGET_RSS_MIB = 46.0


@dataclass(frozen=True, slots=True)
class Run:
    """One reader's one pass over the topic."""

    name: str
    records: int
    stored_bytes: int
    measured: Measured

    @property
    def seconds(self) -> float:
        return self.measured.wall_s

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.stored_bytes / MB / self.seconds

    @property
    def steady_records_per_s(self) -> float | None:
        steady = self.measured.steady_s
        if not steady:
            return None
        return self.records * (STEADY_TO - STEADY_FROM) / 100 / steady

    @property
    def steady_mb_per_s(self) -> float | None:
        rate = self.steady_records_per_s
        return None if rate is None else rate * self.stored_bytes / self.records / MB

    @property
    def cpu_s_per_gb(self) -> float:
        return self.measured.cpu_s / (self.stored_bytes / GB)

    @property
    def steady_cpu_s_per_gb(self) -> float | None:
        """CPU seconds per GB between 10% and 90% of the records: start-up left out."""
        cpu = self.measured.steady_cpu_s
        if cpu is None:
            return None
        return cpu / (self.stored_bytes * (STEADY_TO - STEADY_FROM) / 100 / GB)

    @property
    def idle(self) -> bool:
        return self.measured.cpu_s < IDLE_SHARE * self.measured.wall_s


@dataclass(frozen=True, slots=True)
class Summary:
    """A reader's runs: the median run (by records/s) stands for it; the spread is shown."""

    name: str
    runs: tuple[Run, ...]

    @property
    def median(self) -> Run:
        ordered = sorted(self.runs, key=lambda r: r.records_per_s)
        return ordered[(len(ordered) - 1) // 2]

    @property
    def best(self) -> Run:
        return max(self.runs, key=lambda r: r.records_per_s)

    @property
    def spread(self) -> str:
        rates = [r.records_per_s for r in self.runs]
        if len(rates) == 1:
            return "-"
        return f"{min(rates):,.0f}-{max(rates):,.0f}"

    @property
    def steady_records_per_s(self) -> float | None:
        rates = [r.steady_records_per_s for r in self.runs if r.steady_records_per_s]
        return statistics.median(rates) if rates else None


def summarize(runs: Sequence[Run]) -> list[Summary]:
    names = list(dict.fromkeys(r.name for r in runs))
    return [Summary(n, tuple(r for r in runs if r.name == n)) for n in names]


# -- data -----------------------------------------------------------------------------


def value_pool(rng: random.Random, n: int = 4096) -> list[bytes]:
    return [rng.randbytes(RECORD // 2) + bytes(RECORD // 2) for _ in range(n)]


def produce(bootstrap: str, topic: str, partitions: int, records: int) -> None:
    from confluent_kafka import Producer

    from tools.peers.produce import produce_when_room

    pool = value_pool(random.Random(9))
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": "lz4",
            "linger.ms": 20,
            "batch.size": 256 * 1024,
            "queue.buffering.max.kbytes": 512 * 1024,
        }
    )
    for i in range(records):
        produce_when_room(producer, topic, value=pool[i % len(pool)], partition=i % partitions)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(300) == 0


def log_bytes(data_dir: Path) -> int:
    """Bytes of .log segments under a data dir (a stat per file: the poll costs nothing)."""
    return sum(f.stat().st_size for f in data_dir.glob("*/*.log"))


def file_bytes(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


# -- the readers ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Topic:
    """What every reader reads."""

    bootstrap: str
    name: str
    partitions: int
    records: int
    stored: int
    segments: tuple[Path, ...]  # the broker's .log files, in partition order


def child_env(work: Path, baseline: Path | None = None) -> dict[str, str]:
    """A replicad child's environment: compiled as installed (measure.installed_env), from
    this checkout or `baseline`'s, first on its path.

    Run such a child with `cwd=work` (no checkout there): `python -c` and `python -m` put
    the current directory before PYTHONPATH, so a child started from a checkout imports
    that checkout's replicad whatever PYTHONPATH says. Until issue 32 found it, every
    `--baseline` row had run the current checkout's code."""
    import replicad

    root = baseline or Path(replicad.__file__).resolve().parent.parent
    env = installed_env(root)
    env["PYTHONPATH"] = str(root)
    return env


def run_replicad(work: Path, topic: Topic, *, baseline: Path | None = None) -> tuple[Run, Path]:
    """`replicad run` from the broker into a new data dir; returns the run and the dir.
    `baseline`: the replicad of another checkout (its directory first on PYTHONPATH)."""
    data_dir = work / ("replica-baseline" if baseline else "replica")
    # Without the test-only hypothesis (see the module docstring).
    argv = replicad_argv(
        *run_args(topic.bootstrap, topic.name, data_dir, control_socket=work / "c.sock"),
        as_installed=True,
    )
    measured = run_measured(
        argv,
        # Byte-identical replica: done when it holds as many bytes as the broker's segments.
        until=lambda: log_bytes(data_dir) >= topic.stored,
        progress=lambda: log_bytes(data_dir) / topic.stored,
        env=child_env(work, baseline),
        cwd=work,
    )
    got = sum(end_offsets(data_dir).values())
    if got != topic.records:
        raise RuntimeError(f"replica holds {got:,} records, expected {topic.records:,}")
    name = f"{REPLICAD} ({BASELINE})" if baseline else REPLICAD
    return Run(name, topic.records, topic.stored, measured), data_dir


def serve_argv(data_dir: Path, port: int, *more: str) -> list[str]:
    """`replicad serve` of `data_dir` on `port`, FOLLOWER_ID its privileged follower."""
    return replicad_argv(
        "serve",
        "--data-dir",
        str(data_dir),
        "--listen",
        f"127.0.0.1:{port}",
        "--node-id",
        "1",
        "--allow-follower",
        str(FOLLOWER_ID),
        *more,
        as_installed=True,
    )


def chained_run_argv(work: Path, port: int, topic: str, target: Path) -> list[str]:
    """`replicad run` copying `topic` from the serve on `port` into `target`, as FOLLOWER_ID
    (its config written into `work`)."""
    config = work / "chain.yaml"
    config.write_text(
        f"source:\n  bootstrap_servers: ['127.0.0.1:{port}']\ntopics:\n  include: [{topic}]\n"
        f"fetch:\n  replica_id: {FOLLOWER_ID}\ndata_dir: '{target}'\n"
        f"control:\n  socket: '{work / 'chain.sock'}'\nlogging:\n  level: warning\n"
    )
    return replicad_argv("run", "-c", str(config), as_installed=True)


def run_from_serve(work: Path, source: Path, topic: Topic) -> Run:
    """`replicad serve` over `source` (a finished replica); a second `replicad run`, as a
    privileged follower, copies it into a new data dir. Measured like the others."""
    from tools.peers.process import free_port, port_accepts

    port = free_port()
    target = work / "replica-of-replica"
    chained_run = chained_run_argv(work, port, topic.name, target)
    serve = subprocess.Popen(
        serve_argv(source, port, "--log-format", "json"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **child_env(work)},
        cwd=work,
    )
    try:
        deadline = time.monotonic() + 120
        while not port_accepts(port) and serve.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if serve.poll() is not None:
            raise RuntimeError(f"replicad serve exited with {serve.returncode}")
        measured = run_measured(
            chained_run,
            until=lambda: log_bytes(target) >= topic.stored,
            progress=lambda: log_bytes(target) / topic.stored,
            env=child_env(work),
            cwd=work,
        )
    finally:
        serve.terminate()
        serve.wait(60)
    got = sum(end_offsets(target).values())
    shutil.rmtree(target)
    if got != topic.records:
        raise RuntimeError(f"replicad from serve holds {got:,} records")
    return Run(SERVE_READER, got, topic.stored, measured)


def run_ceiling(work: Path, topic: Topic) -> Run:
    """The plain copy of tools/bench/ceiling.py: a sender (not measured) streams the
    topic's segments; the receiver, measured, writes them to a file."""
    port_file = work / "ceiling.port"
    out = work / "ceiling.out"
    py = sys.executable
    sender = subprocess.Popen(
        [py, "-m", "tools.bench.ceiling", "send", str(port_file), *map(str, topic.segments)]
    )
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if sender.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the ceiling's sender did not start")
            time.sleep(0.02)
        port = port_file.read_text()
        measured = run_measured(
            [py, "-m", "tools.bench.ceiling", "receive", port, str(out), str(topic.stored)],
            progress=lambda: file_bytes(out) / topic.stored,
        )
        if sender.wait(60) != 0:
            raise RuntimeError(f"the ceiling's sender exited with {sender.returncode}")
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.wait()
        port_file.unlink(missing_ok=True)
        out.unlink(missing_ok=True)
    return Run(CEILING, topic.records, topic.stored, measured)


def run_consumer(work: Path, topic: Topic, setup: consumers.PeerSetup) -> Run:
    if setup.client == consumers.KCAT:
        return run_kcat(work, topic, setup)
    marks = work / "marks"
    marks.unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        "tools.bench.consumers",
        setup.client,
        setup.variant,
        topic.bootstrap,
        topic.name,
        str(topic.partitions),
        str(topic.records),
        str(marks),
    ]
    measured = run_measured(argv, marks_file=marks)
    return Run(setup.name, topic.records, topic.stored, measured)


def run_kcat(work: Path, topic: Topic, setup: consumers.PeerSetup) -> Run:
    out = work / "kcat.out"
    # Each record's payload and a newline.
    expected = topic.records * (RECORD + 1)
    with out.open("wb") as sink:
        measured = run_measured(
            consumers.kcat_argv(kcat_binary(), setup, topic.bootstrap, topic.name),
            progress=lambda: file_bytes(out) / expected,
            stdout=sink,
        )
    got = file_bytes(out)
    out.unlink()
    if got != expected:
        raise RuntimeError(f"kcat wrote {got:,} bytes, expected {expected:,}")
    return Run(setup.name, topic.records, topic.stored, measured)


def readers(
    work: Path, topic: Topic, wanted: set[str], baseline: Path | None = None
) -> list[Callable[[], list[Run]]]:
    """One callable per reader (replicad and its chained copy share one), in table order."""
    found: list[Callable[[], list[Run]]] = []
    if baseline is not None:

        def replicad_baseline() -> list[Run]:
            run, data_dir = run_replicad(work, topic, baseline=baseline)
            shutil.rmtree(data_dir)
            return [run]

        found.append(replicad_baseline)
    if "replicad" in wanted:

        def replicad_then_serve() -> list[Run]:
            first, data_dir = run_replicad(work, topic)
            runs = [first]
            if "serve" in wanted:
                runs.append(run_from_serve(work, data_dir, topic))
            shutil.rmtree(data_dir)
            return runs

        found.append(replicad_then_serve)
    if "ceiling" in wanted:
        found.append(lambda: [run_ceiling(work, topic)])
    for setup in consumers.SETUPS:
        if setup.client in wanted:
            found.append(lambda setup=setup: [run_consumer(work, topic, setup)])
    return found


# -- this machine's limits ------------------------------------------------------------


def loopback_mb_per_s(size: int = 2 * 1024 * 1024 * 1024) -> float:
    """TCP on 127.0.0.1, one sender thread, one receiver: the ceiling a single fetch
    connection could reach."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    chunk = b"\0" * (1 << 20)

    def send() -> None:
        with socket.create_connection(("127.0.0.1", port)) as s:
            sent = 0
            while sent < size:
                s.sendall(chunk)
                sent += len(chunk)

    t = threading.Thread(target=send)
    started = time.monotonic()
    t.start()
    conn, _ = server.accept()
    buf = bytearray(1 << 20)
    got = 0
    while got < size:
        n = conn.recv_into(buf)
        if not n:
            break
        got += n
    elapsed = time.monotonic() - started
    t.join()
    conn.close()
    server.close()
    return got / MB / elapsed


def disk_mb_per_s(directory: Path, size_mib: int = 1024) -> float:
    target = directory / "dd.out"
    started = time.monotonic()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={size_mib}", "conv=fdatasync"],
        check=True,
        capture_output=True,
    )
    elapsed = time.monotonic() - started
    target.unlink()
    return size_mib * 1024 * 1024 / MB / elapsed


# -- output ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Limits:
    loopback_mb_per_s: float
    disk_mb_per_s: float


def fastest_consumer(summaries: Sequence[Summary]) -> Summary | None:
    ours = (REPLICAD, f"{REPLICAD} ({BASELINE})", SERVE_READER, CEILING)
    peers = [s for s in summaries if s.name not in ours]
    return max(peers, key=lambda s: s.median.records_per_s, default=None)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _per_gb(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(summaries: Sequence[Summary]) -> str:
    """The main table: each reader's median run, the spread of its runs, the flags."""
    base = fastest_consumer(summaries)
    lines = [
        "| reader | records/s | spread (runs) | MB/s (stored) | records/s, 10-90% "
        "| wall s | CPU s | CPU s per GB | CPU s per GB, 10-90% | peak RSS MiB "
        "| vs fastest consumer | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in summaries:
        r = s.median
        ratio = f"{r.records_per_s / base.median.records_per_s:.2f}x" if base else "-"
        note = ""
        if r.idle:
            idle = 1 - r.measured.cpu_s / r.measured.wall_s
            note = f"idle {idle:.0%} of its wall time: waits on its configuration"
        lines.append(
            f"| {s.name} | {r.records_per_s:,.0f} | {s.spread} ({len(s.runs)}) "
            f"| {r.mb_per_s:,.1f} | {_rate(s.steady_records_per_s)} | {r.seconds:.1f} "
            f"| {r.measured.cpu_s:.1f} | {r.cpu_s_per_gb:.2f} | {_per_gb(r.steady_cpu_s_per_gb)} "
            f"| {r.measured.peak_rss_mib:,.0f} | {ratio} | {note} |"
        )
    return "\n".join(lines)


def settings_notes(summaries: Sequence[Summary]) -> str:
    names = {s.name for s in summaries}
    lines = ["Settings (tools/bench/consumers.py says where each tuned value comes from):"]
    for setup in consumers.SETUPS:
        if setup.name in names:
            lines.append(f"- {setup.settings()}")
    if REPLICAD in names:
        lines.append(
            "- replicad: its defaults (`replicad run --bootstrap-servers ... --topics ...`)"
        )
    if CEILING in names:
        lines.append(
            "- Python socket->file copy: tools/bench/ceiling.py, recv_into a reused 1 MiB "
            "buffer and an unbuffered write; the sender (sendfile) is not measured"
        )
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Target:
    figure: str
    measured: str
    target: str
    met: bool | None  # None: not measured in this run


def targets(
    summaries: Sequence[Summary], stored: int, memory: tuple[float, float] | None
) -> list[Target]:
    """Issue 16's targets from this run's figures; `memory` is (peak RSS MiB, bound MiB)
    at 10,000 partitions when tools/bench/memory ran in the same session."""
    by = {s.name: s for s in summaries}
    found: list[Target] = []
    replicad = by.get(REPLICAD)
    peer = fastest_consumer(summaries)
    if replicad and peer:
        ratio = replicad.median.records_per_s / peer.median.records_per_s
        worst = replicad.median.records_per_s / peer.best.records_per_s
        found.append(
            Target(
                f"replicad records/s vs the fastest consumer ({peer.name})",
                f"{ratio:.2f}x (against its fastest run: {worst:.2f}x)",
                f">= {TARGET_VS_CONSUMER:g}x",
                worst >= TARGET_VS_CONSUMER,
            )
        )
    ceiling = by.get(CEILING)
    if replicad and ceiling:
        share = replicad.median.mb_per_s / ceiling.median.mb_per_s
        found.append(
            Target(
                "replicad vs the plain Python socket->file copy of the same bytes",
                f"{share:.0%}",
                f">= {TARGET_OF_CEILING:.0%}",
                share >= TARGET_OF_CEILING,
            )
        )
    chained = by.get(SERVE_READER)
    if replicad and chained:
        ratio = chained.median.records_per_s / replicad.median.records_per_s
        found.append(
            Target(
                "replicad from `replicad serve` vs replicad from Apache Kafka",
                f"{ratio:.2f}x",
                f">= {TARGET_SERVE_VS_KAFKA:g}x",
                ratio >= TARGET_SERVE_VS_KAFKA,
            )
        )
    if replicad:
        per_gb = replicad.median.measured.cpu_s / (stored / GB)
        steady = replicad.median.steady_cpu_s_per_gb
        found.append(
            Target(
                "CPU seconds per GB replicated (stored bytes), start to end; 10-90% of the "
                "records (start-up left out)",
                f"{per_gb:.2f}; {_per_gb(steady)}",
                f"<= {TARGET_CPU_S_PER_GB:g}",
                per_gb <= TARGET_CPU_S_PER_GB,
            )
        )
    if memory is not None:
        peak, bound = memory
        found.append(
            Target(
                "peak RSS at 10,000 lagging partitions, 3 leaders (tools/bench/memory)",
                f"{peak:.1f} MiB",
                f"<= buffer.memory + 64 MiB ({bound:.0f} MiB)",
                peak <= bound,
            )
        )
    if replicad:
        rss = max(r.measured.peak_rss_mib for r in replicad.runs)
        found.append(
            Target(
                "peak RSS of replicad, this run (largest of its runs)",
                f"{rss:.1f} MiB",
                f"<= {TARGET_RSS_MIB:g} MiB",
                rss <= TARGET_RSS_MIB,
            )
        )
    return found


def targets_table(found: Sequence[Target]) -> str:
    lines = ["| figure | measured | target | |", "|---|---:|---:|---|"]
    for t in found:
        verdict = "met" if t.met else "**missed**"
        lines.append(f"| {t.figure} | {t.measured} | {t.target} | {verdict} |")
    return "\n".join(lines)


def limits_notes(summaries: Sequence[Summary], limits: Limits) -> str:
    by = {s.name: s for s in summaries}
    lines = [
        f"This machine, same run: loopback TCP copy {limits.loopback_mb_per_s:,.0f} MB/s; "
        f"disk write (dd bs=1M, fdatasync) {limits.disk_mb_per_s:,.0f} MB/s."
    ]
    ceiling = by.get(CEILING)
    if ceiling:
        lines.append(
            f"The plain Python socket->file copy: {ceiling.median.mb_per_s:,.0f} MB/s "
            f"({ceiling.median.measured.cpu_s:.1f} CPU s in {ceiling.median.seconds:.1f} s)."
        )
    for name in (REPLICAD, SERVE_READER):
        s = by.get(name)
        if s and ceiling:
            lines.append(
                f"{name}: {s.median.mb_per_s:,.0f} MB/s = "
                f"{s.median.mb_per_s / ceiling.median.mb_per_s:.0%} of the plain copy, "
                f"{s.median.mb_per_s / limits.loopback_mb_per_s:.0%} of loopback, "
                f"{s.median.mb_per_s / limits.disk_mb_per_s:.0%} of the disk."
            )
    return "\n".join(lines)


def run_memory_scenario(work: Path) -> tuple[float, float]:
    """tools/bench/memory's 10,000-partition scenario on a fresh 3-node cluster:
    (peak RSS MiB, its bound MiB)."""
    from tools.bench.memory import MIB, SHM, Scenario
    from tools.bench.memory import run as memory_run
    from tools.peers.kafka_cluster import KafkaCluster

    base = Path(tempfile.mkdtemp(prefix="replicad-mem-", dir=SHM if SHM.is_dir() else work))
    try:
        with KafkaCluster(base / "kafka") as cluster:
            result = memory_run(cluster, base, Scenario())
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if result.mismatched:
        raise RuntimeError(f"memory scenario: {len(result.mismatched)} partitions differ")
    return result.peak_rss / MIB, result.rss_bound / MIB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1, help="passes per reader")
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(CHOICES)}")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="also run the replicad of this checkout (e.g. `git archive main`), same run",
    )
    parser.add_argument(
        "--with-memory",
        action="store_true",
        help="also run tools/bench/memory's 10,000-partition scenario (for the targets)",
    )
    args = parser.parse_args()
    wanted = set(args.only.split(",")) if args.only else set(CHOICES)
    unknown = wanted - set(CHOICES)
    if unknown:
        parser.error(f"--only: unknown {sorted(unknown)}; choose from {', '.join(CHOICES)}")
    records = int(args.gib * 1024 * 1024 * 1024 / RECORD)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="replicad-bench-", dir=os.getcwd()) as tmp:
        work = Path(tmp)
        broker = KafkaBroker(work / "kafka", heap="2g")
        broker.start()
        try:
            topic = prepare_topic(broker, "bench", args.partitions, records)
            runs = measure(work, topic, wanted, args.repeat, args.baseline)
        finally:
            broker.stop()
        limits = Limits(loopback_mb_per_s(), disk_mb_per_s(work))
        memory = run_memory_scenario(work) if args.with_memory else None
    summaries = summarize(runs)
    print(
        f"{records:,} records of 1 KiB (lz4, ~2:1) in {args.partitions} partitions, "
        f"{topic.stored / MB:,.0f} MB as stored; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores; Kafka {_kafka_version()}; load average {load:.2f} at the "
        f"start; {args.repeat} pass(es) per reader, the median shown\n"
    )
    print(table(summaries))
    print()
    print(settings_notes(summaries))
    print(f"- {kafka_settings()}, a 2 GiB heap")
    print()
    print(limits_notes(summaries, limits))
    print()
    print(targets_table(targets(summaries, topic.stored, memory)))
    return 0


def prepare_topic(broker: KafkaBroker, name: str, partitions: int, records: int) -> Topic:
    broker.create_topic(name, partitions)
    t0 = time.monotonic()
    produce(broker.bootstrap, name, partitions, records)
    print(
        f"  produced {records:,} records in {time.monotonic() - t0:.0f}s",
        file=sys.stderr,
        flush=True,
    )
    segments = tuple(
        f for p in range(partitions) for f in sorted(broker.partition_dir(name, p).glob("*.log"))
    )
    stored = sum(f.stat().st_size for f in segments)
    return Topic(broker.bootstrap, name, partitions, records, stored, segments)


def measure(
    work: Path, topic: Topic, wanted: set[str], repeat: int, baseline: Path | None = None
) -> list[Run]:
    """Every reader `repeat` times, taking turns (so a noisy minute spreads over all)."""
    runs: list[Run] = []
    for i in range(repeat):
        for reader in readers(work, topic, wanted, baseline):
            for run in reader():
                runs.append(run)
                print(
                    f"  pass {i + 1}: {run.name}: {run.seconds:.1f}s, "
                    f"{run.measured.cpu_s:.1f} CPU s",
                    file=sys.stderr,
                    flush=True,
                )
    return runs


def _kafka_version() -> str:
    from tools.peers.kafka import kafka_version

    return kafka_version()


if __name__ == "__main__":
    sys.exit(main())
