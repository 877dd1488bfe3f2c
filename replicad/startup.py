"""The daemons' signals, in one place: those that arrive before a daemon's event loop takes
them over, and the loop's own handlers after.

`replicad run` and `replicad serve` spend their first second importing and setting up;
Python's default SIGTERM disposition would kill them there (exit 143), so a
`systemctl stop` or `restart` during a slow start, or a supervisor that stops what it just
started, would see a failed stop. `catch_early_stop` is the first thing `main` does for
those commands: a SIGTERM or SIGINT from then on is only recorded, and the daemon, once its
loop handles signals itself, asks `early_stop_signal` and shuts down cleanly (exit 0).

`LoopSignals` is the loop's part, the same for `replicad run` and `replicad serve`: SIGTERM
and SIGINT call the daemon's stop, SIGHUP its reload (run only); `install` says whether a
stop came early, `remove` gives the signals back when the daemon is done.

`keep_test_libraries_out`, called first by every command run as a process of its own, keeps
it free of what only tests use, so that a daemon measured in the test venv is the one users
run (and a one-shot command does not pay hypothesis's import).

`keep_tls_out`, called by `replicad run` once its config is read and before asyncio is
imported, keeps ssl (and with it OpenSSL) out of a follower that no configured part could
use it for; `let_tls_in` undoes it for a reload's new config.

Kept free of imports beyond `signal`, `sys` and `contextlib`, so installing it costs nothing.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_received: int | None = None


def _record(signum: int, _frame: FrameType | None) -> None:
    global _received
    if _received is None:
        _received = signum


def keep_test_libraries_out() -> None:
    """A replicad process never imports hypothesis, even where it is installed (a test venv).

    kio imports `hypothesis.strategies` whenever it can, to offer strategies for its
    types to tests; the daemon never uses them. Where the test extra is installed that
    import alone costs ~9 MiB of RSS and ~0.2 s of start-up, so a daemon measured in the
    test venv would not be the daemon users run (installed without it). Only for a
    process of its own: a process that has imported hypothesis already keeps it.
    """
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]


def keep_tls_out(config: Any) -> bool:
    """Leave ssl unloaded when nothing `config` (a replicad.config.Config) turns on can use
    TLS; returns whether it was left out.

    asyncio imports ssl whenever it can, and ssl brings OpenSSL: about 4 MiB of RSS in a
    follower that connects in plaintext, a tenth of what issue 32 allows a 10,000-partition
    follower beyond its fetch buffers. Left out only for what cannot change without a
    restart (the source's security, SASL among it, serve, the mirror, the archive, the
    metrics endpoint: daemon.py's `_restart_needed`), and only where ssl is not loaded
    yet. What uses TLS
    imports ssl where it does (replicad.config.tls); replicad.protocol.security tells ssl's
    errors apart without loading it.
    """
    protocol = config.source.security.protocol
    uses_tls = (
        protocol.uses_tls
        # SCRAM's library (scramp) imports ssl for channel binding, over plaintext too.
        or protocol.uses_sasl
        or config.serve is not None  # its listener may be TLS; its modules import ssl
        or config.mirror is not None  # the destination's own security
        or config.archive is not None  # an object store over https
        or config.control.metrics_listen is not None  # prometheus_client imports ssl
    )
    if uses_tls or "ssl" in sys.modules:
        return False
    sys.modules["ssl"] = None  # type: ignore[assignment]  # `import ssl` now fails at once
    return True


def let_tls_in() -> None:
    """ssl may be imported again (a reload's config may name TLS files, which the config's
    own check loads). A running follower left out by `keep_tls_out` still makes no TLS
    connection: everything that would takes effect only after a restart."""
    if "ssl" in sys.modules and sys.modules["ssl"] is None:
        del sys.modules["ssl"]


def catch_early_stop() -> None:
    """From now on, SIGTERM/SIGINT only record that a stop was asked for."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _record)


def early_stop_signal() -> signal.Signals | None:
    """The first stop signal caught by `catch_early_stop`, if any."""
    return None if _received is None else signal.Signals(_received)


class LoopSignals:
    """The running loop's signal handlers for one daemon run."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_stop: Callable[[signal.Signals], None],
        *,
        on_reload: Callable[[], None] | None = None,
    ) -> None:
        self._loop = loop
        self._handlers: dict[signal.Signals, Callable[[], None]] = {
            signum: (lambda signum=signum: on_stop(signum)) for signum in STOP_SIGNALS
        }
        if on_reload is not None:
            self._handlers[signal.SIGHUP] = on_reload
        # Each signal handled, with its disposition before (given back by `remove`).
        self._installed: list[tuple[signal.Signals, Any]] = []

    def install(self) -> signal.Signals | None:
        """Handle the signals on the loop from now on; the stop signal caught before (the
        daemon stops at once, cleanly), if any. Where the loop cannot handle signals (not
        the main thread), the daemon runs without."""
        for signum, handler in self._handlers.items():
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                before = signal.getsignal(signum)
                self._loop.add_signal_handler(signum, handler)
                self._installed.append((signum, before))
        return early_stop_signal()

    def remove(self) -> None:
        """Give the signals back as they were before `install`: the loop's removal sets
        the default disposition, which for a SIGHUP ignored by its parent (nohup, a
        supervisor) would make a later hang-up kill the process."""
        for signum, before in self._installed:
            self._loop.remove_signal_handler(signum)
            if before is not None:
                signal.signal(signum, before)
        self._installed.clear()
