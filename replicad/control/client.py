"""`replicad status` and friends: ask the daemon over its control socket (blocking; for the CLI).

Rules:
- The client binds an abstract socket (a name in the network namespace, not a file) for the
  reply: the daemon runs with PrivateTmp= and ProtectHome=, so it could not reach a socket
  file the client made in /tmp or $HOME, while abstract names are shared.
- Anyone on the host could send to that name, so the client sets SO_PASSCRED and accepts
  reply datagrams only from root or from the owner of the control socket file (the
  daemon's user, who created it).
- No socket file, a file nobody is bound to, or no complete reply within `timeout_s` means
  the daemon is not running: `DaemonNotRunning`. A reply with `ok: false` is a
  `ControlError` carrying the daemon's message.
"""

from __future__ import annotations

import os
import secrets
import socket
import stat
import time
from pathlib import Path
from typing import Any

from replicad.control.creds import (
    CREDENTIALS_SPACE,
    ROOT_UID,
    credentials_from_ancdata,
    enable_credentials,
)
from replicad.control.protocol import (
    MAX_DATAGRAM_BYTES,
    ReplyAssembler,
    ReplyComplete,
    encode_request,
)
from replicad.errors import ControlError, DaemonNotRunning

DEFAULT_TIMEOUT_S = 5.0
# Request ids are random so a late reply to an earlier query is never taken for ours.
REQUEST_ID_BITS = 31
CLIENT_NAME_PREFIX = "replicad-ctl"
STALE_SOCKET = "a stale control socket, left by a daemon that did not stop cleanly:"


def query(
    path: Path | str,
    cmd: str = "status",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Send `cmd` to the daemon at `path` and return its result object."""
    path = Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise DaemonNotRunning(path) from None
    except PermissionError as exc:
        raise ControlError(f"cannot reach control socket {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(info.st_mode):
        raise ControlError(f"{path} is not a socket")
    trusted_uids = {ROOT_UID, info.st_uid}
    request_id = secrets.randbits(REQUEST_ID_BITS)
    deadline = time.monotonic() + timeout_s
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        enable_credentials(sock)
        sock.bind(f"\0{CLIENT_NAME_PREFIX}-{os.getpid()}-{secrets.token_hex(8)}")
        sock.settimeout(timeout_s)
        try:
            sock.sendto(encode_request(cmd, request_id, args), str(path))
        except FileNotFoundError:
            raise DaemonNotRunning(path) from None
        except ConnectionRefusedError:
            # The file is there and nobody is bound to it: a daemon that was killed (SIGKILL,
            # a crash) leaves its socket behind.
            raise DaemonNotRunning(path, STALE_SOCKET) from None
        except PermissionError as exc:
            raise ControlError(f"cannot write to control socket {path}: {exc.strerror}") from None
        except TimeoutError:
            raise DaemonNotRunning(path, f"no answer within {timeout_s:g}s from") from None
        try:
            reply = _receive_reply(sock, ReplyAssembler(request_id), trusted_uids, deadline)
        except TimeoutError:
            raise DaemonNotRunning(path, f"no answer within {timeout_s:g}s from") from None
    if not reply.get("ok"):
        raise ControlError(str(reply.get("error", f"{cmd} failed")))
    result = reply.get("result")
    if not isinstance(result, dict):
        raise ControlError(f"{cmd}: reply has no result object")
    return result


def _receive_reply(
    sock: socket.socket,
    assembler: ReplyAssembler,
    trusted_uids: set[int],
    deadline: float,
) -> dict[str, Any]:
    """The assembled reply; `TimeoutError` once `deadline` passes."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        sock.settimeout(remaining)
        data, ancdata, _flags, _addr = sock.recvmsg(MAX_DATAGRAM_BYTES, CREDENTIALS_SPACE)
        sender = credentials_from_ancdata(ancdata)
        if sender is None or sender.uid not in trusted_uids:
            continue
        step = assembler.feed(data)
        if isinstance(step, ReplyComplete):
            return step.reply
