"""sd_notify: tell systemd we are ready, what we are doing, that we are alive, that we stop.

Rules of the protocol (sd_notify(3), and what systemd's service manager accepts):
- The manager's socket is named by $NOTIFY_SOCKET: a file path, or an abstract socket
  written `@name` (sent to as a leading NUL byte). With no $NOTIFY_SOCKET we are not run by
  systemd as Type=notify, and every call is a no-op.
- Each message is one AF_UNIX datagram of newline-separated `KEY=value` assignments.
- READY=1 once startup is complete (for replicad: logs recovered and first metadata seen),
  STATUS=<one line> whenever the summary changes, STOPPING=1 when shutdown begins.
- With WatchdogSec= the manager sets $WATCHDOG_USEC (and $WATCHDOG_PID, the pid it watches).
  WATCHDOG=1 must arrive more often than that; we ping at half the interval, from the event
  loop itself, so a loop that is wedged stops pinging and systemd restarts the service.
  When $WATCHDOG_PID names another process, the watchdog is not ours and is off.
- A failed notification never stops the daemon: it is logged and dropped.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping

import asyncio_dgram
import structlog
from asyncio_dgram.aio import DatagramClient

log = structlog.get_logger("replicad.control.notify")

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"
WATCHDOG_USEC_ENV = "WATCHDOG_USEC"
WATCHDOG_PID_ENV = "WATCHDOG_PID"
ABSTRACT_PREFIX = "@"
# systemd sends keepalives at half the timeout; so do we, leaving room for one late ping.
WATCHDOG_PING_FRACTION = 0.5
# STATUS= is shown by `systemctl status` on one line; newlines would end the assignment.
STATUS_MAX_CHARS = 200


def encode_notify(fields: Mapping[str, str]) -> bytes:
    """One sd_notify datagram: `KEY=value` lines. Values must not contain a newline."""
    lines = []
    for key, value in fields.items():
        if "\n" in value or "=" in key or not key:
            raise ValueError(f"not a notify assignment: {key!r}={value!r}")
        lines.append(f"{key}={value}")
    return "\n".join(lines).encode()


def decode_notify(datagram: bytes) -> dict[str, str]:
    """The assignments in one sd_notify datagram (what systemd's side reads)."""
    fields: dict[str, str] = {}
    for line in datagram.decode().split("\n"):
        if line:
            key, _, value = line.partition("=")
            fields[key] = value
    return fields


def socket_address(value: str) -> str:
    """$NOTIFY_SOCKET as an AF_UNIX address: `@name` is the abstract socket `\\0name`."""
    if value.startswith(ABSTRACT_PREFIX):
        return "\0" + value[len(ABSTRACT_PREFIX) :]
    return value


def one_line(text: str) -> str:
    """A status text systemd can show: one line, bounded."""
    flat = " ".join(text.split())
    return flat if len(flat) <= STATUS_MAX_CHARS else flat[: STATUS_MAX_CHARS - 1] + "…"


class SystemdNotifier:
    """Speaks sd_notify to the service manager over an AF_UNIX datagram socket.

    `address` None means "not under systemd": every method is a no-op. The datagram socket
    is opened on first use, in the running event loop.
    """

    def __init__(
        self,
        address: str | None,
        watchdog_usec: int | None = None,
    ) -> None:
        self.address = address
        self.watchdog_usec = watchdog_usec
        self._stream: DatagramClient | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SystemdNotifier:
        """Read $NOTIFY_SOCKET, $WATCHDOG_USEC and $WATCHDOG_PID (of this process by default)."""
        env = os.environ if environ is None else environ
        raw_socket = env.get(NOTIFY_SOCKET_ENV, "")
        address = socket_address(raw_socket) if raw_socket else None
        return cls(address, _watchdog_usec(env))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def watchdog_interval_s(self) -> float | None:
        """How often to ping: half of WatchdogSec; None when no watchdog is asked for."""
        if self.address is None or not self.watchdog_usec:
            return None
        return self.watchdog_usec / 1_000_000 * WATCHDOG_PING_FRACTION

    async def ready(self, status: str | None = None) -> None:
        fields = {"READY": "1"}
        if status is not None:
            fields["STATUS"] = one_line(status)
        await self.notify(fields)

    async def status(self, text: str) -> None:
        await self.notify({"STATUS": one_line(text)})

    async def watchdog(self) -> None:
        await self.notify({"WATCHDOG": "1"})

    async def stopping(self, status: str | None = None) -> None:
        fields = {"STOPPING": "1"}
        if status is not None:
            fields["STATUS"] = one_line(status)
        await self.notify(fields)

    async def reloading(self) -> None:
        """RELOADING=1 while a SIGHUP reload is applied; follow with ready() when done."""
        await self.notify({"RELOADING": "1"})

    async def notify(self, fields: Mapping[str, str]) -> None:
        """Send one datagram of assignments; failures are logged, never raised."""
        if self.address is None:
            return
        datagram = encode_notify(fields)
        try:
            if self._stream is None:
                self._stream = await asyncio_dgram.connect(self.address)
            await self._stream.send(datagram)
        except (OSError, asyncio_dgram.TransportClosed) as exc:
            # The manager restarted or the socket went away: reconnect on the next message.
            log.warning(
                "sd_notify failed", socket=self.address, fields=list(fields), error=str(exc)
            )
            self.close()

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


def _watchdog_usec(env: Mapping[str, str]) -> int | None:
    raw = env.get(WATCHDOG_USEC_ENV, "")
    if not raw.isdigit() or int(raw) == 0:
        return None
    watched_pid = env.get(WATCHDOG_PID_ENV, "")
    if watched_pid.isdigit() and int(watched_pid) != os.getpid():
        return None
    return int(raw)


async def watchdog_loop(notifier: SystemdNotifier, stop_event: asyncio.Event) -> None:
    """Ping WATCHDOG=1 at half of WatchdogSec until `stop_event` is set.

    Runs as a task on the daemon's own loop on purpose: if the loop is blocked, this task
    does not run, the pings stop and systemd's watchdog fires.
    """
    interval = notifier.watchdog_interval_s()
    if interval is None:
        return
    while not stop_event.is_set():
        await notifier.watchdog()
        try:
            await asyncio.wait_for(stop_event.wait(), timeout=interval)
        except TimeoutError:
            continue


__all__ = [
    "SystemdNotifier",
    "decode_notify",
    "encode_notify",
    "socket_address",
    "watchdog_loop",
]
