"""Health: is the replica being kept up to date, and if not, why -- derived from the state
`replicad run` reports (its status snapshot), never from its log.

One model feeds every place health shows: the headline of `replicad status`, its exit
code, `--json`, systemd's STATUS= line and the metrics.

Rules (the worst reason decides; every reason is listed):
- DOWN: no broker of the source answers (with the last error and since when), or the
  source refuses us (TLS or SASL), or none of the topics asked for exists there. Nothing
  is being replicated, so a copy that falls behind stays behind.
- DEGRADED: some partitions are not being replicated or may be wrong -- a listed topic
  the source lacks (named), partitions without a leader (offline), halted (on_gap=halt,
  a recreated topic), reconciling a divergence, paused because the disk is full (the disk
  refused their last append: when, and which partitions; not stalled, see
  control/stalls.py), lagging with no progress for `STALL_AFTER_MS` (stalled); a leader
  the daemon cannot reach; fetch responses waiting
  for the memory pool (fetch.buffer_memory caps throughput); the daemon still starting.
- DEGRADED too, with a `mirror:` section: the destination cluster unreachable (the local
  log keeps the data meanwhile) or refusing a partition's batches (named), mirrored
  partitions halted (named), destination topics not mirrored (a different partition
  count, a refused creation).
- DEGRADED too, with an `archive:` section: uploads to the bucket failing (retried with
  back-off; local retention waits for them, so the disk holds what the bucket lacks).
- DEGRADED too, with `serve:` and `archive:`: serve's reads of the bucket failing (its
  last read failed, none succeeded since, within the last minutes: consumers of offsets
  only the bucket holds get KAFKA_STORAGE_ERROR and retry).
- DEGRADED too: a partition whose local log a read found damaged (a batch that does not
  parse where one must start: serve answers CORRUPT_MESSAGE there, the mirror stops at
  it), each named with the offset; it stays so, as the replica does not heal by itself.
- DEGRADED too, with `verify:` enabled: a partition of the replica found to differ from
  its source (each named with the offset of its first mismatch); it stays so, as the
  replica does not heal by itself.
- HEALTHY: none of the above.
Exit codes are a monitoring plugin's: 0 healthy, 1 degraded, 2 down, and 3 when the
daemon cannot be asked at all (`replicad status` sets that one).

Pure: a snapshot (the dict the control socket returns) in, an assessment out.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replicad.control.stalls import (
    DEFAULT_STALL_AFTER_MS,
    connected_leaders,
    is_stalled,
    sharing_leaders,
    waits_for_disk,
)

# A lagging partition whose log end has not moved for this long is stalled, unless the
# snapshot says otherwise (control.stall_after_ms; the rule is control/stalls.py's).
STALL_AFTER_MS = DEFAULT_STALL_AFTER_MS
# Partitions named in one reason at most; the count says how many there are.
NAMED_AT_MOST = 5

EXIT_HEALTHY = 0
EXIT_DEGRADED = 1
EXIT_DOWN = 2
EXIT_UNREACHABLE = 3


class Health(enum.StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    DOWN = "down"

    @property
    def exit_code(self) -> int:
        return {Health.HEALTHY: EXIT_HEALTHY, Health.DEGRADED: EXIT_DEGRADED}.get(self, EXIT_DOWN)

    @property
    def rank(self) -> int:
        return list(Health).index(self)


@dataclass(frozen=True, slots=True)
class Reason:
    health: Health
    code: str  # stable, for scripts: "source_unreachable", "topic_missing", ...
    text: str  # for people

    def as_dict(self) -> dict[str, str]:
        return {"health": self.health.value, "code": self.code, "text": self.text}


@dataclass(frozen=True, slots=True)
class Assessment:
    health: Health
    reasons: tuple[Reason, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.health.value, "reasons": [r.as_dict() for r in self.reasons]}

    def headline(self) -> str:
        if not self.reasons:
            return self.health.value.upper()
        return f"{self.health.value.upper()}: " + "; ".join(r.text for r in self.reasons)


def assess(snapshot: Mapping[str, Any]) -> Assessment:
    reasons = [
        *_source(snapshot),
        *_topics(snapshot),
        *_partitions(
            snapshot.get("partitions") or (),
            snapshot.get("leaders") or (),
            int((snapshot.get("stalls") or {}).get("stall_after_ms", STALL_AFTER_MS)),
        ),
        *_leaders(snapshot.get("leaders") or ()),
        *_pool(snapshot.get("memory_pool") or {}),
        *_mirror(snapshot.get("mirror") or {}),
        *_archive(snapshot.get("archive") or {}),
        *_serve_remote(snapshot.get("serve") or {}),
        *_verify(snapshot.get("verify") or {}),
        *_damaged(snapshot.get("partitions") or ()),
    ]
    if not snapshot.get("ready") and not any(r.health is Health.DOWN for r in reasons):
        reasons.append(
            Reason(Health.DEGRADED, "starting", "starting: the source has not answered yet")
        )
    reasons.sort(key=lambda r: -r.health.rank)
    worst = reasons[0].health if reasons else Health.HEALTHY
    return Assessment(worst, tuple(reasons))


def _source(snap: Mapping[str, Any]) -> list[Reason]:
    problem = snap.get("source_problem")
    if not problem:
        return []
    since = problem.get("since_s_ago")
    ago = f" (for {_seconds(since)})" if since is not None else ""
    if problem.get("kind") == "refused":
        return [
            Reason(Health.DOWN, "source_refused", f"the source refuses us{ago}: {problem['error']}")
        ]
    return [
        Reason(Health.DOWN, "source_unreachable", f"source unreachable{ago}: {problem['error']}")
    ]


def _topics(snap: Mapping[str, Any]) -> list[Reason]:
    missing = list(snap.get("missing_topics") or ())
    if not missing:
        return []
    what = "topic" if len(missing) == 1 else "topics"
    text = f"{what} {listed([repr(t) for t in missing])} not found on the source"
    # The totals count every partition (a status loop's snapshot lists only problem rows).
    count = (snap.get("totals") or {}).get("partitions", len(snap.get("partitions") or ()))
    nothing_else = not count
    health = Health.DOWN if nothing_else and snap.get("ready") else Health.DEGRADED
    return [Reason(health, "topic_missing", text)]


def _partitions(
    partitions: Sequence[Mapping[str, Any]],
    leaders: Sequence[Mapping[str, Any]],
    stall_after_ms: int,
) -> list[Reason]:
    connected = connected_leaders(leaders)
    sharing = sharing_leaders(leaders)
    # Each group's count and the names a reason shows (NAMED_AT_MOST): while 10,000
    # partitions catch up nearly all are named stalled, every 2 s (issue 32's memory).
    counts = {"offline": 0, "halted": 0, "diverging": 0, "disk_full": 0, "stalled": 0}
    groups: dict[str, list[str]] = {code: [] for code in counts}
    # When the disk last refused an append of a partition it names.
    disk_full_ago_ms: int | None = None
    for p in partitions:
        state = p.get("state")
        if state == "halted":
            code = "halted"
        elif int(p.get("leader", 0)) < 0:
            code = "offline"
        elif state == "truncating":
            code = "diverging"
        elif waits_for_disk(p, stall_after_ms):
            code = "disk_full"
            ago = p.get("disk_full_ago_ms")
            if ago is not None and (disk_full_ago_ms is None or int(ago) < disk_full_ago_ms):
                disk_full_ago_ms = int(ago)
        elif is_stalled(p, connected, stall_after_ms, sharing):
            code = "stalled"
        else:
            continue
        counts[code] += 1
        if len(groups[code]) < NAMED_AT_MOST:
            groups[code].append(f"{p.get('topic')}-{p.get('partition')}")
    texts = {
        "offline": "without a leader on the source (offline)",
        "halted": "halted (see their last error)",
        "diverging": "reconciling with their leader (out of range or diverged)",
        "disk_full": "paused: the disk is full"
        + (
            f" (it refused an append {_seconds(disk_full_ago_ms / 1000)} ago; retried)"
            if disk_full_ago_ms is not None
            else " (retried)"
        ),
        "stalled": f"lagging with no progress for {stall_after_ms / 1000:g} s or more (stalled)",
    }
    reasons = []
    for code, names in groups.items():
        if names:
            count = counts[code]
            text = f"{_partition_count(count)} {texts[code]}: {listed(names, count)}"
            reasons.append(Reason(Health.DEGRADED, f"partitions_{code}", text))
    return reasons


def _leaders(leaders: Sequence[Mapping[str, Any]]) -> list[Reason]:
    failing = [leader for leader in leaders if leader.get("connected") is False]
    if not failing:
        return []
    names = ", ".join(f"{leader.get('node_id')} ({leader.get('address')})" for leader in failing)
    last = failing[0].get("last_error")
    error = f": {last}" if last else ""
    return [Reason(Health.DEGRADED, "leader_unreachable", f"leader {names} unreachable{error}")]


def _pool(pool: Mapping[str, Any]) -> list[Reason]:
    if not pool.get("waiting"):
        return []
    text = (
        f"memory pool saturated: {pool['waiting']} fetch response(s) waiting for memory "
        "(fetch.buffer_memory limits throughput)"
    )
    return [Reason(Health.DEGRADED, "pool_saturated", text)]


def _mirror(mirror: Mapping[str, Any]) -> list[Reason]:
    reasons = []
    if mirror.get("problem") and mirror.get("problem_kind") == "refusing":
        # Reachable, but answering a partition's every batch with an error (for example
        # NOT_ENOUGH_REPLICAS): named, or it would show only as growing lag.
        reasons.append(
            Reason(
                Health.DEGRADED,
                "destination_refusing",
                f"mirror destination refuses batches: {mirror['problem']}",
            )
        )
    elif mirror.get("problem"):
        reasons.append(
            Reason(
                Health.DEGRADED,
                "destination_unreachable",
                f"mirror destination unreachable: {mirror['problem']}",
            )
        )
    halted = [
        f"{p.get('topic')}-{p.get('partition')}"
        for p in mirror.get("partitions") or ()
        if p.get("state") == "halted"
    ]
    if halted:
        reasons.append(
            Reason(
                Health.DEGRADED,
                "mirror_halted",
                f"{len(halted)} mirrored partition(s) halted (see their error): {listed(halted)}",
            )
        )
    errors = mirror.get("topic_errors") or {}
    if errors:
        topic, why = next(iter(sorted(errors.items())))
        more = f" (and {len(errors) - 1} more topics)" if len(errors) > 1 else ""
        reasons.append(Reason(Health.DEGRADED, "mirror_topic", f"{topic}: {why}{more}"))
    return reasons


def _archive(archive: Mapping[str, Any]) -> list[Reason]:
    retrying = list(archive.get("retrying_partitions") or ())
    if not retrying:
        return []
    text = (
        f"archive uploads failing for {len(retrying)} partition(s), retried "
        f"({listed(retrying)}): {archive.get('last_error')}"
    )
    return [Reason(Health.DEGRADED, "archive_retrying", text)]


def _serve_remote(serve: Mapping[str, Any]) -> list[Reason]:
    if not serve.get("remote_read_failing"):
        return []
    text = (
        f"serve cannot read the archive's bucket ({serve.get('remote_fetch_errors_total', 0):,} "
        f"failed reads): {serve.get('remote_last_error')}"
    )
    return [Reason(Health.DEGRADED, "serve_remote_failing", text)]


def _verify(verify: Mapping[str, Any]) -> list[Reason]:
    differing = [p for p in verify.get("partitions") or () if p.get("mismatch_count")]
    if not differing:
        return []
    named = []
    for p in differing:
        first = (p.get("mismatches") or [{}])[0]
        named.append(
            f"{p.get('topic')}-{p.get('partition')} at offset {first.get('offset', '?')} "
            f"({first.get('kind', '?')})"
        )
    text = (
        f"{_partition_count(len(differing))} of the replica "
        f"differ{'s' if len(differing) == 1 else ''} from the source: {listed(named)}"
    )
    return [Reason(Health.DEGRADED, "verify_mismatch", text)]


def _damaged(partitions: Sequence[Mapping[str, Any]]) -> list[Reason]:
    damaged = [p for p in partitions if p.get("damaged_reads")]
    if not damaged:
        return []
    named = [
        f"{p.get('topic')}-{p.get('partition')} at offset {p.get('damaged_offset', '?')}"
        for p in damaged
    ]
    text = (
        f"{_partition_count(len(damaged))} of the replica "
        f"{'have' if len(damaged) > 1 else 'has'} a damaged batch on disk: {listed(named)}"
    )
    return [Reason(Health.DEGRADED, "replica_damaged", text)]


def listed(names: Sequence[str], count: int | None = None) -> str:
    """The first NAMED_AT_MOST names, then how many more of `count` (len(names) unless
    given): "a-0, a-1 and 3 more"."""
    more = (len(names) if count is None else count) - NAMED_AT_MOST
    return ", ".join(names[:NAMED_AT_MOST]) + (f" and {more} more" if more > 0 else "")


def _partition_count(count: int) -> str:
    return f"{count} partition{'s' if count > 1 else ''}"


def _seconds(value: float) -> str:
    seconds = int(value)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"
