"""connect_first.py: a driver-side Python worker connects back to Spark before it imports.

The JVM's side of the handshake is played by a socket here only where Spark cannot be made
to wait (a worker whose imports are held until the test lets them go); the last test runs a
real stream on the session's Spark and finds its source process started this way."""

from __future__ import annotations

import ast
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from replicad.spark.connect_first import MODULES
from replicad.spark.forkserver import ENV as FORKSERVER_ENV
from replicad.spark.worker_python import pyspark_home, worker_python
from replicad.types import TopicPartition
from tools.wait import wait_until

INT = struct.Struct("!i")
DEADLINE_S = 120
SECRET = "a-secret"
STUB_MODULE = "pyspark.sql.worker.lookup_data_sources"

# A stand-in PySpark whose import blocks until the test opens the gate (a FIFO), and whose
# module answers b"ping" with b"gnip" over the socket get_sock_file_to_executor gives it.
STUB_INIT = "open(__import__('os').environ['STUB_GATE']).read()\n"
STUB_WORKER_UTIL = """
import contextlib

@contextlib.contextmanager
def get_sock_file_to_executor(timeout=-1):
    raise AssertionError("connect_first should have handed over its connection")
    yield
"""
STUB_MAIN = """
from pyspark.worker_util import get_sock_file_to_executor

if __name__ == "__main__":
    with get_sock_file_to_executor(timeout=None) as sock_file:
        sock_file.write(sock_file.read(4)[::-1])
        sock_file.flush()
"""


def stub_pyspark(root: Path) -> Path:
    package = root / "pyspark"
    (package / "sql" / "worker").mkdir(parents=True)
    (package / "__init__.py").write_text(STUB_INIT)
    (package / "worker_util.py").write_text(STUB_WORKER_UTIL)
    (package / "sql" / "__init__.py").write_text("")
    (package / "sql" / "worker" / "__init__.py").write_text("")
    (package / "sql" / "worker" / "lookup_data_sources.py").write_text(STUB_MAIN)
    return root


def read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def start_worker(tmp_path: Path, listener: socket.socket, *, secret: str = SECRET):
    stubs = stub_pyspark(tmp_path / "stubs")
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(stubs), *sys.path]),
        "STUB_GATE": str(gate),
        "PYTHON_WORKER_FACTORY_PORT": str(listener.getsockname()[1]),
        "PYTHON_WORKER_FACTORY_SECRET": secret,
    }
    env.pop(FORKSERVER_ENV, None)  # a session's server would run the real module
    argv = [sys.executable, "-m", "replicad.spark.connect_first", "-m", STUB_MODULE]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
    return proc, gate


@pytest.fixture
def listener():
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(DEADLINE_S)
    try:
        yield server
    finally:
        server.close()


def test_the_worker_authenticates_and_sends_its_pid_before_it_imports_pyspark(tmp_path, listener):
    proc, gate = start_worker(tmp_path, listener)
    try:
        conn, _ = listener.accept()
        conn.settimeout(DEADLINE_S)
        (length,) = INT.unpack(read_exactly(conn, 4))
        assert read_exactly(conn, length).decode() == SECRET
        conn.sendall(INT.pack(2) + b"ok")
        assert INT.unpack(read_exactly(conn, 4)) == (proc.pid,)
        # PySpark's import is still held at the gate: the connection came first.
        assert proc.poll() is None
        with open(gate, "w") as f:
            f.write("go")
        conn.sendall(b"ping")
        assert read_exactly(conn, 4) == b"gnip"
        assert proc.wait(DEADLINE_S) == 0
        conn.close()
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()


def test_a_refused_secret_ends_the_worker_before_it_imports(tmp_path, listener):
    proc, _ = start_worker(tmp_path, listener, secret="not-it")
    try:
        conn, _ = listener.accept()
        conn.settimeout(DEADLINE_S)
        (length,) = INT.unpack(read_exactly(conn, 4))
        read_exactly(conn, length)
        conn.sendall(INT.pack(3) + b"err")
        # Never reaches the gate (nobody opens it): exits with the handshake's error.
        assert proc.wait(DEADLINE_S) != 0
        assert b"HandshakeError" in proc.stderr.read()
        conn.close()
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()


def main_block_calls(source: str) -> set[str]:
    """Names called in the module's `if __name__ == "__main__":` block."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return {ast.unparse(call.func) for call in ast.walk(node) if isinstance(call, ast.Call)}
    return set()


@pytest.mark.parametrize("module", MODULES)
def test_each_routed_module_of_the_pinned_pyspark_connects_through_the_handed_over_hook(module):
    """A PySpark whose module connects another way would connect twice: checked per module."""
    path = pyspark_home() / Path(*module.split(".")).with_suffix(".py")
    assert "get_sock_file_to_executor" in main_block_calls(path.read_text())


def test_the_workers_script_routes_only_those_modules(tmp_path):
    # Not started by Spark (no factory port): both routes end in the plain interpreter.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON_WORKER_FACTORY")}
    plain = subprocess.run(
        [worker_python(), "-c", "import sys; print(sys.argv)"], env=env, capture_output=True
    )
    assert plain.returncode == 0 and b"['-c']" in plain.stdout
    script = Path(worker_python()).read_text()
    for module in MODULES:
        assert f"'-m {module}'" in script
    assert "'-m pyspark.daemon'" not in script and "'-m pyspark.worker'" not in script


def source_processes(jvm_pid: int) -> list[str]:
    """Command lines of the JVM's children hosting a Python stream source."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == jvm_pid and "python_streaming_source_runner" in cmdline:
            found.append(cmdline)
    return found


def test_a_stream_on_the_sessions_spark_runs_its_source_through_connect_first(
    spark, tmp_path, write_partition, make_batches
):
    data_dir = tmp_path / "data"
    tp = TopicPartition("connect-first", 0)
    write_partition(data_dir, tp, [make_batches.data(0, 20)])
    (data_dir / "replication-offset-checkpoint").write_text(f"0\n1\n{tp.topic} 0 20\n")
    jvm_pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    query = (
        spark.readStream.format("replicad")
        .load(str(data_dir))
        .writeStream.format("memory")
        .queryName("connect_first")
        .start()
    )
    try:
        wait_until(lambda: source_processes(jvm_pid), timeout_s=DEADLINE_S, what="the source")
        assert "-m replicad.spark.connect_first -m " in source_processes(jvm_pid)[0]
        query.processAllAvailable()
        rows = spark.sql("select offset from connect_first").collect()
        assert sorted(r.offset for r in rows) == list(range(20))
    finally:
        query.stop()
