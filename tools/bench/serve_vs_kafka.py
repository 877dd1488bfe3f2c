"""`replicad serve` next to Apache Kafka as a server, the same data, the same clients.

A local Kafka broker gets two topics: `bulk` (MIB of 1 KiB lz4 records in 8 partitions,
tools/bench/replicate's data) and `wide` (200 partitions of 64 such records each). A
`replicad run` copies both into a data directory and stops; `replicad serve` (the CLI, as
shipped) serves that directory. Then, for each server in turn, `--repeat` times:

- kcat tuned for throughput (tools/bench/consumers.py's settings, printed) reads `bulk`
  from its start to its end: wall seconds, MB/s of record batches as stored, the
  server's CPU seconds (from /proc, the JVM's or serve's) and kcat's;
- one client asks the same Fetch of every `wide` partition from offset 0 (v12, no
  session, partition_max_bytes 1 MiB), answer after answer, for FETCHES fetches:
  fetches/s and the server's CPU milliseconds per fetch.

Kafka runs as the test harness configures it (its settings are printed: Kafka's defaults
but for the single-node replication factors and a 2 GiB heap); replicad serve with its
defaults. The machine's other load is printed with the table.

    .venv/bin/python -m tools.bench.serve_vs_kafka [--mib 1024] [--fetches 200] [--repeat 2]
        [--baseline DIR]   # also replicad serve as another checkout has it, same run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from replicad.protocol.connection import BrokerAddress, BrokerConnection
from replicad.protocol.fetch_request import FetchRequest, RequestedPartition, fetch_request
from replicad.protocol.requests import metadata_request
from replicad.types import TopicPartition
from tools.bench import consumers
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


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


@dataclass(frozen=True, slots=True)
class KcatRun:
    server: str
    seconds: float
    server_cpu_s: float
    kcat_cpu_s: float


@dataclass(frozen=True, slots=True)
class FetchRun:
    server: str
    fetches: int
    seconds: float
    server_cpu_s: float
    response_bytes: int


def kcat_read(server: str, bootstrap: str, pid: int, records: int) -> KcatRun:
    expected = records * (RECORD + 1)  # each payload and a newline
    argv = consumers.kcat_argv(kcat_binary(), KCAT_TUNED, bootstrap, BULK)
    before = cpu_s(pid)
    started = time.monotonic()
    with tempfile.TemporaryFile() as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - started
        got = sink.tell()
    if status != 0 or got != expected:
        raise RuntimeError(f"kcat from {server}: status {status}, {got:,} of {expected:,} bytes")
    return KcatRun(server, seconds, cpu_s(pid) - before, usage.ru_utime + usage.ru_stime)


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
        "--baseline",
        type=Path,
        help="also serve a copy of the data with the replicad of this checkout, same run",
    )
    args = parser.parse_args(argv)
    bulk_records = args.mib * MIB // RECORD
    load = os.getloadavg()[0]
    kcat_runs: list[KcatRun] = []
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
                    kcat_runs.append(kcat_read(name, bootstrap, pid, bulk_records))
                    fetch_runs.append(asyncio.run(wide_fetches(name, bootstrap, pid, args.fetches)))
                    print(f"  {name}: {kcat_runs[-1]}, {fetch_runs[-1]}", file=sys.stderr)
            kafka_settings = (work / "kafka" / "server.properties").read_text()
        finally:
            for serve in serves:
                serve.terminate()
                serve.wait(60)
            broker.stop()
    print(
        f"{bulk_records:,} records of 1 KiB (lz4) in {BULK_PARTITIONS} partitions, "
        f"{bulk_stored / MB:,.0f} MB as stored; load average {load:.2f} at the start; "
        f"{args.repeat} run(s) per server, the median shown (range in brackets)\n"
    )
    print(report(kcat_runs, fetch_runs, bulk_stored))
    print(f"\nkcat's settings: {KCAT_TUNED.settings()}")
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


def report(kcat_runs: list[KcatRun], fetch_runs: list[FetchRun], bulk_stored: int) -> str:
    names = list(dict.fromkeys(r.server for r in kcat_runs))
    lines = [
        "| server | kcat MB/s | kcat wall s | server CPU s | kcat CPU s "
        "| 200-partition fetches/s | server CPU ms per fetch | MB per fetch |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        ks = [r for r in kcat_runs if r.server == name]
        fs = [r for r in fetch_runs if r.server == name]
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    _median_range([bulk_stored / MB / r.seconds for r in ks], ",.0f"),
                    _median_range([r.seconds for r in ks], ".1f"),
                    _median_range([r.server_cpu_s for r in ks], ".1f"),
                    _median_range([r.kcat_cpu_s for r in ks], ".1f"),
                    _median_range([r.fetches / r.seconds for r in fs], ",.1f"),
                    _median_range([1000 * r.server_cpu_s / r.fetches for r in fs], ",.1f"),
                    f"{fs[0].response_bytes / fs[0].fetches / MB:.2f}",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
