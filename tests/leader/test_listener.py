"""serve's listener: refused connections closed the moment they are accepted, admitted ones
handed on, accept() out of descriptors reported once and rested (replicad/leader/listener.py)."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from replicad.leader import listener as listener_module
from replicad.leader.listener import Listener, bind_listening
from tools.wait import DEADLINE_S, until


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_refused_connection_is_closed_before_the_next_is_accepted() -> None:
    """A flood from another process, every connection refused: at each decision this
    process holds the listener's descriptors and the one socket being judged, never a
    backlog of accepted sockets waiting for a task (asyncio's own server holds up to 100)."""
    flood = 300
    seen: list[int] = []

    def refuse(_peer: tuple[str, int]) -> bool:
        seen.append(open_fds())
        return False

    listener = Listener(
        bind_listening("127.0.0.1", 0),
        admit=refuse,
        connected=lambda conn, _peer: pytest.fail("a refused connection was handed on"),
        failed=lambda exc: pytest.fail(f"accept failed: {exc}"),
    )
    baseline = open_fds()
    listener.start()
    try:
        client = subprocess.Popen(
            [
                sys.executable,
                "-c",
                textwrap.dedent(
                    f"""
                    import socket, sys
                    socks = []
                    for _ in range({flood}):
                        s = socket.socket()
                        s.settimeout(30)
                        s.connect(("127.0.0.1", {listener.port}))
                        socks.append(s)
                    closed = sum(s.recv(1) == b"" for s in socks)
                    sys.exit(0 if closed == {flood} else 1)
                    """
                ),
            ]
        )
        await until(lambda: client.poll() is not None, what="the flood client to end")
        assert client.returncode == 0, "a refused connection was not closed"
    finally:
        listener.close()
    assert len(seen) == flood
    assert max(seen) <= baseline + 1, (baseline, max(seen))


async def test_an_admitted_connection_is_handed_on_and_reads_what_the_client_sent() -> None:
    handed: asyncio.Queue[tuple[socket.socket, tuple[str, int]]] = asyncio.Queue()
    asked: list[tuple[str, int]] = []

    def admit(peer: tuple[str, int]) -> bool:
        asked.append(peer)
        return True

    listener = Listener(
        bind_listening("127.0.0.1", 0),
        admit=admit,
        connected=lambda conn, peer: handed.put_nowait((conn, peer)),
        failed=lambda exc: pytest.fail(f"accept failed: {exc}"),
    )
    listener.start()
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"hello")
        await writer.drain()
        async with asyncio.timeout(DEADLINE_S):
            conn, peer = await handed.get()
        with conn:
            assert not conn.getblocking()
            assert peer == asked[0] == writer.get_extra_info("sockname")
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(DEADLINE_S):
                assert await loop.sock_recv(conn, 5) == b"hello"
        writer.close()
    finally:
        listener.close()


class _OutOfDescriptors:
    """A listening socket whose accept() fails as a process out of descriptors does, on a
    real descriptor the loop can watch (a socket pair kept readable)."""

    def __init__(self) -> None:
        self.readable, self.other = socket.socketpair()
        self.other.send(b"x")
        self.accepts = 0

    def fileno(self) -> int:
        return self.readable.fileno()

    def accept(self) -> tuple[socket.socket, object]:
        self.accepts += 1
        raise OSError(errno.EMFILE, "Too many open files")

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", 0)

    def close(self) -> None:
        self.readable.close()
        self.other.close()


async def test_accept_out_of_descriptors_is_reported_once_and_rests_before_it_tries_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(listener_module, "ACCEPT_PAUSE_S", 0.2)
    sock = _OutOfDescriptors()
    failures: list[OSError] = []
    listener = Listener(
        [sock],  # type: ignore[list-item]
        admit=lambda _peer: pytest.fail("nothing was accepted"),
        connected=lambda conn, _peer: pytest.fail("nothing was accepted"),
        failed=failures.append,
    )
    listener.start()
    try:
        await until(lambda: sock.accepts >= 1, what="a first accept")
        # Readable all along: without the rest, each of these turns of the loop would call
        # accept() again.
        for _ in range(20):
            await asyncio.sleep(0)
        assert sock.accepts == 1 and [f.errno for f in failures] == [errno.EMFILE]
        await until(lambda: sock.accepts >= 2, what="accept tried again after its rest")
    finally:
        listener.close()


def test_every_address_of_a_name_is_bound_on_one_port() -> None:
    addresses = {info[4][0] for info in socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM)}
    sockets = bind_listening("localhost", 0)
    try:
        assert {s.getsockname()[0] for s in sockets} == addresses
        assert len({s.getsockname()[1] for s in sockets}) == 1
        assert all(not s.getblocking() for s in sockets)
    finally:
        for s in sockets:
            s.close()
