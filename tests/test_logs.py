from __future__ import annotations

import io
import json
import logging
import re
import warnings
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import structlog

from replicad.logs import configure_logging, get_logger

ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Terminal(io.StringIO):
    """A stream that says it is a TTY, as stderr does in an interactive shell."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()


def json_lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_timestamp_level_event_logger_and_fields() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    get_logger("replicad.follower").info("fetched", partition="orders-3", bytes=512)
    (line,) = json_lines(stream)
    assert line["event"] == "fetched"
    assert line["level"] == "info"
    assert line["logger"] == "replicad.follower"
    assert (line["partition"], line["bytes"]) == ("orders-3", 512)
    stamp = datetime.fromisoformat(str(line["timestamp"]))
    assert stamp.utcoffset() is not None and stamp.utcoffset().total_seconds() == 0
    assert list(line)[:4] == ["timestamp", "level", "logger", "event"]


def test_bound_and_context_fields_and_values_json_lacks() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    structlog.contextvars.bind_contextvars(leader="broker-1:9092")
    get_logger("replicad.log").bind(data_dir=Path("/srv/data")).warning("disk nearly full")
    (line,) = json_lines(stream)
    assert line["leader"] == "broker-1:9092"
    assert line["data_dir"] == "/srv/data"
    assert line["level"] == "warning"


def test_stdlib_logging_goes_through_the_same_renderer() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    logging.getLogger("asyncio").warning("slow %s: %d ms", "callback", 250, extra={"task": "t1"})
    (line,) = json_lines(stream)
    assert line["event"] == "slow callback: 250 ms"
    assert line["logger"] == "asyncio"
    assert line["level"] == "warning"
    assert line["task"] == "t1"
    assert "timestamp" in line


def test_exceptions_become_one_json_line_with_the_traceback() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    try:
        raise ValueError("bad batch")
    except ValueError:
        get_logger("replicad").exception("append failed", offset=42)
    (line,) = json_lines(stream)
    assert line["event"] == "append failed"
    assert line["level"] == "error"
    assert "ValueError: bad batch" in str(line["exception"])


@pytest.mark.parametrize(
    ("level", "shown"),
    [
        ("debug", ["d", "i", "w", "e", "stdlib-d", "stdlib-w"]),
        ("info", ["i", "w", "e", "stdlib-w"]),
        ("WARNING", ["w", "e", "stdlib-w"]),
        ("error", ["e"]),
    ],
)
def test_level_filters_both_structlog_and_stdlib(level: str, shown: list[str]) -> None:
    stream = io.StringIO()
    configure_logging(level, "json", stream)
    log = get_logger("replicad.test")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    logging.getLogger("lib").debug("stdlib-d")
    logging.getLogger("lib").warning("stdlib-w")
    assert [line["event"] for line in json_lines(stream)] == [
        event for event in ["d", "i", "w", "e", "stdlib-d", "stdlib-w"] if event in shown
    ]


def test_auto_writes_json_when_not_on_a_terminal() -> None:
    stream = io.StringIO()
    configure_logging("info", "auto", stream)
    get_logger("replicad").info("started", partitions=24)
    assert json_lines(stream)[0]["partitions"] == 24


def test_auto_writes_readable_lines_on_a_terminal() -> None:
    stream = Terminal()
    configure_logging("info", "auto", stream)
    get_logger("replicad").info("started", partitions=24)
    text = ANSI.sub("", stream.getvalue())
    assert not text.lstrip().startswith("{")
    assert "started" in text
    assert "partitions=24" in text
    assert "[replicad]" in text
    assert ANSI.search(stream.getvalue()), "a terminal gets colours"


def test_console_forced_onto_a_pipe_has_no_colour_codes() -> None:
    stream = io.StringIO()
    configure_logging("info", "console", stream)
    get_logger("replicad").info("started", partitions=24)
    text = stream.getvalue()
    assert "partitions=24" in text
    assert not ANSI.search(text)


def test_reconfiguring_replaces_the_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "json", first)
    configure_logging("debug", "json", second)
    get_logger("replicad").debug("once")
    assert first.getvalue() == ""
    assert [line["event"] for line in json_lines(second)] == ["once"]


def test_python_warnings_are_logged() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("old option", DeprecationWarning, stacklevel=1)
    (line,) = json_lines(stream)
    assert line["logger"] == "py.warnings"
    assert "old option" in str(line["event"])


@pytest.mark.parametrize(("level", "fmt"), [("verbose", "json"), ("info", "xml")])
def test_unknown_level_or_format_is_refused(level: str, fmt: str) -> None:
    with pytest.raises(ValueError, match="unknown log"):
        configure_logging(level, fmt, io.StringIO())
