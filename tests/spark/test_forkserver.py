"""forkserver.py: a driver-side worker hands its connection to Spark over to a warm process.

Spark's side of the handshake is played by a socket here, and PySpark by a stand-in whose
module answers over the connection it was handed and says which process it ran in; the
server preloads that stand-in. A real stream on the session's Spark through the server is
in test_connect_first.py (its source process's module runs in a child of the server)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from replicad.spark import forkserver
from replicad.spark.worker_python import worker_python
from tests.spark.stub_worker import (
    DEADLINE_S,
    INT,
    STUB_MODULE,
    child_of,
    handshake,
    path_of_a_worker,
    plain_module_path,
    pythonpath,
    read_exactly,
    read_path,
    start_worker,
    stub_pyspark,
)
from tools.wait import wait_until

# Answers b"ping" with b"gnip", then its pid, its PRELOADED marker (set in the server's
# import, so only a fork of the server sees it set) and a variable of the worker's
# environment; b"wait" instead: blocks until the connection closes; b"path": its sys.path.
STUB_MAIN = """
import os
import pyspark.preloaded as preloaded
from pyspark.worker_util import get_sock_file_to_executor

if __name__ == "__main__":
    with get_sock_file_to_executor(timeout=None) as sock_file:
        asked = sock_file.read(4)
        if asked == b"wait":
            sock_file.read(1)
        elif asked == b"path":
            said = __import__("json").dumps(__import__("sys").path).encode()
            sock_file.write(len(said).to_bytes(4, "big") + said)
            sock_file.flush()
        else:
            said = f"{os.getpid()} {preloaded.MARK} {os.environ.get('STUB_ENV')}".encode()
            sock_file.write(asked[::-1] + len(said).to_bytes(4, "big") + said)
            sock_file.flush()
"""
PRELOADED = "MARK = 'cold'\n"


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    return stub_pyspark(tmp_path / "stubs", STUB_MAIN, more={"preloaded.py": PRELOADED})


@pytest.fixture
def server(tmp_path: Path, stubs: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """A server preloading the stand-in (its marker set to "warm" once imported) and, as
    the real server preloads the modules it runs, the routed module itself."""
    path = str(tmp_path / "fork.sock")
    marker = f"import pyspark.preloaded as p; p.MARK = 'warm'; import {STUB_MODULE}"
    (stubs / "warmup.py").write_text(marker + "\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "replicad.spark.forkserver", path, str(os.getpid()), "warmup"],
        env={**os.environ, "PYTHONPATH": pythonpath(stubs)},
    )
    try:
        wait_until(lambda: os.path.exists(path), timeout_s=DEADLINE_S, what="the server")
        yield path, proc
    finally:
        proc.terminate()
        proc.wait(DEADLINE_S)


def worker_of(
    stubs: Path, listener: socket.socket, server_path: str, stderr: int | None = None
) -> subprocess.Popen:
    env = {forkserver.ENV: server_path, "STUB_ENV": "the worker's"}
    return start_worker(stubs, listener, env, stderr=stderr)


def ping(conn: socket.socket) -> tuple[int, str, str]:
    conn.sendall(b"ping")
    assert read_exactly(conn, 4) == b"gnip"
    (length,) = INT.unpack(read_exactly(conn, 4))
    pid, mark, env = read_exactly(conn, length).decode().split(" ", 2)
    return int(pid), mark, env


def test_the_module_runs_in_a_fork_of_the_warm_server_over_the_workers_connection(
    stubs, server, listener
):
    path, server_proc = server
    for _ in range(2):  # one fork after another
        worker = worker_of(stubs, listener, path, stderr=subprocess.PIPE)
        try:
            conn = handshake(listener, worker)
            pid, mark, env = ping(conn)
            assert mark == "warm" and env == "the worker's"
            assert pid not in (worker.pid, server_proc.pid)
            assert worker.wait(DEADLINE_S) == 0  # the child's status, once it ended
            conn.close()
            # The module ran as `__main__` from its code, not over the preloaded module
            # (runpy: "found in sys.modules ... prior to execution", on every stream).
            assert b"RuntimeWarning" not in worker.stderr.read()
        finally:
            worker.kill()
            worker.wait()
            worker.stderr.close()
    assert server_proc.poll() is None


# What the stand-in imports before and while it hands over must not hold up the query, which
# waits for it: socket.py's and json's imports were most of its start (connect_first.py).
SLOW_TO_IMPORT = {"socket", "json", "signal", "struct", "contextlib", "enum", "re", "selectors"}


def test_the_stand_in_hands_over_importing_none_of_the_slow_standard_modules(
    stubs, server, listener
):
    path, _ = server
    env = {forkserver.ENV: path, "PYTHONPROFILEIMPORTTIME": "1"}
    worker = start_worker(stubs, listener, env, stderr=subprocess.PIPE)
    try:
        conn = handshake(listener, worker)
        _, mark, _ = ping(conn)
        assert mark == "warm"  # handed over: the server's fork ran the module
        assert worker.wait(DEADLINE_S) == 0
        conn.close()
        imported = {
            line.rsplit("|", 1)[1].strip()
            for line in worker.stderr.read().decode().splitlines()
            if line.startswith("import time:") and "|" in line
        }
    finally:
        worker.kill()
        worker.wait()
        worker.stderr.close()
    assert "_socket" in imported  # the profile was read
    assert imported & SLOW_TO_IMPORT == set()


def test_the_stand_in_starts_without_searching_pythonpath_and_hands_it_on(
    tmp_path, stubs, server, listener
):
    """Started by the workers' script, the stand-in's own start searches no PYTHONPATH entry
    (reading pyspark.zip's index was half of it): the script holds PYTHONPATH aside and
    connect_first puts it back, so the module still runs on it."""
    path, _ = server
    zipped = tmp_path / "on-pythonpath.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("unused.py", "")
    env = {
        forkserver.ENV: path,
        "PYTHONPATH": f"{stubs}{os.pathsep}{zipped}",
        "PYTHONVERBOSE": "1",  # a zip searched says "zipimport: found N names in '...'"
    }
    worker = start_worker(stubs, listener, env, stderr=subprocess.PIPE, program=[worker_python()])
    try:
        conn = handshake(listener, worker)
        conn.sendall(b"path")
        child_path = read_path(conn)
        assert worker.wait(DEADLINE_S) == 0
        conn.close()
        said = worker.stderr.read().decode()
    finally:
        worker.kill()
        worker.wait()
        worker.stderr.close()
    assert str(zipped) in child_path and str(stubs) in child_path  # the module's path has it
    assert "# installed zipimport hook" in said  # the stand-in spoke verbosely
    assert "zipimport: found" not in said


def test_a_request_is_json_as_json_dumps_writes_it():
    import json

    request = {
        "module": STUB_MODULE,
        "args": ["--x", "é", ""],
        "env": {"A": "b c", "Q": '"\\', "U": "\udcff\u2028\n\t", "N": "ü"},
        "path": ["/a b", ""],
        "cwd": "/",
        "client_pid": 4242,
    }
    assert forkserver.json_text(request) == json.dumps(request)
    assert json.loads(forkserver.json_text(request)) == request


def test_without_a_server_the_worker_runs_the_module_itself(tmp_path, stubs, listener):
    worker = worker_of(stubs, listener, str(tmp_path / "no-server.sock"))
    try:
        conn = handshake(listener, worker)
        pid, mark, _ = ping(conn)
        assert (pid, mark) == (worker.pid, "cold")
        assert worker.wait(DEADLINE_S) == 0
        conn.close()
    finally:
        worker.kill()
        worker.wait()


def test_the_child_runs_on_the_workers_path_then_the_servers_site_packages(stubs, server, listener):
    """The worker starts without `site` (-S -P): its path (the working directory,
    PYTHONPATH, the standard library) comes first in the child, then the entries of the
    server's it lacks, site-packages among them."""
    path, server_proc = server
    env = {forkserver.ENV: path, "PYTHONPATH": str(stubs)}
    child_path = path_of_a_worker(stubs, listener, env, ask=b"path")
    expected = plain_module_path(stubs)
    assert any(p.endswith("site-packages") for p in expected)
    assert [p for p in child_path if p in expected] == expected
    assert (
        child_path[: expected.index(str(stubs)) + 1] == expected[: expected.index(str(stubs)) + 1]
    )
    assert server_proc.poll() is None


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_the_child_ends_when_spark_destroys_the_worker(stubs, server, listener, how):
    """Spark stops a worker by destroying the process it started (SIGTERM, forwarded); one
    killed outright leaves the child to notice it is gone."""
    path, server_proc = server
    worker = worker_of(stubs, listener, path)
    try:
        conn = handshake(listener, worker)
        conn.sendall(b"wait")
        wait_until(lambda: child_of(server_proc.pid), timeout_s=DEADLINE_S, what="the fork")
        (child,) = child_of(server_proc.pid)
        worker.send_signal(how)
        worker.wait(DEADLINE_S)
        wait_until(lambda: gone(child), timeout_s=DEADLINE_S, what="the child to end")
        conn.close()
    finally:
        worker.kill()
        worker.wait()
    assert server_proc.poll() is None


def test_a_module_not_routed_is_refused_and_the_worker_starts_cold(tmp_path, server):
    path, _ = server
    spark_side, worker_side = socket.socketpair()
    try:
        os.environ[forkserver.ENV] = path
        try:
            status = forkserver.hand_over("os", [], worker_side, worker_side.makefile("rwb"))
        finally:
            del os.environ[forkserver.ENV]
        assert status is None  # refused: the caller runs it itself
        assert worker_side.fileno() != -1  # and still has its connection
    finally:
        spark_side.close()
        worker_side.close()


def test_exit_codes_follow_the_shell_convention():
    assert forkserver.exit_code(0) == 0
    assert forkserver.exit_code(255) == 255
    assert forkserver.exit_code(-signal.SIGTERM) == 128 + signal.SIGTERM


def test_a_local_session_starts_a_server_unless_switched_off(monkeypatch):
    from replicad.spark import pipeline

    monkeypatch.setattr(pipeline, "_forkserver", [])
    monkeypatch.setenv(forkserver.ENV, "0")  # the off switch
    pipeline._start_forkserver()
    assert pipeline._forkserver == [] and os.environ[forkserver.ENV] == "0"
    monkeypatch.delenv(forkserver.ENV)  # on by default
    pipeline._start_forkserver()
    (server,) = pipeline._forkserver
    try:
        assert os.environ[forkserver.ENV] == server.path  # what the JVM's workers inherit
        wait_until(lambda: os.path.exists(server.path), timeout_s=DEADLINE_S, what="the server")
        pipeline._start_forkserver()  # a second session of the process: the same server
        assert pipeline._forkserver == [server]
    finally:
        os.kill(server.pid, signal.SIGTERM)


def test_a_batch_session_starts_no_server_and_passes_on_no_parents(monkeypatch):
    """export and verify run no stream: no server (its imports would cost what it saves);
    a parent's server (its socket in the environment) is not handed to this JVM's workers,
    the off switch and this process's own server are kept."""
    from replicad.spark import pipeline

    monkeypatch.setattr(pipeline, "_forkserver", [])
    monkeypatch.setenv(forkserver.ENV, "/tmp/a-parents/socket")
    pipeline._no_parents_forkserver()
    assert pipeline._forkserver == [] and os.environ[forkserver.ENV] in forkserver.NO_PATH
    monkeypatch.setenv(forkserver.ENV, "0")
    pipeline._no_parents_forkserver()
    assert os.environ[forkserver.ENV] == "0"
    ours = forkserver.Server("/tmp/ours/socket", os.getpid())
    monkeypatch.setattr(pipeline, "_forkserver", [ours])
    monkeypatch.setenv(forkserver.ENV, ours.path)
    pipeline._no_parents_forkserver()
    assert os.environ[forkserver.ENV] == ours.path
