"""The daemon's control socket: JSON requests in, JSON replies out, over Unix datagrams.

Rules:
- One AF_UNIX SOCK_DGRAM socket bound at `path` (mode 0660 by default). Wire format and
  reply splitting are in `replicad.control.protocol`.
- Requests are read with `recvmsg` so the kernel's SCM_CREDENTIALS come along (asyncio-dgram
  reads with `recvfrom`, which drops ancillary data, so the receiving side is a plain
  non-blocking socket under `loop.add_reader`).
- A reply goes back to the sender's bound address from a fresh socket connected to it,
  spoken through asyncio-dgram. A connected datagram socket waits properly while the
  client's queue is full (an unconnected one would spin), and a client that never reads
  only ever blocks its own reply, which is dropped after `reply_timeout_s`.
- That socket is connected before the reply is built: a client that gave up (the CLI
  closes its socket when its timeout passes) refuses the connection, and nothing is built
  or run for it. A status of 10,000 partitions under load took longer than the client's
  5 s, and each retry queued another full reply for a client already gone: 60 retries and
  303 s for one answer (session 13, load 46). What was received is still counted
  (`abandoned`), and a read-only request is dropped before it runs; a mutating command
  whose sender left is dropped too, as its sender is not told whether it ran.
- A sender with no address (an unbound socket) cannot be answered; its request is dropped.
- "status" is built in and read-only; `queries` are more read-only commands; `commands`
  mutate the daemon and need root or the daemon's uid (see `replicad.control.creds`).
- A command that raises is answered with an error; nothing a client sends stops the daemon.
- At most `max_in_flight` requests are handled at once; more are dropped and logged.
- On start, a leftover socket file nobody listens on is replaced; a live one is an error.
  `close()` removes the file, if it is still ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import asyncio_dgram
import structlog

from replicad.control.creds import (
    CREDENTIALS_SPACE,
    PeerCredentials,
    authorize,
    credentials_from_ancdata,
    enable_credentials,
)
from replicad.control.protocol import (
    MAX_DATAGRAM_BYTES,
    decode_request,
    error_reply,
    ok_reply,
    reply_datagrams,
    request_id_of,
)
from replicad.errors import ControlError, ReplicadError

log = structlog.get_logger("replicad.control.server")

Command = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
STATUS_COMMAND = "status"
DEFAULT_MODE = 0o660
SOCKET_DIR_MODE = 0o750
DEFAULT_REPLY_TIMEOUT_S = 5.0
DEFAULT_MAX_IN_FLIGHT = 16
# Datagrams read per wake-up, so a flood of requests cannot hold the event loop.
MAX_READS_PER_WAKEUP = 64


class ControlServer:
    """Serves `status` (from `snapshot()`) and the given commands on a Unix datagram socket."""

    def __init__(
        self,
        path: Path,
        snapshot: Callable[[], dict[str, Any]],
        commands: Mapping[str, Command] | None = None,
        mode: int = DEFAULT_MODE,
        *,
        queries: Mapping[str, Command] | None = None,
        daemon_uid: int | None = None,
        reply_timeout_s: float = DEFAULT_REPLY_TIMEOUT_S,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        self.path = Path(path)
        self.snapshot = snapshot
        self.commands = dict(commands or {})
        self.queries = dict(queries or {})
        overlap = ({STATUS_COMMAND} | set(self.queries)) & set(self.commands)
        if overlap:
            raise ValueError(f"commands both read-only and mutating: {sorted(overlap)}")
        self.mode = mode
        self.daemon_uid = os.geteuid() if daemon_uid is None else daemon_uid
        self.reply_timeout_s = reply_timeout_s
        self.max_in_flight = max_in_flight
        self._sock: socket.socket | None = None
        self._inode: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Requests whose sender was gone before their reply was built (see the rules).
        self.abandoned = 0

    async def start(self) -> None:
        """Bind the socket and start answering; `ControlError` if another daemon listens."""
        if self._sock is not None:
            return
        self._loop = asyncio.get_running_loop()
        try:
            # Under systemd, RuntimeDirectory= made it; elsewhere (--control-socket), we do.
            self.path.parent.mkdir(mode=SOCKET_DIR_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise ControlError(f"cannot create {self.path.parent}: {exc.strerror}") from exc
        _clear_stale_socket(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            enable_credentials(sock)
            sock.bind(str(self.path))
            os.chmod(self.path, self.mode)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise ControlError(f"cannot open control socket {self.path}: {exc}") from exc
        self._sock = sock
        self._inode = os.stat(self.path).st_ino
        self._loop.add_reader(sock.fileno(), self._on_readable)
        log.info("control socket listening", path=str(self.path), mode=oct(self.mode))

    async def close(self) -> None:
        """Stop answering, cancel replies in flight, remove the socket file."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._loop is not None:
            self._loop.remove_reader(sock.fileno())
        sock.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.path).st_ino == self._inode:
                self.path.unlink()

    async def __aenter__(self) -> ControlServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        for _ in range(MAX_READS_PER_WAKEUP):
            try:
                data, ancdata, flags, address = sock.recvmsg(MAX_DATAGRAM_BYTES, CREDENTIALS_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("control socket receive failed", error=str(exc))
                return
            peer = credentials_from_ancdata(ancdata)
            if not address:
                log.debug("control request from an unbound socket dropped", peer=peer)
                continue
            if len(self._tasks) >= self.max_in_flight:
                log.warning("control request dropped: too many in flight", peer=peer)
                continue
            truncated = bool(flags & socket.MSG_TRUNC)
            task = asyncio.ensure_future(self._serve(data, truncated, peer, address))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(
        self, data: bytes, truncated: bool, peer: PeerCredentials | None, address: str | bytes
    ) -> None:
        # Before anything is built: is the sender still there (see the rules)?
        sock = _connected_to(address)
        if sock is None:
            self.abandoned += 1
            log.info("control client gone before its reply was built; not built", peer=peer)
            return
        try:
            request_id = request_id_of(data)
            if truncated:
                reply = error_reply(f"request larger than {MAX_DATAGRAM_BYTES} bytes")
            else:
                try:
                    request = decode_request(data)
                except ControlError as exc:
                    reply = error_reply(str(exc))
                else:
                    request_id = request.id
                    reply = await self._run(request.cmd, request.args, peer)
        except BaseException:
            sock.close()
            raise
        await self._send_reply(request_id, reply, sock)

    async def _run(
        self, cmd: str, args: dict[str, Any], peer: PeerCredentials | None
    ) -> dict[str, Any]:
        mutating = cmd in self.commands
        if not mutating and cmd != STATUS_COMMAND and cmd not in self.queries:
            known = sorted({STATUS_COMMAND, *self.queries, *self.commands})
            return error_reply(f"unknown command {cmd!r} (known: {', '.join(known)})")
        decision = authorize(cmd, peer, mutating=mutating, daemon_uid=self.daemon_uid)
        if not decision.allowed:
            log.warning("control command refused", cmd=cmd, peer=peer, reason=decision.reason)
            return error_reply(decision.reason)
        if mutating:
            log.info("control command", cmd=cmd, peer=peer, args=args)
        try:
            if cmd == STATUS_COMMAND:
                return ok_reply(self.snapshot())
            handler = self.commands.get(cmd) or self.queries[cmd]
            return ok_reply(await handler(args))
        except ReplicadError as exc:
            return error_reply(str(exc))
        except Exception as exc:
            log.exception("control command failed", cmd=cmd)
            return error_reply(f"{cmd} failed: {type(exc).__name__}: {exc}")

    async def _send_reply(
        self, request_id: int, reply: dict[str, Any], sock: socket.socket
    ) -> None:
        """`reply` over `sock`, connected to the client (it is closed after)."""
        try:
            try:
                datagrams = reply_datagrams(request_id, reply)
            except ControlError as exc:
                datagrams = reply_datagrams(request_id, error_reply(str(exc)))
            stream = await asyncio_dgram.from_socket(sock)
        except BaseException:
            sock.close()
            raise
        try:
            async with asyncio.timeout(self.reply_timeout_s):
                for datagram in datagrams:
                    await stream.send(datagram)
        except (TimeoutError, OSError, asyncio_dgram.TransportClosed) as exc:
            log.info("control reply abandoned", error=str(exc) or type(exc).__name__)
        finally:
            stream.close()


def _connected_to(address: str | bytes) -> socket.socket | None:
    """A datagram socket connected to the client's `address`; None if nobody is bound there
    any more (the client gave up and closed its socket)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.connect(address)
    except OSError as exc:
        sock.close()
        log.debug("control client gone before the reply", error=str(exc))
        return None
    return sock


def _clear_stale_socket(path: Path) -> None:
    """Remove a socket file left by a dead daemon; refuse a live one or a non-socket."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ControlError(f"{path} exists and is not a socket; not replacing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        path.unlink()
        return
    except OSError as exc:
        raise ControlError(f"cannot check existing control socket {path}: {exc}") from exc
    finally:
        probe.close()
    raise ControlError(f"another process is listening on {path}")
