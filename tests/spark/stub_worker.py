"""A driver-side Python worker started as Spark starts one, with a stand-in PySpark, and
Spark's side of its handshake played by a socket: shared by test_connect_first.py and
test_forkserver.py (where Spark cannot be made to wait, or to show which process ran the
module).

The stand-in PySpark is a package on the worker's PYTHONPATH whose routed module
(`STUB_MODULE`) runs the `main` it is given, and whose `get_sock_file_to_executor` fails:
connect_first hands the module its own connection instead."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from replicad.spark.connect_first import start_argv
from tools.peers.wire import read_exactly, read_frame

INT = struct.Struct("!i")
DEADLINE_S = 120
SECRET = "a-secret"
STUB_MODULE = "pyspark.sql.worker.lookup_data_sources"

STUB_WORKER_UTIL = """
import contextlib

@contextlib.contextmanager
def get_sock_file_to_executor(timeout=-1):
    raise AssertionError("connect_first should have handed over its connection")
    yield
"""


def stub_pyspark(
    root: Path, main: str, *, init: str = "", more: Mapping[str, str] | None = None
) -> Path:
    """A stand-in PySpark under `root`: `init` its `__init__`, `main` the routed module's
    source, `more` other modules of the package by file name."""
    package = root / "pyspark"
    (package / "sql" / "worker").mkdir(parents=True)
    (package / "__init__.py").write_text(init)
    (package / "worker_util.py").write_text(STUB_WORKER_UTIL)
    (package / "sql" / "__init__.py").write_text("")
    (package / "sql" / "worker" / "__init__.py").write_text("")
    (package / "sql" / "worker" / "lookup_data_sources.py").write_text(main)
    for name, source in (more or {}).items():
        (package / name).write_text(source)
    return root


def pythonpath(stubs: Path) -> str:
    return os.pathsep.join([str(stubs), *sys.path])


def start_worker(
    stubs: Path,
    listener: socket.socket,
    env: Mapping[str, str | None],
    *,
    secret: str = SECRET,
    stderr: int | None = None,
    program: list[str] | None = None,
) -> subprocess.Popen:
    """`python -S -P .../connect_first.py -m STUB_MODULE`, as worker_python.py's script
    starts it for Spark's factory (or `program` `-m STUB_MODULE`: the script itself), told
    to connect to `listener`; `env` on top of this process's environment (a value of None
    removes the variable)."""
    merged = {
        **os.environ,
        "PYTHONPATH": pythonpath(stubs),
        "PYTHON_WORKER_FACTORY_PORT": str(listener.getsockname()[1]),
        "PYTHON_WORKER_FACTORY_SECRET": secret,
        **env,
    }
    merged = {k: v for k, v in merged.items() if v is not None}
    argv = [*(program or start_argv(sys.executable)), "-m", STUB_MODULE]
    return subprocess.Popen(argv, env=merged, stderr=stderr)


def accept(listener: socket.socket) -> tuple[socket.socket, str]:
    """The worker's connection and the secret it sent."""
    conn, _ = listener.accept()
    conn.settimeout(DEADLINE_S)
    return conn, read_frame(conn).decode()


def handshake(listener: socket.socket, worker: subprocess.Popen) -> socket.socket:
    """Spark's side: the secret checked, "ok", then the pid of the process it started."""
    conn, secret = accept(listener)
    assert secret == SECRET
    conn.sendall(INT.pack(2) + b"ok")
    # Spark knows the worker by the pid of the process it started.
    assert INT.unpack(read_exactly(conn, 4)) == (worker.pid,)
    return conn


def child_of(parent: int) -> list[int]:
    """The process ids whose parent is `parent` (a forkserver's forks)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(proc.name))
    return found


def plain_module_path(stubs: Path) -> list[str]:
    """sys.path of `python -m` (with `site`) run with PYTHONPATH=`stubs` from this
    process's working directory: what a module Spark names should run with."""
    (stubs / "print_path.py").write_text("import json, sys\nprint(json.dumps(sys.path))\n")
    plain = subprocess.run(
        [sys.executable, "-m", "print_path"],
        env={**os.environ, "PYTHONPATH": str(stubs)},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(plain.stdout)


def read_path(conn: socket.socket) -> list[str]:
    """A sys.path the stand-in module sent as a length-prefixed JSON list."""
    (length,) = INT.unpack(read_exactly(conn, 4))
    return json.loads(read_exactly(conn, length))


def path_of_a_worker(
    stubs: Path, listener: socket.socket, env: Mapping[str, str | None], ask: bytes = b""
) -> list[str]:
    """The sys.path a worker started as Spark starts it sends (after `ask`, for a
    forkserver's child), once it has ended with status 0."""
    worker = start_worker(stubs, listener, env)
    try:
        conn = handshake(listener, worker)
        if ask:
            conn.sendall(ask)
        path = read_path(conn)
        assert worker.wait(DEADLINE_S) == 0
        conn.close()
    finally:
        worker.kill()
        worker.wait()
    return path
