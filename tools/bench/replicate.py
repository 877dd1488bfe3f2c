"""Replication throughput: replicad next to the consumers people use, same topic, same run.

Produces N GiB (default 2) into a local Apache Kafka topic of P partitions:
1 KiB records whose values compress about 2:1 (half random bytes, half zeros,
drawn from a pool so batches don't collapse), lz4. Then, one after the other, each
reader goes from the start of the topic to its end:

- replicad (`replicad run`, into segments on disk)
- kafka-python, aiokafka and confluent-kafka consumers (records counted, not kept)
- `kcat -C` into a file
- replicad from `replicad serve`: a second `replicad run` (a privileged follower,
  replica id 7) copies the first one's replica, served by `replicad serve`; its MB/s
  is set against min(loopback, disk) (the issue's target: at least 60%)

For each: records/s, MB/s (record batches as stored), CPU seconds and peak RSS
(from the kernel's rusage of the child process). This machine's limits are measured
in the same run: loopback TCP copy and sequential disk write.

replicad runs as installed for production: the `test` extra's hypothesis, which kio
imports at start-up only when it is installed (for its own strategies), is kept out
of the replicad processes (about half a second of CPU at start-up, nothing after).

    .venv/bin/python -m tools.bench.replicate [--gib 2] [--partitions 8]

Prints a markdown table (docs/benchmarks.md holds one run's output).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tools.peers.kafka import KafkaBroker
from tools.replica import end_offsets, replicad_argv, run_args

RECORD = 1024
MB = 1_000_000
FOLLOWER_ID = 7


@dataclass
class Result:
    name: str
    seconds: float
    records: int
    stored_bytes: int
    cpu_s: float
    peak_rss_mib: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.stored_bytes / MB / self.seconds


def value_pool(rng: random.Random, n: int = 4096) -> list[bytes]:
    return [rng.randbytes(RECORD // 2) + bytes(RECORD // 2) for _ in range(n)]


def produce(bootstrap: str, topic: str, partitions: int, records: int) -> None:
    from confluent_kafka import Producer

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
        while True:
            try:
                producer.produce(topic, value=pool[i % len(pool)], partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(300) == 0


def _hwm_mib(pid: int) -> float | None:
    """The process's own peak RSS (VmHWM); it restarts at exec, unlike ru_maxrss, which
    also counts the forked parent's pages before exec."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run_measured(
    argv: list[str], *, until=None, env=None, stdout=None
) -> tuple[float, float, float]:
    """Run a child; returns (wall seconds, CPU seconds, peak RSS MiB). With `until`,
    the child is SIGTERMed once the predicate holds (a daemon); else it must exit."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **(env or {})},
        stdout=stdout or subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    peak = 0.0
    elapsed = None
    while True:
        # wait4, not Popen.poll: poll would reap the child and lose its rusage.
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        peak = max(peak, _hwm_mib(proc.pid) or 0.0)
        if until is not None and until():
            elapsed = time.monotonic() - started
            peak = max(peak, _hwm_mib(proc.pid) or 0.0)
            proc.send_signal(signal.SIGTERM)
            _, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if elapsed is None:
        elapsed = time.monotonic() - started
        if status != 0:
            raise RuntimeError(f"{argv[:3]} exited with status {status}")
    return elapsed, usage.ru_utime + usage.ru_stime, peak


CONSUMERS = {
    "kafka-python": """
import sys
from kafka import KafkaConsumer, TopicPartition
bootstrap, topic, n, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                  fetch_max_bytes=50 * 1024 * 1024, max_partition_fetch_bytes=1024 * 1024)
c.assign([TopicPartition(topic, p) for p in range(n)])
c.seek_to_beginning()
seen = 0
while seen < total:
    for recs in c.poll(timeout_ms=1000, max_records=100000).values():
        seen += len(recs)
""",
    "aiokafka": """
import asyncio, sys
from aiokafka import AIOKafkaConsumer, TopicPartition
bootstrap, topic, n, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
async def main():
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                         fetch_max_bytes=50 * 1024 * 1024, max_partition_fetch_bytes=1024 * 1024)
    await c.start()
    c.assign([TopicPartition(topic, p) for p in range(n)])
    await c.seek_to_beginning()
    seen = 0
    while seen < total:
        for recs in (await c.getmany(timeout_ms=1000, max_records=100000)).values():
            seen += len(recs)
    await c.stop()
asyncio.run(main())
""",
    "confluent-kafka": """
import sys
from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING
bootstrap, topic, n, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False})
c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(n)])
seen = 0
while seen < total:
    seen += sum(1 for m in c.consume(num_messages=100000, timeout=1.0) if not m.error())
c.close()
""",
}


def loopback_mb_per_s(size: int = 2 * 1024 * 1024 * 1024) -> float:
    """TCP on 127.0.0.1 with large buffers, one sender thread, one receiver: the ceiling a
    single fetch connection could reach."""
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--only", help="comma-separated subset of readers")
    args = parser.parse_args()
    records = int(args.gib * 1024 * 1024 * 1024 / RECORD)
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="replicad-bench-", dir=os.getcwd()) as tmp:
        work = Path(tmp)
        broker = KafkaBroker(work / "kafka", heap="2g")
        broker.start()
        try:
            topic = "bench"
            broker.create_topic(topic, args.partitions)
            t0 = time.monotonic()
            produce(broker.bootstrap, topic, args.partitions, records)
            print(
                f"  produced {records:,} records in {time.monotonic() - t0:.0f}s",
                file=sys.stderr,
                flush=True,
            )
            stored = sum(
                sum(f.stat().st_size for f in broker.partition_dir(topic, p).glob("*.log"))
                for p in range(args.partitions)
            )
            wanted = set(
                (args.only or "replicad,serve,kafka-python,aiokafka,confluent-kafka,kcat").split(
                    ","
                )
            )
            py = sys.executable
            if "replicad" in wanted:
                data_dir = work / "replica"
                # Without the test-only hypothesis (see the module docstring).
                argv = replicad_argv(
                    *run_args(broker.bootstrap, topic, data_dir, control_socket=work / "c.sock"),
                    as_installed=True,
                )

                def done() -> bool:
                    # Byte-identical replica: done when it holds as many bytes as the
                    # broker's segments (a stat per file, so the check costs nothing).
                    return sum(f.stat().st_size for f in data_dir.glob("*/*.log")) >= stored

                secs, cpu, rss = run_measured(argv, until=done)
                got = sum(end_offsets(data_dir).values())
                if got != records:
                    raise RuntimeError(f"replica holds {got:,} records, expected {records:,}")
                results.append(Result("replicad", secs, records, stored, cpu, rss))
                if "serve" in wanted:
                    chained = replicate_from_serve(work, data_dir, topic, stored)
                    if chained.records != records:
                        raise RuntimeError(f"replicad from serve holds {chained.records:,} records")
                    results.append(chained)
                shutil.rmtree(data_dir)
            for name, code in CONSUMERS.items():
                if name in wanted:
                    secs, cpu, rss = run_measured(
                        [
                            py,
                            "-c",
                            code,
                            broker.bootstrap,
                            topic,
                            str(args.partitions),
                            str(records),
                        ]
                    )
                    results.append(Result(name, secs, records, stored, cpu, rss))
            if "kcat" in wanted and shutil.which("kcat"):
                with (work / "kcat.out").open("wb") as out:
                    secs, cpu, rss = run_measured(
                        [
                            "kcat",
                            "-C",
                            "-b",
                            broker.bootstrap,
                            "-t",
                            topic,
                            "-o",
                            "beginning",
                            "-e",
                            "-q",
                            "-f",
                            "%s\n",
                        ],
                        stdout=out,
                    )
                results.append(Result("kcat -C > file", secs, records, stored, cpu, rss))
                (work / "kcat.out").unlink()
            for r in results:
                print(f"  {r.name}: {r.seconds:.1f}s", file=sys.stderr, flush=True)
        finally:
            broker.stop()
        loop = loopback_mb_per_s()
        disk = disk_mb_per_s(work)
    print(
        f"{records:,} records of 1 KiB (lz4, ~2:1) in {args.partitions} partitions, "
        f"{stored / MB:,.0f} MB as stored; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores; Kafka {_kafka_version()}\n"
    )
    print("| reader | records/s | MB/s (stored) | wall s | CPU s | peak RSS MiB | vs confluent |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    base = next((r.records_per_s for r in results if r.name == "confluent-kafka"), None)
    for r in results:
        ratio = f"{r.records_per_s / base:.2f}x" if base else "-"
        print(
            f"| {r.name} | {r.records_per_s:,.0f} | {r.mb_per_s:,.1f} | {r.seconds:.1f} "
            f"| {r.cpu_s:.1f} | {r.peak_rss_mib:,.0f} | {ratio} |"
        )
    print(
        f"\nThis machine, same run: loopback TCP copy {loop:,.0f} MB/s; "
        f"disk write (dd bs=1M, fdatasync) {disk:,.0f} MB/s."
    )
    chained = next((r for r in results if r.name == SERVE_READER), None)
    if chained is not None:
        limit = min(loop, disk)
        print(
            f"replicad from replicad serve: {chained.mb_per_s:,.0f} MB/s = "
            f"{chained.mb_per_s / limit:.0%} of min(loopback, disk) = {limit:,.0f} MB/s "
            "(target: at least 60%)."
        )
    return 0


SERVE_READER = "replicad from replicad serve"


def replicate_from_serve(work: Path, source: Path, topic: str, stored: int) -> Result:
    """`replicad serve` over `source` (a finished replica); a second `replicad run`, as a
    privileged follower, copies it into a new data dir. Measured like the others."""
    from tools.peers.process import free_port, port_accepts

    port = free_port()
    target = work / "replica-of-replica"
    config = work / "chain.yaml"
    config.write_text(
        f"source:\n  bootstrap_servers: ['127.0.0.1:{port}']\ntopics:\n  include: [{topic}]\n"
        f"fetch:\n  replica_id: {FOLLOWER_ID}\ndata_dir: '{target}'\n"
        f"control:\n  socket: '{work / 'chain.sock'}'\nlogging:\n  level: warning\n"
    )
    serve = subprocess.Popen(
        replicad_argv(
            "serve",
            "--data-dir",
            str(source),
            "--listen",
            f"127.0.0.1:{port}",
            "--node-id",
            "1",
            "--allow-follower",
            str(FOLLOWER_ID),
            "--log-format",
            "json",
            as_installed=True,
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not port_accepts(port) and serve.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if serve.poll() is not None:
            raise RuntimeError(f"replicad serve exited with {serve.returncode}")

        def done() -> bool:
            return sum(f.stat().st_size for f in target.glob("*/*.log")) >= stored

        secs, cpu, rss = run_measured(
            replicad_argv("run", "-c", str(config), as_installed=True), until=done
        )
    finally:
        serve.terminate()
        serve.wait(60)
    got = sum(end_offsets(target).values())
    shutil.rmtree(target)
    return Result(SERVE_READER, secs, got, stored, cpu, rss)


def _kafka_version() -> str:
    from tools.peers.kafka import kafka_version

    return kafka_version()


if __name__ == "__main__":
    sys.exit(main())
