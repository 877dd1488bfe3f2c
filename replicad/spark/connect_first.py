"""Connect back first, import PySpark after: how a local run's driver-side Python starts.

Spark runs some Python on the driver in processes of their own, `python -m MODULE`: the
data source planner's steps (create_data_source, plan_data_source_read, ...) and, for the
whole life of a streaming query, the host of its stream reader
(python_streaming_source_runner). For each it waits 10 s for the process to connect back
(`Selector.select(10000)` in PythonWorkerFactory.createSimpleWorker, Spark 4.3: a constant,
no setting changes it, and the stream's runner always takes this path, never the daemon).
PySpark's modules connect only after importing PySpark and pyarrow: about 0.5 s of CPU,
which on two busy cores ran past 10 s, and the query failed with "Python worker failed to
connect back" before its first micro-batch.

So worker_python.py's script starts those modules through this one, which connects and
authenticates with the standard library alone, then imports the module and runs it as
`__main__`, PySpark's `get_sock_file_to_executor` handing it the connected socket instead
of connecting again. Spark's side of the handshake (SocketAuthHelper, PySpark's
`local_connect_and_auth`): the secret as a length-prefixed UTF-8 string, "ok" back the
same way, then the worker's process id as a 4-byte int; with a Unix socket (no secret)
only the process id. After the id Spark reads with no deadline, so the imports may take
what the machine gives them.

Only modules whose `__main__` connects through `get_sock_file_to_executor` (checked for
PySpark 4.3, tests/spark/test_connect_first.py) go this way; anything else, and a process
not started by a PythonWorkerFactory, is the plain interpreter. Once connected, a local
session's forkserver (forkserver.py), when there is one, runs the module in a fork of a
process that has imported it already; otherwise this process imports and runs it.

The script starts this module as a file, `python -S -P .../connect_first.py` (START_FLAGS):
a stream's query waits on it, and all it does before handing over is connect, so the
interpreter's own start is most of its cost. `-S` skips `site` (the venv's .pth files, an
editable install's finder: about 0.03 CPU-s of a plain start's 0.05 here), `-P` keeps this
file's directory (replicad/spark, whose module names could shadow others) off the path,
and the standard library modules it needs only after connecting are imported then. `-I`
(`-E -P -s`) is not used: `-E` would also drop what Spark and the caller set for the worker
in the environment (PYTHONPATH, PYTHONUNBUFFERED, PYTHONHASHSEED, PYTHONDONTWRITEBYTECODE).
What `-m` and `site` would have given the module is restored before it runs: the working
directory first on the path (`-m`'s), then, when this process runs the module itself,
`site` (the forkserver's child has the server's site-packages, forkserver.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys

# Neither is imported at run time (typing's import is a third of this module's).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import BinaryIO

# The driver-side modules of PySpark 4.3 that connect back through
# pyspark.worker_util.get_sock_file_to_executor in their `__main__`.
MODULES = (
    "pyspark.sql.streaming.python_streaming_source_runner",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.worker.lookup_data_sources",
    "pyspark.sql.worker.data_source_pushdown_filters",
    "pyspark.sql.worker.commit_data_source_write",
    "pyspark.sql.worker.write_into_data_source",
    "pyspark.sql.worker.python_streaming_sink_runner",
)
# How worker_python.py's script starts this file (the module's docstring says why).
START_FLAGS = ("-S", "-P")
PORT_ENV = "PYTHON_WORKER_FACTORY_PORT"
SOCK_PATH_ENV = "PYTHON_WORKER_FACTORY_SOCK_PATH"
SECRET_ENV = "PYTHON_WORKER_FACTORY_SECRET"
_INT = struct.Struct("!i")


class HandshakeError(ConnectionError):
    """Spark did not answer the secret with "ok"."""


def start_argv(python: str) -> list[str]:
    """The command that starts this module as worker_python.py's script does."""
    return [python, *START_FLAGS, os.path.abspath(__file__)]


def as_module_path() -> None:
    """The working directory first on the path, as `python -m` puts it (started as a file
    with -P, nothing was put there)."""
    if sys.flags.safe_path:
        sys.path.insert(0, os.getcwd())


def with_site() -> None:
    """What `site` adds (site-packages, .pth files), when this process started without it."""
    if sys.flags.no_site:
        import site

        site.main()


def started_by_spark(environ: dict[str, str] | os._Environ[str]) -> bool:
    return PORT_ENV in environ or SOCK_PATH_ENV in environ


def connect(environ: dict[str, str] | os._Environ[str]) -> tuple[socket.socket, BinaryIO]:
    """Connect to the waiting PythonWorkerFactory, authenticate, send our process id."""
    timeout = int(environ.get("SPARK_AUTH_SOCKET_TIMEOUT", 15))
    buffer_size = int(environ.get("SPARK_BUFFER_SIZE", 65536))
    secret = environ.get(SECRET_ENV)
    sock_path = environ.get(SOCK_PATH_ENV)
    if sock_path is not None and secret is None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(sock_path)
        sock_file = sock.makefile("rwb", buffer_size)
    else:
        ipv6 = environ.get("SPARK_PREFER_IPV6", "false").lower() == "true"
        host = "::1" if ipv6 else "127.0.0.1"
        sock = socket.create_connection((host, int(environ[PORT_ENV])), timeout=timeout)
        sock_file = sock.makefile("rwb", buffer_size)
        encoded = (secret or "").encode("utf-8")
        sock_file.write(_INT.pack(len(encoded)) + encoded)
        sock_file.flush()
        if _read_string(sock_file) != b"ok":
            sock_file.close()
            sock.close()
            raise HandshakeError("Spark refused this Python worker's secret")
    sock_file.write(_INT.pack(os.getpid()))
    sock_file.flush()
    return sock, sock_file


def _read_string(stream: BinaryIO) -> bytes:
    head = stream.read(_INT.size)
    if len(head) < _INT.size:
        raise HandshakeError("Spark closed the connection during the handshake")
    (length,) = _INT.unpack(head)
    return stream.read(length)


def run(module: str, args: list[str], sock: socket.socket, sock_file: BinaryIO) -> None:
    """Run `module` as `__main__` over the connection already made."""
    import runpy

    import pyspark.worker_util as worker_util

    @contextlib.contextmanager
    def connected(timeout: int | None = -1) -> Iterator[BinaryIO]:
        # As PySpark's own: a positive timeout or None replaces the handshake's.
        if timeout is None or timeout > 0:
            sock.settimeout(timeout)
        try:
            yield sock_file
        finally:
            sock_file.close()

    worker_util.get_sock_file_to_executor = connected  # type: ignore[assignment]
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


# -- handing the connection to a forkserver (forkserver.py) -------------------------------

# pipeline.spark_session starts a server for a local session unless this is `0` (the off
# switch), and then holds its socket's path here for the workers; unset, empty or `1`
# (on, the default) is not a path yet: a worker that sees it starts cold.
ENV = "REPLICAD_SPARK_FORKSERVER"
OFF = ("0",)
NO_PATH = ("", "1")


def hand_over(
    module: str, args: list[str], spark: socket.socket, spark_file: BinaryIO
) -> int | None:
    """Have the server run `module` over the connection `spark` (and `spark_file`, made
    from it); its exit status, or None when there is no server to take it (the caller runs
    the module itself, over the same connection)."""
    path = os.environ.get(ENV, "")
    if path in OFF or path in NO_PATH:
        return None
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.connect(path)
        payload = json.dumps(
            {
                "module": module,
                "args": args,
                "env": dict(os.environ),
                "path": sys.path,
                "cwd": os.getcwd(),
                "client_pid": os.getpid(),
            }
        ).encode("utf-8")
        fds = [spark.fileno(), 0, 1, 2]
        socket.send_fds(server, [_INT.pack(len(payload)) + payload], fds)
        child = _read_server_int(server)
    except (OSError, EOFError):
        server.close()
        return None
    # From here the child has the connection: this process only stands in for it.
    spark_file.close()
    spark.close()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda signum, _frame: _forward(child, signum))
    try:
        return _read_server_int(server)
    except (OSError, EOFError):
        return _wait_gone(child)  # the server went away: wait for the child itself
    finally:
        server.close()


def _forward(child: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signum)


def _wait_gone(pid: int) -> int:
    import select

    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return 1
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)
    return 1  # not our child: its status is unknown


def _read_server_int(sock: socket.socket) -> int:
    data = b""
    while len(data) < _INT.size:
        chunk = sock.recv(_INT.size - len(data))
        if not chunk:
            raise EOFError("forkserver closed the connection")
        data += chunk
    return int(_INT.unpack(data)[0])


def main(argv: list[str]) -> None:
    """`python -S -P .../connect_first.py -m MODULE [ARGS...]` (start_argv), as Spark ran the
    script (`python -m replicad.spark.connect_first` works too)."""
    if len(argv) >= 2 and argv[0] == "-m" and argv[1] in MODULES and started_by_spark(os.environ):
        sock, sock_file = connect(os.environ)
        as_module_path()
        # A local session's forkserver runs the module in a process that has its imports
        # done already (forkserver.py); without one, this process imports and runs it.
        status = hand_over(argv[1], argv[2:], sock, sock_file)
        if status is not None:
            sys.exit(status)
        with_site()
        run(argv[1], argv[2:], sock, sock_file)
        return
    os.execv(sys.executable, [sys.executable, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
