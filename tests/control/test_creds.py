"""Peer credentials from the kernel, and who may run which command."""

from __future__ import annotations

import os
import socket

import pytest

from replicad.control.creds import (
    CREDENTIALS_SPACE,
    PeerCredentials,
    authorize,
    credentials_from_ancdata,
    enable_credentials,
)

DAEMON_UID = 995
OPERATOR_UID = 1000


def test_the_kernel_attaches_the_senders_credentials() -> None:
    receiver, sender = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with receiver, sender:
        enable_credentials(receiver)
        sender.send(b"hello")
        data, ancdata, _flags, _addr = receiver.recvmsg(64, CREDENTIALS_SPACE)
    assert data == b"hello"
    assert credentials_from_ancdata(ancdata) == PeerCredentials(
        pid=os.getpid(), uid=os.getuid(), gid=os.getgid()
    )


def test_no_ancillary_data_means_no_credentials() -> None:
    assert credentials_from_ancdata([]) is None
    assert credentials_from_ancdata([(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, b"\0")]) is None


def test_read_only_commands_are_open_even_without_credentials() -> None:
    decision = authorize("status", None, mutating=False, daemon_uid=DAEMON_UID)
    assert decision.allowed


@pytest.mark.parametrize(
    ("uid", "allowed"),
    [(0, True), (DAEMON_UID, True), (OPERATOR_UID, False), (65534, False)],
)
def test_mutating_commands_need_root_or_the_daemons_uid(uid: int, allowed: bool) -> None:
    peer = PeerCredentials(pid=1234, uid=uid, gid=uid)
    decision = authorize("reload", peer, mutating=True, daemon_uid=DAEMON_UID)
    assert decision.allowed is allowed
    if not allowed:
        assert f"uid {uid}" in decision.reason
        assert decision.reason.startswith("reload: permission denied")


def test_mutating_commands_without_credentials_are_refused() -> None:
    decision = authorize("reload", None, mutating=True, daemon_uid=DAEMON_UID)
    assert not decision.allowed
    assert "credentials missing" in decision.reason
