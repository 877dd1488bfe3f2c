"""`replicad serve` next to Apache Kafka as a server, the same data, the same clients.

A local Kafka broker gets two topics: `bulk` (MIB of 1 KiB lz4 records in 8 partitions,
tools/bench/replicate's data) and `wide` (200 partitions of 64 such records each). A
`replicad run` copies both into a data directory and stops; `replicad serve` (the CLI, as
shipped) serves that directory. Then, for each server in turn, `--repeat` times:

- each reader of `--readers` reads `bulk` from its start to its end: kcat tuned for
  throughput and confluent-kafka tuned (tools/bench/consumers.py's settings, printed):
  wall seconds, MB/s of record batches as stored, the server's CPU seconds (from /proc,
  the JVM's or serve's), the reader's, and the share of its wall time the reader was on a
  CPU (a reader far below 100% waits on the server, or on its own fetch pacing: kcat's
  librdkafka 2.0.2 cannot take `fetch.queue.backoff.ms`, so once its queue is full it
  waits out a fixed second; confluent-kafka's newer librdkafka is told 10 ms); with
  `--readers ...,replicad` also `replicad run` fetching as a consumer into a directory of
  its own (a reader that decodes no record);
- one client asks the same Fetch of every `wide` partition from offset 0 (v12, no
  session, partition_max_bytes 1 MiB), answer after answer, for FETCHES fetches:
  fetches/s and the server's CPU milliseconds per fetch.

Kafka runs as the test harness configures it (its settings are printed: Kafka's defaults
but for the single-node replication factors and a 2 GiB heap); replicad serve with its
defaults. The machine's other load is printed with the table.

    .venv/bin/python -m tools.bench.serve_vs_kafka [--mib 1024] [--fetches 200] [--repeat 2]
        [--readers kcat,confluent-kafka[,replicad]]
        [--baseline DIR]   # also replicad serve as another checkout has it, same run

Under the tables, for each reader: serve's MB/s and server CPU seconds over Kafka's
(medians of the same run), and the load average at the start and the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from replicad.protocol.connection import BrokerAddress, BrokerConnection
from replicad.protocol.fetch_request import FetchRequest, RequestedPartition, fetch_request
from replicad.protocol.requests import metadata_request
from replicad.types import TopicPartition
from tools.bench import consumers
from tools.bench.measure import run_measured
from tools.bench.replicate import RECORD, child_env, log_bytes, produce
from tools.peers.kafka import KafkaBroker, kafka_version
from tools.peers.kcat import kcat_binary
from tools.peers.process import free_port, port_accepts
from tools.replica import replicad_argv, run_args, wait_until

MB = 1_000_000
MIB = 1024 * 1024
BULK, WIDE = "bulk", "wide"
BULK_PARTITIONS = 8
WIDE_PARTITIONS = 200
WIDE_RECORDS_PER_PARTITION = 64
CLK_TCK = os.sysconf("SC_CLK_TCK")
KCAT_TUNED = consumers.setup(consumers.KCAT, consumers.TUNED)
CONFLUENT_TUNED = consumers.setup(consumers.CONFLUENT, consumers.TUNED)
# replicad's own follower, fetching as a consumer (replica id -1: up to the high watermark)
# and writing what it reads to a data directory of its own, with its defaults: a reader
# that does not decode records (it checks each batch's CRC and writes it as it came).
REPLICAD_RUN = consumers.PeerSetup(
    "replicad", "consumer fetches", {}, "`replicad run` to a fresh data directory, its defaults"
)
READERS = {s.client: s for s in (KCAT_TUNED, CONFLUENT_TUNED, REPLICAD_RUN)}


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


@dataclass(frozen=True, slots=True)
class ReaderRun:
    server: str
    reader: str
    seconds: float
    server_cpu_s: float
    reader_cpu_s: float


@dataclass(frozen=True, slots=True)
class FetchRun:
    server: str
    fetches: int
    seconds: float
    server_cpu_s: float
    response_bytes: int


def bulk_read(
    server: str, bootstrap: str, pid: int, records: int, reader: consumers.PeerSetup, work: Path
) -> ReaderRun:
    """`reader` reads `bulk` from its start to its end; its wall and CPU, the server's CPU."""
    if reader is REPLICAD_RUN:
        return replicad_read(server, bootstrap, pid, work)
    if reader.client == consumers.KCAT:
        expected = records * (RECORD + 1)  # each payload and a newline
        argv = consumers.kcat_argv(kcat_binary(), reader, bootstrap, BULK)
    else:
        marks = work / "marks"
        marks.unlink(missing_ok=True)
        argv = [
            sys.executable, "-m", "tools.bench.consumers", reader.client, reader.variant,
            bootstrap, BULK, str(BULK_PARTITIONS), str(records), str(marks),
        ]  # fmt: skip
    before = cpu_s(pid)
    started = time.monotonic()
    with tempfile.TemporaryFile() as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - started
        got = sink.tell()
    if status != 0 or (reader.client == consumers.KCAT and got != expected):
        raise RuntimeError(f"{reader.name} from {server}: status {status}, {got:,} bytes out")
    return ReaderRun(
        server, reader.name, seconds, cpu_s(pid) - before, usage.ru_utime + usage.ru_stime
    )


def replicad_read(server: str, bootstrap: str, pid: int, work: Path) -> ReaderRun:
    """`replicad run` copies `bulk` into a fresh directory, stopped once it holds all of it."""
    data_dir = work / "reader-replica"
    shutil.rmtree(data_dir, ignore_errors=True)
    stored = int((work / "bulk-stored").read_text())
    before = cpu_s(pid)
    measured = run_measured(
        replicad_argv(*run_args(bootstrap, BULK, data_dir), as_installed=True),
        until=lambda: log_bytes(data_dir) >= stored,
        env=child_env(work),
        cwd=work,
    )
    server_cpu = cpu_s(pid) - before
    shutil.rmtree(data_dir)
    return ReaderRun(server, REPLICAD_RUN.name, measured.wall_s, server_cpu, measured.cpu_s)


async def wide_fetches(server: str, bootstrap: str, pid: int, fetches: int) -> FetchRun:
    host, port = bootstrap.rsplit(":", 1)
    conn = BrokerConnection(
        BrokerAddress(0, host, int(port)),
        client_id="bench",
        connect_timeout_s=10,
        request_timeout_s=120,
    )
    await conn.connect()
    try:
        meta = await conn.request(metadata_request(12, [WIDE]))
        topic_id = meta.topics[0].topic_id
        spec = FetchRequest(
            max_wait_ms=0,
            min_bytes=1,
            max_bytes=64 * MIB,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            partitions=tuple(
                RequestedPartition.of(TopicPartition(WIDE, p), 0, MIB, topic_id=topic_id)
                for p in range(WIDE_PARTITIONS)
            ),
        )
        request = fetch_request(12, spec)
        await conn.request(request)  # warm: the files are in the page cache for both
        received = conn.bytes_received
        before = cpu_s(pid)
        started = time.monotonic()
        for _ in range(fetches):
            await conn.request(request)
        seconds = time.monotonic() - started
        return FetchRun(
            server, fetches, seconds, cpu_s(pid) - before, (conn.bytes_received - received)
        )
    finally:
        await conn.close()


def replicate(work: Path, bootstrap: str, stored: int) -> Path:
    data_dir = work / "replica"
    with (work / "run.log").open("wb") as out:
        proc = subprocess.Popen(
            replicad_argv(*run_args(bootstrap, [BULK, WIDE], data_dir)),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until(lambda: log_bytes(data_dir) >= stored, timeout_s=900, interval_s=0.5)
        finally:
            proc.terminate()
            proc.wait(60)
    return data_dir


def start_serve(
    work: Path, data_dir: Path, baseline: Path | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """`replicad serve` over `data_dir`; `baseline`: the replicad of that checkout."""
    port = free_port()
    log = work / ("serve-baseline.log" if baseline else "serve.log")
    proc = subprocess.Popen(
        replicad_argv(
            "serve", "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{port}", as_installed=True
        ),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **child_env(work, baseline)},
        cwd=work,  # not a checkout: the child imports the replicad child_env names
    )
    try:
        # Generous: on a loaded machine a niced serve took minutes to open 208 partitions.
        wait_until(lambda: port_accepts(port) or proc.poll() is not None, timeout_s=900)
        if proc.poll() is not None:
            raise RuntimeError(f"replicad serve exited: {log.read_text()[-2000:]}")
    except BaseException:
        proc.terminate()
        proc.wait(60)
        raise
    return proc, f"127.0.0.1:{port}"


def stored_bytes(broker: KafkaBroker, topic: str, partitions: int) -> int:
    return sum(
        f.stat().st_size
        for p in range(partitions)
        for f in broker.partition_dir(topic, p).glob("*.log")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="size of the bulk topic")
    parser.add_argument("--fetches", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--readers",
        default=f"{consumers.KCAT},{consumers.CONFLUENT}",
        help=f"the readers of the bulk topic, comma-separated (of {', '.join(READERS)})",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="also serve a copy of the data with the replicad of this checkout, same run",
    )
    args = parser.parse_args(argv)
    readers = [READERS[name] for name in args.readers.split(",") if name]
    bulk_records = args.mib * MIB // RECORD
    load = os.getloadavg()[0]
    reader_runs: list[ReaderRun] = []
    fetch_runs: list[FetchRun] = []
    with tempfile.TemporaryDirectory(prefix="replicad-serve-bench-", dir=os.getcwd()) as tmp:
        work = Path(tmp)
        broker = KafkaBroker(work / "kafka", heap="2g")
        broker.start()
        serves: list[subprocess.Popen[bytes]] = []
        try:
            broker.create_topic(BULK, BULK_PARTITIONS)
            broker.create_topic(WIDE, WIDE_PARTITIONS)
            produce(broker.bootstrap, BULK, BULK_PARTITIONS, bulk_records)
            produce(broker.bootstrap, WIDE, WIDE_PARTITIONS, WIDE_PARTITIONS * 64)
            bulk_stored = stored_bytes(broker, BULK, BULK_PARTITIONS)
            (work / "bulk-stored").write_text(str(bulk_stored))
            stored = bulk_stored + stored_bytes(broker, WIDE, WIDE_PARTITIONS)
            data_dir = replicate(work, broker.bootstrap, stored)
            serve, serve_bootstrap = start_serve(work, data_dir)
            serves.append(serve)
            servers = [
                (f"Apache Kafka {kafka_version()}", broker.bootstrap, broker.pid),
                ("replicad serve", serve_bootstrap, serve.pid),
            ]
            if args.baseline is not None:
                copy = work / "replica-copy"
                # cp keeps the preallocated (sparse) index files sparse; copytree does not.
                subprocess.run(
                    ["cp", "-r", "--sparse=always", str(data_dir), str(copy)], check=True
                )
                old, old_bootstrap = start_serve(work, copy, args.baseline)
                serves.append(old)
                servers.append(("replicad serve (baseline)", old_bootstrap, old.pid))
            for _ in range(args.repeat):
                for name, bootstrap, pid in servers:
                    assert pid is not None
                    for reader in readers:
                        reader_runs.append(
                            bulk_read(name, bootstrap, pid, bulk_records, reader, work)
                        )
                        print(f"  {reader_runs[-1]}", file=sys.stderr)
                    fetch_runs.append(asyncio.run(wide_fetches(name, bootstrap, pid, args.fetches)))
                    print(f"  {fetch_runs[-1]}", file=sys.stderr)
            kafka_settings = (work / "kafka" / "server.properties").read_text()
        finally:
            for serve in serves:
                serve.terminate()
                serve.wait(60)
            broker.stop()
    end_load = os.getloadavg()[0]
    print(
        f"{bulk_records:,} records of 1 KiB (lz4) in {BULK_PARTITIONS} partitions, "
        f"{bulk_stored / MB:,.0f} MB as stored; load average {load:.2f} at the start, "
        f"{end_load:.2f} at the end; {args.repeat} run(s) per server, the median shown "
        "(range in brackets)\n"
    )
    print(report(reader_runs, fetch_runs, bulk_stored))
    print()
    for line in ratios(reader_runs, bulk_stored):
        print(line)
    print("\nReaders' settings:")
    for reader in readers:
        print(f"    {reader.settings()}")
    print("Kafka's server.properties (the test harness's):")
    for line in kafka_settings.splitlines():
        if line and not line.startswith("#"):
            print("   ", line)
    print("replicad serve: its defaults (`replicad serve --data-dir ... --listen ...`)")
    return 0


def _median_range(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-" + (
        f"{format(max(values), fmt)})"
    )


def report(reader_runs: list[ReaderRun], fetch_runs: list[FetchRun], bulk_stored: int) -> str:
    """Two tables: the bulk topic by server and reader; the 200-partition fetches by server."""
    lines = [
        "| server | reader | MB/s | wall s | server CPU s | reader CPU s | reader on CPU |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, reader in dict.fromkeys((r.server, r.reader) for r in reader_runs):
        rs = [r for r in reader_runs if r.server == name and r.reader == reader]
        cells = [
            name,
            reader,
            _median_range([bulk_stored / MB / r.seconds for r in rs], ",.0f"),
            _median_range([r.seconds for r in rs], ".1f"),
            _median_range([r.server_cpu_s for r in rs], ".2f"),
            _median_range([r.reader_cpu_s for r in rs], ".1f"),
            _median_range([100 * r.reader_cpu_s / r.seconds for r in rs], ".0f") + " %",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| server | 200-partition fetches/s | server CPU ms per fetch | MB per fetch |",
        "|---|---:|---:|---:|",
    ]
    for name in dict.fromkeys(r.server for r in fetch_runs):
        fs = [r for r in fetch_runs if r.server == name]
        cells = [
            name,
            _median_range([r.fetches / r.seconds for r in fs], ",.1f"),
            _median_range([1000 * r.server_cpu_s / r.fetches for r in fs], ",.1f"),
            f"{fs[0].response_bytes / fs[0].fetches / MB:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratios(reader_runs: list[ReaderRun], bulk_stored: int) -> list[str]:
    """Per reader: replicad serve over Kafka, MB/s and server CPU seconds (medians)."""
    found = []
    for reader in dict.fromkeys(r.reader for r in reader_runs):

        def median(
            server_prefix: str, value: Callable[[ReaderRun], float], reader: str = reader
        ) -> float | None:
            rs = [
                value(r)
                for r in reader_runs
                if r.reader == reader and r.server.startswith(server_prefix)
                and not r.server.endswith("(baseline)")
            ]  # fmt: skip
            return statistics.median(rs) if rs else None

        serve_rate = median("replicad serve", lambda r: bulk_stored / r.seconds)
        kafka_rate = median("Apache Kafka", lambda r: bulk_stored / r.seconds)
        serve_cpu = median("replicad serve", lambda r: r.server_cpu_s)
        kafka_cpu = median("Apache Kafka", lambda r: r.server_cpu_s)
        if None in (serve_rate, kafka_rate, serve_cpu, kafka_cpu) or not kafka_cpu:
            continue
        assert serve_rate is not None and kafka_rate is not None and serve_cpu is not None
        found.append(
            f"{reader}: replicad serve / Kafka: {serve_rate / kafka_rate:.2f}x MB/s "
            f"(target >= 1.5x), {serve_cpu / kafka_cpu:.2f}x the server's CPU seconds "
            "(target <= 0.5x)"
        )
    return found


if __name__ == "__main__":
    sys.exit(main())
