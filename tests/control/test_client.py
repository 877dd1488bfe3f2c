"""The blocking control client: not-running detection and whom it believes."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replicad.control.client import query
from replicad.control.protocol import (
    MAX_DATAGRAM_BYTES,
    decode_request,
    encode_reply,
    error_reply,
    ok_reply,
)
from replicad.errors import ControlError, DaemonNotRunning


class FakeDaemon:
    """A bound socket answering one request through `answer(request, client_address)`."""

    def __init__(self, path: Path, answer: Callable[[Any, Any], None]) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(5)
        self.answer = answer
        self.thread = threading.Thread(target=self._serve_one)
        self.thread.start()

    def _serve_one(self) -> None:
        data, address = self.sock.recvfrom(MAX_DATAGRAM_BYTES)
        self.answer(decode_request(data), address)

    def reply(self, request_id: int, reply: dict[str, Any], address: Any) -> None:
        for datagram in encode_reply(request_id, reply):
            self.sock.sendto(datagram, address)

    def close(self) -> None:
        self.thread.join(5)
        self.sock.close()


def test_no_socket_file_means_not_running(tmp_path: Path) -> None:
    path = tmp_path / "control.sock"
    with pytest.raises(DaemonNotRunning) as caught:
        query(path)
    assert str(caught.value) == f"replicad is not running (no control socket at {path})"
    assert caught.value.path == path


def test_a_socket_file_nobody_is_bound_to_means_not_running(tmp_path: Path) -> None:
    path = tmp_path / "control.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as dead:
        dead.bind(str(path))
    with pytest.raises(DaemonNotRunning, match="a stale control socket") as caught:
        query(path, timeout_s=1.0)
    assert str(path) in str(caught.value)


def test_a_daemon_that_never_answers_times_out_as_not_running(tmp_path: Path) -> None:
    path = tmp_path / "control.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as mute:
        mute.bind(str(path))
        with pytest.raises(DaemonNotRunning, match=r"no answer within 0.3s from"):
            query(path, timeout_s=0.3)


def test_a_path_that_is_not_a_socket_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "control.sock"
    path.write_text("")
    with pytest.raises(ControlError, match="is not a socket"):
        query(path)


def test_an_error_reply_becomes_a_control_error(tmp_path: Path) -> None:
    path = tmp_path / "control.sock"
    daemon = FakeDaemon(path, lambda req, addr: daemon.reply(req.id, error_reply("no"), addr))
    try:
        with pytest.raises(ControlError, match=r"^no$"):
            query(path, "reload")
    finally:
        daemon.close()


def test_the_request_carries_cmd_args_and_credentials(tmp_path: Path) -> None:
    path = tmp_path / "control.sock"
    seen: list[Any] = []

    def answer(request: Any, address: Any) -> None:
        seen.append((request, address))
        daemon.reply(request.id, ok_reply({"fine": True}), address)

    daemon = FakeDaemon(path, answer)
    try:
        assert query(path, "reload", args={"topics": ["a"]}) == {"fine": True}
    finally:
        daemon.close()
    request, address = seen[0]
    assert (request.cmd, request.args) == ("reload", {"topics": ["a"]})
    # The reply address is abstract: a daemon with PrivateTmp= cannot see the client's /tmp.
    assert isinstance(address, bytes) and address.startswith(b"\0replicad-ctl-")


def test_replies_forged_by_another_user_are_ignored(
    tmp_path: Path, run_as_nobody: Callable[..., Any]
) -> None:
    path = tmp_path / "control.sock"

    def answer(request: Any, address: Any) -> None:
        forged = encode_reply(request.id, ok_reply({"forged": True}))

        def forge() -> int:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                for datagram in forged:
                    sock.sendto(datagram, address)
            return os.getuid()

        assert run_as_nobody(forge) == 65534
        daemon.reply(request.id, ok_reply({"genuine": True}), address)

    daemon = FakeDaemon(path, answer)
    try:
        assert query(path, "status") == {"genuine": True}
    finally:
        daemon.close()
