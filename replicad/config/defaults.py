"""Where replicad keeps its state when the config does not say.

Rules, first match wins:
- Under systemd, the directories the unit asks for: `$STATE_DIRECTORY` (StateDirectory=)
  holds `data/`, `$RUNTIME_DIRECTORY` (RuntimeDirectory=) the control socket.
- As root, the system's: /var/lib/replicad/data and /run/replicad/control.sock.
- As anyone else, the user's own (XDG): `$XDG_STATE_HOME/replicad/data` (default
  ~/.local/state/replicad/data) and `$XDG_RUNTIME_DIR/replicad/control.sock` (without
  XDG_RUNTIME_DIR, beside the data in the state directory). A first try needs no root.
- `replicad status` without --socket also looks at the service's socket, so an operator
  in group `replicad` reaches the daemon systemd runs.

Read from the environment when asked, never at import: a reload or a test sees its own.
"""

from __future__ import annotations

import os
from pathlib import Path

SYSTEM_STATE_DIR = Path("/var/lib/replicad")
SYSTEM_CONTROL_SOCKET = Path("/run/replicad/control.sock")
CONTROL_SOCKET_NAME = "control.sock"
DATA_DIR_NAME = "data"


def _first(env: str) -> Path | None:
    # systemd passes several directories colon-separated when the unit lists several.
    value = os.environ.get(env, "").split(":")[0]
    return Path(value) if value else None


def _user_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "replicad"


def default_data_dir() -> Path:
    state = _first("STATE_DIRECTORY")
    if state is not None:
        return state / DATA_DIR_NAME
    if os.geteuid() == 0:
        return SYSTEM_STATE_DIR / DATA_DIR_NAME
    return _user_state_dir() / DATA_DIR_NAME


def default_control_socket() -> Path:
    runtime = _first("RUNTIME_DIRECTORY")
    if runtime is not None:
        return runtime / CONTROL_SOCKET_NAME
    if os.geteuid() == 0:
        return SYSTEM_CONTROL_SOCKET
    xdg_runtime = os.environ.get("XDG_RUNTIME_DIR")
    if xdg_runtime:
        return Path(xdg_runtime) / "replicad" / CONTROL_SOCKET_NAME
    return _user_state_dir() / CONTROL_SOCKET_NAME


def control_socket_candidates() -> tuple[Path, ...]:
    """Where `replicad status` looks without --socket: this user's default, then the
    service's."""
    mine = default_control_socket()
    return (mine,) if mine == SYSTEM_CONTROL_SOCKET else (mine, SYSTEM_CONTROL_SOCKET)
