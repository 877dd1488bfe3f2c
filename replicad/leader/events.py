"""What clients do to `replicad serve` that an operator should hear of: each kind counted,
and logged as one line at a limited rate.

Rules:
- The kinds are a fixed list (`ServeEvent`): counters and rate-limit keys are never made
  from what a client sent (an api key, a version, a client id, an address), so no client
  can grow the server's state or its metrics with values of its choosing.
- Every event is counted, always (`counters[event.counter]`); the first event of a kind is
  logged at once, then at most one line per kind every `interval_ms`, saying how many were
  held back since (`repeats_suppressed`).
- The line carries the fields of the event that was logged (the peer's address among them);
  the suppressed ones are only counted.
- A peer's bad bytes are warnings, not errors, and never carry a traceback; only
  `UNEXPECTED_ERROR` (a fault of ours) logs one, and at the same limited rate.
- Time is passed in (monotonic ms).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable
from typing import Any

import structlog

from replicad.ratelimit import RateLimitedLog

log = structlog.get_logger("replicad.leader")

# One line a minute per kind, as the follower's repeated warnings.
DEFAULT_INTERVAL_MS = 60_000


class ServeEvent(enum.Enum):
    """(counter name, log level, message) of each kind of event."""

    PROTOCOL_ERROR = (
        "protocol_errors_total",
        "warning",
        "client broke the protocol; connection closed",
    )
    REFUSED_REQUEST = (
        "closed_requests_total",
        "warning",
        "request refused; connection closed",
    )
    IMPLAUSIBLE_REQUEST = (
        "implausible_requests_total",
        "warning",
        "request larger than this replica makes plausible; refused",
    )
    FRAME_TIMEOUT = (
        "frame_timeouts_total",
        "warning",
        "request frame not completed in time; connection closed",
    )
    IDLE_TIMEOUT = ("idle_closed_total", "info", "idle connection closed")
    AUTHENTICATION_TIMEOUT = (
        "authentication_timeouts_total",
        "warning",
        "connection did not authenticate in time; closed",
    )
    AUTHENTICATION_FAILED = (
        "authentication_failures_total",
        "warning",
        "SASL authentication failed; connection closed",
    )
    UNAUTHENTICATED_REQUEST = (
        "unauthenticated_requests_total",
        "warning",
        "request before SASL authentication; connection closed",
    )
    TLS_HANDSHAKE_FAILED = (
        "tls_handshake_failures_total",
        "info",
        "TLS handshake failed; connection closed",
    )
    CONNECTION_LIMIT = (
        "refused_connections_total",
        "warning",
        "connection refused: max_connections reached",
    )
    CONNECTION_LIMIT_PER_IP = (
        "refused_connections_per_ip_total",
        "warning",
        "connection refused: max_connections_per_ip reached for its address",
    )
    OUT_OF_FILE_DESCRIPTORS = (
        "accept_errors_total",
        "error",
        "cannot accept a connection: out of file descriptors",
    )
    REFUSED_FOLLOWER = (
        "refused_followers_total",
        "warning",
        "fetch from a replica id that is not an allowed follower refused",
    )
    THROTTLED = (
        "throttled_responses_total",
        "info",
        "client over its quota; answer throttled and connection muted",
    )
    UNEXPECTED_ERROR = (
        "connection_failures_total",
        "error",
        "connection failed",
    )

    @property
    def counter(self) -> str:
        return self.value[0]

    @property
    def level(self) -> str:
        return self.value[1]

    @property
    def message(self) -> str:
        return self.value[2]


class ServeEvents:
    """Counts and rate-limited lines for `ServeEvent`s (see the module rules)."""

    def __init__(
        self,
        counters: Counter[str],
        *,
        now_ms: Callable[[], int],
        interval_ms: int = DEFAULT_INTERVAL_MS,
    ) -> None:
        self._counters = counters
        self._now_ms = now_ms
        self._said = RateLimitedLog(interval_ms)
        self.lines = 0  # lines logged, for tests and the hostile tool

    def note(self, event: ServeEvent, *, exc_info: bool = False, **fields: Any) -> bool:
        """Count `event`; log it unless its kind was logged within the interval.
        Returns whether a line was written."""
        self._counters[event.counter] += 1
        emit = self._said.should_emit(event, self._now_ms())
        if not emit.emit:
            return False
        self.lines += 1
        say = getattr(log, event.level)
        if emit.suppressed:
            fields["repeats_suppressed"] = emit.suppressed
        if exc_info and event is ServeEvent.UNEXPECTED_ERROR:
            say(event.message, exc_info=True, **fields)
        else:
            say(event.message, **fields)
        return True
