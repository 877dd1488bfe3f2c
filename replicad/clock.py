"""The process's two clocks, in whole milliseconds: the one place a shell reads the time.

Rules:
- `monotonic_ms` measures intervals, deadlines and back-off: it never jumps. It is what
  a sans-I/O core is handed as `now_ms`.
- `wall_ms` is what a record, a log segment, a status line or a "since" stamp carries: it
  can jump with the system clock, so nothing is timed with it.
- Cores never import this module (tools/layers.py keeps them from `time` and from here);
  the shell that drives a core reads a clock here and passes the value in.
"""

from __future__ import annotations

import time


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def wall_ms() -> int:
    return time.time_ns() // 1_000_000
