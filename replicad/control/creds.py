"""Who is on the other end of a control datagram, and whether they may change the daemon.

Unix datagram sockets have no connection, so SO_PEERCRED tells nothing; instead the
receiving socket sets SO_PASSCRED and the kernel attaches the sender's pid, uid and gid to
every datagram as SCM_CREDENTIALS ancillary data. A sender can only claim someone else's
identity with CAP_SETUID/CAP_SETGID, i.e. when it is root already.

Rules:
- Read-only commands (status) are open to whoever can write to the socket: the file's
  mode (0660 by default) and its directory decide that.
- Mutating commands (reload, ...) need credentials, and the uid must be root (0) or the
  daemon's own uid. A datagram without credentials is refused.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

ROOT_UID = 0
# struct ucred { pid_t pid; uid_t uid; gid_t gid; } on Linux.
UCRED = struct.Struct("iII")
CREDENTIALS_SPACE = socket.CMSG_SPACE(UCRED.size)


@dataclass(frozen=True, slots=True)
class PeerCredentials:
    pid: int
    uid: int
    gid: int


@dataclass(frozen=True, slots=True)
class Authorization:
    """Whether a command may run, and a reason to log or send back when it may not."""

    allowed: bool
    reason: str


def enable_credentials(sock: socket.socket) -> None:
    """Ask the kernel to attach the sender's credentials to every datagram `sock` receives."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)


def credentials_from_ancdata(
    ancdata: Iterable[tuple[int, int, bytes]],
) -> PeerCredentials | None:
    """The SCM_CREDENTIALS a `recvmsg` returned, if any."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            if len(data) < UCRED.size:
                return None
            pid, uid, gid = UCRED.unpack_from(data)
            return PeerCredentials(pid=pid, uid=uid, gid=gid)
    return None


def authorize(
    cmd: str, peer: PeerCredentials | None, *, mutating: bool, daemon_uid: int
) -> Authorization:
    """May `peer` run `cmd`? Mutating commands are for root and the daemon's own user."""
    if not mutating:
        return Authorization(allowed=True, reason="read-only command")
    if peer is None:
        return Authorization(allowed=False, reason=f"{cmd}: sender credentials missing")
    if peer.uid == ROOT_UID:
        return Authorization(allowed=True, reason="root")
    if peer.uid == daemon_uid:
        return Authorization(allowed=True, reason="the daemon's own user")
    return Authorization(
        allowed=False,
        reason=f"{cmd}: permission denied for uid {peer.uid} (needs root or uid {daemon_uid})",
    )
