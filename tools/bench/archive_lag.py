"""Do uploads keep up with replication at full speed? `replicad run` with `archive:` on,
copying a topic from a local Apache Kafka as fast as it can, next to the same run with the
archive off; how far the bucket trails the replica.

    .venv/bin/python -m tools.bench.archive_lag [--mib 1024] [--partitions 4]
        [--segment-mib 64] [--segment-ms 1000]

One run, the same topic for both passes (tools/bench/replicate's data: 1 KiB lz4 records,
written by confluent-kafka into a local Kafka), each into a fresh data directory:
1. `replicad run`, its defaults but `log.segment_bytes`, no archive: seconds until the
   replica holds every byte (the replication rate this machine allows now);
2. the same with `archive:` pointed at versitygw (tools/peers/s3.py, its posix backend on
   the same disk) and `log.segment_ms` to roll the quiet tail: seconds until the replica
   holds every byte, and until the bucket's manifests name every record.
The uploads keep up when the second pass's replication is as fast as the first's and the
bucket trails the replica by about one segment's roll and upload, not by a growing backlog:
both are printed, with replicad's CPU seconds and the machine's load average, and the
bucket's trail at each tenth of the replication (how far the manifests' ends were behind
the replica's, in MB).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tools.bench.measure import cpu_seconds
from tools.bench.replicate import RECORD, child_env, log_bytes, prepare_topic
from tools.peers import s3
from tools.peers.kafka import KafkaBroker
from tools.peers.s3 import ACCESS_KEY, REGION, SECRET_KEY, S3Server
from tools.replica import replicad_argv

MIB = 1024 * 1024
MB = 1_000_000
TOPIC = "lag"
PREFIX = "replica"
POLL_S = 0.2
DEADLINE_S = 1800.0


@dataclass(frozen=True, slots=True)
class Pass:
    archive: bool
    replicated_s: float
    uploaded_s: float | None  # until the bucket names every record; None without archive
    cpu_s: float
    # (seconds, MB the bucket's manifests trail the replica by), at each tenth of the bytes
    trail: tuple[tuple[float, float], ...]


def config_text(bootstrap: str, data_dir: Path, args: argparse.Namespace, bucket: str | None,
                endpoint: str | None) -> str:  # fmt: skip
    sock = data_dir.with_name(data_dir.name + ".sock")
    text = (
        f"source:\n  bootstrap_servers: ['{bootstrap}']\ntopics:\n  include: [{TOPIC}]\n"
        f"data_dir: '{data_dir}'\ncontrol:\n  socket: '{sock}'\nlogging:\n  level: warning\n"
        f"log:\n  segment_bytes: {args.segment_mib * MIB}\n"
    )
    if bucket is None:
        return text
    return text + (
        f"  segment_ms: {args.segment_ms}\n"
        f"archive:\n  bucket: {bucket}\n  prefix: {PREFIX}\n  endpoint: '{endpoint}'\n"
        f"  region: {REGION}\n  access_key_id: {ACCESS_KEY}\n"
        "  secret_access_key_env: BENCH_ARCHIVE_SECRET\n  interval_ms: 100\n"
    )


def one_pass(
    work: Path,
    bootstrap: str,
    stored: int,
    records: int,
    partitions: int,
    args: argparse.Namespace,
    server: S3Server | None,
) -> Pass:
    data_dir = work / ("replica-archived" if server else "replica")
    shutil.rmtree(data_dir, ignore_errors=True)
    bucket = server.create_bucket(f"lag-{time.monotonic_ns()}") if server else None
    config = work / "run.yaml"
    config.write_text(
        config_text(bootstrap, data_dir, args, bucket, server.endpoint if server else None)
    )
    client = server.client() if server else None

    def archived() -> int:
        if client is None or bucket is None:
            return 0
        return sum(s3.archived_end(client, bucket, PREFIX, TOPIC, p) for p in range(partitions))

    env = {**os.environ, **child_env(work), "BENCH_ARCHIVE_SECRET": SECRET_KEY}
    started = time.monotonic()
    proc = subprocess.Popen(
        replicad_argv("run", "-c", str(config), as_installed=True),
        env=env,
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    replicated_s = uploaded_s = None
    trail: list[tuple[float, float]] = []
    next_tenth = 1
    cpu = 0.0
    try:
        while time.monotonic() - started < DEADLINE_S:
            if proc.poll() is not None:
                raise RuntimeError(f"replicad run exited with {proc.returncode}")
            now = time.monotonic() - started
            cpu = cpu_seconds(proc.pid) or cpu
            have = log_bytes(data_dir)
            if server is not None and next_tenth <= 10 and have >= stored * next_tenth / 10:
                done = archived()
                behind = (have - done * stored / records) / MB  # records -> stored bytes
                trail.append((now, behind))
                next_tenth += 1
            if replicated_s is None and have >= stored:
                replicated_s = now
                if server is None:
                    break
            if replicated_s is not None and archived() >= records:
                uploaded_s = now
                break
            time.sleep(POLL_S)
        else:
            raise RuntimeError(f"not done in {DEADLINE_S:.0f} s")
    finally:
        proc.terminate()
        proc.wait(60)
    shutil.rmtree(data_dir, ignore_errors=True)
    assert replicated_s is not None
    return Pass(server is not None, replicated_s, uploaded_s, cpu, tuple(trail))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--segment-mib", type=int, default=64)
    parser.add_argument("--segment-ms", type=int, default=1000)
    args = parser.parse_args(argv)
    records = args.mib * MIB // RECORD
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="replicad-archive-lag-", dir=os.getcwd()) as tmp:
        work = Path(tmp)
        broker = KafkaBroker(work / "kafka", heap="1g")
        broker.start()
        try:
            topic = prepare_topic(broker, TOPIC, args.partitions, records)
            with S3Server(work / "s3") as server:
                passes = [
                    one_pass(work, broker.bootstrap, topic.stored, records, args.partitions,
                             args, None),
                    one_pass(work, broker.bootstrap, topic.stored, records, args.partitions,
                             args, server),
                ]  # fmt: skip
        finally:
            broker.stop()
    stored_mb = topic.stored / MB
    print(
        f"{records:,} records of 1 KiB (lz4) in {args.partitions} partitions, "
        f"{stored_mb:,.0f} MB stored, {args.segment_mib} MiB segments; load average "
        f"{load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end\n"
    )
    print("| replicad run | replicated s | MB/s | in the bucket s | bucket trails by s "
          "| replicad CPU s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for p in passes:
        up = "-" if p.uploaded_s is None else f"{p.uploaded_s:.1f}"
        lag = "-" if p.uploaded_s is None else f"{p.uploaded_s - p.replicated_s:.1f}"
        print(
            f"| {'archive on' if p.archive else 'archive off'} | {p.replicated_s:.1f} | "
            f"{stored_mb / p.replicated_s:,.0f} | {up} | {lag} | {p.cpu_s:.1f} |"
        )
    on = passes[1]
    print(
        "\nThe bucket behind the replica at each tenth of it (s since start: MB): "
        + ", ".join(f"{t:.1f}: {mb:,.0f}" for t, mb in on.trail)
    )
    print(
        f"Replication with uploads / without: {passes[0].replicated_s / on.replicated_s:.2f}x "
        "the rate (same run)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
