"""How long the event loop went without turning: the watchdog of the loop itself.

Everything replicad does (fetching, the control socket, serve) shares one event loop, so a
call that blocks it (a disk that hangs, a CPU-bound step on a huge answer) stops all of
them at once, and nothing else would say so. A task asks to wake every `interval_ms`;
`tick(now_ms)` is called when it does, and how much later than asked it woke is how long
the loop was blocked. Kept: the longest block since start, and the longest of the current
and the previous window (`window_ms`), so a figure that was high once decays in a minute
or two while the lifetime maximum stays.

Sans-I/O: time is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_INTERVAL_MS = 100
DEFAULT_WINDOW_MS = 60_000


@dataclass(slots=True)
class LoopWatch:
    interval_ms: int = DEFAULT_INTERVAL_MS
    window_ms: int = DEFAULT_WINDOW_MS
    max_block_ms: float = 0.0
    _last_ms: float | None = None
    _window_start_ms: float | None = None
    _window_max_ms: float = 0.0
    _previous_window_max_ms: float = 0.0

    def tick(self, now_ms: float) -> float:
        """The loop woke the watch at `now_ms`; returns how long it was blocked."""
        if self._last_ms is None or self._window_start_ms is None:
            self._last_ms = self._window_start_ms = now_ms
            return 0.0
        blocked = max(0.0, now_ms - self._last_ms - self.interval_ms)
        self._last_ms = now_ms
        if now_ms - self._window_start_ms >= self.window_ms:
            self._previous_window_max_ms = self._window_max_ms
            self._window_max_ms = 0.0
            self._window_start_ms = now_ms
        self._window_max_ms = max(self._window_max_ms, blocked)
        self.max_block_ms = max(self.max_block_ms, blocked)
        return blocked

    @property
    def recent_max_block_ms(self) -> float:
        """The longest block in this window and the one before it."""
        return max(self._window_max_ms, self._previous_window_max_ms)

    def status(self) -> dict[str, float]:
        return {
            "max_block_ms": round(self.max_block_ms, 1),
            "recent_max_block_ms": round(self.recent_max_block_ms, 1),
            "interval_ms": self.interval_ms,
        }
