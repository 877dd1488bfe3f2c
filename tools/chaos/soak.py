"""Soak: steady production plus random network faults for a long while, watching that the
daemon's resources stay flat, then the invariant.

One replicad process runs the whole time behind the fault proxy; every few seconds a
random fault is injected (cut, short or long stall, truncated frame, flipped batch byte,
delay burst, refused connections). The daemon is sampled from outside only:
/proc/<pid>/status (VmRSS, RssAnon, Threads) and /proc/<pid>/fd (sockets, files in the
data dir, others). The asyncio task count would come from the status JSON, which has no
such field: it is reported as missing, not guessed.

Flat means: after a warm-up (the first quarter of the samples), the median of the last
quarter is within a limit of the median of the second quarter. Anonymous memory is the
leak signal; VmRSS also counts the pages of mmap'd index files, which grow with the data
and are reported, not judged. Data-dir descriptors grow with segments (up to the log
store's open-file cap) and are reported, not judged.

At the end the replica is also compared with the source itself, batch by batch
(`replicad verify --against-source`'s SourceVerifier): it must be clean. With
`--tiered-partitions N` the broker runs tiered storage (Kafka's LocalTieredStorage,
tools/peers/tiered.py) and a second topic of N partitions keeps only its newest segment
locally: the follower reads the rest from remote storage, and that topic is proved by the
comparison with the source (the broker's own files no longer hold it).

    python -m tools.chaos.soak --minutes 30
    python -m tools.chaos.soak --minutes 30 --partitions 1000 --tiered-partitions 8
    python -m tools.chaos.soak --minutes 30 --partitions 10000 --tiered-partitions 8
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools.chaos.follower import DaemonCounters, Follower
from tools.chaos.invariant import check_replica, covers, end_offsets
from tools.chaos.load import SteadyLoad, wait_stable
from tools.chaos.proxy import ChaosProxy
from tools.chaos.scenarios import fill, new_topic, partitions_of, wait_for
from tools.peers.kafka import KafkaBroker
from tools.peers.produce import produce_mixed

MIB_KB = 1024
# Limits for "flat", between the second quarter's and the last quarter's medians.
ANON_GROWTH_LIMIT_KB = 24 * MIB_KB
ANON_GROWTH_LIMIT_SHARE = 0.20
SOCKET_GROWTH_LIMIT = 3
OTHER_FD_GROWTH_LIMIT = 3
THREAD_GROWTH_LIMIT = 2
TASKS_KEY = "asyncio_tasks"  # what a status snapshot would call it, if it had it
CATCH_UP_TIMEOUT_S = 180
# The tiered topic's segments: small, so that many roll and go to remote storage.
TIERED_SEGMENT_BYTES = 128 * 1024
# The producers' batches when a tiered topic is on: under its segment size (Kafka refuses a
# batch larger than a segment, RECORD_LIST_TOO_LARGE; values reach about 32 KiB).
TIERED_MAX_BATCH_BYTES = TIERED_SEGMENT_BYTES // 4

FAULTS = (
    "cut",
    "stall-short",
    "stall-long",
    "truncate-close",
    "truncate-short",
    "flip-batch",
    "delay-burst",
    "refuse",
)

# The soak's stall threshold (control.stall_after_ms): well above a fault's 2 s plus the
# reconnect back-off, well below the default 60 s so that a short soak can see one.
SOAK_STALL_AFTER_MS = 30_000


@dataclass(frozen=True, slots=True)
class FdCounts:
    sockets: int
    data_files: int
    other: int


@dataclass(frozen=True, slots=True)
class SoakSample:
    elapsed_s: float
    rss_kb: int
    anon_kb: int
    threads: int
    fds: FdCounts
    tasks: int | None
    replica_offsets: int


@dataclass(frozen=True, slots=True)
class Trend:
    name: str
    early: float  # median of the second quarter of the samples
    late: float  # median of the last quarter
    limit: float | None  # None: reported, not judged

    @property
    def growth(self) -> float:
        return self.late - self.early

    @property
    def flat(self) -> bool:
        return self.limit is None or self.growth <= self.limit


@dataclass(frozen=True, slots=True)
class SoakResult:
    duration_s: float
    faults: dict[str, int]
    samples: tuple[SoakSample, ...]
    trends: tuple[Trend, ...]
    records_checked: int
    lost: int
    duplicated: int
    counters: DaemonCounters
    problems: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())
    # Partition stalls the daemon reported (control/stalls.py; any fails the soak), and
    # the longest time its event loop did not turn (control/loop_watch.py), None when
    # the daemon never answered status.
    stalls: int | None = None
    max_loop_block_ms: float | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        trends = ", ".join(
            f"{t.name} {t.early:.0f}->{t.late:.0f}" + ("" if t.flat else " (NOT FLAT)")
            for t in self.trends
        )
        lines = [
            f"soak {self.duration_s:.0f} s: {sum(self.faults.values())} faults {self.faults}, "
            f"{len(self.samples)} samples, {trends}; {self.records_checked} records checked, "
            f"{self.lost} lost, {self.duplicated} duplicated; stalls {self.stalls}, "
            f"longest event-loop block {self.max_loop_block_ms} ms; "
            f"counters {self.counters.as_dict()}",
            *(f"  problem: {p}" for p in self.problems),
            *(f"  note: {n}" for n in self.notes),
        ]
        return "\n".join(lines)


def fd_counts(pid: int, data_dir: Path) -> FdCounts | None:
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return None
    sockets = data = other = 0
    prefix = str(data_dir.resolve())
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue  # closed while we looked
        if target.startswith("socket:"):
            sockets += 1
        elif target.startswith(prefix):
            data += 1
        else:
            other += 1
    return FdCounts(sockets, data, other)


def memory_kb(pid: int) -> tuple[int, int, int] | None:
    """(VmRSS, RssAnon, Threads) from /proc/<pid>/status."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return None
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon", "Threads"):
            values[key] = int(rest.split()[0])
    return values.get("VmRSS", 0), values.get("RssAnon", 0), values.get("Threads", 0)


def trends(samples: list[SoakSample]) -> tuple[Trend, ...]:
    quarter = max(1, len(samples) // 4)
    early = samples[quarter : 2 * quarter] or samples
    late = samples[-quarter:]

    def trend(name: str, pick: Callable[[SoakSample], float], limit: float | None) -> Trend:
        return Trend(
            name,
            statistics.median(pick(s) for s in early),
            statistics.median(pick(s) for s in late),
            limit,
        )

    anon_early = statistics.median(s.anon_kb for s in early)
    anon_limit = max(ANON_GROWTH_LIMIT_KB, ANON_GROWTH_LIMIT_SHARE * anon_early)
    found = [
        trend("anon_kb", lambda s: s.anon_kb, anon_limit),
        trend("rss_kb", lambda s: s.rss_kb, None),
        trend("threads", lambda s: s.threads, THREAD_GROWTH_LIMIT),
        trend("sockets", lambda s: s.fds.sockets, SOCKET_GROWTH_LIMIT),
        trend("other_fds", lambda s: s.fds.other, OTHER_FD_GROWTH_LIMIT),
        trend("data_fds", lambda s: s.fds.data_files, None),
    ]
    if all(s.tasks is not None for s in samples):
        found.append(trend("tasks", lambda s: s.tasks, 2))
    return tuple(found)


def _inject(proxy: ChaosProxy, kind: str, timeout_s: float) -> None:
    if kind == "cut":
        proxy.cut()
    elif kind == "stall-short":
        proxy.stall(1.0)
    elif kind == "stall-long":
        proxy.stall(timeout_s + 1.0)
    elif kind == "truncate-close":
        proxy.truncate_responses(1, close=True)
    elif kind == "truncate-short":
        proxy.truncate_responses(1, close=False)
    elif kind == "flip-batch":
        proxy.flip_batches(1)
    elif kind == "delay-burst":
        proxy.set_delay_ms(250)
    elif kind == "refuse":
        proxy.refuse_connections(True)
        proxy.cut()


def soak(
    broker: KafkaBroker,
    workdir: Path,
    *,
    duration_s: float,
    seed: int = 0,
    partitions: int = 4,
    sample_every_s: float = 2.0,
    fault_gap_s: tuple[float, float] = (2.0, 6.0),
    tiered_partitions: int = 0,
) -> SoakResult:
    """`tiered_partitions` > 0: a second topic with remote storage on (the broker must run
    tiered storage: tools/peers/tiered.py), checked against the source only."""
    rng = random.Random(seed)
    topic = new_topic(broker, "soak", partitions)
    topics = {topic: partitions}
    tiered = None
    if tiered_partitions:
        from tools.peers.tiered import TIERED_TOPIC_CONFIG

        tiered = f"chaos-tiered-{uuid.uuid4().hex[:8]}"
        broker.create_topic(
            tiered, tiered_partitions, TIERED_TOPIC_CONFIG, segment_bytes=TIERED_SEGMENT_BYTES
        )
        topics[tiered] = tiered_partitions
    tps = partitions_of(topics)
    local = [tp for tp in tps if tp.topic != tiered]
    fill(broker, {topic: partitions}, 2000, seed=800 + seed)
    if tiered is not None:
        produce_mixed(
            broker.bootstrap,
            tiered,
            partitions=tiered_partitions,
            records=2000,
            seed=801 + seed,
            max_batch_bytes=TIERED_MAX_BATCH_BYTES,
        )
    faults: Counter[str] = Counter()
    samples: list[SoakSample] = []
    problems: list[str] = []
    notes: list[str] = []
    proxy = ChaosProxy(lambda: ("127.0.0.1", broker.port), seed=seed).start()
    # A partition lagging with no progress for this long, its leader connected, is a
    # stall: far above what any injected fault holds a partition (2 s, plus reconnecting).
    follower = Follower(
        workdir,
        proxy.address,
        list(topics),
        name="soak",
        config={"control": {"stall_after_ms": SOAK_STALL_AFTER_MS}},
    )
    load = SteadyLoad(
        broker.bootstrap,
        topics,
        records_per_round=300,
        pause_s=0.5,
        **({"max_batch_bytes": TIERED_MAX_BATCH_BYTES} if tiered is not None else {}),
    )
    started = time.monotonic()
    try:
        follower.start()
        if wait_for(lambda: sum(follower.ends(tps).values()) > 0, 60) is None:
            problems.append(f"replicad did not start: {follower.output()[-1500:]}")
            return _result(started, faults, samples, problems, notes, follower, None)
        load.start()
        timeout_s = follower.config["source"]["request_timeout_ms"] / 1000
        next_fault = time.monotonic() + rng.uniform(*fault_gap_s)
        heal_at: float | None = None
        tasks_missing = False
        while time.monotonic() - started < duration_s:
            now = time.monotonic()
            if heal_at is not None and now >= heal_at:
                proxy.heal()
                heal_at = None
            if now >= next_fault:
                kind = rng.choice(FAULTS)
                _inject(proxy, kind, timeout_s)
                faults[kind] += 1
                heal_at = now + 2.0
                next_fault = now + rng.uniform(*fault_gap_s)
            pid = follower.pid
            if pid is None:
                problems.append(f"replicad died (exit {follower.exit_code()})")
                break
            snapshot = follower.status()
            memory, fds = memory_kb(pid), fd_counts(pid, follower.data_dir)
            if memory is None or fds is None:
                continue
            tasks = snapshot.get(TASKS_KEY) if snapshot else None
            tasks_missing = tasks_missing or tasks is None
            samples.append(
                SoakSample(
                    elapsed_s=now - started,
                    rss_kb=memory[0],
                    anon_kb=memory[1],
                    threads=memory[2],
                    fds=fds,
                    tasks=tasks,
                    replica_offsets=sum(follower.ends(tps).values()),
                )
            )
            time.sleep(max(0.0, sample_every_s - (time.monotonic() - now)))
        if tasks_missing:
            notes.append(
                f"asyncio task count: missing (the status JSON has no `{TASKS_KEY}` field; "
                "nothing was added to the daemon to count them)"
            )
        proxy.heal()
        load.stop()
        wait_stable(lambda: end_offsets(broker.log_dir, tps))
        if (
            wait_for(
                lambda: covers(follower.ends(tps), end_offsets(broker.log_dir, tps)),
                CATCH_UP_TIMEOUT_S,
            )
            is None
        ):
            problems.append(f"replica did not catch up within {CATCH_UP_TIMEOUT_S} s")
        notes.append(
            f"proxy: {proxy.stats().faults} fault events delivered (a cut closes every open"
            " connection, a refusal turns away every reconnect)"
        )
        final = follower.status() or {}
        stalls = (final.get("stalls") or {}).get("stalls_total")
        max_block = (final.get("event_loop") or {}).get("max_block_ms")
        if stalls:
            problems.append(
                f"{stalls} partition stall(s) reported by replicad (its log: 'partition stalled')"
            )
        code = follower.stop()
        if code != 0:
            problems.append(f"replicad exited {code} on SIGTERM")
        problems += [f"log: {line[:300]}" for line in follower.unexpected_lines()[:5]]
        report = check_replica(broker.log_dir, follower.data_dir, local, caught_up=True)
        problems += [f"invariant: {p}" for p in report.problems]
        verified, differ = against_source(broker.bootstrap, follower.data_dir)
        problems += [f"verify --against-source: {line}" for line in differ]
        notes.append(f"verify --against-source: {verified}")
        if tiered is not None:
            from tools.chaos.tiered_cluster import earliest_local

            firsts = earliest_local(broker.bootstrap, [tp for tp in tps if tp.topic == tiered])
            notes.append(
                "tiered: first local offsets "
                f"{sorted(firsts.values())} (below them the source had the records in remote "
                "storage only)"
            )
            if min(firsts.values()) <= 0:
                problems.append(f"tiered: a partition never went to remote storage: {firsts}")
        return _result(
            started, faults, samples, problems, notes, follower, report, stalls, max_block
        )
    finally:
        load.stop()
        follower.kill()
        proxy.stop()


def against_source(bootstrap: str, data_dir: Path) -> tuple[str, list[str]]:
    """The replica compared with the source batch by batch: a summary line, and one line per
    partition that is not clean (a mismatch, or not compared to its end)."""
    import asyncio

    from replicad.protocol.client import ClientSettings
    from replicad.verify.report import partition_line, summary_line
    from replicad.verify.source import SourceVerifier, VerifyOptions

    verifier = SourceVerifier(data_dir, [bootstrap], ClientSettings(), VerifyOptions())
    results = asyncio.run(verifier.run())
    return summary_line(results, seed=None), [partition_line(r) for r in results if not r.clean]


def _result(
    started: float,
    faults: Counter[str],
    samples: list[SoakSample],
    problems: list[str],
    notes: list[str],
    follower: Follower,
    report: object,
    stalls: int | None = None,
    max_loop_block_ms: float | None = None,
) -> SoakResult:
    found = trends(samples) if len(samples) >= 8 else ()
    if samples and len(samples) < 8:
        problems.append(f"only {len(samples)} samples: too few to judge flatness")
    problems += [
        f"{t.name} not flat: {t.early:.0f} -> {t.late:.0f} (limit +{t.limit:.0f})"
        for t in found
        if not t.flat
    ]
    return SoakResult(
        duration_s=time.monotonic() - started,
        faults=dict(faults),
        samples=tuple(samples),
        trends=found,
        records_checked=getattr(report, "records_checked", 0),
        lost=getattr(report, "lost", 0),
        duplicated=getattr(report, "duplicated", 0),
        counters=follower.counters(),
        problems=tuple(problems),
        notes=tuple(notes),
        stalls=stalls,
        max_loop_block_ms=max_loop_block_ms,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument(
        "--tiered-partitions",
        type=int,
        default=0,
        help="also a topic of N partitions in tiered storage (the broker runs LocalTieredStorage)",
    )
    parser.add_argument("--json", type=Path, help="write every sample and the verdict here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="replicad-soak-") as tmp:
        workdir = Path(tmp)
        broker_config = None
        if args.tiered_partitions:
            from tools.peers.tiered import tiered_broker_config

            (workdir / "remote").mkdir()
            broker_config = tiered_broker_config(workdir / "remote")
        with KafkaBroker(workdir / "kafka", broker_config=broker_config) as broker:
            result = soak(
                broker,
                workdir / "soak",
                duration_s=args.minutes * 60,
                seed=args.seed,
                partitions=args.partitions,
                sample_every_s=5.0,
                tiered_partitions=args.tiered_partitions,
            )
    print(result.summary())
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=1, default=str))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
