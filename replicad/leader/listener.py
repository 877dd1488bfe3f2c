"""The listening sockets of `replicad serve`: it accepts connections itself, so that one over
the connection limits is closed the moment it is accepted.

Rules:
- Each accepted socket is judged (`admit`) before anything else is made for it. Refused, it
  is closed there and then; admitted, it is handed on (`connected`) and its slot is the
  caller's to count. The descriptors the listener holds are the admitted connections'
  plus, for an instant, one.
- Why not asyncio's own server: it accepts up to its backlog (100) sockets each time the
  listening socket is readable and closes none of them before a task has run for each. A
  flood of connections past the limit then held hundreds of descriptors for a few loop
  turns, which on a loaded machine reached the open-file limit the connection limit keeps
  clear of: accept() failed, and so did a consumer's Fetch opening a segment (EMFILE; CI,
  2026-11-27).
- At most ACCEPT_BURST sockets are accepted each time a listening socket is readable, so a
  flood takes turns with the connections already served.
- accept() failing for want of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) is
  reported (`failed`) and the listening socket is not read for ACCEPT_PAUSE_S: the same
  failure again at once would only repeat (asyncio's own server waits a second too). Any
  other accept() error (a client that reset before it was accepted) drops that one.
- Several addresses (a host name with an IPv4 and an IPv6 address) are each bound, on one
  port: the first's, when the port asked is 0.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable

# Sockets accepted each time a listening socket is readable.
ACCEPT_BURST = 64
# How long accept() rests after it failed for want of descriptors or memory.
ACCEPT_PAUSE_S = 1.0
# The kernel's queue of connections not yet accepted.
LISTEN_BACKLOG = 128
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

Address = tuple[str, int]


def bind_listening(host: str, port: int) -> list[socket.socket]:
    """Non-blocking listening sockets on every address of `host`, all on one port."""
    infos = socket.getaddrinfo(
        host or None,
        port,
        type=socket.SOCK_STREAM,
        proto=socket.IPPROTO_TCP,
        flags=socket.AI_PASSIVE,
    )
    sockets: list[socket.socket] = []
    seen: set[tuple[int, str]] = set()
    try:
        for family, kind, proto, _name, address in infos:
            if (family, address[0]) in seen:
                continue
            seen.add((family, address[0]))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                # Each address its own socket: an IPv6 one does not also take IPv4's.
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if sockets[0] is not sock:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class Listener:
    """Accepts on `sockets`; see the module's rules."""

    def __init__(
        self,
        sockets: list[socket.socket],
        *,
        admit: Callable[[Address], bool],
        connected: Callable[[socket.socket, Address], None],
        failed: Callable[[OSError], None],
    ) -> None:
        self.sockets = sockets
        self._admit = admit
        self._connected = connected
        self._failed = failed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resume: dict[int, asyncio.TimerHandle] = {}

    @property
    def port(self) -> int:
        return int(self.sockets[0].getsockname()[1])

    @property
    def host(self) -> str:
        return str(self.sockets[0].getsockname()[0])

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for sock in self.sockets:
            self._loop.add_reader(sock.fileno(), self._acceptable, sock)

    def close(self) -> None:
        for handle in self._resume.values():
            handle.cancel()
        self._resume.clear()
        for sock in self.sockets:
            if self._loop is not None and sock.fileno() >= 0:
                self._loop.remove_reader(sock.fileno())
            sock.close()

    def _acceptable(self, sock: socket.socket) -> None:
        for _ in range(ACCEPT_BURST):
            try:
                conn, address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in OUT_OF_RESOURCES:
                    self._rest(sock)
                    self._failed(exc)
                    return
                continue  # this client is gone (ECONNABORTED and the like)
            peer = (str(address[0]), int(address[1]))
            if not self._admit(peer):
                conn.close()
                continue
            conn.setblocking(False)
            self._connected(conn, peer)

    def _rest(self, sock: socket.socket) -> None:
        assert self._loop is not None
        self._loop.remove_reader(sock.fileno())
        self._resume[sock.fileno()] = self._loop.call_later(ACCEPT_PAUSE_S, self._wake, sock)

    def _wake(self, sock: socket.socket) -> None:
        assert self._loop is not None
        self._resume.pop(sock.fileno(), None)
        if sock.fileno() >= 0:
            self._loop.add_reader(sock.fileno(), self._acceptable, sock)
