"""A warm start for a local run's driver-side Python: fork from a process that has already
imported PySpark, pyarrow and the `replicad` source, instead of importing them again.

Spark starts a fresh Python process on the driver for each streaming query, the one that
hosts its source (python_streaming_source_runner: a simple worker, never Spark's daemon). It
imports PySpark, pyarrow and our source before doing anything: about 0.9 s of CPU on this
machine, paid by every query however few records it reads (docs/benchmarks.md, session 10).
(Spark 4.3 runs the planner's steps, create_data_source and plan_data_source_read, through
pyspark.daemon in workers it reuses: those import once and are warm already.)

So a local session (pipeline.spark_session; on by default, off with
REPLICAD_SPARK_FORKSERVER=0) starts one server that imports them once, and
connect_first.py, once connected to Spark, hands it that connection: the socket, its own
stdin/stdout/stderr (SCM_RIGHTS over a Unix socket), the module, its arguments,
environment, sys.path and working directory. The server forks; the child takes them over
and runs the module as connect_first would have (on the worker's path, then the server's
entries it lacks: the worker starts without `site`). Spark's daemon for executor workers works
the same way (pyspark/daemon.py); these driver-side processes do not go through it.

Rules:
- The process Spark started stays until the child ends: Spark knows it by its pid and stops
  the worker by destroying it. It waits for the child's exit status (the server sends it)
  and exits with it; SIGTERM, SIGINT and SIGHUP it forwards to the child; and the child
  ends itself if that process goes away first (SIGKILL).
- Anything that fails before the server has said it forked (no server yet, a server that
  is gone or refuses) leaves connect_first to import and run the module itself: the warm
  start is never needed, only faster. The server binds its socket only once its imports
  are done, so an early worker finds nothing and starts cold.
- The server serves only connect_first.MODULES, on a socket in a directory only its user
  can enter, and ends when the process that started it is gone (or is told to).
- The worker's side (`connect_first.hand_over`) imports the standard library only: it runs
  before anything else in the worker.
- What a preloaded module reads from the environment when imported, it read in the server,
  which has the driver's environment (PySpark 4.3's modules read two test switches so,
  SPARK_TESTING and PYSPARK_ENABLE_NAMEDTUPLE_PATCH); everything read while running sees
  the worker's own.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
from dataclasses import dataclass

from replicad.spark.connect_first import (  # the worker's side, and what it shares
    ENV as ENV,
)
from replicad.spark.connect_first import (
    MODULES,
    _forward,
    run,
)
from replicad.spark.connect_first import (
    NO_PATH as NO_PATH,
)
from replicad.spark.connect_first import (
    OFF as OFF,
)
from replicad.spark.connect_first import (
    hand_over as hand_over,
)
from replicad.spark.connect_first import (
    json_text as json_text,
)

_INT = struct.Struct("!i")
_FDS = 4  # the connection to Spark, then stdin, stdout, stderr
_MAX_REQUEST = 1 << 20
_POLL_S = 0.2
_DIR_PREFIX = "replicad-fork-"
# Imported once by the server: what the driver-side modules and our source import.
PRELOAD = (
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.streaming.python_streaming_source_runner",
    "replicad.spark.source",
    "replicad.spark.stream",
    "replicad.spark.connect_first",
)


@dataclass(frozen=True)
class Request:
    module: str
    args: list[str]
    env: dict[str, str]
    path: list[str]
    cwd: str
    client_pid: int
    fds: list[int]


def exit_code(status: int) -> int:
    """A child's exit status as this process's: killed by signal N -> 128 + N."""
    return 128 - status if status < 0 else status & 0xFF


# -- the driver's side ---------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    path: str  # its socket, bound once the server has imported what it preloads
    pid: int


def start(python: str, pythonpath: str, preload: tuple[str, ...] = ()) -> Server:
    """Start a server for this process (ended with it)."""
    import atexit
    import shutil
    import subprocess
    import tempfile

    directory = tempfile.mkdtemp(prefix=_DIR_PREFIX)  # mode 0700
    path = os.path.join(directory, "socket")
    env = {**os.environ, "PYTHONPATH": pythonpath}
    with open(os.path.join(directory, "server.log"), "wb") as log:
        proc = subprocess.Popen(
            [python, "-m", "replicad.spark.forkserver", path, str(os.getpid()), *preload],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            close_fds=True,
        )

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(directory, ignore_errors=True)

    atexit.register(stop)
    return Server(path, proc.pid)


# -- the server ----------------------------------------------------------------------------


def serve(path: str, parent: int, preload: tuple[str, ...] | list[str] = PRELOAD) -> None:
    import importlib

    for module in preload:
        importlib.import_module(module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    os.rename(path + ".new", path)  # clients see the socket only once it listens
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    while not stopping.is_set() and os.getppid() == parent:
        ready, _, _ = select.select([listener], [], [], _POLL_S)
        _reap(children)
        if not ready:
            continue
        conn, _ = listener.accept()
        conn.settimeout(5)
        try:
            request = _receive(conn)
        except (OSError, EOFError, ValueError) as error:
            print(f"forkserver: a request refused: {error}", file=sys.stderr, flush=True)
            conn.close()
            continue
        if request.module not in MODULES:
            _close_all(request.fds)
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            for other in children.values():
                other.close()
            conn.close()
            _child(request)  # never returns
        _close_all(request.fds)
        conn.settimeout(None)
        try:
            conn.sendall(_INT.pack(pid))
        except OSError:
            conn.close()
            continue
        children[pid] = conn
    listener.close()
    for pid in children:
        _forward(pid, signal.SIGTERM)


def _receive(conn: socket.socket) -> Request:
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, _FDS)
    if len(fds) != _FDS:
        _close_all(fds)
        raise ValueError(f"{len(fds)} file descriptors, not {_FDS}")
    try:
        while len(data) < _INT.size:
            more = conn.recv(65536)
            if not more:
                raise EOFError("closed before the request")
            data += more
        (length,) = _INT.unpack(data[: _INT.size])
        if not 0 < length <= _MAX_REQUEST:
            raise ValueError(f"a request of {length} bytes")
        body = data[_INT.size :]
        while len(body) < length:
            more = conn.recv(65536)
            if not more:
                raise EOFError("closed in the middle of the request")
            body += more
        fields = json.loads(body[:length])
        return Request(
            str(fields["module"]),
            [str(a) for a in fields["args"]],
            {str(k): str(v) for k, v in fields["env"].items()},
            [str(p) for p in fields["path"]],
            str(fields["cwd"]),
            int(fields["client_pid"]),
            list(fds),
        )
    except BaseException:
        _close_all(fds)
        raise


def _close_all(fds: list[int] | array.array) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        with contextlib.suppress(OSError):
            conn.sendall(_INT.pack(exit_code(os.waitstatus_to_exitcode(status))))
        conn.close()


def _child(request: Request) -> None:
    """Become the worker Spark started: its connection, files, environment; then the
    module. Ends the process, whatever happens."""
    code = 1
    try:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        spark_fd, *std = request.fds
        for target, fd in enumerate(std):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request.cwd)
        os.environ.clear()
        os.environ.update(request.env)
        # The worker's path, then the server's entries it lacks: a worker started without
        # `site` (connect_first's START_FLAGS) has no site-packages on its path, and the
        # server, the same interpreter started with its site, has.
        sys.path[:] = [*request.path, *(p for p in sys.path if p not in request.path)]
        import random

        random.seed()
        _watch(request.client_pid)
        sock = socket.socket(fileno=spark_fd)
        sock.settimeout(int(request.env.get("SPARK_AUTH_SOCKET_TIMEOUT", 15)))
        sock_file = sock.makefile("rwb", int(request.env.get("SPARK_BUFFER_SIZE", 65536)))
        # Run as `__main__` from its code, as a cold worker would: the preloaded module
        # object stays out of it (runpy warns when running a module already imported).
        sys.modules.pop(request.module, None)
        run(request.module, request.args, sock, sock_file)
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        import atexit

        with contextlib.suppress(Exception):
            atexit._run_exitfuncs()  # as the interpreter would on its way out
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code & 0xFF)


def _watch(client_pid: int) -> None:
    """End this process when the one Spark started is gone (it was killed outright)."""
    try:
        fd = os.pidfd_open(client_pid)
    except (OSError, AttributeError):
        return

    def wait() -> None:
        select.select([fd], [], [])
        os._exit(1)

    threading.Thread(target=wait, name="forkserver-watch", daemon=True).start()


def main(argv: list[str]) -> None:
    """`python -m replicad.spark.forkserver SOCKET PARENT_PID [MODULE...]`: MODULEs
    preloaded instead of PRELOAD (the tests' stand-in PySpark)."""
    path, parent, preload = argv[0], int(argv[1]), argv[2:]
    try:
        serve(path, parent, preload or PRELOAD)
    finally:
        for leftover in (path, path + ".new"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
        # The directory start() made, when its driver was killed before it could.
        directory = os.path.dirname(path)
        if os.path.basename(directory).startswith(_DIR_PREFIX):
            import shutil

            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
