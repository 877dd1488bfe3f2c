"""The last few distinct warnings and errors the daemon logged, with counts, for
`replicad status` (an operator sees what went wrong without reading the journal).

Rules:
- A warning is known by (level, logger, event): repeats of one only count up and refresh
  its last time and fields, so a storm of one kind cannot push the others out.
- At most `keep` distinct warnings are held; the one heard of least recently goes first.
- Fields are kept as a short text (first few key=value pairs, cut at `FIELDS_CHARS`), so
  the ring's memory is bounded whatever a peer makes us log.
- Time is passed in (wall ms, shown to people).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KEEP = 20
SHOWN = 5
FIELDS_CHARS = 300
LEVELS = frozenset({"warning", "error", "critical"})
# Fields every record has; the rest say what happened.
_SKIPPED = frozenset(
    {"event", "level", "logger", "timestamp", "exc_info", "_record", "_from_structlog"}
)


@dataclass(slots=True)
class SeenWarning:
    level: str
    logger: str
    event: str
    count: int
    first_ms: int
    last_ms: int
    fields: str

    def as_dict(self) -> dict[str, Any]:
        # log-fields-ok: the status view of a warning, never logged
        return {
            "level": self.level,
            "logger": self.logger,
            "event": self.event,
            "count": self.count,
            "first_ms": self.first_ms,
            "last_ms": self.last_ms,
            "fields": self.fields,
        }


class RecentWarnings:
    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        self._seen: OrderedDict[tuple[str, str, str], SeenWarning] = OrderedDict()

    def note(
        self, level: str, logger: str, event: str, fields: Mapping[str, Any], now_ms: int
    ) -> None:
        if level not in LEVELS:
            return
        key = (level, logger, event)
        text = _fields_text(fields)
        seen = self._seen.pop(key, None)
        if seen is None:
            seen = SeenWarning(level, logger, event, 0, now_ms, now_ms, text)
        seen.count += 1
        seen.last_ms = now_ms
        seen.fields = text
        self._seen[key] = seen
        while len(self._seen) > self._keep:
            self._seen.popitem(last=False)

    def latest(self, n: int = SHOWN) -> list[dict[str, Any]]:
        """The `n` heard of most recently, newest first."""
        return [w.as_dict() for w in reversed(list(self._seen.values())[-n:])]

    def clear(self) -> None:
        self._seen.clear()


def _fields_text(fields: Mapping[str, Any]) -> str:
    parts = []
    size = 0
    for key, value in fields.items():
        if key in _SKIPPED or key.startswith("_"):
            continue
        part = f"{key}={value}"
        parts.append(part)
        size += len(part) + 1
        if size >= FIELDS_CHARS:
            break
    text = " ".join(parts)
    return text if len(text) <= FIELDS_CHARS else text[: FIELDS_CHARS - 1] + "…"


# The daemon's own ring, fed by its logging (replicad/logs.py).
RECENT = RecentWarnings()
