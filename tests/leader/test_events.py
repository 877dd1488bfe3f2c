"""ServeEvents: every event counted, one line per kind per interval, tracebacks only for
faults of ours."""

from __future__ import annotations

from collections import Counter

import structlog

from replicad.leader.events import ServeEvent, ServeEvents


def test_each_event_is_counted_and_each_kind_logged_once_per_interval() -> None:
    counters: Counter[str] = Counter()
    now = [0]
    events = ServeEvents(counters, now_ms=lambda: now[0], interval_ms=1000)
    with structlog.testing.capture_logs() as lines:
        for _ in range(50):
            events.note(ServeEvent.PROTOCOL_ERROR, peer="a")
        events.note(ServeEvent.FRAME_TIMEOUT, peer="b")
        now[0] = 1000
        events.note(ServeEvent.PROTOCOL_ERROR, peer="c")
    assert counters["protocol_errors_total"] == 51
    assert counters["frame_timeouts_total"] == 1
    assert [(line["event"], line["peer"]) for line in lines] == [
        (ServeEvent.PROTOCOL_ERROR.message, "a"),
        (ServeEvent.FRAME_TIMEOUT.message, "b"),
        (ServeEvent.PROTOCOL_ERROR.message, "c"),
    ]
    assert lines[2]["repeats_suppressed"] == 49
    assert events.lines == 3


def test_only_an_unexpected_error_carries_a_traceback() -> None:
    events = ServeEvents(Counter(), now_ms=lambda: 0)
    with structlog.testing.capture_logs() as lines:
        events.note(ServeEvent.PROTOCOL_ERROR, exc_info=True)
        events.note(ServeEvent.UNEXPECTED_ERROR, exc_info=True)
    assert ["exc_info" in line for line in lines] == [False, True]
    assert [line["log_level"] for line in lines] == ["warning", "error"]


def test_counter_names_are_distinct() -> None:
    names = [event.counter for event in ServeEvent]
    assert len(names) == len(set(names))
