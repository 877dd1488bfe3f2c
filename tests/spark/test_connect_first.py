"""connect_first.py: a driver-side Python worker connects back to Spark before it imports.

The JVM's side of the handshake is played by a socket here only where Spark cannot be made
to wait (a worker whose imports are held until the test lets them go); the last test runs a
real stream on the session's Spark and finds its source process started this way: by the
module's file, without `site` (START_FLAGS)."""

from __future__ import annotations

import ast
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from replicad.spark.connect_first import MODULES, start_argv
from replicad.spark.forkserver import ENV as FORKSERVER_ENV
from replicad.spark.forkserver import OFF as FORKSERVER_OFF
from replicad.spark.pipeline import _forkserver
from replicad.spark.worker_python import pyspark_home, worker_python
from replicad.types import TopicPartition
from tests.spark.stub_worker import (
    DEADLINE_S,
    INT,
    SECRET,
    accept,
    child_of,
    handshake,
    path_of_a_worker,
    plain_module_path,
    read_exactly,
    start_worker,
    stub_pyspark,
)
from tools.wait import wait_until

# A stand-in PySpark whose import blocks until the test opens the gate (a FIFO), and whose
# module answers b"ping" with b"gnip" over the socket get_sock_file_to_executor gives it.
STUB_INIT = "open(__import__('os').environ['STUB_GATE']).read()\n"
STUB_MAIN = """
from pyspark.worker_util import get_sock_file_to_executor

if __name__ == "__main__":
    with get_sock_file_to_executor(timeout=None) as sock_file:
        sock_file.write(sock_file.read(4)[::-1])
        sock_file.flush()
"""


def gated_worker(
    tmp_path: Path, listener: socket.socket, *, secret: str = SECRET
) -> tuple[subprocess.Popen, Path]:
    """A worker whose PySpark import waits at the gate it is returned with."""
    stubs = stub_pyspark(tmp_path / "stubs", STUB_MAIN, init=STUB_INIT)
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    # No forkserver: a session's server would run the real module.
    env = {"STUB_GATE": str(gate), FORKSERVER_ENV: None}
    return start_worker(stubs, listener, env, secret=secret, stderr=subprocess.PIPE), gate


def test_the_worker_authenticates_and_sends_its_pid_before_it_imports_pyspark(tmp_path, listener):
    proc, gate = gated_worker(tmp_path, listener)
    try:
        conn = handshake(listener, proc)
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
    proc, _ = gated_worker(tmp_path, listener, secret="not-it")
    try:
        conn, _ = accept(listener)
        conn.sendall(INT.pack(3) + b"err")
        # Never reaches the gate (nobody opens it): exits with the handshake's error.
        assert proc.wait(DEADLINE_S) != 0
        assert b"HandshakeError" in proc.stderr.read()
        conn.close()
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()


# Sends its sys.path (length-prefixed JSON) over the connection it was handed.
PATH_MAIN = """
import json, sys
from pyspark.worker_util import get_sock_file_to_executor

if __name__ == "__main__":
    with get_sock_file_to_executor(timeout=None) as sock_file:
        said = json.dumps(sys.path).encode()
        sock_file.write(len(said).to_bytes(4, "big") + said)
        sock_file.flush()
"""


def test_a_worker_started_without_site_runs_the_module_on_the_path_python_m_gives(
    tmp_path, listener
):
    """Started as a file without `site` (-S -P), the worker that runs the module itself puts
    back what `python -m` and `site` would have: the working directory first, PYTHONPATH,
    then site-packages (here only `site` adds it: PYTHONPATH holds only the stand-in)."""
    stubs = stub_pyspark(tmp_path / "stubs", PATH_MAIN)
    env = {"PYTHONPATH": str(stubs), FORKSERVER_ENV: None}  # no server: it runs it itself
    path = path_of_a_worker(stubs, listener, env)
    expected = plain_module_path(stubs)
    assert any(p.endswith("site-packages") for p in expected)
    assert path == expected
    assert not Path(path[0]).samefile(Path(start_argv(sys.executable)[-1]).parent)


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
    # ... through connect_first's file, without `site`.
    assert f"exec {shlex.join(start_argv(sys.executable))} " in script
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
        # Started by connect_first's file, without `site` (-S -P): what the script says.
        started = " ".join(start_argv(sys.executable))
        runner = "pyspark.sql.streaming.python_streaming_source_runner"
        assert source_processes(jvm_pid)[0].startswith(f"{started} -m {runner}")
        if os.environ.get(FORKSERVER_ENV, "") not in FORKSERVER_OFF:  # on unless switched off
            # ... and handed its connection to the session's server, whose fork runs it
            # for the query's whole life.
            (server,) = _forkserver
            wait_until(lambda: child_of(server.pid), timeout_s=DEADLINE_S, what="the fork")
        query.processAllAvailable()
        rows = spark.sql("select offset from connect_first").collect()
        assert sorted(r.offset for r in rows) == list(range(20))
    finally:
        query.stop()
