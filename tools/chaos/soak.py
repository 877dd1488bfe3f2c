"""Soak: steady production plus faults chosen by seed for a long while, against a single
Kafka broker, a three-node Kafka cluster or Tansu, watching that the daemon's resources stay
flat; at the end the replica is proved against the source.

One replicad process runs the whole time behind fault proxies (one per source node; each
answers Metadata with every node at its proxy, so every connection goes through one). A
thread injects one fault at a time, picked by the seed from `faults`, a few seconds apart:
- network faults through the proxies (cut, short or long stall, truncated frame, flipped
  batch byte, delay burst, refused connections), healed after 2 s;
- the source's own (tools/chaos/soak_sources.py): a leader SIGKILL, a rolling restart,
  session evictions (a privileged client evicting fetch sessions for `eviction_s`);
- a full disk: replicad's data dir is a tmpfs of its own (root only), shrunk to what it
  holds and its last bytes taken for `disk_full_s`, then given back.
A fault the source cannot have (a restart of a Tansu on memory storage, sessions on a
broker that opens none) is counted as skipped, with the reason, and the seed goes on.

The verdict is replicad's: a source fault whose own recovery (a node serving again, every
replica back in sync) does not come within its deadline is reported apart, as "source not
recovered in N s" (`SoakResult.source_unrecovered`), and fails nothing; replicad's own
checks (stalls, the invariant, verify, lag and catch-up, memory, its exit) still fail the
soak. At the end such a source is waited for once more; a source still not whole then
leaves the catch-up unjudged (said so), not failed.

The daemon is sampled from outside: /proc/<pid>/status (VmRSS, RssAnon, Threads),
/proc/<pid>/fd (sockets, files in the data dir, others) and `replicad status --json` (lag,
the event loop's recent longest block, partitions paused on a full disk). The asyncio task
count would come from the status JSON, which has no such field: reported as missing.

Flat means: after a warm-up (the first quarter of the samples), the median of the last
quarter is within a limit of the median of the second quarter. Anonymous memory is the
leak signal; VmRSS also counts the pages of mmap'd index files, which grow with the data
and are reported, not judged; the peak VmRSS is reported beside the memory bound the
daemon runs with (`fetch.buffer_memory`). Data-dir descriptors grow with segments (up to
the log store's open-file cap) and are reported, not judged.

At the end: the lag while the producers still run (the source's high watermarks against
the replica's ends), then the producers stop and the replica must catch up; the daemon's
partition stalls (any fails the soak) and the longest time its event loop did not turn;
the invariant against the source's own segment files (Kafka; Tansu keeps none); and
`replicad verify --against-source` (its SourceVerifier), which must be clean. With
`--tiered-partitions N` (single Kafka broker only) the broker runs tiered storage (Kafka's
LocalTieredStorage, tools/peers/tiered.py) and a second topic of N partitions keeps only
its newest segment locally: that topic is proved by the comparison with the source.

    python -m tools.chaos.soak --source kafka-cluster --minutes 30 --partitions 1000
    python -m tools.chaos.soak --source tansu --minutes 30 --partitions 1000
    python -m tools.chaos.soak --source kafka --minutes 30 --partitions 1000 --tiered-partitions 8
    python -m tools.chaos.soak --source kafka --minutes 2 --faults network   # proxy faults only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from tools.chaos.disk import DiskFaultUnavailable, SmallFilesystem
from tools.chaos.evictor import SessionEvictor
from tools.chaos.follower import DaemonCounters, Follower
from tools.chaos.invariant import covers
from tools.chaos.load import SteadyLoad, wait_stable
from tools.chaos.priority import PriorityKeeper
from tools.chaos.proxy import ChaosProxy
from tools.chaos.scenarios import partitions_of, wait_for
from tools.chaos.soak_sources import (
    DISK_FULL,
    LEADER_SIGKILL,
    ROLLING_RESTART,
    SEGMENT_BYTES,
    SESSION_EVICTIONS,
    SOURCES,
    TANSU_BUCKET,
    KafkaSource,
    SoakSource,
    SourceNotRecovered,
    as_source,
    cluster_node_heap,
    heap_mib,
    start_peer,
)
from tools.peers.process import PeerError, proc_status
from tools.peers.produce import produce_mixed

MIB_KB = 1024
MIB = 1024 * 1024
# Limits for "flat", between the second quarter's and the last quarter's medians.
ANON_GROWTH_LIMIT_KB = 24 * MIB_KB
ANON_GROWTH_LIMIT_SHARE = 0.20
SOCKET_GROWTH_LIMIT = 3
OTHER_FD_GROWTH_LIMIT = 3
THREAD_GROWTH_LIMIT = 2
TASKS_KEY = "asyncio_tasks"  # what a status snapshot would call it, if it had it
# Deadlines only a hang reaches: a 1,000-partition backlog after a rolling restart on a
# loaded machine takes minutes.
CATCH_UP_TIMEOUT_S = 900
STARTUP_TIMEOUT_S = 300
# The tiered topic's segments: small, so that many roll and go to remote storage.
TIERED_SEGMENT_BYTES = 128 * 1024
# The producers' batches when a tiered topic is on: under its segment size (Kafka refuses a
# batch larger than a segment, RECORD_LIST_TOO_LARGE; values reach about 32 KiB).
TIERED_MAX_BATCH_BYTES = TIERED_SEGMENT_BYTES // 4
# Topics of at most this many partitions (Kafka's controller refuses 10,000 in one request).
TOPIC_PARTITIONS_MAX = 5_000
FILL_ATTEMPTS = 3

NETWORK_FAULTS = (
    "cut",
    "stall-short",
    "stall-long",
    "truncate-close",
    "truncate-short",
    "flip-batch",
    "delay-burst",
    "refuse",
)
FAULTS = NETWORK_FAULTS  # the proxy's faults (the name the report's callers know)
SOURCE_FAULTS = (LEADER_SIGKILL, ROLLING_RESTART, SESSION_EVICTIONS, DISK_FULL)
# The faults that stop a node of the source.
NODE_FAULTS = (LEADER_SIGKILL, ROLLING_RESTART)
ALL_FAULTS = NETWORK_FAULTS + SOURCE_FAULTS
# How long a network fault holds before the proxies heal.
NETWORK_FAULT_S = 2.0

# The soak's stall threshold (control.stall_after_ms): well above a fault's 2 s plus the
# reconnect back-off, well below the default 60 s so that a short soak can see one.
SOAK_STALL_AFTER_MS = 30_000
# The memory bound the soak's daemon runs with (fetch.buffer_memory), its peak RSS beside it.
SOAK_BUFFER_MEMORY = 32 * MIB
# The data dir's tmpfs (only what is written takes memory) and, on a full disk, the few
# bytes left over the data when the filesystem is shrunk (then a ballast file takes them).
DISK_BYTES = 4096 * MIB
DISK_SLACK_BYTES = 256 * 1024
SHRINK_ATTEMPTS = 20
# A rolling restart of three nodes on a loaded machine takes minutes: a fault in progress at
# the end is let finish (a node left down would fail the end's checks).
FAULT_JOIN_TIMEOUT_S = 1800
# A source that did not recover from a fault in time is waited for once more at the end.
END_RECOVERY_TIMEOUT_S = 600
PAUSED_DISK_FULL = "paused-disk-full"
STATUS_TIMEOUT_S = 30
# How long the source's ends may keep moving at the end before the last reading is taken.
ENDS_SETTLE_TIMEOUT_S = 120


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
    lag: int | None = None  # the daemon's own total (status)
    recent_block_ms: float | None = None  # the event loop's longest block, last 1-2 min
    paused_disk_full: int = 0  # partitions paused on a full disk
    load_1m: float | None = None  # the machine's load average


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
class EndLag:
    """The replica against the source when the soak's time ran out, producers still on."""

    total: int
    largest: int  # the most behind partition's lag
    behind: int  # partitions behind


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
    source: str = "kafka"
    partitions: int = 0
    seed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # faults the source cannot have
    end_lag: EndLag | None = None
    catch_up_s: float | None = None  # producers stopped until the replica held the source
    verify: str | None = None  # verify --against-source's summary
    verify_clean: bool | None = None
    buffer_memory: int = SOAK_BUFFER_MEMORY
    timeline: tuple[str, ...] = field(default=())  # "at 123 s: fault: what happened"
    # Source faults the source did not recover from in time: the source's, not replicad's
    # (they fail nothing; see the module doc).
    source_unrecovered: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def peak_rss_kb(self) -> int:
        return max((s.rss_kb for s in self.samples), default=0)

    @property
    def peak_anon_kb(self) -> int:
        return max((s.anon_kb for s in self.samples), default=0)

    @property
    def steady_block_ms(self) -> float | None:
        """The longest recent block the samples saw after the first quarter (start-up's
        creation of every partition is in `max_loop_block_ms`, not here)."""
        seen = [s.recent_block_ms for s in self.samples[len(self.samples) // 4 :]]
        known = [b for b in seen if b is not None]
        return max(known) if known else None

    def load_average(self) -> tuple[float, float] | None:
        """(mean, max) of the 1-minute load average over the samples."""
        loads = [s.load_1m for s in self.samples if s.load_1m is not None]
        return (statistics.fmean(loads), max(loads)) if loads else None

    def summary(self) -> str:
        trends = ", ".join(
            f"{t.name} {t.early:.0f}->{t.late:.0f}" + ("" if t.flat else " (NOT FLAT)")
            for t in self.trends
        )
        load = self.load_average()
        lag = self.end_lag
        lines = [
            f"soak on {self.source}, {self.partitions} partitions, seed {self.seed}, "
            f"{self.duration_s:.0f} s: {sum(self.faults.values())} faults {self.faults}, "
            f"skipped {self.skipped}, {len(self.samples)} samples, {trends}; "
            f"{self.records_checked} records checked, {self.lost} lost, "
            f"{self.duplicated} duplicated; stalls {self.stalls}, longest event-loop block "
            f"{self.max_loop_block_ms} ms (after warm-up {self.steady_block_ms} ms); "
            f"peak RSS {self.peak_rss_kb / MIB_KB:.0f} MiB, anon {self.peak_anon_kb / MIB_KB:.0f}"
            f" MiB, fetch.buffer_memory {self.buffer_memory / MIB:.0f} MiB; "
            + (
                f"lag at the end {lag.total} offsets ({lag.behind} partitions behind, "
                f"largest {lag.largest}); "
                if lag is not None
                else "lag at the end unknown; "
            )
            + f"caught up in {self.catch_up_s and round(self.catch_up_s, 1)} s; "
            f"verify --against-source: {self.verify}; "
            + (f"load average mean {load[0]:.1f}, max {load[1]:.1f}; " if load else "")
            + f"counters {self.counters.as_dict()}",
            *(f"  problem: {p}" for p in self.problems),
            *(f"  source (not replicad's): {s}" for s in self.source_unrecovered),
            *(f"  note: {n}" for n in self.notes),
        ]
        return "\n".join(lines)

    def markdown_row(self) -> str:
        """One row of docs/reliability.md's long-soak table (`TABLE_HEAD`)."""
        load = self.load_average()
        lag = self.end_lag
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items()))
        skipped = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped.items())) or "none"
        return (
            f"| {self.source} | {self.partitions:,} | {self.seed} | "
            f"{self.duration_s / 60:.1f} min | {faults} (skipped: {skipped}) | "
            f"{self.max_loop_block_ms} ms ({self.steady_block_ms} ms after warm-up) | "
            f"{self.peak_rss_kb / MIB_KB:.0f} MiB (anon {self.peak_anon_kb / MIB_KB:.0f}) / "
            f"{self.buffer_memory / MIB:.0f} MiB | {self.stalls} | "
            + (f"{lag.total} ({lag.behind} partitions, max {lag.largest})" if lag else "?")
            + f" | {self.catch_up_s and round(self.catch_up_s)} s | "
            f"{'clean' if self.verify_clean else 'NOT CLEAN'} | "
            + (f"{load[0]:.0f} (max {load[1]:.0f})" if load else "?")
            + f" | {self.verdict()} |"
        )

    def verdict(self) -> str:
        """replicad's verdict, and apart from it the faults the source did not recover
        from in time."""
        mine = "ok" if self.ok else "FAILED"
        if not self.source_unrecovered:
            return mine
        first = first_line(self.source_unrecovered[0])
        more = len(self.source_unrecovered) - 1
        return f"{mine} (the source's own: {first}" + (f"; and {more} more" if more else "") + ")"


def first_line(text: str) -> str:
    """`text`'s first line, a parenthesis it leaves open closed: a SourceNotRecovered
    message carries the node's log tail after its first line, which does not belong in a
    table cell."""
    line = text.split("\n", 1)[0].rstrip()
    return line + ")" * max(0, line.count("(") - line.count(")"))


TABLE_HEAD = (
    "| Source | Partitions | Seed | Time | Faults | Longest event-loop block | "
    "Peak RSS / fetch.buffer_memory | Stalls | Lag at the end (offsets) | Caught up | "
    "verify --against-source | Load average | Verdict |\n"
    "|---|---:|---:|---|---|---|---|---:|---|---|---|---|---|"
)


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


@dataclass
class _Run:
    """What the fault thread and the sampling loop share."""

    source: SoakSource
    proxies: list[ChaosProxy]
    follower: Follower
    load: SteadyLoad
    topics: dict[str, int]
    fs: SmallFilesystem | None
    no_disk: str | None  # why there is no full disk, None when there is
    started: float
    stop: threading.Event = field(default_factory=threading.Event)
    faults: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    timeline: list[str] = field(default_factory=list)
    unrecovered: list[str] = field(default_factory=list)  # the source's, not replicad's

    def at(self) -> str:
        return f"at {time.monotonic() - self.started:.0f} s"

    def note_once(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _cannot(run: _Run, kind: str) -> str | None:
    if kind == DISK_FULL:
        return run.no_disk
    if kind in NODE_FAULTS and run.unrecovered and not _whole_again(run):
        # One source fault at a time: a node stopped while another has not come back can
        # take the quorum with it (session 15's 10,000-partition cluster: a node that could
        # not register at load 40, then a rolling restart stopped the other two).
        return "the source not whole again since an earlier fault"
    return run.source.cannot(kind)


def _whole_again(run: _Run) -> bool:
    """Whether the source is whole, after starting again any node an earlier fault left down."""
    with contextlib.suppress(Exception):
        run.source.restore()
    try:
        return run.source.recovered(list(run.topics))
    except Exception:
        return False


def _fault_loop(
    run: _Run, rng: random.Random, kinds: Sequence[str], gap_s: tuple[float, float], **opts: Any
) -> None:
    """One fault at a time, picked by `rng`, `gap_s` apart, until `run.stop`."""
    timeout_s = run.follower.config["source"]["request_timeout_ms"] / 1000
    while not run.stop.wait(rng.uniform(*gap_s)):
        kind = rng.choice(kinds)
        reason = _cannot(run, kind)
        if reason is not None:
            run.skipped[kind] += 1
            run.note_once(f"{kind} skipped: {reason}")
            continue
        what = kind
        try:
            what = _one_fault(run, rng, kind, timeout_s, **opts)
        except SourceNotRecovered as exc:  # the source's own failure: said, fails nothing
            what = str(exc)
            run.unrecovered.append(f"{kind} {run.at()}: {exc}"[:500])
            with contextlib.suppress(Exception):
                run.source.restore()
        except Exception as exc:  # a fault that failed is the soak's problem, not its end
            run.problems.append(f"{kind} {run.at()}: {type(exc).__name__}: {exc}"[:500])
            with contextlib.suppress(Exception):
                run.source.restore()
        run.faults[kind] += 1
        run.timeline.append(f"{run.at()}: {kind}: {what}")


def _one_fault(
    run: _Run,
    rng: random.Random,
    kind: str,
    timeout_s: float,
    *,
    disk_full_s: float,
    eviction_s: float,
) -> str:
    names = list(run.topics)
    if kind in NETWORK_FAULTS:
        for proxy in run.proxies:
            _inject(proxy, kind, timeout_s)
        run.stop.wait(NETWORK_FAULT_S)
        for proxy in run.proxies:
            proxy.heal()
        return f"on {len(run.proxies)} proxies"
    if kind == LEADER_SIGKILL:
        return run.source.leader_sigkill(rng, run.load, names)
    if kind == ROLLING_RESTART:
        return run.source.rolling_restart(rng, run.load, names)
    if kind == SESSION_EVICTIONS:
        evictors = [
            SessionEvictor(bootstrap, run.topics, interval_s=1.0).start()
            for bootstrap in run.source.evictor_bootstraps()
        ]
        try:
            run.stop.wait(eviction_s)
        finally:
            for evictor in evictors:
                evictor.stop()
        created = sum(e.sessions_created for e in evictors)
        return f"{created} privileged sessions in {eviction_s:.0f} s"
    if kind == DISK_FULL:
        assert run.fs is not None
        return _disk_full(run.fs, disk_full_s, run.stop)
    raise ValueError(f"no fault {kind!r}")


def _disk_full(fs: SmallFilesystem, hold_s: float, stop: threading.Event) -> str:
    """The data dir's filesystem shrunk to what it holds and its last bytes taken for
    `hold_s`, then given back whole. Shrinking, not filling: a tmpfs filled with ballast
    would take that much of the machine's memory."""
    size = fs.size_bytes
    ballast = fs.path / "ballast"
    for _ in range(SHRINK_ATTEMPTS):
        stats = os.statvfs(fs.path)
        used = (stats.f_blocks - stats.f_bfree) * stats.f_frsize
        try:
            fs.resize(used + DISK_SLACK_BYTES)
            break
        except DiskFaultUnavailable:
            continue  # the daemon wrote more in between: a tmpfs never shrinks below its use
    else:
        raise DiskFaultUnavailable("could not shrink the data dir's tmpfs to its use")
    try:
        _fill_up(ballast)
        stop.wait(hold_s)
    finally:
        ballast.unlink(missing_ok=True)
        fs.resize(size)
    return f"{used / MIB:.0f} MiB in use, full for {hold_s:.0f} s"


def _fill_up(path: Path) -> None:
    from tools.chaos.scenarios import _fill_up as fill_up

    fill_up(path)


def _topics(label: str, partitions: int) -> dict[str, int]:
    """`partitions` over topics of at most TOPIC_PARTITIONS_MAX."""
    topics: dict[str, int] = {}
    left = partitions
    while left > 0:
        count = min(left, TOPIC_PARTITIONS_MAX)
        topics[f"chaos-{label}-{uuid.uuid4().hex[:8]}"] = count
        left -= count
    return topics


def _status(follower: Follower) -> dict[str, Any] | None:
    """The status snapshot, asked over the control socket from this process (a `replicad
    status` process per sample took 4 s at load 30, and the samples thinned out); None when
    it cannot be had (starting, stopping, no answer in time)."""
    from replicad.control.client import query
    from replicad.errors import ControlError, DaemonNotRunning

    try:
        return query(follower.socket, "status", timeout_s=STATUS_TIMEOUT_S)
    except (ControlError, DaemonNotRunning, OSError, ValueError):
        return None


def started(replicated: int, snapshot: dict[str, Any] | None, partitions: int) -> bool:
    """Whether replicad has started: it holds some of the source's offsets, or it answers
    status ready with every partition in its table (a source the initial fill could not
    fill is empty: at 10,000 partitions a cluster whose controller was overloaded refused
    the fill for minutes, and an empty replica of an empty source was taken for a daemon
    that had not started)."""
    if replicated > 0:
        return True
    snapshot = snapshot or {}
    totals = snapshot.get("totals") or {}
    return bool(snapshot.get("ready")) and int(totals.get("partitions") or 0) >= partitions


def _sample(run: _Run) -> SoakSample | None:
    """/proc and the status snapshot, once; None when the daemon is gone meanwhile."""
    follower = run.follower
    pid = follower.pid
    if pid is None:
        return None
    snapshot = _status(follower)
    try:
        memory = proc_status(pid)
    except OSError:
        return None
    fds = fd_counts(pid, follower.data_dir)
    if fds is None:
        return None
    totals = (snapshot or {}).get("totals") or {}
    loop = (snapshot or {}).get("event_loop") or {}
    states = totals.get("partitions_by_state") or {}
    return SoakSample(
        elapsed_s=time.monotonic() - run.started,
        rss_kb=memory.get("VmRSS", 0),
        anon_kb=memory.get("RssAnon", 0),
        threads=memory.get("Threads", 0),
        fds=fds,
        tasks=snapshot.get(TASKS_KEY) if snapshot else None,
        replica_offsets=sum(
            int(p.get("log_end_offset") or 0) for p in (snapshot or {}).get("partitions", [])
        ),
        lag=totals.get("lag"),
        recent_block_ms=loop.get("recent_max_block_ms"),
        paused_disk_full=int(states.get(PAUSED_DISK_FULL, 0)),
        load_1m=os.getloadavg()[0],
    )


def soak(
    peer: object,
    workdir: Path,
    *,
    duration_s: float,
    seed: int = 0,
    partitions: int = 4,
    sample_every_s: float = 2.0,
    fault_gap_s: tuple[float, float] = (2.0, 6.0),
    tiered_partitions: int = 0,
    faults: Sequence[str] = NETWORK_FAULTS,
    disk_full_s: float = 60.0,
    disk_bytes: int = DISK_BYTES,
    eviction_s: float = 20.0,
    records_per_round: int = 300,
    initial_records: int = 2000,
    catch_up_timeout_s: float = CATCH_UP_TIMEOUT_S,
) -> SoakResult:
    """`peer`: a KafkaBroker, a KafkaCluster or a TansuBroker, started (or a SoakSource).
    `tiered_partitions` > 0: a second topic with remote storage on (a single broker running
    tiered storage: tools/peers/tiered.py), checked against the source only."""
    unknown = set(faults) - set(ALL_FAULTS)
    if unknown or not faults:
        raise ValueError(f"faults must be some of {', '.join(ALL_FAULTS)}, not {sorted(unknown)}")
    source = as_source(peer)
    if tiered_partitions and not isinstance(source, KafkaSource):
        raise ValueError("a tiered topic needs a single Kafka broker running tiered storage")
    rng = random.Random(seed)
    topics = _topics("soak", partitions)
    source.create_topics(topics)
    tiered = None
    if tiered_partitions:
        from tools.peers.tiered import TIERED_TOPIC_CONFIG

        assert isinstance(source, KafkaSource)
        tiered = f"chaos-tiered-{uuid.uuid4().hex[:8]}"
        source.broker.create_topic(
            tiered, tiered_partitions, TIERED_TOPIC_CONFIG, segment_bytes=TIERED_SEGMENT_BYTES
        )
    local = partitions_of(topics)
    all_topics = {**topics, **({tiered: tiered_partitions} if tiered else {})}
    tps = partitions_of(all_topics)
    fill_notes = _fill(source.bootstrap, topics, seed=seed, records=initial_records)
    if tiered is not None:
        produce_mixed(
            source.bootstrap,
            tiered,
            partitions=tiered_partitions,
            records=initial_records,
            seed=801 + seed,
            max_batch_bytes=TIERED_MAX_BATCH_BYTES,
        )
    samples: list[SoakSample] = []
    problems: list[str] = []
    with contextlib.ExitStack() as stack:
        fs: SmallFilesystem | None = None
        no_disk: str | None = None
        if DISK_FULL in faults:
            try:
                fs = stack.enter_context(SmallFilesystem(Path(workdir) / "disk", disk_bytes))
            except DiskFaultUnavailable as exc:
                no_disk = f"no disk of a set size here ({exc})"
        else:
            no_disk = "not asked for"
        proxies: list[ChaosProxy] = []

        def advertised() -> dict[tuple[str, int], tuple[str, int]]:
            return {
                upstream(): ("127.0.0.1", proxy.port)
                for upstream, proxy in zip(source.upstreams(), proxies, strict=True)
            }

        for i, upstream in enumerate(source.upstreams()):
            proxy = ChaosProxy(upstream, seed=seed * 10 + i, advertise=advertised).start()
            stack.callback(proxy.stop)
            proxies.append(proxy)
        follower = Follower(
            workdir,
            ",".join(proxy.address for proxy in proxies),
            list(all_topics),
            name="soak",
            data_dir=fs.path / "data" if fs is not None else None,
            config={
                "control": {"stall_after_ms": SOAK_STALL_AFTER_MS},
                "fetch": {"buffer_memory": SOAK_BUFFER_MEMORY},
            },
        )
        stack.callback(follower.kill)
        load = SteadyLoad(
            source.bootstrap,
            all_topics,
            records_per_round=records_per_round,
            pause_s=0.5,
            **({"max_batch_bytes": TIERED_MAX_BATCH_BYTES} if tiered is not None else {}),
        )
        stack.callback(load.stop)
        run = _Run(source, proxies, follower, load, all_topics, fs, no_disk, time.monotonic())
        run.notes.extend(fill_notes)
        follower.start()
        load.start()
        if (
            wait_for(
                lambda: (
                    started(sum(follower.ends(tps).values()), _status(follower), len(tps))
                    or not follower.running
                ),
                STARTUP_TIMEOUT_S,
                interval_s=1.0,
            )
            is None
            or not follower.running
        ):
            problems.append(f"replicad did not start: {follower.output()[-1500:]}")
            return _result(run, samples, problems, None, seed=seed, partitions=partitions)
        faulting = threading.Thread(
            target=_fault_loop,
            args=(run, rng, tuple(faults), fault_gap_s),
            kwargs={"disk_full_s": disk_full_s, "eviction_s": eviction_s},
            name="soak-faults",
            daemon=True,
        )
        faulting.start()
        # On the way out: the fault in progress finishes (a node started again), then the rest.
        stack.callback(faulting.join, FAULT_JOIN_TIMEOUT_S)
        stack.callback(run.stop.set)
        tasks_missing = False
        died = False
        while time.monotonic() - run.started < duration_s:
            tick = time.monotonic()
            if follower.pid is None:
                problems.append(f"replicad died (exit {follower.exit_code()})")
                died = True
                break
            sample = _sample(run)
            if sample is not None:
                samples.append(sample)
                tasks_missing = tasks_missing or sample.tasks is None
            run.stop.wait(max(0.0, sample_every_s - (time.monotonic() - tick)))
        run.stop.set()
        faulting.join()
        source_whole = True
        if run.unrecovered:
            recovered = wait_for(lambda: _whole_again(run), END_RECOVERY_TIMEOUT_S, interval_s=1.0)
            source_whole = recovered is not None
            run.notes.append(
                "the source, at the end: "
                + (
                    f"whole again after {recovered:.0f} s more"
                    if recovered is not None
                    else f"still not whole after {END_RECOVERY_TIMEOUT_S} s more (the "
                    "catch-up is not judged)"
                )
            )
        if tasks_missing:
            run.notes.append(
                f"asyncio task count: missing (the status JSON has no `{TASKS_KEY}` field; "
                "nothing was added to the daemon to count them)"
            )
        for proxy in proxies:
            proxy.heal()
        end_lag = None if died else _end_lag(source, follower, tps)
        load.stop()
        if load.failures:
            run.notes.append(
                f"steady load: {load.rounds} rounds, {load.records} records, "
                f"{len(load.failures)} failed rounds (a broker down, a leader moving)"
            )
        catch_up = None
        if not died:
            caught = catch_up_to(
                lambda: source.ends(tps),
                lambda: follower.ends(tps),
                lambda: follower.running,
                catch_up_timeout_s,
            )
            catch_up = caught.seconds
            if not follower.running:
                problems.append(f"replica did not catch up within {catch_up_timeout_s:.0f} s")
            elif catch_up is None and not caught.ends_known:
                run.unrecovered.append(
                    f"the source's ends not readable for {catch_up_timeout_s:.0f} s after the "
                    "producers stopped (the catch-up is not judged)"
                )
            elif catch_up is None and source_whole:
                problems.append(f"replica did not catch up within {catch_up_timeout_s:.0f} s")
            elif catch_up is None:
                run.notes.append(
                    f"replica did not catch up within {catch_up_timeout_s:.0f} s, with the "
                    "source not whole: not judged"
                )
        run.notes.append(
            f"proxies: {sum(p.stats().faults for p in proxies)} fault events delivered (a cut "
            "closes every open connection, a refusal turns away every reconnect)"
        )
        # Each node's connections go through its proxy (Metadata names the proxies), or the
        # network faults missed that node.
        problems += [
            f"no connection went through the proxy of node {i + 1}: replicad went around it"
            for i, proxy in enumerate(proxies)
            if proxy.stats().connections == 0
        ]
        paused = max((s.paused_disk_full for s in samples), default=0)
        if run.faults[DISK_FULL]:
            run.notes.append(f"full disk: at most {paused} partitions paused at once")
            if not paused:
                problems.append("the disk was full, and no partition paused for it")
        final = follower.status() or {}  # `replicad status` as a user runs it, counters kept
        stalls = (final.get("stalls") or {}).get("stalls_total")
        max_block = (final.get("event_loop") or {}).get("max_block_ms")
        if stalls:
            problems.append(
                f"{stalls} partition stall(s) reported by replicad (its log: 'partition stalled')"
            )
        code = follower.stop() if follower.running else follower.exit_code()
        if code != 0:
            problems.append(f"replicad exited {code} on SIGTERM")
        problems += [f"log: {line[:300]}" for line in follower.unexpected_lines()[:5]]
        report = source.invariant(follower.data_dir, local)
        if report is not None:
            problems += [f"invariant: {p}" for p in report.problems]
        else:
            run.notes.append(
                f"invariant: {source.name} keeps no segment files; the proof is verify "
                "--against-source"
            )
        verifying = time.monotonic()
        verified, differ = against_source(source.bootstrap, follower.data_dir)
        problems += [f"verify --against-source: {line}" for line in differ[:20]]
        if len(differ) > 20:
            problems.append(f"verify --against-source: {len(differ) - 20} more partitions")
        run.notes.append(
            f"verify --against-source: {verified} ({time.monotonic() - verifying:.0f} s)"
        )
        if tiered is not None:
            from tools.chaos.tiered_cluster import earliest_local

            firsts = earliest_local(source.bootstrap, [tp for tp in tps if tp.topic == tiered])
            run.notes.append(
                "tiered: first local offsets "
                f"{sorted(firsts.values())} (below them the source had the records in remote "
                "storage only)"
            )
            if min(firsts.values()) <= 0:
                problems.append(f"tiered: a partition never went to remote storage: {firsts}")
        return _result(
            run,
            samples,
            problems,
            report,
            seed=seed,
            partitions=partitions,
            stalls=stalls,
            max_loop_block_ms=max_block,
            end_lag=end_lag,
            catch_up_s=catch_up,
            verify=verified,
            verify_clean=not differ,
        )


@dataclass(frozen=True, slots=True)
class CatchUp:
    seconds: float | None  # until the replica held the source; None: not within the deadline
    ends_known: bool  # whether the source's ends could be read at all


def catch_up_to(
    source_ends: Callable[[], dict[Any, int] | None],
    replica_ends: Callable[[], dict[Any, int]],
    running: Callable[[], bool],
    timeout_s: float,
    *,
    settle_s: float = 2.0,
) -> CatchUp:
    """Until the replica holds the source's ends (read until they stop moving: transaction
    markers land after a commit returns) or replicad has stopped. Ends the source cannot
    say yet (None: a ListOffsets round that failed) are read again each second: session
    14's 10,000-partition cluster run read them once right after a preferred-leader
    election, got none, and waited its 900 s on an empty target."""
    target: dict[Any, int] = {}

    def done() -> bool:
        nonlocal target
        if not running():
            return True
        if not target:
            first = source_ends()
            if not first:
                return False
            target = wait_stable(
                lambda: source_ends() or first, settle_s=settle_s, timeout_s=ENDS_SETTLE_TIMEOUT_S
            )
        return covers(replica_ends(), target)

    return CatchUp(wait_for(done, timeout_s, interval_s=1.0), bool(target))


def _fill(
    bootstrap: str,
    topics: dict[str, int],
    *,
    seed: int,
    records: int,
    produce: Callable[..., object] = produce_mixed,
) -> list[str]:
    """Data before replicad starts: `records` in each topic. A round the source could not
    take in time is tried again, then left to the steady load (1,000 partitions on three
    nodes at load 60 left 779 records unsent after 60 s; at 10,000 partitions and load 28
    the producer's own reading of the 5,000 ends timed out, KafkaException). Notes of what
    failed."""
    notes: list[str] = []
    for i, (topic, count) in enumerate(topics.items()):
        for attempt in range(1, FILL_ATTEMPTS + 1):
            try:
                produce(
                    bootstrap,
                    topic,
                    partitions=count,
                    records=records,
                    seed=800 + seed + i + 1000 * attempt,
                    max_batch_bytes=SEGMENT_BYTES // 4,
                )
                break
            except (PeerError, KafkaException) as exc:
                notes.append(f"initial fill of {topic}, attempt {attempt}: {exc}"[:300])
    return notes


def _end_lag(source: SoakSource, follower: Follower, tps: Sequence[Any]) -> EndLag | None:
    ends = source.ends(tps)
    if ends is None:
        return None
    replica = follower.ends(tps)
    lags = [max(0, end - replica.get(tp, 0)) for tp, end in ends.items()]
    return EndLag(total=sum(lags), largest=max(lags, default=0), behind=sum(1 for x in lags if x))


def against_source(bootstrap: str, data_dir: Path) -> tuple[str, list[str]]:
    """The replica compared with the source batch by batch: a summary line, and one line per
    partition that is not clean (a mismatch, or not compared to its end)."""
    import asyncio

    from replicad.protocol.client import ClientSettings
    from replicad.verify.report import partition_line, summary_line
    from replicad.verify.source import SourceVerifier, VerifyOptions

    servers = [server for server in bootstrap.split(",") if server]
    verifier = SourceVerifier(data_dir, servers, ClientSettings(), VerifyOptions())
    results = asyncio.run(verifier.run())
    return summary_line(results, seed=None), [partition_line(r) for r in results if not r.clean]


def _result(
    run: _Run,
    samples: list[SoakSample],
    problems: list[str],
    report: object,
    **figures: Any,
) -> SoakResult:
    found = trends(samples) if len(samples) >= 8 else ()
    problems = list(problems) + run.problems
    if samples and len(samples) < 8:
        problems.append(f"only {len(samples)} samples: too few to judge flatness")
    problems += [
        f"{t.name} not flat: {t.early:.0f} -> {t.late:.0f} (limit +{t.limit:.0f})"
        for t in found
        if not t.flat
    ]
    return SoakResult(
        duration_s=time.monotonic() - run.started,
        faults=dict(run.faults),
        samples=tuple(samples),
        trends=found,
        records_checked=getattr(report, "records_checked", 0),
        lost=getattr(report, "lost", 0),
        duplicated=getattr(report, "duplicated", 0),
        counters=run.follower.counters(),
        problems=tuple(problems),
        notes=tuple(run.notes),
        source=run.source.name,
        skipped=dict(run.skipped),
        buffer_memory=SOAK_BUFFER_MEMORY,
        timeline=tuple(run.timeline),
        source_unrecovered=tuple(run.unrecovered),
        **figures,
    )


def _fault_list(text: str) -> tuple[str, ...]:
    """`all`, `network`, `source` or names, comma-separated."""
    groups = {"all": ALL_FAULTS, "network": NETWORK_FAULTS, "source": SOURCE_FAULTS}
    chosen: list[str] = []
    for name in (n.strip() for n in text.split(",") if n.strip()):
        for fault in groups.get(name, (name,)):
            if fault not in ALL_FAULTS:
                raise argparse.ArgumentTypeError(
                    f"no fault {fault!r}: all, network, source or any of {', '.join(ALL_FAULTS)}"
                )
            if fault not in chosen:
                chosen.append(fault)
    return tuple(chosen)


def _heap(text: str) -> str:
    try:
        heap_mib(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def _node_heap(source: str, partitions: int, asked: str | None) -> str | None:
    """A Kafka node's heap: the one asked, else on the cluster one for the partitions, else
    the harness's (None)."""
    if asked is not None:
        return asked
    return cluster_node_heap(partitions) if source == "kafka-cluster" else None


def _settings(args: argparse.Namespace, heap: str | None) -> str:
    return (
        f"soak settings: source {args.source}"
        f"{f' on {args.tansu_storage} storage' if args.source == 'tansu' else ''}, "
        f"{args.partitions} partitions, seed {args.seed}, "
        f"{args.minutes} min, faults {','.join(args.faults)}, node heap "
        f"{heap or 'the harness default'}, stall_after_ms {SOAK_STALL_AFTER_MS}, "
        f"fetch.buffer_memory {SOAK_BUFFER_MEMORY // MIB} MiB, disk {args.disk_mb} MiB, "
        f"{args.records_per_round} records a round"
    )


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", choices=SOURCES, default="kafka")
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument(
        "--faults",
        type=_fault_list,
        default=ALL_FAULTS,
        help="comma-separated: all (default), network, source, or fault names "
        f"({', '.join(ALL_FAULTS)})",
    )
    parser.add_argument("--disk-full-seconds", type=float, default=60.0)
    parser.add_argument("--eviction-seconds", type=float, default=20.0)
    parser.add_argument(
        "--disk-mb", type=int, default=DISK_BYTES // MIB, help="the data dir's tmpfs"
    )
    parser.add_argument("--records-per-round", type=int, default=300)
    parser.add_argument("--sample-seconds", type=float, default=5.0)
    parser.add_argument(
        "--catch-up-seconds",
        type=float,
        default=CATCH_UP_TIMEOUT_S,
        help="how long the replica may take to hold the whole source once the producers stop",
    )
    parser.add_argument(
        "--tiered-partitions",
        type=int,
        default=0,
        help="also a topic of N partitions in tiered storage (the broker runs LocalTieredStorage)",
    )
    parser.add_argument(
        "--node-heap",
        type=_heap,
        help="a Kafka node's JVM heap (768m, 2g); on the cluster by default one for the "
        "partitions (cluster_node_heap: 1536m at 10,000), on one broker the harness's",
    )
    parser.add_argument(
        "--tansu-storage",
        choices=("memory", "s3"),
        default="memory",
        help="Tansu's storage engine: memory (a restart empties it, so the restart faults are "
        "skipped) or a bucket of a local S3 server (versitygw), which survives them",
    )
    parser.add_argument("--json", type=Path, help="write every sample and the verdict here")
    parser.add_argument("--workdir", type=Path, help="keep the peers' and replicad's files here")
    args = parser.parse_args(argv)
    # SIGTERM (and SIGINT, which a shell's background job ignores) end the run through its
    # clean-up: the daemon, the peers and the data dir's tmpfs are stopped, not left behind.
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, _interrupted)
    if args.tiered_partitions and args.source != "kafka":
        parser.error("--tiered-partitions needs --source kafka")
    if args.tansu_storage != "memory" and args.source != "tansu":
        parser.error("--tansu-storage needs --source tansu")
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="replicad-soak-"))
        )
        broker_config = None
        if args.tiered_partitions:
            from tools.peers.tiered import tiered_broker_config

            (workdir / "remote").mkdir(parents=True, exist_ok=True)
            broker_config = tiered_broker_config(workdir / "remote")
        # The soak's priority to the peers and replicad, each in a session of its own.
        keeper = stack.enter_context(PriorityKeeper())
        heap = _node_heap(args.source, args.partitions, args.node_heap)
        print(_settings(args, heap) + f", priority: {keeper.describe()}", flush=True)
        s3_endpoint = None
        if args.tansu_storage == "s3":
            from tools.peers.s3 import S3Server

            s3 = stack.enter_context(S3Server(workdir / "s3"))
            s3.create_bucket(TANSU_BUCKET)
            s3_endpoint = s3.endpoint
        peer = stack.enter_context(
            start_peer(
                args.source,
                workdir / args.source,
                broker_config,
                heap=heap,
                s3_endpoint=s3_endpoint,
            )
        )
        print(f"{args.source} up at {peer.bootstrap}; soaking {args.minutes} min", flush=True)
        result = soak(
            peer,
            workdir / "soak",
            duration_s=args.minutes * 60,
            seed=args.seed,
            partitions=args.partitions,
            sample_every_s=args.sample_seconds,
            tiered_partitions=args.tiered_partitions,
            faults=args.faults,
            disk_full_s=args.disk_full_seconds,
            eviction_s=args.eviction_seconds,
            disk_bytes=args.disk_mb * MIB,
            records_per_round=args.records_per_round,
            catch_up_timeout_s=args.catch_up_seconds,
        )
    print(result.summary())
    print(f"priority: {keeper.given} autogroups given the soak's, {keeper.refused} refused")
    print("\n".join(result.timeline))
    print(TABLE_HEAD)
    print(result.markdown_row())
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=1, default=str))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
