"""Logging set-up: structlog for replicad's own logs, with the stdlib's routed through it.

One handler on the root logger renders every record, whether it came from a structlog logger
(`get_logger`) or from a library using `logging`, so they all share one format and one level:
- JSON lines (one object per line: timestamp, level, event, logger and the bound fields) when
  the format is `json`, or `auto` and the stream is not a terminal -- what journald and log
  shippers want;
- readable console lines when the format is `console`, or `auto` on a terminal.
Calling `configure_logging` again (on reload) replaces the handler; it never adds a second one.
The level is the root logger's, so a reload that only changes the level takes effect at once.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog
from structlog.typing import Processor

from replicad.clock import wall_ms
from replicad.recent_warnings import LEVELS as LEVELS_REMEMBERED
from replicad.recent_warnings import RECENT

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
FORMATS = ("auto", "json", "console")
# Keys a JSON line starts with, so a person scanning raw lines finds them in one place.
LEADING_KEYS = ("timestamp", "level", "logger", "event")

# The handler this module installed, so reconfiguring replaces it and leaves others alone.
_installed: logging.Handler | None = None


def _shared_processors() -> list[Processor]:
    """What every record gets, whether it came through structlog or the stdlib."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


def _leading_keys_first(
    _logger: object, _method: str, event_dict: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    ordered = {key: event_dict.pop(key) for key in LEADING_KEYS if key in event_dict}
    ordered.update(event_dict)
    return ordered


def _remember_warnings(
    _logger: object, _method: str, event_dict: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Warnings and errors also go to the ring `replicad status` shows."""
    level = str(event_dict.get("level", ""))
    if level in LEVELS_REMEMBERED:
        RECENT.note(
            level,
            str(event_dict.get("logger", "")),
            str(event_dict.get("event", "")),
            event_dict,
            wall_ms(),
        )
    return event_dict


def _renderer(fmt: str, stream: TextIO) -> list[Processor]:
    if fmt == "json" or (fmt == "auto" and not _is_tty(stream)):
        return [
            structlog.processors.format_exc_info,
            _leading_keys_first,
            # str() rather than repr() for values JSON lacks (paths, enums, addresses).
            structlog.processors.JSONRenderer(default=str),
        ]
    return [structlog.dev.ConsoleRenderer(colors=_is_tty(stream))]


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def configure_logging(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Send every log record at `level` or above to `stream` (default stderr) as `fmt`.

    `level` is debug|info|warning|error, `fmt` auto|json|console (case does not matter);
    anything else is a ValueError -- the config has already been validated by then.
    """
    level_number = LEVELS.get(str(level).lower())
    fmt = str(fmt).lower()
    if level_number is None:
        raise ValueError(f"unknown log level {level!r}; expected one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; expected one of {', '.join(FORMATS)}")
    target = stream if stream is not None else sys.stderr

    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_shared_processors(),
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # No caching: a reconfiguration (reload, or a test capturing logs) must reach
        # loggers that were already used. Logging is not on a hot path.
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(target)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*_shared_processors(), structlog.stdlib.ExtraAdder()],
            processors=[
                _remember_warnings,
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                *_renderer(fmt, target),
            ],
        )
    )

    global _installed
    root = logging.getLogger()
    if _installed is not None:
        root.removeHandler(_installed)
        _installed.close()
    root.addHandler(handler)
    root.setLevel(level_number)
    _installed = handler
    logging.captureWarnings(True)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A logger named `name` (use the module's `__name__`); bind fields with `.bind(...)`."""
    logger: structlog.stdlib.BoundLogger = structlog.stdlib.get_logger(name)
    return logger
