"""Prometheus metrics, read from the same status snapshot `replicad status` shows.

A custom collector turns the snapshot into metric families at scrape time, so nothing is
counted twice and no metric object lives in the replicator. The HTTP endpoint is
prometheus-client's own threaded server; when it is started from inside the daemon's event
loop, the snapshot is taken on that loop (the replicator's state is only ever touched there),
and a loop too wedged to answer within SNAPSHOT_TIMEOUT_S fails the scrape.

With many partitions, `per_topic=True` replaces the per-partition series (lag, offsets,
bytes, CRC failures) with per-topic sums, so 10,000 partitions cost tens of series, not tens
of thousands.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from replicad.leader.events import ServeEvent

PREFIX = "replicad"
SNAPSHOT_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 5.0
MS_PER_S = 1000.0

Snapshot = Mapping[str, Any]
LEADER_LABELS = ["leader", "address"]


class SnapshotCollector(Collector):
    """Metric families from `snapshot()`, built afresh on every scrape."""

    def __init__(self, snapshot: Callable[[], Snapshot], *, per_topic: bool = False) -> None:
        self.snapshot = snapshot
        self.per_topic = per_topic

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        yield from _daemon_metrics(snap)
        yield from _leader_metrics(snap.get("leaders") or [])
        partitions = snap.get("partitions") or []
        if self.per_topic:
            yield from _topic_metrics(partitions)
        else:
            yield from _partition_metrics(partitions)
        yield from _totals_metrics(snap.get("totals") or {})
        if snap.get("memory_pool"):
            yield from _memory_pool_metrics(snap["memory_pool"])
        if snap.get("serve"):
            yield from _serve_metrics(snap["serve"])
        if snap.get("mirror"):
            yield from _mirror_metrics(snap["mirror"], per_partition=not self.per_topic)
        if snap.get("archive"):
            yield from _archive_metrics(snap["archive"])
        if snap.get("verify"):
            yield from _verify_metrics(snap["verify"], per_partition=not self.per_topic)


@dataclass(frozen=True, slots=True)
class MetricsServer:
    """A running metrics endpoint; `close()` stops it."""

    host: str
    port: int
    server: WSGIServer
    thread: threading.Thread

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(STOP_TIMEOUT_S)


def build_registry(
    snapshot: Callable[[], Snapshot],
    *,
    per_topic: bool = False,
    loop: asyncio.AbstractEventLoop | None = None,
    snapshot_timeout_s: float = SNAPSHOT_TIMEOUT_S,
) -> CollectorRegistry:
    """A registry with replicad's collector (and the process's CPU, memory and fds)."""
    registry = CollectorRegistry()
    read = snapshot if loop is None else on_loop(loop, snapshot, snapshot_timeout_s)
    registry.register(SnapshotCollector(read, per_topic=per_topic))
    ProcessCollector(registry=registry)
    return registry


def start_metrics_server(
    host: str,
    port: int,
    snapshot: Callable[[], Snapshot],
    *,
    per_topic: bool = False,
    loop: asyncio.AbstractEventLoop | None = None,
    snapshot_timeout_s: float = SNAPSHOT_TIMEOUT_S,
) -> MetricsServer:
    """Serve /metrics on `host:port` (port 0 picks a free one; see `.port`).

    Called from a coroutine, the snapshot is read on that coroutine's loop unless `loop`
    names another.
    """
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
    registry = build_registry(
        snapshot, per_topic=per_topic, loop=loop, snapshot_timeout_s=snapshot_timeout_s
    )
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(host=host, port=server.server_port, server=server, thread=thread)


def on_loop(
    loop: asyncio.AbstractEventLoop,
    fn: Callable[[], Snapshot],
    timeout_s: float = SNAPSHOT_TIMEOUT_S,
) -> Callable[[], Snapshot]:
    """`fn` made callable from any thread: it runs on `loop` and the caller waits for it."""

    def call() -> Snapshot:
        try:
            if asyncio.get_running_loop() is loop:
                return fn()
        except RuntimeError:
            pass
        result: concurrent.futures.Future[Snapshot] = concurrent.futures.Future()

        def run() -> None:
            try:
                result.set_result(fn())
            except BaseException as exc:
                result.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return result.result(timeout=timeout_s)

    return call


# -- families -------------------------------------------------------------------------


def _name(suffix: str) -> str:
    return f"{PREFIX}_{suffix}"


def _daemon_metrics(snap: Snapshot) -> Iterator[Metric]:
    build = InfoMetricFamily(_name("build"), "replicad version")
    build.add_metric([], {"version": str(snap.get("version", ""))})
    yield build
    yield GaugeMetricFamily(
        _name("uptime_seconds"), "Seconds since the daemon started", value=snap.get("uptime_s", 0)
    )
    yield GaugeMetricFamily(
        _name("ready"),
        "1 once logs are recovered and the first metadata is in",
        value=1 if snap.get("ready") else 0,
    )
    # The health model of `replicad status` (control/health.py), for alerting on.
    health = snap.get("health") or {}
    states = ("healthy", "degraded", "down")
    state = health.get("state", "healthy")
    yield GaugeMetricFamily(
        _name("health"),
        "0 healthy, 1 degraded, 2 down (as replicad status and its exit code say)",
        value=states.index(state) if state in states else len(states),
    )
    reasons = GaugeMetricFamily(
        _name("health_reasons"),
        "Reasons the daemon is not healthy, by code (1 while present)",
        labels=["code"],
    )
    for code in sorted({r.get("code", "") for r in health.get("reasons", ())}):
        reasons.add_metric([code], 1)
    yield reasons


# Each family below is a row of a table: its kind, its name after "replicad_", its help,
# and the snapshot key it reads (divided by `per`, e.g. ms -> s). A family whose key is
# absent from a row gets no sample for that row when `optional`, else 0.


@dataclass(frozen=True, slots=True)
class Family:
    kind: type[GaugeMetricFamily] | type[CounterMetricFamily]
    name: str
    help: str
    key: str
    per: float = 1.0
    optional: bool = False

    def value(self, row: Mapping[str, Any]) -> float | None:
        value = row.get(self.key)
        if value is None:
            return None if self.optional else 0
        return float(value) / self.per

    def single(self, row: Mapping[str, Any]) -> Metric:
        """The family with one unlabelled sample from `row`."""
        return self.kind(_name(self.name), self.help, value=self.value(row) or 0)


GAUGE, COUNTER = GaugeMetricFamily, CounterMetricFamily

LEADER_FAMILIES = (
    Family(COUNTER, "fetch_requests", "Fetch requests sent to the leader", "requests"),
    Family(COUNTER, "fetch_errors", "Failed fetches and error responses", "errors"),
    Family(
        GAUGE,
        "fetch_latency_seconds",
        "Round trip of the last fetch to the leader",
        "last_fetch_latency_ms",
        per=MS_PER_S,
        optional=True,
    ),
    Family(
        GAUGE,
        "leader_bytes_per_second",
        "Record bytes replicated from the leader per second",
        "bytes_per_s",
    ),
    Family(GAUGE, "leader_partitions", "Partitions fetched from the leader", "partitions"),
    Family(
        GAUGE,
        "fetch_session_active",
        "1 while an incremental fetch session (KIP-227) is open with the leader",
        "sessionful",
    ),
)
PARTITION_FAMILIES = (
    Family(GAUGE, "partition_lag", "Leader high watermark minus local log end", "lag"),
    Family(GAUGE, "partition_log_end_offset", "Local log end offset", "log_end_offset"),
    Family(
        GAUGE, "partition_high_watermark", "Leader's high watermark, last seen", "high_watermark"
    ),
    Family(
        COUNTER, "partition_bytes_replicated", "Record bytes appended locally", "bytes_replicated"
    ),
    Family(
        COUNTER, "partition_crc_failures", "Fetched batches that failed the CRC", "crc_failures"
    ),
    Family(
        COUNTER,
        "partition_damaged_reads",
        "Reads of the local log that found a damaged batch",
        "damaged_reads",
    ),
    Family(
        COUNTER,
        "partition_gap_offsets",
        "Offsets skipped because the leader's log started above ours (on_gap=reset)",
        "gap_offsets",
    ),
)
TOPIC_FAMILIES = (
    Family(GAUGE, "topic_partitions", "Partitions replicated", "partitions"),
    Family(GAUGE, "topic_lag", "Sum of the topic's partition lags", "lag"),
    Family(COUNTER, "topic_bytes_replicated", "Record bytes appended locally", "bytes_replicated"),
    Family(COUNTER, "topic_crc_failures", "Fetched batches that failed the CRC", "crc_failures"),
)
# What each topic sums over its partitions (the count of partitions comes with them).
TOPIC_SUMS = ("lag", "bytes_replicated", "crc_failures")
TOTALS_FAMILIES = (
    Family(GAUGE, "leaders", "Leaders fetched from", "leaders"),
    Family(GAUGE, "lag", "Sum of all partition lags", "lag"),
    Family(COUNTER, "bytes_replicated", "Record bytes appended locally", "bytes_replicated"),
    Family(GAUGE, "bytes_per_second", "Record bytes replicated per second", "bytes_per_s"),
    Family(COUNTER, "crc_failures", "Fetched batches that failed the CRC", "crc_failures"),
    Family(
        COUNTER,
        "damaged_reads",
        "Reads of the local log that found a damaged batch",
        "damaged_reads",
    ),
    Family(
        COUNTER,
        "gaps",
        "Times a leader's log started above a partition's local end (retention outran us)",
        "gaps",
    ),
    Family(
        COUNTER,
        "gap_offsets",
        "Offsets skipped because the leader's log started above ours (on_gap=reset)",
        "gap_offsets",
    ),
    Family(
        GAUGE,
        "partitions_stalled",
        "Partitions lagging, their leader connected, their log not moving (stall_after_ms)",
        "partitions_stalled",
    ),
    Family(COUNTER, "stalls", "Partition stalls that began since start", "stalls_total"),
    Family(
        COUNTER,
        "control_requests_abandoned",
        "Control requests (replicad status) whose client was gone before the reply was built",
        "control_abandoned",
    ),
    # The watchdog of the loop (control/loop_watch.py): a block stops fetching, the
    # control socket and serve alike.
    Family(
        GAUGE,
        "event_loop_max_block_seconds",
        "Longest time the event loop did not turn, in the last one to two minutes",
        "event_loop_recent_max_block_ms",
        per=MS_PER_S,
    ),
)
MEMORY_POOL_FAMILIES = (
    Family(
        GAUGE,
        "memory_pool_capacity_bytes",
        "Bound on fetch-response memory across all leaders (KIP-81)",
        "capacity",
    ),
    Family(GAUGE, "memory_pool_used_bytes", "Fetch-response memory in use", "used"),
    # Buffers kept for the next frames; counted within the bound with what is in use.
    Family(GAUGE, "memory_pool_idle_bytes", "Fetch-response buffers held idle for reuse", "idle"),
    # The high-water mark shows how close the bound came to binding; waits, that it did.
    Family(
        GAUGE,
        "memory_pool_peak_bytes",
        "Most fetch-response memory ever held (in use and idle) at once since start",
        "peak",
    ),
    Family(
        COUNTER,
        "memory_pool_waits",
        "Fetch responses that waited for room in the memory pool",
        "waits",
    ),
)
# Kafka's names: NumIncrementalFetchSessions, NumIncrementalFetchPartitionsCached,
# IncrementalFetchSessionEvictionsPerSec (a rate there; a counter here, rate() it).
SERVE_FAMILIES = (
    Family(
        GAUGE,
        "serve_incremental_fetch_sessions",
        "Incremental fetch sessions in the session cache",
        "sessions",
    ),
    Family(
        GAUGE,
        "serve_incremental_fetch_partitions_cached",
        "Partitions held by all cached fetch sessions",
        "partitions_cached",
    ),
    Family(
        COUNTER,
        "serve_incremental_fetch_session_evictions",
        "Fetch sessions evicted from the session cache",
        "evictions_total",
    ),
    Family(GAUGE, "serve_connections", "Client connections open", "connections"),
    Family(
        GAUGE,
        "serve_request_pool_used_bytes",
        "Bytes of request frames held in the request memory pool (queued.max.request.bytes)",
        "request_pool_used_bytes",
    ),
    Family(
        COUNTER,
        "serve_request_pool_waits",
        "Request frames that waited for room in the request memory pool",
        "request_pool_waits_total",
    ),
    # serve's group coordinator (leader/groups.py).
    Family(
        COUNTER,
        "serve_group_rebalances",
        "Rebalances the group coordinator began",
        "group_rebalances_total",
    ),
    Family(
        COUNTER,
        "serve_offset_commits",
        "Partition offsets committed to serve's groups",
        "offset_commits_total",
    ),
    Family(
        COUNTER,
        "serve_offset_store_write_failures",
        "Writes of committed offsets that failed (the commits were answered with an error)",
        "offset_store_write_failures_total",
    ),
    # One family per kind of thing clients do wrong (leader/events.py): a fixed set, never
    # a label per value a client chose.
    *(
        Family(
            COUNTER, "serve_" + event.counter.removesuffix("_total"), event.message, event.counter
        )
        for event in ServeEvent
    ),
)


# The `mirror:` section (replicad/mirror): the whole mirror, then per mirrored partition.
MIRROR_FAMILIES = (
    Family(COUNTER, "mirror_produce_requests", "Produce requests sent to the destination",
           "produce_requests"),
    Family(COUNTER, "mirror_produce_errors", "Produce answers with an error", "produce_errors"),
    Family(COUNTER, "mirror_produced_bytes", "Batch bytes the destination took",
           "bytes_produced"),
    Family(COUNTER, "mirror_producer_sessions_renewed",
           "New producer ids after the destination forgot or fenced ours", "session_resets"),
    Family(GAUGE, "mirror_lag", "Offsets held locally and not mirrored yet, all partitions",
           "lag"),
    Family(GAUGE, "mirror_destination_unreachable",
           "1 while the destination cluster cannot be reached", "unreachable"),
)  # fmt: skip
# The `archive:` section (replicad/archive/uploader.py): rolled segments in the bucket.
ARCHIVE_FAMILIES = (
    Family(COUNTER, "archive_uploaded_segments", "Rolled segments uploaded to the bucket",
           "uploaded_segments"),
    Family(COUNTER, "archive_uploaded_bytes", "Bytes uploaded (.log, .index, .timeindex)",
           "uploaded_bytes"),
    Family(GAUGE, "archive_pending_segments", "Rolled segments not uploaded yet",
           "pending_segments"),
    Family(COUNTER, "archive_upload_failures",
           "Uploads that failed (bucket down, 503 SlowDown, timeouts); each is retried",
           "failures"),
    Family(GAUGE, "archive_retrying_partitions", "Partitions waiting to retry an upload",
           "retrying"),
    Family(COUNTER, "archive_put_requests", "PUT requests sent to the bucket", "puts"),
    Family(COUNTER, "archive_deleted_segments",
           "Archived segments deleted from the bucket by remote retention", "deleted_segments"),
)  # fmt: skip
# The continuous check against the source (`verify:`, replicad/verify/continuous.py).
VERIFY_FAMILIES = (
    Family(COUNTER, "verify_passes", "Passes of the check against the source", "passes"),
    Family(COUNTER, "verify_fetched_bytes", "Bytes fetched from the source to compare",
           "bytes_fetched"),
    Family(COUNTER, "verify_compared_batches", "Batches compared with the source's",
           "batches_compared"),
    Family(GAUGE, "verify_unverified_offsets",
           "Offsets of the replica not compared with the source yet, all partitions",
           "unverified_offsets"),
    Family(GAUGE, "verify_mismatches",
           "Batches found to differ from the source since start, all partitions",
           "mismatches_total"),
)  # fmt: skip
VERIFY_PARTITION_FAMILIES = (
    Family(GAUGE, "verified_offset",
           "Offset below which the replica was compared with the source", "verified_offset"),
    Family(GAUGE, "verify_partition_mismatches",
           "Batches of this partition found to differ from the source since start",
           "mismatch_count"),
)  # fmt: skip
# serve's reads of the archive's bucket below the local log start
# (replicad/leader/remote_fetch.py), when `serve:` and `archive:` are both on.
SERVE_REMOTE_FAMILIES = (
    Family(COUNTER, "serve_remote_fetches", "Fetch answers read from the archive's bucket",
           "remote_fetches_total"),
    Family(COUNTER, "serve_remote_fetch_bytes", "Record bytes answered from the bucket",
           "remote_fetch_bytes_total"),
    Family(COUNTER, "serve_remote_fetch_errors",
           "Reads of the bucket that failed (answered KAFKA_STORAGE_ERROR)",
           "remote_fetch_errors_total"),
    Family(GAUGE, "serve_remote_fetches_in_flight", "Reads of the bucket under way",
           "remote_fetches_in_flight"),
    Family(GAUGE, "serve_remote_cache_bytes",
           "Bytes of the bucket held in serve's read cache (archive.read_cache_bytes)",
           "remote_cache_bytes"),
    Family(COUNTER, "serve_remote_get_requests", "GET requests serve sent to the bucket",
           "remote_get_requests_total"),
    Family(GAUGE, "serve_remote_read_failing",
           "1 while serve's reads of the bucket fail (the last failed, none succeeded since)",
           "remote_read_failing"),
)  # fmt: skip
# serve's sync of the source's group offsets (replicad/leader/source_group_sync.py), when
# `serve:` and groups.enabled.
SERVE_GROUP_SYNC_FAMILIES = (
    Family(GAUGE, "serve_groups_synced", "Source groups whose offsets serve takes",
           "groups_synced"),
    Family(GAUGE, "serve_groups_failed_over",
           "Source groups no longer synced: they are the replica's own", "groups_failed_over"),
    Family(COUNTER, "serve_group_sync_offsets", "Partition offsets synced into serve's groups",
           "offsets_synced_total"),
    Family(GAUGE, "serve_group_sync_lag_seconds",
           "Age of serve's copy of the source's group offsets (since the last sync round)",
           "sync_lag_ms", per=1000.0, optional=True),
    Family(GAUGE, "serve_group_held_back_offsets",
           "Source offsets beyond the replica's high watermark, held there", "held_offsets"),
    Family(COUNTER, "serve_group_sync_errors",
           "Sync rounds or source groups that could not be read", "errors_total"),
)  # fmt: skip
# The group sync (replicad/mirror/group_sync.py), when groups.enabled.
MIRROR_GROUP_FAMILIES = (
    Family(GAUGE, "mirror_groups_synced", "Groups whose offsets the mirror commits",
           "groups_synced"),
    Family(GAUGE, "mirror_groups_failed_over",
           "Groups no longer synced: they had members at the destination", "groups_failed_over"),
    Family(GAUGE, "mirror_group_sync_lag_seconds",
           "Longest wait of a source commit for its destination commit", "sync_lag_ms",
           per=1000.0),
    Family(GAUGE, "mirror_group_held_back_offsets",
           "Source offsets committed beyond the mirrored data, held at its end",
           "held_back_offsets"),
    Family(COUNTER, "mirror_group_commits", "Partition offsets committed at the destination",
           "commits_total"),
    Family(COUNTER, "mirror_group_sync_errors",
           "Group reads or commits that failed (tried again next round)", "sync_errors_total"),
)  # fmt: skip
MIRROR_PARTITION_FAMILIES = (
    Family(GAUGE, "mirror_partition_lag",
           "Offsets below the local high watermark not mirrored yet", "lag", optional=True),
    Family(GAUGE, "mirror_mirrored_offset",
           "Source offset below which everything is mirrored (or skipped)", "mirrored_offset"),
    Family(GAUGE, "mirror_destination_next_offset",
           "Destination offset the next mirrored batch lands at", "destination_next_offset",
           optional=True),
    Family(COUNTER, "mirror_records", "Records mirrored since start", "records_mirrored"),
    Family(COUNTER, "mirror_gap_offsets",
           "Offsets deleted locally before they were mirrored", "gap_offsets"),
    Family(GAUGE, "mirror_offsets_kept",
           "1 while every mirrored record keeps its source offset", "offsets_kept"),
    Family(GAUGE, "mirror_halted", "1 when mirroring this partition halted", "halted"),
)  # fmt: skip


def _labelled(
    families: tuple[Family, ...],
    rows: Iterable[Mapping[str, Any]],
    label_names: list[str],
    labels_of: Callable[[Mapping[str, Any]], list[str]],
) -> list[Metric]:
    """Each family with one sample per row, labelled by `labels_of(row)`."""
    made = [f.kind(_name(f.name), f.help, labels=label_names) for f in families]
    for row in rows:
        labels = labels_of(row)
        for family, metric in zip(families, made, strict=True):
            value = family.value(row)
            if value is not None:
                metric.add_metric(labels, value)
    return made


def _leader_metrics(leaders: list[Mapping[str, Any]]) -> Iterator[Metric]:
    def labels(leader: Mapping[str, Any]) -> list[str]:
        return [str(leader.get("node_id", "")), str(leader.get("address", ""))]

    yield from _labelled(LEADER_FAMILIES, leaders, LEADER_LABELS, labels)
    recoveries = CounterMetricFamily(
        _name("session_recoveries"),
        "Fetch sessions restarted after an error, by the error",
        labels=[*LEADER_LABELS, "reason"],
    )
    for leader in leaders:
        for reason, count in sorted((leader.get("session_recoveries") or {}).items()):
            recoveries.add_metric([*labels(leader), reason], count)
    yield recoveries


def _partition_metrics(partitions: list[Mapping[str, Any]]) -> Iterator[Metric]:
    yield from _labelled(
        PARTITION_FAMILIES,
        partitions,
        ["topic", "partition"],
        lambda part: [str(part["topic"]), str(part["partition"])],
    )


def _topic_metrics(partitions: list[Mapping[str, Any]]) -> Iterator[Metric]:
    sums: dict[str, dict[str, Any]] = {}
    for part in partitions:
        topic = str(part["topic"])
        row = sums.setdefault(
            topic, {"topic": topic, "partitions": 0.0, **dict.fromkeys(TOPIC_SUMS, 0.0)}
        )
        row["partitions"] += 1
        for key in TOPIC_SUMS:
            row[key] += part.get(key, 0)
    rows = [sums[topic] for topic in sorted(sums)]
    yield from _labelled(TOPIC_FAMILIES, rows, ["topic"], lambda row: [row["topic"]])


def _totals_metrics(totals: Mapping[str, Any]) -> Iterator[Metric]:
    yield from (family.single(totals) for family in TOTALS_FAMILIES)
    by_state = GaugeMetricFamily(_name("partitions"), "Partitions by state", labels=["state"])
    for state, count in sorted((totals.get("partitions_by_state") or {}).items()):
        by_state.add_metric([state], count)
    yield by_state


def _memory_pool_metrics(pool: Mapping[str, Any]) -> Iterator[Metric]:
    yield from (family.single(pool) for family in MEMORY_POOL_FAMILIES)


def _serve_metrics(serve: Mapping[str, Any]) -> Iterator[Metric]:
    yield from (family.single(serve) for family in SERVE_FAMILIES)
    by_state = GaugeMetricFamily(
        _name("serve_groups"), "Consumer groups on serve, by state", labels=["state"]
    )
    for state, count in sorted((serve.get("groups") or {}).items()):
        by_state.add_metric([str(state)], float(count))
    yield by_state
    if "remote_fetches_in_flight" in serve:
        yield from (family.single(serve) for family in SERVE_REMOTE_FAMILIES)
    sync = serve.get("group_sync")
    if sync:
        yield from (family.single(sync) for family in SERVE_GROUP_SYNC_FAMILIES)


def _archive_metrics(archive: Mapping[str, Any]) -> Iterator[Metric]:
    row = {
        **archive,
        "retrying": len(archive.get("retrying_partitions") or ()),
        "puts": (archive.get("requests") or {}).get("PUT", 0),
    }
    yield from (family.single(row) for family in ARCHIVE_FAMILIES)


def _verify_metrics(verify: Mapping[str, Any], *, per_partition: bool) -> Iterator[Metric]:
    yield from (family.single(verify) for family in VERIFY_FAMILIES)
    if per_partition:
        yield from _labelled(
            VERIFY_PARTITION_FAMILIES,
            verify.get("partitions") or (),
            ["topic", "partition"],
            lambda part: [str(part["topic"]), str(part["partition"])],
        )


def _mirror_metrics(mirror: Mapping[str, Any], *, per_partition: bool) -> Iterator[Metric]:
    unreachable = mirror.get("problem") and mirror.get("problem_kind") != "refusing"
    totals = {**mirror, "unreachable": 1 if unreachable else 0}
    yield from (family.single(totals) for family in MIRROR_FAMILIES)
    groups = mirror.get("groups") or {}
    if groups.get("enabled"):
        yield from (family.single(groups) for family in MIRROR_GROUP_FAMILIES)
    if not per_partition:
        return
    rows = [
        {**p, "halted": p.get("state") == "halted", "offsets_kept": bool(p.get("offsets_kept"))}
        for p in mirror.get("partitions") or ()
    ]
    yield from _labelled(
        MIRROR_PARTITION_FAMILIES,
        rows,
        ["topic", "partition"],
        lambda part: [str(part["topic"]), str(part["partition"])],
    )
