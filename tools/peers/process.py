"""Child processes of the peer harness: free ports, spawning, never leaking a broker, and
what /proc says of a process (`proc_status`, `rss_mib`).

Every peer (the Kafka JVM, Tansu) is started through `spawn`, which puts it in a
process group of its own and registers it, so that

- `terminate`/`kill` reach the whole group (a JVM's helper processes included);
- an interpreter that exits normally, or by an uncaught exception, kills every
  peer still registered (atexit);
- an interpreter that is killed outright (SIGKILL, OOM killer) takes its peers
  with it: on Linux the child gets PR_SET_PDEATHSIG=SIGKILL. The kernel sends
  that signal when the *thread* that spawned the child ends, so it is only set
  when spawning from the main thread; a peer spawned from another thread relies
  on atexit alone.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, TypeVar

LOOPBACK = "127.0.0.1"
# linux/prctl.h
_PR_SET_PDEATHSIG = 1

T = TypeVar("T")


class PeerError(RuntimeError):
    """A real peer could not be set up, started, reached or stopped."""


class PeerNotInstalledError(PeerError):
    """What a peer needs is not on this machine; the message says which command installs it."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it).

    Another process may take it before the caller binds it; callers that can
    tell a bind failure retry with a new port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that a listening socket holds while the block runs: what a peer
    whose first bind must fail meets (the tests of its retry with another port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def port_accepts(port: int, host: str = LOOPBACK, timeout_s: float = 0.5) -> bool:
    """Whether something accepts TCP connections on host:port right now."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_until(
    probe: Callable[[], T | None],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.1,
    alive: Callable[[], str | None] | None = None,
) -> T:
    """Call `probe` until it returns something other than None, or raise PeerError.

    `alive` is asked between tries; when it returns a reason (e.g. "exited with
    code 1") waiting stops at once instead of running out the timeout.
    """
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            result = probe()
        except Exception as exc:  # the probe talks to a peer that may not be up yet
            last_error = exc
            result = None
        if result is not None:
            return result
        if alive is not None:
            reason = alive()
            if reason is not None:
                raise PeerError(f"{what}: {reason}")
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise PeerError(f"{what}: not within {timeout_s:.0f} s{detail}")
        time.sleep(interval_s)


_live: set[subprocess.Popen[bytes]] = set()
_live_lock = threading.Lock()


def proc_status(pid: int) -> dict[str, int]:
    """The numbers of /proc/<pid>/status as the kernel writes them: VmRSS, VmHWM, RssAnon
    and the other sizes in kB, Threads a count. OSError once the process is gone."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        value = rest.split()
        if value and value[0].isdigit():
            found[key] = int(value[0])
    return found


def rss_mib(pid: int) -> float:
    """The process's resident set now (VmRSS), in MiB; OSError once it is gone."""
    return proc_status(pid).get("VmRSS", 0) / 1024


def _set_parent_death_signal() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def dies_with_us() -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel SIGKILL the child when this process dies (see the
    module doc: Linux, and only from the main thread), or None where it cannot."""
    tied = sys.platform == "linux" and threading.current_thread() is threading.main_thread()
    return _set_parent_death_signal if tied else None


def spawn(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    output: IO[bytes] | int | None = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    """Start a peer in its own process group; see the module doc for how it is reaped."""
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=dies_with_us(),
    )
    with _live_lock:
        _live.add(proc)
    return proc


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    # The child leads its own session, so its pid is its process-group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _forget(proc: subprocess.Popen[bytes]) -> None:
    with _live_lock:
        _live.discard(proc)


def kill(proc: subprocess.Popen[bytes]) -> int:
    """SIGKILL the peer's process group and reap it; returns its exit code."""
    _signal_group(proc, signal.SIGKILL)
    code = proc.wait()
    _forget(proc)
    return code


def terminate(proc: subprocess.Popen[bytes], *, timeout_s: float) -> int:
    """SIGTERM the peer's group, wait up to `timeout_s`, then SIGKILL; returns the exit code."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)
    return kill(proc)


def exit_reason(proc: subprocess.Popen[bytes]) -> str | None:
    """None while the peer runs; a sentence once it has exited."""
    code = proc.poll()
    if code is None:
        return None
    return f"exited with code {code}"


@atexit.register
def _kill_all_live() -> None:
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        kill(proc)
