"""The replicator's live state as one JSON-able snapshot (for `replicad status`,
metrics and sd_notify STATUS=). Read-only: building it changes nothing.

The daemon's status loop (every 2 s: the stall watch, health, STATUS=) asks for the rows
it reads only (`problems_after_ms`): a partition's row is a dict of 20 fields, about 1 KB,
so every row of 10,000 partitions was 10 MiB made and dropped every 2 s. The rows it
reads are those health and the stall watch could name (control/health.py, stalls.py):
halted, without a leader, truncating, paused on a full disk (or fetching again since an
append failed on it and nothing was appended since), fetching with lag and idle for at least
the stall time, or with a damaged read. The totals count every partition either way.
Those rows are `ProblemRow`s, not dicts: the fields health and the stall watch read, in
slots (about 150 bytes, not a 1.3 KB dict of every field), since while 10,000 partitions
catch up nearly all of them are lagging and idle past the stall time, and their rows were
the heap at the daemon's peak (issue 32). A stall's log line takes the partition's full row
(`partition_row`), for the few a check logs one each.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from replicad import __version__
from replicad.clock import monotonic_ms, wall_ms
from replicad.follower.fetcher import LeaderFetcher
from replicad.follower.partition_phase import PartitionPhase
from replicad.follower.partition_state import TURN_KINDS, PartitionState
from replicad.follower.replicator import Replicator
from replicad.log.partition import PartitionLog
from replicad.types import TopicPartition

# Phases health names whatever else holds (control/health.py's _partitions).
_NAMED_PHASES = frozenset({PartitionPhase.HALTED.value, PartitionPhase.TRUNCATING.value})
# The one phase the stall rule considers (control/stalls.py's is_stalled).
_FETCHING = PartitionPhase.FETCHING.value
_PAUSED_DISK_FULL = PartitionPhase.PAUSED_DISK_FULL.value


@dataclass(slots=True)
class RateMeter:
    """Bytes per second over the last interval, from cumulative counters sampled
    with a passed-in clock."""

    last_total: int = 0
    last_ms: int | None = None
    rate: float = 0.0
    per_key: dict[object, tuple[int, float]] = field(default_factory=dict)

    def sample(self, total: int, now_ms: int) -> float:
        if self.last_ms is not None and now_ms > self.last_ms:
            self.rate = (total - self.last_total) * 1000 / (now_ms - self.last_ms)
        self.last_total, self.last_ms = total, now_ms
        return self.rate


def _leader(fetcher: LeaderFetcher, rate: float) -> dict[str, Any]:
    s = fetcher.stats
    session = fetcher.session
    counts = session.status()
    return {
        "node_id": fetcher.address.node_id,
        "address": f"{fetcher.address.host}:{fetcher.address.port}",
        "session_id": session.session_id,
        "epoch": session.epoch,
        "sessionful": session.is_sessionful,
        "partitions": len(fetcher.partitions),
        "last_fetch_latency_ms": round(s.last_latency_ms, 3),
        "last_data_latency_ms": (
            None if s.last_data_latency_ms is None else round(s.last_data_latency_ms, 3)
        ),
        "bytes_per_s": rate,
        "requests": s.requests,
        "errors": s.connection_errors + sum(s.partition_errors.values()),
        "last_error": s.last_error,
        # False while the connection keeps failing (reconnecting with backoff).
        "connected": s.failing_since_ms is None,
        "session_recoveries": dict(s.session_recoveries),
        "rejected_responses": s.rejected_responses,
        "truncations": s.truncations,
        "full_requests": counts.full_requests,
        "incremental_requests": counts.incremental_requests,
        "last_request_bytes": s.last_request_bytes,
        "last_response_bytes": s.last_response_bytes,
        "request_bytes_total": s.request_bytes_total,
        "response_bytes_total": s.response_bytes_total,
        "last_request_partitions": s.last_request_partitions,
        # Requests that named only a share of a sessionless leader's partitions (in turns).
        "sessionless_shares": s.sessionless_shares,
        # The last request was such a share, and the passes over every partition begun: a
        # partition of such a leader waits for its turn until answered twice since its log
        # last moved (control/stalls.py).
        "in_shares": s.in_shares,
        "share_passes": s.share_passes,
    }


def _source_problem(replicator: Replicator) -> dict[str, Any] | None:
    problem = replicator.client.problem
    if problem is None:
        return None
    return {
        "kind": problem.kind,
        "error": problem.error,
        "since_ms": problem.since_ms,
        "since_s_ago": max(0.0, (wall_ms() - problem.since_ms) / 1000),
    }


def _row(
    tp: TopicPartition, st: PartitionState, plog: PartitionLog | None, now_ms: int
) -> dict[str, Any]:
    """One partition's row of `replicad status`."""
    disk_full_ms = st.disk_full_ms
    damaged = plog.damaged_reads if plog else 0
    return {
        "topic": tp.topic,
        "partition": tp.partition,
        "leader": st.leader_id,
        "log_start_offset": plog.log_start_offset if plog else None,
        "log_end_offset": plog.log_end_offset if plog else st.fetch_offset,
        "high_watermark": st.high_watermark,
        # The leader's, as last reported: a fetch offset below its log start is
        # out of range (retention upstream outran the replica).
        "leader_log_start_offset": st.leader_log_start_offset,
        "leader_last_stable_offset": st.last_stable_offset,
        "lag": st.lag,
        "state": st.phase.value,
        "last_error": st.last_error,
        # Since the local log last moved or an answer found it caught up (with lag, a long
        # idle is a stall).
        "idle_ms": max(0, now_ms - st.progress_ms),
        # Since an append last failed on a full disk (None: never): with that
        # failure after its last progress, the partition waits for disk space
        # (control/stalls.py).
        "disk_full_ago_ms": None if disk_full_ms is None else max(0, now_ms - disk_full_ms),
        # Since it last left a full-disk pause to try again (None: never).
        "disk_retry_ago_ms": (
            None if st.disk_retry_ms is None else max(0, now_ms - st.disk_retry_ms)
        ),
        # Requests that named it and ended since its log last moved (answered or not; the
        # one that moved it not counted): the stall rule's wait for a turn.
        "answers_since_move": st.answers_since_move,
        # What those were, oldest first (the last few; follower/partition_state.py).
        "turns_since_move": [TURN_KINDS[kind] for kind in st.turns],
        "bytes_replicated": st.bytes_replicated,
        "records_replicated": st.records_replicated,
        "crc_failures": st.corrupt_count,
        "errors": st.error_count,
        # Failures since the last successful append: > 0 while it keeps failing.
        "consecutive_failures": st.consecutive_failures,
        # Leader logs that started above ours, and the offsets skipped over them.
        "gaps": st.gaps,
        "gap_offsets": st.gap_offsets,
        # Reads of the local log that found a damaged batch (serve, the mirror,
        # verify read it), and where the last one did.
        "damaged_reads": damaged,
        "damaged_offset": plog.damaged_offset if plog else None,
    }


class ProblemRow(Mapping[str, Any]):
    """The fields of a partition's row that health and the stall watch read
    (control/health.py, stalls.py), as a read-only mapping with slots."""

    __slots__ = (
        "answers_since_move",
        "damaged_offset",
        "damaged_reads",
        "disk_full_ago_ms",
        "disk_retry_ago_ms",
        "idle_ms",
        "lag",
        "leader",
        "partition",
        "state",
        "topic",
    )

    def __init__(
        self, tp: TopicPartition, st: PartitionState, plog: PartitionLog | None, now_ms: int
    ) -> None:
        disk_full_ms, disk_retry_ms = st.disk_full_ms, st.disk_retry_ms
        self.topic = tp.topic
        self.partition = tp.partition
        self.leader = st.leader_id
        self.state = st.phase.value
        self.lag = st.lag
        self.idle_ms = max(0, now_ms - st.progress_ms)
        self.disk_full_ago_ms = None if disk_full_ms is None else max(0, now_ms - disk_full_ms)
        self.disk_retry_ago_ms = None if disk_retry_ms is None else max(0, now_ms - disk_retry_ms)
        self.answers_since_move = st.answers_since_move
        self.damaged_reads = plog.damaged_reads if plog else 0
        self.damaged_offset = plog.damaged_offset if plog else None

    def __getitem__(self, key: str) -> Any:
        if key not in _PROBLEM_FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in _PROBLEM_FIELDS else default

    def __iter__(self) -> Iterator[str]:
        return iter(self.__slots__)

    def __len__(self) -> int:
        return len(self.__slots__)


_PROBLEM_FIELDS = frozenset(ProblemRow.__slots__)


def partition_row(replicator: Replicator, tp: TopicPartition, now_ms: int) -> dict[str, Any] | None:
    """One partition's full row (None if it is no longer replicated)."""
    st = replicator.states.get(tp)
    if st is None:
        return None
    logs = replicator.logs
    return _row(tp, st, logs.get(tp) if logs is not None else None, now_ms)


def partition_rows(replicator: Replicator, now_ms: int) -> Iterator[dict[str, Any]]:
    """Every partition's row, made one at a time: what a status reply encodes row by row
    (control/protocol.py's JsonRows) instead of holding 10,000 rows at once."""
    logs = replicator.logs
    local = logs.partitions() if logs is not None else {}
    for tp, st in sorted(replicator.states.items()):
        yield _row(tp, st, local.get(tp), now_ms)


def _no_log(tp: TopicPartition) -> None:
    return None


def build_snapshot(
    replicator: Replicator,
    *,
    uptime_s: float,
    rates: dict[int, float],
    total_rate: float,
    problems_after_ms: int | None = None,
    now_ms: int | None = None,
) -> dict[str, Any]:
    """The snapshot; with `problems_after_ms` (the stall time), only the rows of
    partitions health and the stall watch could name, as ProblemRows (see the module
    docstring).
    `now_ms` (monotonic): the moment idle times are measured at; now if not given."""
    logs = replicator.logs
    # A lookup, not a copy of the store's 10,000-entry map.
    local_log = logs.get if logs is not None else _no_log
    if now_ms is None:
        now_ms = monotonic_ms()
    partitions: list[Mapping[str, Any]] = []
    states: Counter[str] = Counter()
    gaps = gap_offsets = damaged_reads = 0
    last_disk_full_ms: int | None = None
    for tp, st in sorted(replicator.states.items()):
        plog = local_log(tp)
        phase = st.phase.value
        states[phase] += 1
        gaps += st.gaps
        gap_offsets += st.gap_offsets
        damaged = plog.damaged_reads if plog else 0
        damaged_reads += damaged
        disk_full_ms = st.disk_full_ms
        # The disk refused its last append and nothing was appended since (paused, or
        # fetching again to retry): health names it, and the stall rule waits.
        on_full_disk = disk_full_ms is not None and disk_full_ms >= st.progress_ms
        if disk_full_ms is not None:
            last_disk_full_ms = (
                disk_full_ms if last_disk_full_ms is None else max(disk_full_ms, last_disk_full_ms)
            )
        if problems_after_ms is None:
            partitions.append(_row(tp, st, plog, now_ms))
        elif (
            damaged
            or phase in _NAMED_PHASES
            or st.leader_id < 0
            or phase == _PAUSED_DISK_FULL
            or (
                phase == _FETCHING
                and st.lag > 0
                and (on_full_disk or max(0, now_ms - st.progress_ms) >= problems_after_ms)
            )
        ):
            partitions.append(ProblemRow(tp, st, plog, now_ms))
    leaders = [
        _leader(f, rates.get(node_id, 0.0)) for node_id, f in sorted(replicator.fetchers.items())
    ]
    stats = [f.stats for f in replicator.fetchers.values()]
    return {
        "version": __version__,
        "pid": os.getpid(),
        "uptime_s": round(uptime_s, 3),
        "ready": replicator.ready.is_set(),
        "data_dir": str(replicator.settings.data_dir),
        "source": list(replicator.settings.bootstrap_servers),
        "source_problem": _source_problem(replicator),
        "missing_topics": list(replicator.missing_topics),
        "totals": {
            "leaders": len(leaders),
            "partitions": len(replicator.states),
            "lag": replicator.lag(),
            "bytes_replicated": sum(s.bytes_appended for s in stats),
            "bytes_per_s": total_rate,
            "crc_failures": sum(s.crc_failures for s in stats),
            "session_recoveries": sum(sum(s.session_recoveries.values()) for s in stats),
            "partitions_by_state": dict(states),
            "checkpoint_failures": replicator.checkpoint_failures,
            "gaps": gaps,
            "gap_offsets": gap_offsets,
            "damaged_reads": damaged_reads,
            # Since an append of any partition last failed on a full disk (None: never).
            "last_disk_full_ago_ms": (
                None if last_disk_full_ms is None else max(0, now_ms - last_disk_full_ms)
            ),
        },
        "leaders": leaders,
        "partitions": partitions,
        "memory_pool": replicator.pool.snapshot(),
        "serve": None,
    }
