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
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
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


def _leader_metrics(leaders: list[Mapping[str, Any]]) -> Iterator[Metric]:
    requests = CounterMetricFamily(
        _name("fetch_requests"), "Fetch requests sent to the leader", labels=LEADER_LABELS
    )
    errors = CounterMetricFamily(
        _name("fetch_errors"), "Failed fetches and error responses", labels=LEADER_LABELS
    )
    latency = GaugeMetricFamily(
        _name("fetch_latency_seconds"),
        "Round trip of the last fetch to the leader",
        labels=LEADER_LABELS,
    )
    rate = GaugeMetricFamily(
        _name("leader_bytes_per_second"),
        "Record bytes replicated from the leader per second",
        labels=LEADER_LABELS,
    )
    partitions = GaugeMetricFamily(
        _name("leader_partitions"), "Partitions fetched from the leader", labels=LEADER_LABELS
    )
    sessionful = GaugeMetricFamily(
        _name("fetch_session_active"),
        "1 while an incremental fetch session (KIP-227) is open with the leader",
        labels=LEADER_LABELS,
    )
    recoveries = CounterMetricFamily(
        _name("session_recoveries"),
        "Fetch sessions restarted after an error, by the error",
        labels=[*LEADER_LABELS, "reason"],
    )
    for leader in leaders:
        labels = [str(leader.get("node_id", "")), str(leader.get("address", ""))]
        requests.add_metric(labels, leader.get("requests", 0))
        errors.add_metric(labels, leader.get("errors", 0))
        if leader.get("last_fetch_latency_ms") is not None:
            latency.add_metric(labels, leader["last_fetch_latency_ms"] / MS_PER_S)
        rate.add_metric(labels, leader.get("bytes_per_s", 0))
        partitions.add_metric(labels, leader.get("partitions", 0))
        sessionful.add_metric(labels, 1 if leader.get("sessionful") else 0)
        for reason, count in sorted((leader.get("session_recoveries") or {}).items()):
            recoveries.add_metric([*labels, reason], count)
    yield from (requests, errors, latency, rate, partitions, sessionful, recoveries)


def _partition_metrics(partitions: list[Mapping[str, Any]]) -> Iterator[Metric]:
    labels = ["topic", "partition"]
    lag = GaugeMetricFamily(
        _name("partition_lag"), "Leader high watermark minus local log end", labels=labels
    )
    end = GaugeMetricFamily(
        _name("partition_log_end_offset"), "Local log end offset", labels=labels
    )
    high = GaugeMetricFamily(
        _name("partition_high_watermark"), "Leader's high watermark, last seen", labels=labels
    )
    replicated = CounterMetricFamily(
        _name("partition_bytes_replicated"), "Record bytes appended locally", labels=labels
    )
    crc = CounterMetricFamily(
        _name("partition_crc_failures"), "Fetched batches that failed the CRC", labels=labels
    )
    for part in partitions:
        key = [str(part["topic"]), str(part["partition"])]
        lag.add_metric(key, part.get("lag", 0))
        end.add_metric(key, part.get("log_end_offset", 0))
        high.add_metric(key, part.get("high_watermark", 0))
        replicated.add_metric(key, part.get("bytes_replicated", 0))
        crc.add_metric(key, part.get("crc_failures", 0))
    yield from (lag, end, high, replicated, crc)


def _topic_metrics(partitions: list[Mapping[str, Any]]) -> Iterator[Metric]:
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for part in partitions:
        topic = sums[str(part["topic"])]
        topic["partitions"] += 1
        topic["lag"] += part.get("lag", 0)
        topic["bytes_replicated"] += part.get("bytes_replicated", 0)
        topic["crc_failures"] += part.get("crc_failures", 0)
    count = GaugeMetricFamily(_name("topic_partitions"), "Partitions replicated", labels=["topic"])
    lag = GaugeMetricFamily(
        _name("topic_lag"), "Sum of the topic's partition lags", labels=["topic"]
    )
    replicated = CounterMetricFamily(
        _name("topic_bytes_replicated"), "Record bytes appended locally", labels=["topic"]
    )
    crc = CounterMetricFamily(
        _name("topic_crc_failures"), "Fetched batches that failed the CRC", labels=["topic"]
    )
    for topic, values in sorted(sums.items()):
        count.add_metric([topic], values["partitions"])
        lag.add_metric([topic], values["lag"])
        replicated.add_metric([topic], values["bytes_replicated"])
        crc.add_metric([topic], values["crc_failures"])
    yield from (count, lag, replicated, crc)


def _totals_metrics(totals: Mapping[str, Any]) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        _name("leaders"), "Leaders fetched from", value=totals.get("leaders", 0)
    )
    by_state = GaugeMetricFamily(_name("partitions"), "Partitions by state", labels=["state"])
    for state, count in sorted((totals.get("partitions_by_state") or {}).items()):
        by_state.add_metric([state], count)
    yield by_state
    yield GaugeMetricFamily(_name("lag"), "Sum of all partition lags", value=totals.get("lag", 0))
    yield CounterMetricFamily(
        _name("bytes_replicated"),
        "Record bytes appended locally",
        value=totals.get("bytes_replicated", 0),
    )
    yield GaugeMetricFamily(
        _name("bytes_per_second"),
        "Record bytes replicated per second",
        value=totals.get("bytes_per_s", 0),
    )
    yield CounterMetricFamily(
        _name("crc_failures"),
        "Fetched batches that failed the CRC",
        value=totals.get("crc_failures", 0),
    )


def _memory_pool_metrics(pool: Mapping[str, Any]) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        _name("memory_pool_capacity_bytes"),
        "Bound on fetch-response memory across all leaders (KIP-81)",
        value=pool.get("capacity", 0),
    )
    yield GaugeMetricFamily(
        _name("memory_pool_used_bytes"),
        "Fetch-response memory in use",
        value=pool.get("used", 0),
    )
    # The high-water mark shows how close the bound came to binding; waits, that it did.
    yield GaugeMetricFamily(
        _name("memory_pool_peak_bytes"),
        "Most fetch-response memory ever in use at once since start",
        value=pool.get("peak", 0),
    )
    yield CounterMetricFamily(
        _name("memory_pool_waits"),
        "Fetch responses that waited for room in the memory pool",
        value=pool.get("waits", 0),
    )


def _serve_metrics(serve: Mapping[str, Any]) -> Iterator[Metric]:
    # Kafka's names: NumIncrementalFetchSessions, NumIncrementalFetchPartitionsCached,
    # IncrementalFetchSessionEvictionsPerSec (a rate there; a counter here, rate() it).
    yield GaugeMetricFamily(
        _name("serve_incremental_fetch_sessions"),
        "Incremental fetch sessions in the session cache",
        value=serve.get("sessions", 0),
    )
    yield GaugeMetricFamily(
        _name("serve_incremental_fetch_partitions_cached"),
        "Partitions held by all cached fetch sessions",
        value=serve.get("partitions_cached", 0),
    )
    yield CounterMetricFamily(
        _name("serve_incremental_fetch_session_evictions"),
        "Fetch sessions evicted from the session cache",
        value=serve.get("evictions_total", 0),
    )
