"""tools/peers/process.py: ports, waiting, and peers that never outlive the test run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tools.wait
from tools.peers.process import (
    LOOPBACK,
    PeerError,
    exit_reason,
    free_port,
    kill,
    port_accepts,
    proc_status,
    rss_mib,
    spawn,
    taken_port,
    terminate,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def wait_dead(pid: int) -> bool:
    return bool(tools.wait.wait_until(lambda: not pid_alive(pid), what=f"pid {pid} to end"))


def test_free_port_can_be_bound_and_port_accepts_sees_a_listener() -> None:
    port = free_port()
    assert not port_accepts(port)
    with socket.socket() as server:
        server.bind((LOOPBACK, port))
        server.listen()
        assert port_accepts(port)


def test_a_taken_port_refuses_another_bind_until_the_block_ends() -> None:
    with taken_port() as port:
        assert port_accepts(port)
        with socket.socket() as late, pytest.raises(OSError):
            late.bind((LOOPBACK, port))
    assert not port_accepts(port)


def test_wait_until_returns_the_first_result_that_is_not_none() -> None:
    calls = iter([None, None, "ready"])
    assert wait_until(lambda: next(calls), timeout_s=5, what="x", interval_s=0.01) == "ready"


def test_wait_until_times_out_naming_what_and_the_last_error() -> None:
    def probe() -> None:
        raise ConnectionRefusedError("nope")

    with pytest.raises(PeerError, match=r"the thing: not within 0 s.*nope"):
        wait_until(probe, timeout_s=0.2, what="the thing", interval_s=0.05)


def test_wait_until_stops_at_once_when_the_peer_died() -> None:
    probes: list[int] = []
    with pytest.raises(PeerError, match="peer: exited with code 3"):
        wait_until(
            lambda: probes.append(1),
            timeout_s=3600,
            what="peer",
            alive=lambda: "exited with code 3",
        )
    assert probes == [1]  # asked once, then told the peer is gone: no second try


def test_terminate_reaches_the_whole_process_group() -> None:
    # bash starts a grandchild; ending only bash would leave the sleep behind.
    proc = spawn(["bash", "-c", "sleep 300 & echo $! ; wait"], output=subprocess.PIPE)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    assert pid_alive(grandchild)
    terminate(proc, timeout_s=5)
    assert exit_reason(proc) is not None
    assert wait_dead(grandchild)


def test_kill_returns_the_exit_code_of_a_signalled_peer() -> None:
    proc = spawn(["sleep", "300"])
    assert exit_reason(proc) is None
    assert kill(proc) == -signal.SIGKILL
    assert exit_reason(proc) == f"exited with code {-signal.SIGKILL}"


CHILD = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {root!r})
    from tools.peers.process import spawn
    peer = spawn(["sleep", "300"])
    print(peer.pid, flush=True)
    if sys.argv[1] == "exit":
        sys.exit(0)  # without stopping the peer: atexit must
    time.sleep(300)  # the test SIGKILLs us here: the parent-death signal must
    """
)


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_a_peer_dies_with_the_interpreter_that_spawned_it(how: str) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(root=str(ROOT)), how],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        peer_pid = int(child.stdout.readline())
        if how == "sigkill":
            assert pid_alive(peer_pid)
            child.kill()
        child.wait(timeout=30)
        assert wait_dead(peer_pid), f"peer {peer_pid} outlived its interpreter ({how})"
    finally:
        child.kill()
        child.wait()


def test_proc_status_reads_the_kernels_sizes_and_counts() -> None:
    """VmRSS and VmHWM in kB, Threads a count, as /proc/<pid>/status writes them; a process
    that is not there raises."""
    held = bytearray(16 << 20)  # touched below: resident
    held[::4096] = b"x" * len(held[::4096])
    status = proc_status(os.getpid())
    assert status["VmHWM"] >= status["VmRSS"] >= 16 << 10
    assert status["Threads"] >= 1
    assert rss_mib(os.getpid()) >= 16
    no_such_pid = int(Path("/proc/sys/kernel/pid_max").read_text())  # pids stay below it
    with pytest.raises(OSError):
        proc_status(no_such_pid)
