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
and the standard library modules it needs only after connecting are imported then. To
connect and hand over it imports only C modules (`_socket`, `_signal`, `_struct`, `_json`'s
string escape), not socket.py, signal.py or json: their Python imports (enums, selectors,
re) were 0.03 of a stand-in's 0.055 CPU-s, and a query waits for its connection. `-I`
(`-E -P -s`) is not used: `-E` would also drop what Spark and the caller set for the worker
in the environment (PYTHONPATH, PYTHONUNBUFFERED, PYTHONHASHSEED, PYTHONDONTWRITEBYTECODE).
What `-m` and `site` would have given the module is restored before it runs: the working
directory first on the path (`-m`'s), then, when this process runs the module itself,
`site` (the forkserver's child has the server's site-packages, forkserver.py).
"""

from __future__ import annotations

# The C modules beneath socket, signal, struct and json, not those: a stream's query waits
# for this process to connect, and socket.py's import alone (its enums, selectors) cost
# about 24 ms of CPU, json's (re) 8 ms, of a stand-in's 55 ms (load 4); the C modules, none
# of it. What only a cold start needs (socket's file object) is imported on that path; the
# rest before PYTHONPATH is put back (restore_pythonpath), so no import searches it.
import _signal
import _socket
import _struct
import os
import sys
from _json import encode_basestring_ascii as _quote

# Neither is imported at run time (typing's import is a third of this module's).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
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
# worker_python.py's script starts this file with PYTHONPATH moved here: restore_pythonpath.
HELD_PYTHONPATH = "REPLICAD_HELD_PYTHONPATH"
PORT_ENV = "PYTHON_WORKER_FACTORY_PORT"
SOCK_PATH_ENV = "PYTHON_WORKER_FACTORY_SOCK_PATH"
SECRET_ENV = "PYTHON_WORKER_FACTORY_SECRET"
_INT = _struct.Struct("!i")


class HandshakeError(ConnectionError):
    """Spark did not answer the secret with "ok"."""


def start_argv(python: str) -> list[str]:
    """The command that starts this module as worker_python.py's script does."""
    return [python, *START_FLAGS, os.path.abspath(__file__)]


def restore_pythonpath() -> None:
    """PYTHONPATH back where the worker script held it aside (HELD_PYTHONPATH): in the
    environment (the module's, the forkserver child's) and on sys.path as the interpreter's
    start puts it (each entry made absolute, an empty one the working directory, ahead of
    the standard library). Started with it, the interpreter would have searched its entries
    (pyspark.zip among them) for the modules of its own start."""
    held = os.environ.pop(HELD_PYTHONPATH, None)
    if held is None:
        return
    os.environ["PYTHONPATH"] = held
    if held:
        sys.path[0:0] = [os.path.abspath(entry) for entry in held.split(os.pathsep)]


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


def connect(environ: dict[str, str] | os._Environ[str]) -> _socket.socket:
    """Connect to the waiting PythonWorkerFactory, authenticate, send our process id: the
    connection, a bare `_socket.socket` (the handshake's timeout set on it)."""
    timeout = int(environ.get("SPARK_AUTH_SOCKET_TIMEOUT", 15))
    secret = environ.get(SECRET_ENV)
    sock_path = environ.get(SOCK_PATH_ENV)
    if sock_path is not None and secret is None:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(sock_path)
    else:
        ipv6 = environ.get("SPARK_PREFER_IPV6", "false").lower() == "true"
        family, host = (_socket.AF_INET6, "::1") if ipv6 else (_socket.AF_INET, "127.0.0.1")
        sock = _socket.socket(family, _socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect((host, int(environ[PORT_ENV])))
            encoded = (secret or "").encode("utf-8")
            sock.sendall(_INT.pack(len(encoded)) + encoded)
            if _read_string(sock) != b"ok":
                raise HandshakeError("Spark refused this Python worker's secret")
        except BaseException:
            sock.close()
            raise
    sock.sendall(_INT.pack(os.getpid()))
    return sock


def _read_string(sock: _socket.socket) -> bytes:
    (length,) = _INT.unpack(_read_exactly(sock, _INT.size))
    return _read_exactly(sock, length)


def _read_exactly(sock: _socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise HandshakeError("Spark closed the connection during the handshake")
        data += chunk
    return data


def full_socket(sock: _socket.socket) -> socket.socket:
    """`sock` as a `socket.socket` (what PySpark's modules are given), its timeout kept."""
    import socket

    timeout = sock.gettimeout()
    full = socket.socket(fileno=sock.detach())
    full.settimeout(timeout)
    return full


def run(module: str, args: list[str], sock: socket.socket, sock_file: BinaryIO) -> None:
    """Run `module` as `__main__` over the connection already made."""
    import contextlib
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
    module: str,
    args: list[str],
    spark: _socket.socket | socket.socket,
    spark_file: BinaryIO | None = None,
) -> int | None:
    """Have the server run `module` over the connection `spark` (and `spark_file`, made
    from it, if any); its exit status, or None when there is no server to take it (the
    caller runs the module itself, over the same connection)."""
    path = os.environ.get(ENV, "")
    if path in OFF or path in NO_PATH:
        return None
    server = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        server.connect(path)
        payload = json_text(
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
        # socket.send_fds's message: the descriptors as C ints (its array "i").
        rights = b"".join(fd.to_bytes(_FD_BYTES, sys.byteorder, signed=True) for fd in fds)
        server.sendmsg(
            [_INT.pack(len(payload)) + payload],
            [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)],
        )
        child = _read_server_int(server)
    except (OSError, EOFError):
        server.close()
        return None
    # From here the child has the connection: this process only stands in for it.
    if spark_file is not None:
        spark_file.close()
    spark.close()
    for signum in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(signum, lambda signum, _frame: _forward(child, signum))
    try:
        return _read_server_int(server)
    except (OSError, EOFError):
        return _wait_gone(child)  # the server went away: wait for the child itself
    finally:
        server.close()


_FD_BYTES = 4  # a C int on the platforms Spark runs on (array("i").itemsize)


def json_text(value: object) -> str:
    """`json.dumps(value)` for the str, int, list and dict (str keys) a request holds,
    without importing json (its decoder imports re): strings escaped by json's own C
    function (ASCII, lone surrogates of a non-UTF-8 environment as \\udcXX, as json does)."""
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(json_text(item) for item in value) + "]"
    if isinstance(value, dict):
        items = (f"{_quote(key)}: {json_text(item)}" for key, item in value.items())
        return "{" + ", ".join(items) + "}"
    raise TypeError(f"not in a forkserver request: {type(value).__name__}")


def _forward(child: int, signum: int) -> None:
    try:  # noqa: SIM105 -- contextlib's import is what this module does without
        os.kill(child, signum)
    except ProcessLookupError:
        pass


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


def _read_server_int(sock: _socket.socket) -> int:
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
    restore_pythonpath()
    if len(argv) >= 2 and argv[0] == "-m" and argv[1] in MODULES and started_by_spark(os.environ):
        raw = connect(os.environ)
        as_module_path()
        # A local session's forkserver runs the module in a process that has its imports
        # done already (forkserver.py); without one, this process imports and runs it.
        status = hand_over(argv[1], argv[2:], raw)
        if status is not None:
            sys.exit(status)
        with_site()
        sock = full_socket(raw)
        sock_file = sock.makefile("rwb", int(os.environ.get("SPARK_BUFFER_SIZE", 65536)))
        run(argv[1], argv[2:], sock, sock_file)
        return
    os.execv(sys.executable, [sys.executable, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
