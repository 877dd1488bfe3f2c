"""A status snapshot in the shape the daemon's `snapshot()` (replicad/daemon.py) produces, for
the tests of what reads one: `replicad status`'s view, the Prometheus metrics and the control
server. One home for the shape: a field the daemon adds is added here once."""

from __future__ import annotations

from typing import Any


def status_snapshot(
    *,
    totals: dict[str, Any],
    leaders: list[dict[str, Any]],
    partitions: list[dict[str, Any]],
    **extra: Any,
) -> dict[str, Any]:
    """A ready daemon of pid 123, up 12.5 s, replicating from h:9092; `extra` adds or
    replaces top-level sections (serve, mirror, archive, verify, ...)."""
    return {
        "version": "0.1.0",
        "pid": 123,
        "uptime_s": 12.5,
        "ready": True,
        "data_dir": "/var/lib/replicad/data",
        "source": ["h:9092"],
        "totals": totals,
        "leaders": leaders,
        "partitions": partitions,
        "serve": None,
        **extra,
    }


def leader_entry(**fields: Any) -> dict[str, Any]:
    """Leader 1 at h:9092 with a fetch session, no errors; `fields` on top."""
    return {
        "node_id": 1,
        "address": "h:9092",
        "session_id": 123,
        "epoch": 5,
        "sessionful": True,
        "bytes_per_s": 1.0e6,
        "requests": 100,
        "errors": 0,
        "last_error": None,
        **fields,
    }


def partition_entry(topic: str, number: int, end: int, high: int, **fields: Any) -> dict[str, Any]:
    """A fetching partition of leader 1 whose local log ends at `end`, the leader's high
    watermark at `high`; `fields` on top."""
    return {
        "topic": topic,
        "partition": number,
        "leader": 1,
        "log_start_offset": 0,
        "log_end_offset": end,
        "high_watermark": high,
        "lag": high - end,
        "state": "fetching",
        "last_error": None,
        "bytes_replicated": 0,
        "crc_failures": 0,
        **fields,
    }
