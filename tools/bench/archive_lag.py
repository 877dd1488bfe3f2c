"""Do uploads keep up with replication at full speed? `replicad run` with `archive:` on,
copying a topic from a local Apache Kafka as fast as it can, next to the same run with the
archive off; how far the bucket trails the replica, and what the uploads cost.

    .venv/bin/python -m tools.bench.archive_lag [--mib 1024] [--partitions 4]
        [--segment-mib 64] [--segment-ms 1000] [--signing auto,unsigned]
        [--upload-threads N] [--baseline DIR] [--profile FILE]

One run, the same topic for every pass (tools/bench/replicate's data: 1 KiB lz4 records,
written by confluent-kafka into a local Kafka), each into a fresh data directory:
1. `replicad run`, its defaults but `log.segment_bytes`, no archive: seconds until the
   replica holds every byte (the replication rate this machine allows now);
2. the same with `archive:` pointed at versitygw (tools/peers/s3.py, its posix backend on
   the same disk, plain http on 127.0.0.1) and `log.segment_ms` to roll the quiet tail, once
   per `--signing` value (`archive.payload_signing`: auto signs the body's SHA-256 over
   http, unsigned does not; a CRC32C goes with every PUT either way): seconds until the
   replica holds every byte, and until the bucket's manifests name every record;
3. with `--baseline DIR` (a `git archive` of another commit), the archive pass again with
   that checkout's replicad and its own archive defaults (no new keys in its config).
The uploads keep up when an archive pass replicates as fast as the first pass and the
bucket trails the replica by about one segment's roll and upload, not by a growing backlog.
Printed per pass: replicad's CPU seconds and peak RSS (VmHWM), versitygw's CPU seconds,
CPU seconds per GB uploaded beyond the pass without the archive, the machine's load
average, and the bucket's trail at each tenth of the replication (MB behind the replica).
`--profile FILE`: each archive pass is sampled by py-spy (attached to replicad, Python
frames, non-blocking: py-spy takes native frames only by pausing the process), raw samples
kept in FILE.<signing> (FILE.baseline), and the top functions printed; the sampling costs
CPU, so take the other figures from a run without it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tools.bench.measure import cpu_seconds, hwm_mib
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
SIGNINGS = ("auto", "unsigned", "signed")


@dataclass(frozen=True, slots=True)
class Archive:
    """One archive pass's settings: None fields are left to replicad's defaults."""

    signing: str | None = None
    upload_threads: int | None = None
    baseline: Path | None = None

    @property
    def label(self) -> str:
        if self.baseline is not None:
            return f"archive on, baseline ({self.baseline.name})"
        what = {"auto": "payload signed (auto over http)", "unsigned": "unsigned payload"}
        return f"archive on, {what.get(self.signing or 'auto', f'payload {self.signing}')}"


@dataclass(frozen=True, slots=True)
class Pass:
    archive: Archive | None
    replicated_s: float
    uploaded_s: float | None  # until the bucket names every record; None without archive
    cpu_s: float
    peak_rss_mib: float | None
    s3_cpu_s: float | None  # versitygw's CPU during the pass
    # (seconds, MB the bucket's manifests trail the replica by), at each tenth of the bytes
    trail: tuple[tuple[float, float], ...]


def config_text(bootstrap: str, data_dir: Path, args: argparse.Namespace, bucket: str | None,
                endpoint: str | None, archive: Archive | None = None) -> str:  # fmt: skip
    sock = data_dir.with_name(data_dir.name + ".sock")
    text = (
        f"source:\n  bootstrap_servers: ['{bootstrap}']\ntopics:\n  include: [{TOPIC}]\n"
        f"data_dir: '{data_dir}'\ncontrol:\n  socket: '{sock}'\nlogging:\n  level: warning\n"
        f"log:\n  segment_bytes: {args.segment_mib * MIB}\n"
    )
    if bucket is None:
        return text
    text += (
        f"  segment_ms: {args.segment_ms}\n"
        f"archive:\n  bucket: {bucket}\n  prefix: {PREFIX}\n  endpoint: '{endpoint}'\n"
        f"  region: {REGION}\n  access_key_id: {ACCESS_KEY}\n"
        "  secret_access_key_env: BENCH_ARCHIVE_SECRET\n  interval_ms: 100\n"
    )
    if archive is not None and archive.signing is not None:
        text += f"  payload_signing: {archive.signing}\n"
    if archive is not None and archive.upload_threads is not None:
        text += f"  upload_threads: {archive.upload_threads}\n"
    return text


def _profiler(pid: int, out: Path) -> subprocess.Popen[bytes]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--format", "raw", "-o", str(out), "--rate", "100",
         "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def one_pass(
    work: Path,
    bootstrap: str,
    stored: int,
    records: int,
    partitions: int,
    args: argparse.Namespace,
    server: S3Server | None,
    archive: Archive | None,
    profile: Path | None = None,
) -> Pass:
    data_dir = work / ("replica-archived" if server else "replica")
    shutil.rmtree(data_dir, ignore_errors=True)
    bucket = server.create_bucket(f"lag-{time.monotonic_ns()}") if server else None
    config = work / "run.yaml"
    config.write_text(
        config_text(bootstrap, data_dir, args, bucket, server.endpoint if server else None,
                    archive)
    )  # fmt: skip
    client = server.client() if server else None

    def archived() -> int:
        if client is None or bucket is None:
            return 0
        return sum(s3.archived_end(client, bucket, PREFIX, TOPIC, p) for p in range(partitions))

    baseline = archive.baseline if archive is not None else None
    env = {**os.environ, **child_env(work, baseline), "BENCH_ARCHIVE_SECRET": SECRET_KEY}
    s3_before = cpu_seconds(server.pid) if server and server.pid else None
    started = time.monotonic()
    proc = subprocess.Popen(
        replicad_argv("run", "-c", str(config), as_installed=True),
        env=env,
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    spy = _profiler(proc.pid, profile) if profile is not None else None
    replicated_s = uploaded_s = None
    trail: list[tuple[float, float]] = []
    next_tenth = 1
    cpu = 0.0
    peak: float | None = None
    try:
        while time.monotonic() - started < DEADLINE_S:
            if proc.poll() is not None:
                raise RuntimeError(f"replicad run exited with {proc.returncode}")
            now = time.monotonic() - started
            cpu = cpu_seconds(proc.pid) or cpu
            peak = hwm_mib(proc.pid) or peak
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
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        if spy is not None:
            spy.wait(120)  # py-spy writes its samples once replicad is gone
    s3_cpu = None
    if server is not None and server.pid and s3_before is not None:
        s3_cpu = (cpu_seconds(server.pid) or s3_before) - s3_before
    shutil.rmtree(data_dir, ignore_errors=True)
    assert replicated_s is not None
    return Pass(archive, replicated_s, uploaded_s, cpu, peak, s3_cpu, tuple(trail))


def table(passes: list[Pass], stored: int) -> str:
    """The passes as a markdown table; the first pass is the one without the archive."""
    stored_mb, stored_gb = stored / MB, stored / 1e9
    off = passes[0]
    lines = [
        "| replicad run | replicated s | MB/s | in the bucket s | bucket trails by s "
        "| replicad CPU s | CPU s per GB uploaded, beyond replication | peak RSS MiB "
        "| versitygw CPU s | replication vs archive off |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in passes:
        up = "-" if p.uploaded_s is None else f"{p.uploaded_s:.1f}"
        lag = "-" if p.uploaded_s is None else f"{p.uploaded_s - p.replicated_s:.1f}"
        extra = "-" if p.archive is None else f"{(p.cpu_s - off.cpu_s) / stored_gb:.2f}"
        rss = "-" if p.peak_rss_mib is None else f"{p.peak_rss_mib:.0f}"
        s3_cpu = "-" if p.s3_cpu_s is None else f"{p.s3_cpu_s:.1f}"
        label = "archive off" if p.archive is None else p.archive.label
        lines.append(
            f"| {label} | {p.replicated_s:.1f} | {stored_mb / p.replicated_s:,.0f} | {up} | "
            f"{lag} | {p.cpu_s:.1f} | {extra} | {rss} | {s3_cpu} | "
            f"{off.replicated_s / p.replicated_s:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--segment-mib", type=int, default=64)
    parser.add_argument("--segment-ms", type=int, default=1000)
    parser.add_argument(
        "--signing",
        default="auto,unsigned",
        help=f"archive.payload_signing of each archive pass, from {','.join(SIGNINGS)}",
    )
    parser.add_argument("--upload-threads", type=int, help="archive.upload_threads")
    parser.add_argument("--baseline", type=Path, help="a checkout to run an archive pass of")
    parser.add_argument("--profile", type=Path, help="py-spy's raw samples, FILE.<signing>")
    args = parser.parse_args(argv)
    signings = [s for s in args.signing.split(",") if s]
    if not set(signings) <= set(SIGNINGS):
        parser.error(f"--signing: each of {', '.join(SIGNINGS)}")
    archives = [Archive(s, args.upload_threads) for s in signings]
    if args.baseline is not None:
        archives.append(Archive(baseline=args.baseline.resolve()))
    records = args.mib * MIB // RECORD
    load = os.getloadavg()[0]
    profiles: list[tuple[str, Path]] = []
    with tempfile.TemporaryDirectory(prefix="replicad-archive-lag-", dir=os.getcwd()) as tmp:
        work = Path(tmp)
        broker = KafkaBroker(work / "kafka", heap="1g")
        broker.start()
        try:
            topic = prepare_topic(broker, TOPIC, args.partitions, records)
            with S3Server(work / "s3") as server:
                passes = [
                    one_pass(work, broker.bootstrap, topic.stored, records, args.partitions,
                             args, None, None),
                ]  # fmt: skip
                for archive in archives:
                    profile = None
                    if args.profile is not None:
                        suffix = "baseline" if archive.baseline else archive.signing
                        profile = args.profile.with_name(f"{args.profile.name}.{suffix}")
                        profiles.append((archive.label, profile))
                    passes.append(
                        one_pass(work, broker.bootstrap, topic.stored, records,
                                 args.partitions, args, server, archive, profile)
                    )  # fmt: skip
        finally:
            broker.stop()
    print(
        f"{records:,} records of 1 KiB (lz4) in {args.partitions} partitions, "
        f"{topic.stored / MB:,.0f} MB stored, {args.segment_mib} MiB segments, upload threads "
        f"{args.upload_threads or 'default'}; load average {load:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end{'; sampled by py-spy' if profiles else ''}\n"
    )
    print(table(passes, topic.stored))
    for p in passes[1:]:
        assert p.archive is not None
        print(
            f"\n{p.archive.label}: the bucket behind the replica at each tenth of it "
            "(s since start: MB): " + ", ".join(f"{t:.1f}: {mb:,.0f}" for t, mb in p.trail)
        )
    if profiles:
        from tools.bench.profile import read_collapsed, top_table

        for label, path in profiles:
            if path.exists():
                print(f"\n{label}, py-spy (raw samples in {path}):\n")
                print(top_table(read_collapsed(path.read_text()), 30))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
