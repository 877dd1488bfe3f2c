"""tools/replica.py: the one way tests, benches and chaos start `replicad run`."""

from __future__ import annotations

import time

import pytest
import yaml

from tools.replica import ReplicadExited, replicad_argv, replicad_run, run_args


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
    started = time.monotonic()
    with (
        pytest.raises(ReplicadExited, match=r"fetch\.bogus_key"),
        replicad_run("127.0.0.1:9", "t", tmp_path / "data", config=config) as proc,
    ):
        proc.wait_for(lambda: False, timeout_s=60, what="never")
    assert time.monotonic() - started < 30
    assert yaml.safe_load((tmp_path / "data.yaml").read_text()) == config
    assert proc.proc is not None and proc.proc.returncode == 78
    with (
        pytest.raises(ReplicadExited, match="exited with 78"),
        replicad_run("127.0.0.1:9", "t", tmp_path / "data", config=config) as again,
    ):
        assert again.proc is not None
        again.proc.wait(30)
