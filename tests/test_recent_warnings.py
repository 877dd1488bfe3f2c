"""The ring of recent distinct warnings `replicad status` shows."""

from __future__ import annotations

import io

import structlog

from replicad.logs import configure_logging
from replicad.recent_warnings import FIELDS_CHARS, RECENT, RecentWarnings


def test_repeats_count_up_and_the_newest_comes_first() -> None:
    ring = RecentWarnings(keep=3)
    ring.note("warning", "a", "leader connection failed", {"leader": "1"}, now_ms=1)
    ring.note("error", "b", "append failed", {"tp": "t-0"}, now_ms=2)
    ring.note("warning", "a", "leader connection failed", {"leader": "2"}, now_ms=3)
    latest = ring.latest()
    assert [w["event"] for w in latest] == ["leader connection failed", "append failed"]
    assert latest[0]["count"] == 2 and latest[0]["first_ms"] == 1 and latest[0]["last_ms"] == 3
    assert latest[0]["fields"] == "leader=2"


def test_info_is_not_kept_and_the_ring_is_bounded() -> None:
    ring = RecentWarnings(keep=3)
    ring.note("info", "a", "replicating", {}, now_ms=1)
    assert ring.latest() == []
    for i in range(10):
        ring.note("warning", "a", f"event {i}", {"x": "y" * 10_000}, now_ms=i)
    latest = ring.latest(n=10)
    assert [w["event"] for w in latest] == ["event 9", "event 8", "event 7"]
    assert all(len(w["fields"]) <= FIELDS_CHARS for w in latest)


def test_the_daemons_logging_feeds_the_ring() -> None:
    RECENT.clear()
    configure_logging("info", "json", stream=io.StringIO())
    log = structlog.get_logger("replicad.test")
    log.info("all is well")
    log.warning("topic not found on the source cluster", topic="ordrs")
    log.warning("topic not found on the source cluster", topic="ordrs")
    latest = RECENT.latest()
    assert len(latest) == 1
    assert latest[0]["event"] == "topic not found on the source cluster"
    assert latest[0]["count"] == 2 and latest[0]["fields"] == "topic=ordrs"
    RECENT.clear()
