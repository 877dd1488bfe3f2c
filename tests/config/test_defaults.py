"""Default paths by who runs replicad: systemd's directories, root's, a user's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from replicad.config import defaults
from replicad.config.defaults import (
    SYSTEM_CONTROL_SOCKET,
    control_socket_candidates,
    default_control_socket,
    default_data_dir,
)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in ("STATE_DIRECTORY", "RUNTIME_DIRECTORY", "XDG_STATE_HOME", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_under_systemd_the_units_directories(env: pytest.MonkeyPatch) -> None:
    env.setenv("STATE_DIRECTORY", "/var/lib/replicad:/var/lib/other")
    env.setenv("RUNTIME_DIRECTORY", "/run/replicad")
    assert default_data_dir() == Path("/var/lib/replicad/data")
    assert default_control_socket() == Path("/run/replicad/control.sock")


def test_as_root_the_systems(env: pytest.MonkeyPatch) -> None:
    env.setattr(defaults.os, "geteuid", lambda: 0)
    assert default_data_dir() == Path("/var/lib/replicad/data")
    assert default_control_socket() == SYSTEM_CONTROL_SOCKET
    assert control_socket_candidates() == (SYSTEM_CONTROL_SOCKET,)


def test_as_a_user_the_users_own(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env.setattr(defaults.os, "geteuid", lambda: 1000)
    home = tmp_path / "home"
    assert default_data_dir() == home / ".local/state/replicad/data"
    assert default_control_socket() == home / ".local/state/replicad/control.sock"
    env.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    env.setenv("XDG_RUNTIME_DIR", str(tmp_path / "runtime"))
    assert default_data_dir() == tmp_path / "state/replicad/data"
    assert default_control_socket() == tmp_path / "runtime/replicad/control.sock"
    # `replicad status` also tries the service's socket.
    assert control_socket_candidates() == (default_control_socket(), SYSTEM_CONTROL_SOCKET)
