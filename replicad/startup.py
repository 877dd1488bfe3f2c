"""Stop signals that arrive before a daemon's event loop takes them over.

`replicad run` and `replicad serve` spend their first second importing and setting up;
Python's default SIGTERM disposition would kill them there (exit 143), so a
`systemctl stop` or `restart` during a slow start, or a supervisor that stops what it just
started, would see a failed stop. `catch_early_stop` is the first thing `main` does for
those commands: a SIGTERM or SIGINT from then on is only recorded, and the daemon, once its
loop handles signals itself, asks `early_stop_signal` and shuts down cleanly (exit 0).

Kept free of imports beyond `signal`, so installing it costs nothing.
"""

from __future__ import annotations

import signal
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_received: int | None = None


def _record(signum: int, _frame: FrameType | None) -> None:
    global _received
    if _received is None:
        _received = signum


def catch_early_stop() -> None:
    """From now on, SIGTERM/SIGINT only record that a stop was asked for."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _record)


def early_stop_signal() -> signal.Signals | None:
    """The first stop signal caught by `catch_early_stop`, if any."""
    return None if _received is None else signal.Signals(_received)
