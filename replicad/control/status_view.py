"""`replicad status` output: the daemon's snapshot as a table or JSON, and `--watch`.

Rendering is pure (snapshot dict in, text out); `watch` is the only part that sleeps or
writes, and it takes its clock, sleep and output as arguments.

Rules of the table:
- Health first (control/health.py: the state, its reasons, the last warnings), then one
  header line, then leaders, partitions and totals.
- Partitions that need attention (state other than fetching, or a last error) come first,
  then the rest by lag, largest first; ties by topic and partition. At most `max_rows` are
  shown unless `all_partitions`; the rest are counted in a "... N more" line, so 10,000
  partitions stay readable.
- Progress (watch mode): from two snapshots `dt` seconds apart, each partition with lag
  gets its fetch rate (offsets/s) and an ETA. The ETA divides the lag by how fast the lag
  shrinks, not by the fetch rate, since the leader keeps appending while we catch up; a lag
  that is not shrinking has no ETA.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from replicad.control.health import Assessment, Health, Reason, assess, listed
from replicad.errors import DaemonNotRunning

DEFAULT_MAX_ROWS = 50
PROGRESS_MAX_BARS = 10
BAR_WIDTH = 24
LAST_ERROR_MAX_CHARS = 60
HEALTHY_STATE = "fetching"
# ANSI: cursor home, clear screen -- what watch(1) does between frames.
CLEAR_SCREEN = "\x1b[H\x1b[2J"
NONE_MARK = "-"

Snapshot = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PartitionProgress:
    topic: str
    partition: int
    lag: int
    fraction: float  # of the leader's log (log start .. high watermark) held locally
    rate: float  # offsets fetched per second
    eta_s: float | None  # None while the lag is not shrinking


@dataclass(frozen=True, slots=True)
class Progress:
    partitions: tuple[PartitionProgress, ...]  # lag > 0 only, largest lag first
    total_lag: int
    total_rate: float
    eta_s: float | None


def render_json(snapshot: Snapshot) -> str:
    return json.dumps(snapshot, indent=2, default=str)


def render_table(
    snapshot: Snapshot, *, all_partitions: bool = False, max_rows: int = DEFAULT_MAX_ROWS
) -> str:
    sections = [
        _health_section(health_of(snapshot), snapshot.get("recent_warnings") or ()),
        _header(snapshot),
        _leaders_section(snapshot.get("leaders") or []),
        _partitions_section(snapshot.get("partitions") or [], all_partitions, max_rows),
        _totals_section(snapshot.get("totals") or {}),
        _mirror_section(snapshot.get("mirror") or {}, all_partitions, max_rows),
        _verify_section(snapshot.get("verify") or {}, all_partitions, max_rows),
    ]
    return "\n\n".join(section for section in sections if section)


def health_of(snapshot: Snapshot) -> Assessment:
    """The snapshot's health as the daemon judged it (control/health.py); judged here
    from the snapshot when a daemon older than the health model sent it."""
    given = snapshot.get("health")
    if isinstance(given, Mapping) and given.get("state") in {h.value for h in Health}:
        reasons = tuple(
            Reason(Health(r["health"]), r["code"], r["text"]) for r in given.get("reasons", ())
        )
        return Assessment(Health(given["state"]), reasons)
    return assess(snapshot)


def render_status_line(snapshot: Snapshot) -> str:
    """One line for systemd's STATUS=: health (with its first reason), then leaders,
    partitions (and any not fetching), lag, rate."""
    health = health_of(snapshot)
    first = f" ({health.reasons[0].text})" if health.reasons else ""
    return f"{health.health.value}{first}; " + _counts_line(snapshot)


def _counts_line(snapshot: Snapshot) -> str:
    totals = snapshot.get("totals") or {}
    by_state = totals.get("partitions_by_state") or {}
    unhealthy = ", ".join(
        f"{count:,} {state}"
        for state, count in sorted(by_state.items())
        if state != HEALTHY_STATE and count
    )
    return (
        f"{totals.get('leaders', 0):,} leaders, {totals.get('partitions', 0):,} partitions"
        + (f" ({unhealthy})" if unhealthy else "")
        + f", lag {totals.get('lag', 0):,}, {format_bytes(totals.get('bytes_per_s', 0))}/s"
    )


def progress(prev: Snapshot | None, cur: Snapshot, dt: float) -> Progress:
    """Catch-up progress between two snapshots taken `dt` seconds apart."""
    before = {(p["topic"], p["partition"]): p for p in ((prev or {}).get("partitions") or [])}
    rows = []
    lag_shrink_total = 0.0
    for part in cur.get("partitions") or []:
        lag = int(part.get("lag") or 0)
        if lag <= 0:
            continue
        old = before.get((part["topic"], part["partition"]))
        rate = shrink = 0.0
        if old is not None and dt > 0:
            rate = max(0.0, (part["log_end_offset"] - old["log_end_offset"]) / dt)
            shrink = (int(old.get("lag") or 0) - lag) / dt
            lag_shrink_total += shrink
        rows.append(
            PartitionProgress(
                topic=part["topic"],
                partition=part["partition"],
                lag=lag,
                fraction=_held_fraction(part),
                rate=rate,
                eta_s=lag / shrink if shrink > 0 else None,
            )
        )
    rows.sort(key=lambda row: (-row.lag, row.topic, row.partition))
    total_lag = sum(row.lag for row in rows)
    return Progress(
        partitions=tuple(rows),
        total_lag=total_lag,
        total_rate=sum(row.rate for row in rows),
        eta_s=total_lag / lag_shrink_total if lag_shrink_total > 0 and total_lag else None,
    )


def render_progress(report: Progress, *, max_bars: int = PROGRESS_MAX_BARS) -> str:
    if not report.partitions:
        return "CATCHING UP\nall partitions caught up"
    lines = [
        f"CATCHING UP  {len(report.partitions):,} partitions  lag {report.total_lag:,}  "
        f"{_count_rate(report.total_rate)}  ETA {format_duration(report.eta_s)}"
    ]
    names = [f"{row.topic}-{row.partition}" for row in report.partitions[:max_bars]]
    width = max(len(name) for name in names)
    for name, row in zip(names, report.partitions, strict=False):
        lines.append(
            f"{name:<{width}}  {progress_bar(row.fraction)} {row.fraction * 100:5.1f}%  "
            f"lag {row.lag:,}  {_count_rate(row.rate)}  ETA {format_duration(row.eta_s)}"
        )
    hidden = len(report.partitions) - max_bars
    if hidden > 0:
        lines.append(f"... {hidden:,} more catching up")
    return "\n".join(lines)


def progress_bar(fraction: float, width: int = BAR_WIDTH) -> str:
    filled = round(min(1.0, max(0.0, fraction)) * width)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def watch(
    query_fn: Callable[[], Snapshot],
    interval_s: float,
    out: TextIO,
    *,
    all_partitions: bool = False,
    max_frames: int | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Redraw the status every `interval_s` until interrupted (or `max_frames` are drawn).

    A daemon that is not running is shown as such and asked again next time, so the
    watch survives a restart.
    """
    prev: Snapshot | None = None
    prev_at = 0.0
    frames = 0
    try:
        while max_frames is None or frames < max_frames:
            at = clock()
            try:
                cur = query_fn()
            except DaemonNotRunning as exc:
                body = f"{exc}; asking again every {interval_s:g}s"
                prev = None
            else:
                report = progress(prev, cur, at - prev_at if prev is not None else 0.0)
                body = (
                    render_table(cur, all_partitions=all_partitions)
                    + "\n\n"
                    + render_progress(report)
                )
                prev, prev_at = cur, at
            if out.isatty():
                out.write(CLEAR_SCREEN)
            out.write(f"every {interval_s:g}s: replicad status\n\n{body}\n")
            out.flush()
            frames += 1
            if max_frames is None or frames < max_frames:
                sleep(interval_s)
    except KeyboardInterrupt:
        pass
    return 0


# -- sections -------------------------------------------------------------------------


def _health_section(health: Assessment, warnings: Sequence[Mapping[str, Any]]) -> str:
    """The headline, as `systemctl status` leads with active/failed: the state, then each
    reason on a line of its own, then the last distinct warnings with their counts."""
    lines = [f"health: {health.health.value.upper()}"]
    lines += [f"  - {reason.text}" for reason in health.reasons]
    if warnings:
        lines.append("recent warnings (newest first):")
        for w in warnings:
            times = f" x{w.get('count', 1)}" if w.get("count", 1) > 1 else ""
            fields = f" [{w['fields']}]" if w.get("fields") else ""
            lines.append(f"  {w.get('level', '?')}{times}: {w.get('event', '')}{fields}")
    return "\n".join(lines)


def _header(snap: Snapshot) -> str:
    parts = [
        f"replicad {snap.get('version', '?')}",
        f"pid {snap.get('pid', '?')}",
        f"up {format_duration(snap.get('uptime_s'))}",
        "ready" if snap.get("ready") else "starting",
    ]
    if snap.get("data_dir"):
        parts.append(f"data {snap['data_dir']}")
    if snap.get("source"):
        parts.append(f"source {','.join(snap['source'])}")
    lines = ["  ".join(parts)]
    pool = snap.get("memory_pool")
    if pool:
        lines.append(
            f"memory pool {format_bytes(pool.get('used', 0))} of "
            f"{format_bytes(pool.get('capacity', 0))}, "
            f"peak {format_bytes(pool.get('peak', 0))}, {pool.get('waits', 0):,} waits"
        )
    serve = snap.get("serve")
    if serve:
        where = f" on {serve['listen']}" if serve.get("listen") else ""
        lines.append(
            f"serving{where}: {serve.get('sessions', 0):,} fetch sessions, "
            f"{serve.get('partitions_cached', 0):,} partitions cached, "
            f"{serve.get('evictions_total', 0):,} evictions"
        )
        groups = serve.get("groups") or {}
        if any(groups.values()):
            states = ", ".join(f"{n:,} {state}" for state, n in groups.items() if n)
            lines.append(
                f"consumer groups: {states}; {serve.get('group_rebalances_total', 0):,} "
                f"rebalances, {serve.get('offset_commits_total', 0):,} offsets committed"
            )
        if "remote_fetches_in_flight" in serve:
            lines.append(
                f"serving from the archive: {serve.get('remote_fetches_total', 0):,} reads of "
                f"the bucket ({format_bytes(serve.get('remote_fetch_bytes_total', 0))}), "
                f"{serve.get('remote_fetch_errors_total', 0):,} failed, "
                f"{serve.get('remote_fetches_in_flight', 0):,} under way, cache "
                f"{format_bytes(serve.get('remote_cache_bytes', 0))}"
            )
        sync = serve.get("group_sync")
        if sync:
            problem = f"; problem: {sync['problem']}" if sync.get("problem") else ""
            lines.append(
                f"group offsets from the source: {sync.get('groups_synced', 0):,} groups synced, "
                f"{sync.get('groups_failed_over', 0):,} failed over here, "
                f"{sync.get('held_offsets', 0):,} held at the high watermark{problem}"
            )
    archive = snap.get("archive")
    if archive:
        lines.append(_archive_line(archive))
    return "\n".join(lines)


def _archive_line(archive: Mapping[str, Any]) -> str:
    """The `archive:` uploader: what went up, what waits, and what is failing now."""
    line = (
        f"archive {archive.get('bucket', '?')}: {archive.get('uploaded_segments', 0):,} "
        f"segments uploaded ({format_bytes(archive.get('uploaded_bytes', 0))}), "
        f"{archive.get('pending_segments', 0):,} pending, {archive.get('failures', 0):,} "
        "failed uploads"
    )
    if archive.get("deleted_segments"):
        line += f", {archive['deleted_segments']:,} deleted by remote retention"
    retrying = archive.get("retrying_partitions") or ()
    if retrying:
        line += f"; retrying {listed(retrying)}: {archive.get('last_error')}"
    return line


def _mirror_section(mirror: Mapping[str, Any], all_partitions: bool, max_rows: int) -> str:
    """The `mirror:` section: per partition the local log end, the mirrored offset and the
    destination lag; halted and lagging partitions first."""
    if not mirror:
        return ""
    parts = [
        f"MIRROR to {mirror.get('destination', '?')}",
        "running" if mirror.get("running") else "starting",
        f"lag {mirror.get('lag', 0):,}",
        f"{mirror.get('produce_requests', 0):,} produce requests",
        f"{mirror.get('produce_errors', 0):,} errors",
    ]
    lines = _head(parts, mirror)
    for topic, why in sorted((mirror.get("topic_errors") or {}).items()):
        lines.append(f"topic {topic}: {why}")
    headers = (
        "PARTITION",
        "LOCAL END",
        "MIRRORED",
        "DEST NEXT",
        "LAG",
        "OFFSETS",
        "STATE",
        "ERROR",
    )
    partitions = sorted(
        mirror.get("partitions") or (),
        key=lambda p: (
            p.get("state") != "halted",
            -(p.get("lag") or 0),
            p["topic"],
            p["partition"],
        ),
    )
    shown = partitions if all_partitions else partitions[:max_rows]
    rows = [
        (
            f"{p['topic']}-{p['partition']}",
            _or_none(p.get("local_log_end")),
            _or_none(p.get("mirrored_offset")),
            _or_none(p.get("destination_next_offset")),
            _or_none(p.get("lag")),
            "kept" if p.get("offsets_kept") else "mapped",
            str(p.get("state", NONE_MARK)),
            _short_error(p.get("error")),
        )
        for p in shown
    ]
    groups = _mirror_groups(mirror.get("groups") or {}, all_partitions, max_rows)
    return "\n".join(lines) + _rows_and_more(headers, rows, len(partitions)) + groups


def _verify_section(verify: Mapping[str, Any], all_partitions: bool, max_rows: int) -> str:
    """The `verify:` section: passes, load on the source, and per partition the verified
    offset; partitions that differ from the source first, each with its first mismatch as
    an ERROR, then the least verified."""
    if not verify:
        return ""
    parts = [
        "VERIFY against the source",
        "running" if verify.get("running") else "starting",
        f"{verify.get('passes', 0):,} passes",
        f"{verify.get('batches_compared', 0):,} batches compared",
        f"fetched {format_bytes(verify.get('bytes_fetched', 0))}"
        f" (at most {format_bytes(verify.get('max_bytes_per_second', 0))}/s)",
        f"unverified {verify.get('unverified_offsets', 0):,} offsets",
        f"{verify.get('mismatches_total', 0):,} mismatches",
    ]
    lines = _head(parts, verify)
    partitions = sorted(
        verify.get("partitions") or (),
        key=lambda p: (
            not p.get("mismatch_count"),
            -(p.get("unverified_offsets") or 0),
            p["topic"],
            p["partition"],
        ),
    )
    shown = partitions if all_partitions else partitions[:max_rows]

    def error(p: Mapping[str, Any]) -> str:
        mismatches = p.get("mismatches") or ()
        if mismatches:
            m = mismatches[0]
            more = p.get("mismatch_count", 1) - 1
            also = f" (+{more} more)" if more > 0 else ""
            # The detail is in --json and the log; the table names where and what.
            return f"ERROR at offset {m['offset']}: {m['kind']}{also}"
        return _short_error(p.get("unverified"))

    rows = [
        (
            f"{p['topic']}-{p['partition']}",
            _or_none(p.get("verified_offset")),
            _or_none(p.get("log_end_offset")),
            _or_none(p.get("unverified_offsets")),
            f"{p.get('batches_compared', 0):,}",
            error(p),
        )
        for p in shown
    ]
    headers = ("PARTITION", "VERIFIED", "LOG END", "UNVERIFIED", "BATCHES", "ERROR")
    return "\n".join(lines) + _rows_and_more(headers, rows, len(partitions))


def _head(parts: Sequence[str], section: Mapping[str, Any]) -> list[str]:
    """A section's first line, and its `problem` on the next when it has one."""
    lines = ["  ".join(parts)]
    if section.get("problem"):
        lines.append(f"problem: {section['problem']}")
    return lines


def _rows_and_more(headers: Sequence[str], rows: Sequence[Sequence[str]], total: int) -> str:
    """A section's per-partition table (its four offset columns right-aligned), and how
    many of `total` partitions it left out."""
    table = "\n" + _table(headers, rows, right={1, 2, 3, 4}) if rows else ""
    more = f"\n... {total - len(rows):,} more" if len(rows) < total else ""
    return table + more


def _mirror_groups(groups: Mapping[str, Any], all_rows: bool, max_rows: int) -> str:
    """The group sync under the mirror: per group its last sync, partitions, offsets held
    back, and why it stopped (failed over) or waits (gone at the source); failed-over and
    erring groups first."""
    promoted = groups.get("promoted_topics") or {}
    lines = [f"promoted (no longer mirrored): {', '.join(sorted(promoted))}"] if promoted else []
    if groups.get("enabled"):
        lines.append(
            f"GROUPS synced {groups.get('groups_synced', 0):,}  "
            f"failed over {groups.get('groups_failed_over', 0):,}  "
            f"held back {groups.get('held_back_offsets', 0):,} offsets  "
            f"sync lag {groups.get('sync_lag_ms', 0) / 1000:.1f}s  "
            f"errors {groups.get('sync_errors_total', 0):,}"
            + (f"  problem: {groups['problem']}" if groups.get("problem") else "")
        )
    rows_in = sorted(
        (groups.get("groups") or {}).items(),
        key=lambda item: (item[1].get("state") != "failed_over", not item[1].get("error"), item[0]),
    )
    shown = rows_in if all_rows else rows_in[:max_rows]
    rows = [
        (
            group,
            str(g.get("state", NONE_MARK)),
            _clock(g.get("last_sync_ms")),
            _or_none(g.get("partitions")),
            _or_none(g.get("held_back_offsets")),
            _or_none(len(g.get("skipped") or {})),
            _short_error(g.get("reason") or g.get("error") or _absent(g.get("absent_since_ms"))),
        )
        for group, g in shown
    ]
    if rows:
        headers = ("GROUP", "STATE", "LAST SYNC", "PARTITIONS", "HELD BACK", "SKIPPED", "WHY")
        lines.append(_table(headers, rows, right={3, 4, 5}))
    if len(shown) < len(rows_in):
        lines.append(f"... {len(rows_in) - len(shown):,} more groups")
    return "\n" + "\n".join(lines) if lines else ""


def _absent(since_ms: object) -> str | None:
    # Forgotten once gone at the destination too (group_sync.py).
    return f"gone at the source since {_clock(since_ms)}" if isinstance(since_ms, int) else None


def _clock(ms: object) -> str:
    if not isinstance(ms, int):
        return NONE_MARK
    return time.strftime("%H:%M:%S", time.gmtime(ms / 1000))


def _leaders_section(leaders: Sequence[Mapping[str, Any]]) -> str:
    headers = (
        "NODE", "ADDRESS", "SESSION", "EPOCH", "MODE", "PARTITIONS", "LATENCY",
        "RATE", "REQUESTS", "ERRORS", "RECOVERIES", "LAST ERROR",
    )  # fmt: skip
    rows = []
    for leader in sorted(leaders, key=lambda lead: lead.get("node_id", 0)):
        sessionful = leader.get("sessionful")
        rows.append(
            (
                str(leader.get("node_id", NONE_MARK)),
                str(leader.get("address", NONE_MARK)),
                _or_none(leader.get("session_id") if sessionful else None),
                _or_none(leader.get("epoch") if sessionful else None),
                "sessionful" if sessionful else "sessionless",
                f"{leader.get('partitions', 0):,}",
                # Answers without records wait out the long poll (fetch.max_wait_ms): the
                # latency shown is that of the last answer that carried records.
                _latency(leader.get("last_data_latency_ms")),
                format_bytes(leader.get("bytes_per_s", 0)) + "/s",
                f"{leader.get('requests', 0):,}",
                f"{leader.get('errors', 0):,}",
                f"{sum((leader.get('session_recoveries') or {}).values()):,}",
                _short_error(leader.get("last_error")),
            )
        )
    return f"LEADERS ({len(leaders)})\n" + _table(headers, rows, right={5, 6, 7, 8, 9, 10})


def _partitions_section(
    partitions: Sequence[Mapping[str, Any]], all_partitions: bool, max_rows: int
) -> str:
    headers = ("PARTITION", "LEADER", "LOG END", "HIGH WATERMARK", "LAG", "STATE", "LAST ERROR")
    ordered = sorted(partitions, key=_partition_order)
    shown = ordered if all_partitions else ordered[:max_rows]
    rows = [
        (
            f"{part['topic']}-{part['partition']}",
            _or_none(part.get("leader")),
            _offset(part.get("log_end_offset")),
            _offset(part.get("high_watermark")),
            _offset(part.get("lag")),
            str(part.get("state", NONE_MARK)),
            _short_error(part.get("last_error")),
        )
        for part in shown
    ]
    title = f"PARTITIONS ({len(partitions):,}; needing attention first, then by lag)"
    text = title + "\n" + _table(headers, rows, right={1, 2, 3, 4})
    hidden = len(ordered) - len(shown)
    if hidden:
        text += f"\n... {hidden:,} more (use --json, or --all)"
    return text


def _totals_section(totals: Mapping[str, Any]) -> str:
    by_state = totals.get("partitions_by_state") or {}
    states = ", ".join(f"{state} {count:,}" for state, count in sorted(by_state.items()))
    return "TOTALS\n" + "  ".join(
        [
            f"leaders {totals.get('leaders', 0):,}",
            f"partitions {totals.get('partitions', 0):,}" + (f" ({states})" if states else ""),
            f"lag {totals.get('lag', 0):,}",
            f"replicated {format_bytes(totals.get('bytes_replicated', 0))}",
            f"rate {format_bytes(totals.get('bytes_per_s', 0))}/s",
            f"crc failures {totals.get('crc_failures', 0):,}",
            f"session recoveries {totals.get('session_recoveries', 0):,}",
        ]
    )


# -- formatting -----------------------------------------------------------------------


def _partition_order(part: Mapping[str, Any]) -> tuple[int, int, str, int]:
    healthy = part.get("state", HEALTHY_STATE) == HEALTHY_STATE and not part.get("last_error")
    return (1 if healthy else 0, -int(part.get("lag") or 0), part["topic"], part["partition"])


def _held_fraction(part: Mapping[str, Any]) -> float:
    start = int(part.get("log_start_offset") or 0)
    end, high = int(part["log_end_offset"]), int(part.get("high_watermark") or 0)
    if high <= start:
        return 1.0
    return min(1.0, max(0.0, (end - start) / (high - start)))


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.rjust(width) if col in right else cell.ljust(width)
            for col, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), *(line(row) for row in rows)])


def format_bytes(count: float) -> str:
    value = float(count or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return NONE_MARK
    whole = round(seconds)
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def _count_rate(per_s: float) -> str:
    return f"{per_s:,.0f} msg/s"


def _latency(ms: float | None) -> str:
    return NONE_MARK if ms is None else f"{ms:.1f} ms"


def _offset(value: int | None) -> str:
    return NONE_MARK if value is None or value < 0 else f"{value:,}"


def _or_none(value: object) -> str:
    return NONE_MARK if value is None else str(value)


def _short_error(error: object) -> str:
    if not error:
        return NONE_MARK
    text = " ".join(str(error).split())
    return text if len(text) <= LAST_ERROR_MAX_CHARS else text[: LAST_ERROR_MAX_CHARS - 1] + "…"
