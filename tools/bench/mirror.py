"""Mirroring throughput: replicad's mirror next to MirrorMaker 2, same topic, same run.

A local Apache Kafka broker is the source; for each workload a topic is produced there,
then each mirror copies it into a fresh destination broker of its own (the same broker
config), from the start of the topic to its end:

- replicad: `replicad run` with a `mirror:` section (the follower replicates into the
  local log, the mirror produces from it; one process);
- MirrorMaker 2 in dedicated mode (org.apache.kafka.connect.mirror.MirrorMaker, the jars
  fetched by tools/kafka/mirrormaker.sh), tasks.max = partitions, its producer tuned for
  throughput as its documentation recommends (batch.size, linger.ms, compression.type as
  the source, the source consumer's fetch sizes); its settings and its defaults are printed
  under the table.

Both name the copy `source.<topic>` (MirrorMaker 2's default replication policy; replicad's
`mirror.topic_prefix`). Workloads:
- `batched`: 1 KiB records (lz4, about 2:1), produced in large batches (linger.ms 20,
  batch.size 256 KiB), over 6 partitions;
- `tiny`: the same records, one record a batch (a producer with linger.ms 0 and
  batch.num.messages 1): MirrorMaker 2's best case, since its producer batches again;
  replicad runs it twice: with its defaults (runs of small batches coalesced, up to
  `mirror.coalesce_bytes` 256 KiB) and with `coalesce_bytes` 0 (every batch as stored).

For each: records/s from the process's start to the last record at the destination, the
same between 10% and 90% of the records (steady), and CPU seconds of the process (from the
kernel), start to end and steady (10-90%: start-up and the end left out). Progress is the
destination's end offsets, polled. replicad starts compiled as installed (its bytecode
compiled beforehand, as pip does), from a directory without a checkout.

`--profile DIR`: replicad's runs are sampled by py-spy instead of measured (no table);
the top of each profile is printed and its raw samples kept in DIR (`--native`: with C
frames, e.g. the cyclic collector's passes).

`--baseline NAME=DIR` (repeatable): the replicad rows run from the checkout DIR too (an
A/B: its code, this checkout's bench), and with `--repeat N` every replicad row runs N
times, the checkouts interleaved (A B A B) over the same produced topic, so that each meets
the same load; each row says the load average at its start. On a loaded machine read the
CPU seconds, not the rates.

    .venv/bin/python -m tools.bench.mirror [--records 1000000] [--tiny-records 200000]
        [--partitions 6] [--only replicad,as-stored,mirrormaker2] [--workloads batched,tiny]
        [--profile DIR [--native]] [--baseline NAME=DIR ...] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tools.bench.measure import Measured, run_measured
from tools.bench.profile import read_collapsed, sampled, top_table
from tools.bench.replicate import child_env
from tools.peers.kafka import KafkaBroker
from tools.replica import replicad_argv

ROOT = Path(__file__).resolve().parents[2]
MIRRORMAKER_SH = ROOT / "tools" / "kafka" / "mirrormaker.sh"
RECORD = 1024
PREFIX = "source."
REPLICAD, MIRRORMAKER2 = "replicad mirror", "MirrorMaker 2"
AS_STORED = "replicad mirror, coalesce_bytes 0 (as stored)"
CHOICES = {"replicad": REPLICAD, "as-stored": AS_STORED, "mirrormaker2": MIRRORMAKER2}
# How often the destination's end offsets are asked (one ListOffsets for every partition).
PROGRESS_EVERY_S = 0.25
# An ask of them not answered by then has failed, and its client is replaced by a new
# one; asks failing for this long in a row, and it is replaced too (at most one new client
# every REPLACE_AFTER_S: until a mirror creates the topic, every ask fails).
ASK_TIMEOUT_S = 10.0
REPLACE_AFTER_S = 30.0

# MirrorMaker 2's producer and consumer as tuned for throughput (Red Hat's "Handling high
# volumes of messages", Kafka's producer docs: larger batches, some linger, the source's
# codec), next to Kafka's defaults for the same keys.
MM2_TUNED: dict[str, str] = {
    "target.producer.batch.size": "327680",
    "target.producer.linger.ms": "100",
    "target.producer.compression.type": "lz4",
    "source.consumer.fetch.max.bytes": "52428800",
    "source.consumer.max.partition.fetch.bytes": "1048576",
    "source.consumer.max.poll.records": "500",
}
MM2_DEFAULTS: dict[str, str] = {
    "target.producer.batch.size": "16384",
    "target.producer.linger.ms": "5 (Kafka 4)",
    "target.producer.compression.type": "none",
    "source.consumer.fetch.max.bytes": "52428800",
    "source.consumer.max.partition.fetch.bytes": "1048576",
    "source.consumer.max.poll.records": "500",
}


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    topic: str
    records: int
    partitions: int
    one_per_batch: bool


@dataclass(frozen=True, slots=True)
class Run:
    mirror: str
    workload: Workload
    measured: Measured
    # The load average (1 min) when the run started.
    load: float = 0.0

    @property
    def records_per_s(self) -> float:
        return self.workload.records / self.measured.wall_s

    @property
    def steady_records_per_s(self) -> float | None:
        steady = self.measured.steady_s
        return None if steady is None else self.workload.records * 0.8 / steady


def produce(bootstrap: str, workload: Workload) -> None:
    from confluent_kafka import Producer

    from tools.peers.produce import produce_when_room

    rng = random.Random(9)
    pool = [rng.randbytes(RECORD // 2) + bytes(RECORD // 2) for _ in range(4096)]
    settings: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "compression.type": "lz4",
        "queue.buffering.max.kbytes": 512 * 1024,
        # Retried until delivered (0: no limit): at load 60 ProduceRequests timed out and
        # librdkafka's default 300 s gave up on 92,718 of 100,000 records, which flush()
        # did not say; the bench then waited for records that were never there.
        "message.timeout.ms": 0,
    }
    if workload.one_per_batch:
        settings.update({"linger.ms": 0, "batch.num.messages": 1})
    else:
        settings.update({"linger.ms": 20, "batch.size": 256 * 1024})
    producer = Producer(settings)
    failures: list[str] = []

    def failed_delivery(error: object, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    for i in range(workload.records):
        produce_when_room(
            producer,
            workload.topic,
            value=pool[i % len(pool)],
            partition=i % workload.partitions,
            on_delivery=failed_delivery,
        )
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(600) == 0
    if failures:
        raise RuntimeError(f"{len(failures)} records not delivered: {failures[:3]}")


class DestinationProgress:
    """The destination copy's records: the sum of its partitions' end offsets, asked in one
    ListOffsets (an AdminClient's) at most every PROGRESS_EVERY_S, without blocking the
    measuring loop (`records()` takes an answer when it has come and returns the last
    count; it never goes down).

    A client that stopped answering is replaced: after an ask unanswered for ASK_TIMEOUT_S
    (its own timeout: librdkafka should have failed it by then), or asks failing for
    REPLACE_AFTER_S in a row (0 records while the topic is not created yet). Under load a
    destination broker fenced itself (KRaft heartbeats) and answered
    NOT_LEADER_OR_FOLLOWER for minutes; a confluent-kafka client asking it afterwards
    never saw its offsets again (session 13), and a bench waiting on it waits forever.
    `admin`: how a client is made (a test's stand-in; default an AdminClient)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        *,
        admin: Callable[[], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topic = topic
        self.partitions = partitions
        self.count = 0
        # Clients made, asks answered, and asks that failed or went unanswered.
        self.clients = 0
        self.answers = 0
        self.failures = 0
        self.last_error: str | None = None
        self._make = admin or (lambda: _admin_client(bootstrap))
        self._clock = clock
        self._admin: Any = None
        self._asked: dict[Any, Any] | None = None
        self._asked_at = 0.0
        self._at: float | None = None
        # Since when every ask failed (None: the last one was answered).
        self._failing_since: float | None = None

    def records(self) -> int:
        now = self._clock()
        if self._asked is not None:
            if all(f.done() for f in self._asked.values()):
                self.answers += 1
                self._take(self._asked, now)
                self._asked = None
            elif now - self._asked_at >= ASK_TIMEOUT_S:
                self._asked = None
                self.last_error = f"no answer in {ASK_TIMEOUT_S:.0f} s"
                self._failed(now, stuck=True)
        if self._asked is None and (self._at is None or now - self._at >= PROGRESS_EVERY_S):
            self._at = now
            self._ask(now)
        return self.count

    def _ask(self, now: float) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KTP
        from confluent_kafka.admin import OffsetSpec

        if self._admin is None:
            self._admin = self._make()
            self.clients += 1
        wanted = {KTP(self.topic, p): OffsetSpec.latest() for p in range(self.partitions)}
        try:
            self._asked = self._admin.list_offsets(wanted, request_timeout=ASK_TIMEOUT_S)
        except KafkaException as exc:
            self.last_error = str(exc)
            self._failed(now)
            return
        self._asked_at = now

    def _take(self, asked: dict[Any, Any], now: float) -> None:
        from confluent_kafka import KafkaException

        total = 0
        for future in asked.values():
            try:
                total += future.result().offset
            except KafkaException as exc:
                # Also while the topic is not created yet ("No leaders found"): a new
                # client every REPLACE_AFTER_S costs little.
                self.last_error = str(exc)
                self._failed(now)
                return
        self._failing_since = None
        self.count = max(self.count, total)

    def _failed(self, now: float, *, stuck: bool = False) -> None:
        """An ask failed (`stuck`: never answered, past its own timeout)."""
        self.failures += 1
        if self._failing_since is None:
            self._failing_since = now
        if stuck or now - self._failing_since >= REPLACE_AFTER_S:
            self._admin = None  # a new client at the next ask: no state of the old one's
            self._failing_since = now

    def close(self) -> None:
        self._admin = None
        self._asked = None


def _admin_client(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def run_replicad(
    work: Path,
    source: str,
    dest: str,
    workload: Workload,
    *,
    coalesce_bytes: int | None = None,
    profile: Path | None = None,
    checkout: Path | None = None,
    native: bool = False,
    log: Path | None = None,
) -> Measured | None:
    """One `replicad run` mirroring `workload` into `dest` (`coalesce_bytes` None: the
    default): measured, or with `profile` sampled by py-spy into that file (then None).
    `checkout`: the replicad of another checkout (None: this one)."""
    data_dir = work / "replicad-data"
    mirror: dict[str, object] = {"bootstrap_servers": [dest], "topic_prefix": PREFIX}
    if coalesce_bytes is not None:
        mirror["coalesce_bytes"] = coalesce_bytes
    config = {
        "source": {"bootstrap_servers": [source]},
        "topics": {"include": [workload.topic]},
        "data_dir": str(data_dir),
        "mirror": mirror,
    }
    path = work / "replicad.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = replicad_argv("run", "-c", str(path), "--log-format", "json", as_installed=True)
    # Compiled as installed, and started where no checkout shadows PYTHONPATH's.
    env = child_env(work, checkout)
    if profile is None:
        if log is not None:
            # Its log is on stderr, which the measuring drops: into stdout, by a shell
            # that execs it (the same process, so the same CPU seconds).
            argv = ["sh", "-c", 'exec "$@" 2>&1', "sh", *argv]
        return _measure(argv, dest, workload, log, env=env, cwd=work)
    progress = DestinationProgress(dest, PREFIX + workload.topic, workload.partitions)
    try:
        sampled(
            argv,
            profile,
            native=native,
            done=lambda: progress.records() >= workload.records,
            env=env,
            cwd=work,
        )
    finally:
        progress.close()
    return None


def mm2_properties(source: str, dest: str, workload: Workload) -> dict[str, str]:
    return {
        "clusters": "source, target",
        "source.bootstrap.servers": source,
        "target.bootstrap.servers": dest,
        "source->target.enabled": "true",
        "target->source.enabled": "false",
        "source->target.topics": workload.topic,
        "tasks.max": str(workload.partitions),
        "replication.factor": "1",
        "checkpoints.topic.replication.factor": "1",
        "heartbeats.topic.replication.factor": "1",
        "offset-syncs.topic.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        "config.storage.replication.factor": "1",
        "sync.topic.acls.enabled": "false",
        **MM2_TUNED,
    }


def run_mirrormaker2(work: Path, source: str, dest: str, workload: Workload) -> Measured:
    path = work / "mm2.properties"
    props = mm2_properties(source, dest, workload)
    path.write_text("".join(f"{k} = {v}\n" for k, v in props.items()))
    output = work / "mm2.log"
    try:
        return _measure([str(MIRRORMAKER_SH), "run", str(path)], dest, workload, output)
    except RuntimeError:
        # Its log goes with the run's directory: say why it stopped first.
        tail = output.read_text(errors="replace").splitlines()[-40:]
        print("MirrorMaker 2 exited early; the end of its log:", *tail, sep="\n", file=sys.stderr)
        raise


def _measure(
    argv: list[str],
    dest: str,
    workload: Workload,
    output: Path | None = None,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Measured:
    progress = DestinationProgress(dest, PREFIX + workload.topic, workload.partitions)
    with open(output or os.devnull, "wb") as out:
        try:
            return run_measured(
                argv,
                until=lambda: progress.records() >= workload.records,
                progress=lambda: progress.records() / workload.records,
                stdout=out,
                env=env,
                cwd=cwd,
            )
        finally:
            progress.close()


def runner(
    mirror: str,
    profile: Path | None = None,
    coalesce_bytes: int | None = None,
    checkout: Path | None = None,
    native: bool = False,
    log: Path | None = None,
) -> Callable[[Path, str, str, Workload], Measured | None]:
    """How `mirror` runs (a replicad row sampled into `profile` when given; MirrorMaker 2
    is never sampled; `coalesce_bytes` for the default row, None: replicad's default;
    `checkout`: a replicad row's code from another checkout; `log`: where a replicad
    row's log is kept, None: not kept)."""
    if mirror == MIRRORMAKER2:
        return run_mirrormaker2
    if mirror == AS_STORED:
        coalesce_bytes = 0
    return lambda *args: run_replicad(
        *args,
        coalesce_bytes=coalesce_bytes,
        profile=profile,
        checkout=checkout,
        native=native,
        log=log,
    )


def planned(
    mirrors: list[str], baselines: dict[str, Path], repeat: int
) -> list[tuple[str, str, Path | None]]:
    """The runs of one workload, in order: (mirror, row label, checkout or None). Every
    replicad row of this checkout and of each baseline `repeat` times, interleaved (A B A
    B: the same load for each); MirrorMaker 2 once, at the end."""
    out: list[tuple[str, str, Path | None]] = []
    for _ in range(repeat):
        for mirror in mirrors:
            if mirror == MIRRORMAKER2:
                continue
            out.append((mirror, mirror, None))
            for name, checkout in baselines.items():
                out.append((mirror, f"{mirror} [{name}]", checkout))
    if MIRRORMAKER2 in mirrors:
        out.append((MIRRORMAKER2, MIRRORMAKER2, None))
    return out


def table(runs: list[Run]) -> str:
    lines = [
        "| workload | mirror | records/s start to end | records/s steady (10-90%) | CPU s | "
        "CPU s steady | wall s | load | "
        "vs MirrorMaker 2 (start to end / steady / CPU / CPU steady) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for run in runs:
        peer = next(
            (r for r in runs if r.workload == run.workload and r.mirror == MIRRORMAKER2), None
        )
        versus = ""
        cpu_steady = run.measured.steady_cpu_s
        if peer is not None and run.mirror != MIRRORMAKER2:
            steady, peer_steady = run.steady_records_per_s, peer.steady_records_per_s
            peer_cpu_steady = peer.measured.steady_cpu_s
            versus = (
                f"{run.records_per_s / peer.records_per_s:.2f}x / "
                + (f"{steady / peer_steady:.2f}x" if steady and peer_steady else "-")
                + f" / {run.measured.cpu_s / peer.measured.cpu_s:.2f} / "
                + (
                    f"{cpu_steady / peer_cpu_steady:.2f}"
                    if cpu_steady is not None and peer_cpu_steady
                    else "-"
                )
            )
        steady = run.steady_records_per_s
        lines.append(
            f"| {run.workload.name} | {run.mirror} | {run.records_per_s:,.0f} | "
            f"{f'{steady:,.0f}' if steady else '-'} | {run.measured.cpu_s:.1f} | "
            f"{f'{cpu_steady:.1f}' if cpu_steady is not None else '-'} | "
            f"{run.measured.wall_s:.1f} | {run.load:.1f} | {versus} |"
        )
    return "\n".join(lines)


def settings_notes() -> str:
    lines = ["MirrorMaker 2's settings (dedicated mode, tasks.max = partitions):", ""]
    lines.append("| key | set here | Kafka's default |")
    lines.append("|---|---|---|")
    for key, value in MM2_TUNED.items():
        lines.append(f"| {key} | {value} | {MM2_DEFAULTS[key]} |")
    lines.append("")
    lines.append(
        "replicad's mirror: its defaults (mirror.buffer_bytes 4 MiB read ahead per "
        "partition, 5 batches in flight per partition, many partitions per Produce, batches "
        "of 16 KiB or more produced as stored: never decompressed nor re-batched; runs of "
        "smaller ones coalesced into batches of up to mirror.coalesce_bytes 256 KiB, "
        "re-compressed); on the tiny workload also with coalesce_bytes 0 (every batch as "
        "stored)."
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--tiny-records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--only", help=f"comma-separated subset of: {','.join(CHOICES)}")
    parser.add_argument("--workloads", default="batched,tiny")
    parser.add_argument("--profile", type=Path, help="sample replicad's runs into this directory")
    parser.add_argument("--top", type=int, default=25, help="functions shown per profile")
    parser.add_argument(
        "--logs", type=Path, help="keep each replicad row's log (JSON lines) in this directory"
    )
    parser.add_argument(
        "--native", action="store_true", help="with --profile: C frames too (the collector)"
    )
    parser.add_argument(
        "--coalesce-bytes",
        type=int,
        help="mirror.coalesce_bytes of the default replicad row (to compare a checkout "
        "whose default differs)",
    )
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also run the replicad rows from the checkout DIR, interleaved (an A/B)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs of each replicad row, interleaved"
    )
    args = parser.parse_args()
    baselines: dict[str, Path] = {}
    for item in args.baseline:
        name, sep, path = item.partition("=")
        if not sep or not (Path(path) / "replicad" / "__init__.py").is_file():
            parser.error(f"--baseline {item!r}: NAME=DIR of a checkout with replicad/")
        baselines[name] = Path(path).resolve()
    mirrors = [CHOICES[m] for m in (args.only.split(",") if args.only else CHOICES)]
    if args.profile is not None:
        mirrors = [m for m in mirrors if m != MIRRORMAKER2]
        args.profile.mkdir(parents=True, exist_ok=True)
    if MIRRORMAKER2 in mirrors:
        subprocess.run([str(MIRRORMAKER_SH), "fetch"], check=True)
    wanted = args.workloads.split(",")
    workloads = [
        w
        for w in (
            Workload("batched", "bench-batched", args.records, args.partitions, False),
            Workload("tiny", "bench-tiny", args.tiny_records, args.partitions, True),
        )
        if w.name in wanted
    ]
    load = os.getloadavg()[0]
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="replicad-bench-mirror-", dir=os.getcwd()) as tmp:
        work = Path(tmp)
        source = KafkaBroker(work / "source", heap="1g")
        source.start()
        try:
            for workload in workloads:
                source.create_topic(workload.topic, workload.partitions)
                started = time.monotonic()
                produce(source.bootstrap, workload)
                print(
                    f"  {workload.name}: produced {workload.records:,} records in "
                    f"{time.monotonic() - started:.0f}s",
                    file=sys.stderr,
                    flush=True,
                )
                for n, (mirror, label, checkout) in enumerate(
                    planned(mirrors, baselines, args.repeat)
                ):
                    if mirror == AS_STORED and not workload.one_per_batch:
                        continue  # large batches are produced as stored by default
                    run_dir = work / f"{workload.name}-{n}"
                    run_dir.mkdir()
                    dest = KafkaBroker(run_dir / "destination", heap="1g")
                    dest.start()
                    raw = None
                    if args.profile is not None:
                        raw = args.profile / f"{run_dir.name}.txt"
                    at_load = os.getloadavg()[0]
                    try:
                        log = None
                        if args.logs is not None:
                            args.logs.mkdir(parents=True, exist_ok=True)
                            log = args.logs / f"{run_dir.name}-{label}.log".replace(" ", "_")
                        measured = runner(
                            mirror, raw, args.coalesce_bytes, checkout, args.native, log
                        )(run_dir, source.bootstrap, dest.bootstrap, workload)
                    finally:
                        dest.stop()
                    if measured is None:
                        assert raw is not None
                        print(f"\n{workload.name}, {label} (py-spy, raw samples in {raw}):\n")
                        print(top_table(read_collapsed(raw.read_text()), args.top), flush=True)
                        continue
                    runs.append(Run(label, workload, measured, at_load))
                    print(
                        f"  {workload.name}: {label}: {measured.wall_s:.1f}s, "
                        f"{measured.cpu_s:.1f} CPU s, load {at_load:.1f}",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            source.stop()
    if args.profile is not None:
        return 0
    print(
        f"{', '.join(f'{w.name}: {w.records:,} records' for w in workloads)} of 1 KiB (lz4), "
        f"{args.partitions} partitions; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores; load average {load:.2f} at the start\n"
    )
    print(table(runs))
    print()
    print(settings_notes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
