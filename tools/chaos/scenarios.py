"""Fault scenarios: replicad, as a black box, under one kind of fault each, against a real
Apache Kafka broker, ending with the invariant.

Every run of every scenario:
1. creates fresh topics (1 MiB segments) and fills them with `produce_mixed` data
   (every codec, transactions committed and aborted);
2. starts replicad (`tools.chaos.follower.Follower`) and a steady producer;
3. injects its faults; after each one is over, measures the recovery time: from the
   end of the fault until the replica holds everything the source held at that moment;
4. stops the producer, waits for the replica to catch up with the settled source, reads
   the daemon's counters (`replicad status --json`), stops it with SIGTERM (exit 0
   expected), and checks the invariant (`tools.chaos.invariant`), `replicad verify`,
   and the daemon's log for errors that escaped their handling.

A run's problems (invariant failures, a daemon that died or exited non-zero, counters
that do not explain the faults, a recovery that timed out) are collected, never raised,
so the report can show every scenario; tests assert that there are none.

Scenarios that kill or restart the broker, or need a broker config of their own, say so
in `SCENARIOS` (`private_broker`); the others share one broker.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replicad.types import TopicPartition
from tools.chaos.disk import SlowDisk, SmallFilesystem
from tools.chaos.evictor import CompetingConsumers, SessionEvictor
from tools.chaos.follower import DaemonCounters, Follower
from tools.chaos.invariant import InvariantReport, check_replica, covers, end_offsets
from tools.chaos.load import SteadyLoad, wait_stable
from tools.chaos.proxy import ChaosProxy, wait_for_delivery
from tools.peers.kafka import KafkaBroker
from tools.peers.produce import produce_mixed

SEGMENT_BYTES = 1024 * 1024
POLL_S = 0.2
# A fault lands mid-replication: wait for this many new offsets first.
PROGRESS_OFFSETS = 50
# Deadlines only a hang reaches (a loaded machine, a CPU hog beside the suite): every wait
# ends as soon as what it waits for happens, and the time it took is what gets reported.
PROGRESS_TIMEOUT_S = 180
STARTUP_TIMEOUT_S = 180
# Session cache of the pressure scenario's broker: one slot in each of Kafka's 8 shards.
TINY_SESSION_CACHE_SLOTS = 8


@dataclass(frozen=True, slots=True)
class Size:
    """How much of each scenario to run."""

    name: str
    runs: int
    rounds: int  # faults of each kind per run
    partitions: int
    initial_records: int  # per topic before replicad starts
    load_records: int  # per topic and steady-load round
    recovery_timeout_s: float
    pressure_s: float  # how long the session-cache and slow-disk pressure lasts


CI = Size(
    "ci",
    runs=1,
    rounds=2,
    partitions=3,
    initial_records=2000,
    load_records=200,
    recovery_timeout_s=180,
    pressure_s=15,
)
FULL = Size(
    "full",
    runs=3,
    rounds=6,
    partitions=6,
    initial_records=20_000,
    load_records=1000,
    recovery_timeout_s=180,
    pressure_s=90,
)
SIZES = {size.name: size for size in (CI, FULL)}


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    name: str
    title: str
    size: str
    runs: int
    faults: Mapping[str, int]
    records_checked: int
    lost: int
    duplicated: int
    recovery_s: tuple[float, ...]
    counters: DaemonCounters
    daemon: str
    problems: tuple[str, ...]
    known_issues: tuple[str, ...]  # symptoms of reported daemon bugs (KNOWN_ISSUES)
    notes: tuple[str, ...]
    elapsed_s: float

    @property
    def faults_injected(self) -> int:
        return sum(self.faults.values())

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        recovery = (
            f"recovery max {max(self.recovery_s):.1f} s" if self.recovery_s else "no recovery"
        )
        lines = [
            f"{self.name} ({self.size}): {self.runs} runs, {self.faults_injected} faults "
            f"{dict(self.faults)}, {self.records_checked} records checked, {self.lost} lost, "
            f"{self.duplicated} duplicated, {recovery}, daemon {self.daemon}, "
            f"counters {self.counters.as_dict()}",
            *(f"  problem: {p}" for p in self.problems),
            *(f"  known issue: {k}" for k in self.known_issues),
            *(f"  note: {n}" for n in self.notes),
        ]
        return "\n".join(lines)


@dataclass
class _Outcome:
    """One scenario's results as they accumulate over its runs."""

    name: str
    title: str
    size: Size
    started: float = field(default_factory=time.monotonic)
    runs: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    records_checked: int = 0
    lost: int = 0
    duplicated: int = 0
    recovery_s: list[float] = field(default_factory=list)
    counters: DaemonCounters = field(default_factory=DaemonCounters)
    daemon: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def fault(self, kind: str, count: int = 1) -> None:
        self.faults[kind] += count

    def problem(self, text: str) -> None:
        self.problems.append(f"run {self.runs}: {text}")

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def result(self) -> ScenarioResult:
        states = sorted(set(self.daemon))
        return ScenarioResult(
            name=self.name,
            title=self.title,
            size=self.size.name,
            runs=self.runs,
            faults=dict(self.faults),
            records_checked=self.records_checked,
            lost=self.lost,
            duplicated=self.duplicated,
            recovery_s=tuple(self.recovery_s),
            counters=self.counters,
            daemon=", ".join(states) if states else "not started",
            problems=tuple(self.problems),
            known_issues=tuple(dict.fromkeys(self.known)),
            notes=tuple(self.notes),
            elapsed_s=time.monotonic() - self.started,
        )


@dataclass(frozen=True, slots=True)
class KnownIssue:
    """A reported daemon bug, recognised by what it leaves in the daemon's log."""

    name: str
    description: str
    log_pattern: re.Pattern[str]


# Reported daemon bugs whose symptoms a scenario may show (none open now: the checkpoint
# ENOSPC bug this held, "a failed checkpoint kills the housekeeping task", is fixed).
KNOWN_ISSUES: tuple[KnownIssue, ...] = ()


def known_issue(log: str) -> KnownIssue | None:
    return next((issue for issue in KNOWN_ISSUES if issue.log_pattern.search(log)), None)


# -- building blocks ------------------------------------------------------------------


def new_topic(broker: KafkaBroker, label: str, partitions: int) -> str:
    name = f"chaos-{label}-{uuid.uuid4().hex[:8]}"
    broker.create_topic(name, partitions, segment_bytes=SEGMENT_BYTES)
    return name


def fill(broker: KafkaBroker, topics: Mapping[str, int], records: int, seed: int) -> None:
    for i, (topic, partitions) in enumerate(topics.items()):
        produce_mixed(
            broker.bootstrap,
            topic,
            partitions=partitions,
            records=records,
            seed=seed + i,
            max_batch_bytes=SEGMENT_BYTES // 4,
        )


def partitions_of(topics: Mapping[str, int]) -> list[TopicPartition]:
    return [TopicPartition(t, p) for t, n in topics.items() for p in range(n)]


def source_ends(broker: KafkaBroker, partitions: Iterable[TopicPartition]) -> dict:
    return end_offsets(broker.log_dir, partitions)


def wait_for(
    predicate: Callable[[], bool], timeout_s: float, *, interval_s: float = POLL_S
) -> float | None:
    """Seconds until `predicate()` held, or None if it did not within `timeout_s`."""
    started = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - started
        if time.monotonic() - started >= timeout_s:
            return None
        time.sleep(interval_s)


def await_progress(
    out: _Outcome, follower: Follower, partitions: Sequence[TopicPartition], offsets: int
) -> None:
    before = sum(follower.ends(partitions).values())
    waited = wait_for(
        lambda: sum(follower.ends(partitions).values()) >= before + offsets or not follower.running,
        PROGRESS_TIMEOUT_S,
    )
    if waited is None:
        out.problem(f"no progress of {offsets} offsets within {PROGRESS_TIMEOUT_S} s")
    if not follower.running:
        out.problem(f"{follower.name} exited with {follower.exit_code()} while replicating")


def await_recovery(
    out: _Outcome,
    broker: KafkaBroker,
    follower: Follower,
    partitions: Sequence[TopicPartition],
    what: str,
    *,
    fresh: bool = True,
) -> float | None:
    """Seconds from now (the end of a fault) until the replica holds everything the source
    holds now and, with `fresh` (a producer is running), the first records the source
    gets after now: proof that replication goes on, not only that nothing was missed.
    Recorded in `out`."""
    started = time.monotonic()
    target = source_ends(broker, partitions)
    deadline_s = out.size.recovery_timeout_s
    if fresh:
        grew = wait_for(
            lambda: not covers(target, source_ends(broker, partitions)) or not follower.running,
            deadline_s,
        )
        if grew is None:
            out.problem(f"the source did not grow within {deadline_s:.0f} s after {what}")
            return None
        target = source_ends(broker, partitions)
    took = wait_for(
        lambda: covers(follower.ends(partitions), target) or not follower.running,
        deadline_s,
    )
    if took is None or not follower.running:
        out.problem(f"no recovery after {what} within {deadline_s:.0f} s")
        return None
    elapsed = time.monotonic() - started
    out.recovery_s.append(elapsed)
    return elapsed


def finish(
    out: _Outcome,
    broker: KafkaBroker,
    follower: Follower,
    partitions: Sequence[TopicPartition],
    load: SteadyLoad | None,
) -> InvariantReport | None:
    """Stop the load, let the replica catch up, stop the daemon, check everything."""
    if load is not None:
        load.stop()
        if load.failures:
            out.note(f"steady load: {len(load.failures)} failed rounds (broker down)")
    target = wait_stable(lambda: source_ends(broker, partitions))
    caught_up = wait_for(
        lambda: (
            covers(follower.ends(partitions), source_ends(broker, partitions))
            or not follower.running
        ),
        out.size.recovery_timeout_s,
    )
    if caught_up is None:
        out.problem(
            f"replica did not catch up within {out.size.recovery_timeout_s:.0f} s: "
            f"{follower.ends(partitions)} vs {target}"
        )
    ended: list[str] = []  # what the daemon's end says, checked against known issues
    if follower.running:
        follower.status()
        code = follower.stop()
        state = "ran to the end, stopped cleanly" if code == 0 else f"exit {code}"
        if code != 0:
            ended.append(f"{follower.name} exited with {code} on SIGTERM")
    else:
        code = follower.exit_code()
        state = f"died (exit {code})"
        ended.append(f"{follower.name} was not running at the end (exit {code})")
        follower.kill()
    ended += [f"{follower.name} log: {line[:500]}" for line in follower.unexpected_lines()[:5]]
    issue = known_issue(follower.output()) if ended else None
    if issue is not None:
        # The symptom of a reported daemon bug: counted apart, so that anything else
        # still fails the scenario. The invariant is never excused.
        state += f" (known issue: {issue.name})"
        out.known.append(f"{issue.name}: {issue.description}")
    else:
        for problem in ended:
            out.problem(problem)
    out.daemon.append(state)
    out.counters = out.counters + follower.counters()
    report = check_replica(broker.log_dir, follower.data_dir, partitions, caught_up=True)
    out.records_checked += report.records_checked
    out.lost += report.lost
    out.duplicated += report.duplicated
    for problem in report.problems:
        out.problem(f"invariant: {problem}")
    verify = follower.verify()
    if verify.returncode != 0:
        out.problem(f"replicad verify failed: {(verify.stdout + verify.stderr)[-2000:]}")
    return report


def _follower(
    out: _Outcome,
    workdir: Path,
    bootstrap: str,
    topics: Iterable[str],
    run: int,
    **kwargs: Any,
) -> Follower:
    name = kwargs.pop("name", "replicad")
    return Follower(workdir / f"{out.name}-{run}", bootstrap, list(topics), name=name, **kwargs)


def _started(out: _Outcome, follower: Follower, partitions: Sequence[TopicPartition]) -> bool:
    follower.start()
    waited = wait_for(
        lambda: sum(follower.ends(partitions).values()) > 0 or not follower.running,
        STARTUP_TIMEOUT_S,
    )
    if waited is None or not follower.running:
        out.problem(f"{follower.name} did not start replicating: {follower.output()[-1500:]}")
        return False
    return True


def _cleanup(*things: Any) -> None:
    for thing in things:
        if thing is None:
            continue
        if isinstance(thing, Follower):
            thing.kill()
        else:
            thing.stop()


def _filled_topic(broker: KafkaBroker, label: str, size: Size, seed: int) -> dict[str, int]:
    """A new topic of `size.partitions` partitions holding `size.initial_records` records."""
    topics = {new_topic(broker, label, size.partitions): size.partitions}
    fill(broker, topics, size.initial_records, seed=seed)
    return topics


@contextlib.contextmanager
def _replicating(
    out: _Outcome,
    broker: KafkaBroker,
    follower: Follower,
    topics: Mapping[str, int],
    *also: Any,
) -> Iterator[SteadyLoad | None]:
    """`follower` started and replicating `topics` while a producer keeps writing to them,
    for the block: the load, or None when the follower did not start (its problem is
    recorded; skip the run). After the block the load, the follower and `also` stop."""
    load = None
    try:
        if _started(out, follower, partitions_of(topics)):
            load = SteadyLoad(broker.bootstrap, topics, records_per_round=out.size.load_records)
            load.start()
        yield load
    finally:
        _cleanup(load, follower, *also)


@dataclass(frozen=True, slots=True)
class _Run:
    """One run of a one-topic scenario: replicad replicating while a producer writes on."""

    partitions: list[TopicPartition]
    follower: Follower
    load: SteadyLoad
    proxy: ChaosProxy | None


@contextlib.contextmanager
def _one_topic_run(
    out: _Outcome,
    broker: KafkaBroker,
    workdir: Path,
    run: int,
    *,
    label: str,
    seed: int,
    proxy_seed: int | None = None,
) -> Iterator[_Run | None]:
    """Run `run` of a scenario on a new topic (`label`, filled from `seed`), replicated
    through a ChaosProxy seeded `proxy_seed` when one is given: the run, or None when
    replicad did not start (its problem is recorded; skip the run). After the block the
    load, replicad and the proxy stop."""
    out.runs += 1
    topics = _filled_topic(broker, label, out.size, seed=seed)
    proxy = None
    if proxy_seed is not None:
        proxy = ChaosProxy(lambda: ("127.0.0.1", broker.port), seed=proxy_seed).start()
    follower = _follower(
        out, workdir, broker.bootstrap if proxy is None else proxy.address, topics, run
    )
    with _replicating(out, broker, follower, topics, *([] if proxy is None else [proxy])) as load:
        yield None if load is None else _Run(partitions_of(topics), follower, load, proxy)


# -- the scenarios ----------------------------------------------------------------------


NETWORK_FAULTS = ("cut", "stall", "truncate-close", "truncate-short", "delay", "refuse")


def network_faults(broker: KafkaBroker, workdir: Path, size: Size) -> ScenarioResult:
    """The proxy cuts connections, stalls past the request timeout, truncates responses
    (cut mid-frame, or whole but short), delays every response, refuses connections."""
    out = _Outcome("network", "proxy: cut, stall, truncate, delay, refuse", size)
    for run in range(size.runs):
        with _one_topic_run(
            out, broker, workdir, run, label="net", seed=100 + run, proxy_seed=run
        ) as r:
            if r is None:
                continue
            assert r.proxy is not None  # asked for one
            follower, partitions, proxy, load = r.follower, r.partitions, r.proxy, r.load
            timeout_s = follower.config["source"]["request_timeout_ms"] / 1000
            for kind in itertools.islice(itertools.cycle(NETWORK_FAULTS), size.rounds * 6):
                await_progress(out, follower, partitions, PROGRESS_OFFSETS)
                _network_fault(out, proxy, kind, timeout_s)
                await_recovery(out, broker, follower, partitions, kind)
            stats = proxy.stats()
            if stats.truncated_closed + stats.truncated_short < out.faults["truncate-close"]:
                out.problem(f"truncations asked {out.faults}, delivered {stats}")
            finish(out, broker, follower, partitions, load)
            if out.counters.errors == 0:
                out.problem("the daemon counted no connection error after network faults")
    return out.result()


def _network_fault(out: _Outcome, proxy: ChaosProxy, kind: str, timeout_s: float) -> None:
    if kind == "cut":
        proxy.cut()
    elif kind == "stall":
        proxy.stall(timeout_s + 1.5)
        time.sleep(timeout_s + 1.5)
    elif kind in ("truncate-close", "truncate-short"):
        proxy.truncate_responses(1, close=kind == "truncate-close")
        if not wait_for_delivery(proxy, timeout_s=20):
            out.problem(f"{kind}: no Fetch response to truncate within 20 s")
            proxy.heal()
    elif kind == "delay":
        proxy.set_delay_ms(300)
        time.sleep(3)
        proxy.set_delay_ms(0)
    elif kind == "refuse":
        proxy.refuse_connections(True)
        proxy.cut()
        time.sleep(3)
        proxy.refuse_connections(False)
    out.fault(kind)


def corrupt_batches(broker: KafkaBroker, workdir: Path, size: Size) -> ScenarioResult:
    """The proxy flips one checksummed byte in one record batch of a Fetch response, over
    and over. Every flip must be caught by the CRC check (crc_failures equals the flips
    delivered) and refetched, never written."""
    out = _Outcome("corrupt", "proxy: flipped bytes inside record batches", size)
    flips_per_run = size.rounds * 6
    for run in range(size.runs):
        with _one_topic_run(
            out, broker, workdir, run, label="crc", seed=200 + run, proxy_seed=1000 + run
        ) as r:
            if r is None:
                continue
            assert r.proxy is not None  # asked for one
            follower, partitions, proxy, load = r.follower, r.partitions, r.proxy, r.load
            for _ in range(flips_per_run):
                await_progress(out, follower, partitions, PROGRESS_OFFSETS // 5)
                proxy.flip_batches(1)
                if not wait_for_delivery(proxy, timeout_s=20):
                    out.problem("no Fetch response with a whole batch to damage within 20 s")
                    proxy.heal()
            await_recovery(out, broker, follower, partitions, "flipped bytes")
            flipped = proxy.stats().flipped_batches
            out.fault("flipped byte in a batch", flipped)
            before = out.counters.crc_failures
            finish(out, broker, follower, partitions, load)
            seen = out.counters.crc_failures - before
            if seen != flipped:
                out.problem(f"crc_failures {seen} != batches damaged {flipped}")
    return out.result()


def follower_sigkill(broker: KafkaBroker, workdir: Path, size: Size) -> ScenarioResult:
    """SIGKILL replicad mid-replication and start it again on the same data dir. Between
    the kill and the restart the replica must already be a prefix of the source (a torn
    last batch allowed: recovery removes it)."""
    out = _Outcome("follower-sigkill", "SIGKILL of replicad, restart", size)
    kills = size.rounds * 3
    for run in range(size.runs):
        with _one_topic_run(out, broker, workdir, run, label="fkill", seed=300 + run) as r:
            if r is None:
                continue
            follower, partitions, load = r.follower, r.partitions, r.load
            for _ in range(kills):
                await_progress(out, follower, partitions, PROGRESS_OFFSETS)
                follower.status()
                follower.kill()
                out.fault("SIGKILL")
                crashed = check_replica(
                    broker.log_dir,
                    follower.data_dir,
                    partitions,
                    caught_up=False,
                    allow_torn_tail=True,
                )
                for problem in crashed.problems:
                    out.problem(f"after SIGKILL, before restart: {problem}")
                follower.start()
                await_recovery(out, broker, follower, partitions, "SIGKILL")
            finish(out, broker, follower, partitions, load)
    out.note("recovery includes the restart: log recovery, metadata, catch-up")
    return out.result()


def leader_sigkill(broker: KafkaBroker, workdir: Path, size: Size) -> ScenarioResult:
    """SIGKILL the broker (the leader of every partition) and start it again; the producer
    pauses while it is down. Needs a broker of its own."""
    return _leader_fault(broker, workdir, size, kill=True)


def leader_restart(broker: KafkaBroker, workdir: Path, size: Size) -> ScenarioResult:
    """Restart the broker cleanly: its fetch-session cache is gone, so replicad's session
    must be re-established (counted in session_recoveries). Needs a broker of its own."""
    return _leader_fault(broker, workdir, size, kill=False)


def leader_rounds(size: Size) -> int:
    """Broker kills and restarts per run: each costs a broker start (about 10 s)."""
    return max(1, size.rounds // 2)


def _leader_fault(broker: KafkaBroker, workdir: Path, size: Size, *, kill: bool) -> ScenarioResult:
    name = "leader-sigkill" if kill else "leader-restart"
    title = "SIGKILL of the broker, restart" if kill else "clean broker restart (sessions lost)"
    out = _Outcome(name, title, size)
    for run in range(size.runs):
        with _one_topic_run(out, broker, workdir, run, label="leader", seed=400 + run) as r:
            if r is None:
                continue
            follower, partitions, load = r.follower, r.partitions, r.load
            for _ in range(leader_rounds(size)):
                await_progress(out, follower, partitions, PROGRESS_OFFSETS)
                load.pause()
                if kill:
                    broker.kill()
                    time.sleep(1)
                    broker.start()
                else:
                    broker.restart()
                out.fault("broker SIGKILL" if kill else "broker restart")
                load.resume()
                await_recovery(out, broker, follower, partitions, name)
            finish(out, broker, follower, partitions, load)
            restarts = out.faults["broker restart"]
            if not kill and out.counters.session_recoveries < restarts:
                out.problem(
                    f"{out.counters.session_recoveries} session recoveries for {restarts} "
                    "restarts that each lost the broker's session cache"
                )
    out.note("recovery: from the broker serving again")
    return out.result()


def session_cache_pressure(broker: KafkaBroker, workdir: Path, size: Size) -> ScenarioResult:
    """Three replicad daemons (1, 2 and 3 topics), four kafka-python consumers and a
    privileged client that keeps evicting sessions share a broker whose session cache
    has one slot per shard. Needs a broker with
    `max.incremental.fetch.session.cache.slots` = TINY_SESSION_CACHE_SLOTS."""
    out = _Outcome("session-cache", "8-slot session cache: 3 replicads, 4 consumers, evictor", size)
    for run in range(size.runs):
        out.runs += 1
        topics = {
            new_topic(broker, f"cache{i}", size.partitions): size.partitions for i in range(3)
        }
        names = list(topics)
        fill(broker, topics, size.initial_records // 2, seed=500 + run)
        followers = [
            _follower(out, workdir, broker.bootstrap, names[: i + 1], run, name=f"replicad{i}")
            for i in range(3)
        ]
        load = consumers = evictor = None
        try:
            for follower in followers:
                follower.start()
            consumers = CompetingConsumers(broker.bootstrap, topics, count=4).start()
            load = SteadyLoad(broker.bootstrap, topics, records_per_round=size.load_records)
            load.start()
            # Eviction starts once every follower and the consumers are fetching (so each
            # has asked the broker for a session), not after a guess of how long that takes.
            fetching = functools.partial(_all_fetching, followers, consumers)
            if wait_for(fetching, STARTUP_TIMEOUT_S) is None:
                out.problem(f"followers and consumers not fetching within {STARTUP_TIMEOUT_S} s")
            evictor = SessionEvictor(broker.bootstrap, topics, interval_s=1.0).start()
            deadline = time.monotonic() + size.pressure_s
            while time.monotonic() < deadline:
                time.sleep(1)
                for follower in followers:
                    if follower.running:
                        follower.status()
            evictor.stop()
            out.fault("privileged session (evicts one)", evictor.sessions_created)
            for follower in followers:
                mine = partitions_of({t: topics[t] for t in follower.topics})
                await_recovery(out, broker, follower, mine, "session evictions")
            consumers.stop()
            if consumers.failures:
                out.note(f"competing consumers restarted {consumers.failures} times")
            load.stop()
            for follower in followers:
                mine = {t: topics[t] for t in follower.topics}
                finish(out, broker, follower, partitions_of(mine), None)
            if out.counters.session_recoveries == 0:
                out.problem("no session recovery counted although sessions were evicted")
        finally:
            _cleanup(evictor, consumers, load, *followers)
    out.note(
        "Kafka splits the slots over 8 shards (one slot each here); evictions are"
        " counted by replicad as session recoveries"
    )
    return out.result()


def _all_fetching(followers: Sequence[Follower], consumers: CompetingConsumers) -> bool:
    """Every running follower's status counts a Fetch request, and the consumers have read."""
    for follower in followers:
        if follower.running:
            follower.status()
            if follower.counters().requests == 0:
                return False
    return consumers.records > 0


DISK_BYTES = 2 * 1024 * 1024


def disk_full(broker: KafkaBroker, workdir: Path, size: Size) -> ScenarioResult:
    """The data dir is a 2 MiB tmpfs and the source holds several times that: partitions
    pause (disk full) with whole batches only on disk; the filesystem then grows and
    replication resumes by itself."""
    return _disk_full(broker, workdir, size, tenant=False)


def disk_full_tenant(broker: KafkaBroker, workdir: Path, size: Size) -> ScenarioResult:
    """As `disk_full`, and while the partitions are paused another tenant takes the last
    free byte, so that even the checkpoint files cannot be written for a few intervals."""
    return _disk_full(broker, workdir, size, tenant=True)


def _disk_full(broker: KafkaBroker, workdir: Path, size: Size, *, tenant: bool) -> ScenarioResult:
    if tenant:
        out = _Outcome("disk-full-tenant", "2 MiB tmpfs 100% full (checkpoints fail)", size)
    else:
        out = _Outcome("disk-full", "2 MiB tmpfs fills up, then grows", size)
    for run in range(size.runs):
        out.runs += 1
        topics = {new_topic(broker, "full", size.partitions): size.partitions}
        partitions = partitions_of(topics)
        seed = 600 + run * 100
        while _source_bytes(broker, partitions) < 3 * DISK_BYTES:
            fill(broker, topics, size.initial_records, seed=seed)
            seed += 1
        with SmallFilesystem(workdir / f"disk-full-{run}-fs", DISK_BYTES) as fs:
            follower = _follower(
                out, workdir, broker.bootstrap, topics, run, data_dir=fs.path / "data"
            )
            try:
                follower.start()
                paused = wait_for(
                    lambda f=follower: _any_state(f, "paused-disk-full") or not f.running,
                    out.size.recovery_timeout_s,
                    interval_s=1.0,
                )
                if paused is None or not follower.running:
                    out.problem(
                        f"no partition paused for a full disk (exit {follower.exit_code()})"
                    )
                else:
                    out.fault("disk full")
                mid = check_replica(broker.log_dir, follower.data_dir, partitions, caught_up=False)
                for problem in mid.problems:
                    out.problem(f"while the disk is full: {problem}")
                ballast = fs.path / "ballast"
                if tenant:
                    # Another tenant takes the last free bytes: now even checkpoint files
                    # cannot be written. The daemon must ride it out.
                    _fill_up(ballast)
                    out.fault("disk 100% full")
                time.sleep(3 * follower.config["checkpoint_interval_ms"] / 1000 + 1)
                if not follower.running or follower.status() is None:
                    out.problem(
                        f"daemon not answering on a full disk (exit {follower.exit_code()})"
                    )
                ballast.unlink(missing_ok=True)
                fs.resize(64 * DISK_BYTES)
                # No producer here: recovery is the catch-up of the whole backlog.
                await_recovery(out, broker, follower, partitions, "disk full", fresh=False)
                finish(out, broker, follower, partitions, None)
            finally:
                _cleanup(follower)
    out.note("recovery: from the filesystem growing until the replica caught up (no producer)")
    return out.result()


def _fill_up(path: Path) -> None:
    """Write `path` until the filesystem has no byte left."""
    chunk = b"\0" * 65536
    with path.open("wb", buffering=0) as ballast:
        while True:
            try:
                ballast.write(chunk)
            except OSError:
                break
        while True:
            try:
                ballast.write(b"\0")
            except OSError:
                return


def _source_bytes(broker: KafkaBroker, partitions: Iterable[TopicPartition]) -> int:
    return sum(
        f.stat().st_size
        for tp in partitions
        for f in broker.partition_dir(tp.topic, tp.partition).glob("*.log")
    )


def _any_state(follower: Follower, state: str) -> bool:
    snapshot = follower.status()
    if snapshot is None:
        return False
    return any(p.get("state") == state for p in snapshot.get("partitions", []))


def slow_disk(broker: KafkaBroker, workdir: Path, size: Size) -> ScenarioResult:
    """Every write and fsync replicad makes in its data dir takes longer (an LD_PRELOAD
    shim: 3 ms per write, 100 ms per fsync, an fsync every 200 records) while the source
    keeps growing; then the disk is fast again and the replica catches up."""
    out = _Outcome("slow-disk", "slow writes and fsyncs (LD_PRELOAD shim)", size)
    for run in range(size.runs):
        out.runs += 1
        topics = _filled_topic(broker, "slow", size, seed=700 + run)
        partitions = partitions_of(topics)
        run_dir = workdir / f"slow-disk-{run}"
        run_dir.mkdir(parents=True, exist_ok=True)
        data_dir = run_dir / "data"
        data_dir.mkdir(exist_ok=True)
        slow = SlowDisk(data_dir, run_dir, write_us=3000, sync_us=100_000)
        slow.on()
        follower = _follower(
            out,
            workdir,
            broker.bootstrap,
            topics,
            run,
            data_dir=data_dir,
            env=slow.env(),
            config={"log": {"flush_messages": 200}},
        )
        try:
            with _replicating(out, broker, follower, topics) as load:
                if load is None:
                    continue
                deadline = time.monotonic() + size.pressure_s
                slowest_status = 0.0
                while time.monotonic() < deadline and follower.running:
                    asked = time.monotonic()
                    if follower.status() is None:
                        out.problem("status did not answer on the slow disk")
                    slowest_status = max(slowest_status, time.monotonic() - asked)
                    time.sleep(1)
                slow.off()
                out.fault("delayed write or fsync", slow.delayed_calls())
                out.note(f"slowest status answer on the slow disk: {slowest_status:.1f} s")
                await_recovery(out, broker, follower, partitions, "slow disk")
                finish(out, broker, follower, partitions, load)
        finally:
            slow.off()
    return out.result()


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    run: Callable[[KafkaBroker, Path, Size], ScenarioResult]
    # None: the shared broker will do; a mapping: a broker of its own with this config.
    private_broker: Mapping[str, str] | None = None


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("network", network_faults),
    Scenario("corrupt", corrupt_batches),
    Scenario("follower-sigkill", follower_sigkill),
    Scenario("leader-sigkill", leader_sigkill, private_broker={}),
    Scenario("leader-restart", leader_restart, private_broker={}),
    Scenario(
        "session-cache",
        session_cache_pressure,
        private_broker={"max.incremental.fetch.session.cache.slots": str(TINY_SESSION_CACHE_SLOTS)},
    ),
    Scenario("disk-full", disk_full),
    Scenario("disk-full-tenant", disk_full_tenant),
    Scenario("slow-disk", slow_disk),
)
