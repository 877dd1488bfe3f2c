"""tools/replica.py: the one way tests, benches and chaos start `replicad run`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import yaml

from tools.peers.process import free_port
from tools.replica import (
    STATUS_UNREACHABLE,
    ReplicadExited,
    replicad_argv,
    replicad_cli,
    replicad_run,
    replicad_run_config,
    replicad_serve,
    run_args,
)


def test_run_args_name_the_source_topics_and_where_to_write(tmp_path) -> None:
    args = run_args(
        "127.0.0.1:9092",
        ["a", "b"],
        tmp_path / "data",
        config=tmp_path / "c.yaml",
        control_socket=tmp_path / "c.sock",
        extra=["--start-from", "latest"],
    )
    assert args == [
        "run",
        "-c",
        str(tmp_path / "c.yaml"),
        "--bootstrap-servers",
        "127.0.0.1:9092",
        "--topics",
        "a,b",
        "--data-dir",
        str(tmp_path / "data"),
        "--control-socket",
        str(tmp_path / "c.sock"),
        "--log-format",
        "json",
        "--start-from",
        "latest",
    ]
    bare = run_args("h:1", None, tmp_path, log_format=None, extra=["--topics-regex", "x.*"])
    assert "--topics" not in bare and "--log-format" not in bare
    assert bare[-2:] == ["--topics-regex", "x.*"]


def test_as_installed_hides_hypothesis() -> None:
    argv = replicad_argv("status", as_installed=True)
    assert "sys.modules['hypothesis'] = None" in argv[2] and argv[3:] == ["status"]


def test_a_daemon_that_exits_fails_the_block_with_its_output(tmp_path) -> None:
    """A config mapping is written as YAML the daemon reads; a bad key makes it exit 78,
    which wait_for reports at once (not at its timeout) and the block reports again."""
    config = {"fetch": {"bogus_key": 1}}
    # A wait that ran out would raise TimeoutError, not ReplicadExited with the output.
    with (
        pytest.raises(ReplicadExited, match=r"fetch\.bogus_key"),
        replicad_run("127.0.0.1:9", "t", tmp_path / "data", config=config) as proc,
    ):
        proc.wait_for(lambda: False, what="never")
    assert yaml.safe_load((tmp_path / "data.yaml").read_text()) == config
    assert proc.proc is not None and proc.proc.returncode == 78
    with (
        pytest.raises(ReplicadExited, match="exited with 78"),
        replicad_run("127.0.0.1:9", "t", tmp_path / "data", config=config) as again,
    ):
        assert again.proc is not None
        again.proc.wait(30)


def test_a_serve_that_cannot_start_fails_at_once_with_its_output(tmp_path) -> None:
    """replicad_serve waits until serve listens, and not a moment longer when it exits:
    here it refuses a follower principal without a certificate check to match it."""
    # A wait that ran out would not carry serve's own words.
    with pytest.raises(ReplicadExited, match="follower-principal"):
        replicad_serve(
            tmp_path / "data",
            free_port(),
            log_path=tmp_path / "serve.log",
            flags=["--tls-client-auth", "required", "--follower-principal", "replica"],
        )


def test_the_cli_runs_to_its_end_and_a_config_alone_starts_run(tmp_path) -> None:
    config = tmp_path / "replicad.yaml"
    config.write_text(
        "source:\n  bootstrap_servers: ['127.0.0.1:9']\ntopics:\n  include: [t]\n"
        f"data_dir: {tmp_path / 'data'}\nfetch:\n  bogus_key: 1\n"
    )
    asked = replicad_cli("status", "--socket", str(tmp_path / "nobody.sock"))
    assert asked.returncode == STATUS_UNREACHABLE, asked.stdout + asked.stderr
    proc = replicad_run_config(config, tmp_path / "run.log")
    assert proc.proc is not None and proc.proc.wait(30) == 78
    assert proc.args[-5:] == ["run", "-c", str(config), "--log-format", "json"]
    assert "fetch.bogus_key" in proc.output()


def test_status_json_is_what_replicad_status_json_prints(tmp_path) -> None:
    """tools.replica.status_json asks in the test's process what the command prints: the
    same snapshot while a daemon answers, None where the command exits 3."""
    import json
    import socket

    from tools.replica import status_json

    sock = tmp_path / "c.sock"
    assert status_json(sock) is None  # no socket: the command's "not running"
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as bound:
        bound.bind(str(stale))
    assert status_json(stale) is None  # nobody bound to it any more
    with replicad_run("127.0.0.1:9", "orders", tmp_path / "data", control_socket=sock) as proc:
        proc.wait_for(
            lambda: ((status_json(sock) or {}).get("health") or {}).get("state") == "down",
            what="the daemon to answer that it is down (no source at :9)",
        )
        asked = replicad_cli("status", "--socket", str(sock), "--json", timeout_s=600)
        mine = status_json(sock)
        assert proc.stop() == 0, proc.output()
    assert asked.returncode in (0, 1, 2), asked.stdout + asked.stderr
    theirs = json.loads(asked.stdout)
    assert mine is not None and sorted(mine) == sorted(theirs)
    assert mine["health"]["state"] == theirs["health"]["state"] == "down"
    assert [p["topic"] for p in mine["partitions"]] == [p["topic"] for p in theirs["partitions"]]


_RUNNER = """
import sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from tools.replica import replicad_run
daemon = replicad_run("127.0.0.1:{port}", ["t"], Path({data!r}))
print(daemon.pid, flush=True)
time.sleep(300)  # the test SIGKILLs us here
"""


def test_a_daemon_dies_with_the_process_that_started_it(tmp_path) -> None:
    """A test run killed outright (SIGKILL, a CI timeout) left its `replicad run` daemons
    running: each leads a session of its own. Now the kernel kills it with its parent."""
    from tests.peers.test_process import ROOT, pid_alive, wait_dead

    code = _RUNNER.format(root=str(ROOT), port=free_port(), data=str(tmp_path / "data"))
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    daemon_pid = None
    try:
        assert parent.stdout is not None
        daemon_pid = int(parent.stdout.readline())
        assert pid_alive(daemon_pid)
        parent.kill()
        parent.wait(30)
        assert wait_dead(daemon_pid), "the daemon outlived the process that started it"
    finally:
        parent.kill()
        parent.wait()
        if daemon_pid is not None and pid_alive(daemon_pid):
            os.kill(daemon_pid, signal.SIGKILL)
