"""What `replicad run` would fail on before replicating, found without doing any of it.

`--check-config` and `run` itself ask `preflight(config)` after the file validated: the
data directory and the control socket's directory can be created and written, the socket's
path is short enough to bind (a default under a deep home may not be), the TLS files can be
read. Nothing is created, opened for writing or bound: the checks look at
the filesystem as the user running them sees it (os.access), so a config checked by
`--check-config` as the service user is one `run` can start with.

Each problem names the config key, the path, the reason and the fix, and carries the
sysexits(3) code `run` exits with: 73 (EX_CANTCREAT) when a path cannot be created or
written, 77 (EX_NOPERM) when it exists but may not be used, 78 (EX_CONFIG) when it is the
wrong kind of thing (a file where a directory must be).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from replicad.config.model import Config
from replicad.config.rules import UNIX_SOCKET_PATH_MAX
from replicad.exits import EX_CANTCREAT, EX_CONFIG, EX_NOPERM


@dataclass(frozen=True, slots=True)
class Problem:
    key: str  # the config key, dotted: "data_dir", "control.socket"
    path: Path
    reason: str
    fix: str
    exit_code: int

    def line(self) -> str:
        return f"{self.key}: {self.path}: {self.reason}; {self.fix}"


def preflight(config: Config) -> tuple[Problem, ...]:
    problems: list[Problem] = []
    try:
        _check(config, problems)
    except OSError as exc:  # a directory on the way we may not even look into
        where = Path(exc.filename) if exc.filename else Path("/")
        fix = "run replicad as a user who can reach its paths, or choose other paths"
        problems.append(Problem("data_dir", where, exc.strerror or str(exc), fix, EX_NOPERM))
    return tuple(problems)


def _check(config: Config, problems: list[Problem]) -> None:
    data_fix = "choose a directory you can write (--data-dir DIR, or data_dir: in the config)"
    _writable_dir(problems, "data_dir", config.data_dir, data_fix)
    socket = config.control.socket
    socket_fix = (
        "choose a path in a directory you can write (--control-socket PATH, or "
        "control.socket: in the config)"
    )
    _writable_dir(problems, "control.socket", socket.parent, socket_fix, shown=socket)
    size = len(os.fsencode(socket))
    if size > UNIX_SOCKET_PATH_MAX:  # a default under a deep home: bind() would refuse it
        reason = f"a Unix socket path has at most {UNIX_SOCKET_PATH_MAX} bytes, this one {size}"
        problems.append(Problem("control.socket", socket, reason, socket_fix, EX_CONFIG))
    tls_files = [("source", config.source.security.tls, ("ca_file", "cert_file", "key_file"))]
    if config.serve is not None:
        tls_files.append(("serve", config.serve.security.tls, ("cert_file", "key_file", "ca_file")))
    for section, tls, names in tls_files:
        for name in names:
            _readable_file(problems, f"{section}.security.tls.{name}", getattr(tls, name))


def _who() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return f"uid {os.geteuid()}"


def _writable_dir(
    problems: list[Problem], key: str, directory: Path, fix: str, *, shown: Path | None = None
) -> None:
    """`directory` exists and may be written, or the nearest existing ancestor is a
    directory that may (so it can be created)."""
    shown = shown or directory
    path = directory if directory.is_absolute() else Path.cwd() / directory
    if path.exists():
        if not path.is_dir():
            problems.append(Problem(key, shown, f"{path} is not a directory", fix, EX_CONFIG))
        elif not os.access(path, os.W_OK | os.X_OK):
            reason = f"directory {path} is not writable by {_who()}"
            problems.append(Problem(key, shown, reason, fix, EX_NOPERM))
        return
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        reason = f"cannot be created: {ancestor} is not a directory"
        problems.append(Problem(key, shown, reason, fix, EX_CANTCREAT))
    elif not os.access(ancestor, os.W_OK | os.X_OK):
        reason = f"cannot be created: {ancestor} is not writable by {_who()}"
        problems.append(Problem(key, shown, reason, fix, EX_CANTCREAT))


def _readable_file(problems: list[Problem], key: str, path: Path | None) -> None:
    if path is None:
        return
    fix = f"point {key} at a file {_who()} can read"
    if not path.exists():
        problems.append(Problem(key, path, "no such file", fix, EX_CONFIG))
    elif not path.is_file():
        problems.append(Problem(key, path, "not a file", fix, EX_CONFIG))
    elif not os.access(path, os.R_OK):
        problems.append(Problem(key, path, f"not readable by {_who()}", fix, EX_NOPERM))
