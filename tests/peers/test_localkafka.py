"""`make kafka`: a broker on a fixed port with a sample topic, stopped cleanly by Ctrl-C; and
the README's "Trying it by hand" against it, as written (the port and the venv the test's)."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from tools.peers.process import free_port
from tools.peers.produce import READ_UNCOMMITTED, consume_all
from tools.readme import shell_commands
from tools.replica import end_offsets, wait_until

READY = "Kafka is up at"
SECTION = "Trying it by hand"
VENV_BIN = Path(sys.executable).parent


def readme_commands(port: int) -> list[list[str]]:
    """The section's commands after `make kafka`, for a broker on `port`, with this venv."""
    commands = [c.command for c in shell_commands() if c.section == SECTION]
    assert commands[0] == "make kafka", commands
    return [
        [
            str(VENV_BIN / "replicad") if word == ".venv/bin/replicad" else word
            for word in shlex.split(command.replace("127.0.0.1:9092", f"127.0.0.1:{port}"))
        ]
        for command in commands[1:]
    ]


def the_readmes_commands_replicate_the_sample_topic(port: int, cwd: Path) -> None:
    run, status, verify = readme_commands(port)
    assert run[1] == "run" and status[1] == "status" and verify[1] == "verify"
    daemon = subprocess.Popen(run, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        source = consume_all(f"127.0.0.1:{port}", "demo", isolation=READ_UNCOMMITTED)
        data_dir = cwd / "var" / "try" / "data"

        def caught_up() -> bool:
            ends = end_offsets(data_dir) if data_dir.is_dir() else {}
            return len(ends) == len(source) and subprocess.run(status, cwd=cwd).returncode == 0

        wait_until(caught_up, timeout_s=60, what="the replica to catch up, status healthy")
        shown = subprocess.run(status, cwd=cwd, capture_output=True, text=True)
        assert shown.returncode == 0 and shown.stdout.startswith("health: HEALTHY"), shown
        verified = subprocess.run(verify, cwd=cwd, capture_output=True, text=True)
        assert verified.returncode == 0, verified.stdout + verified.stderr
    finally:
        daemon.send_signal(signal.SIGINT)  # Ctrl-C in the README's terminal
        output = daemon.communicate(timeout=60)[0].decode()
    assert daemon.returncode == 0 and "Traceback" not in output, output


def test_a_sample_topic_the_readmes_commands_replicate_until_ctrl_c(
    tmp_path: Path,
) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.localkafka", "--port", str(port), "--workdir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if READY in line:
                break
        assert any(f"{READY} 127.0.0.1:{port} with topic 'demo'" in line for line in lines), lines
        records = consume_all(f"127.0.0.1:{port}", "demo", isolation=READ_UNCOMMITTED)
        assert sum(len(r) for r in records.values()) >= 3_000  # plus aborted transactions
        # A second terminal, as the README goes on.
        try_dir = tmp_path / "checkout"
        try_dir.mkdir()
        the_readmes_commands_replicate_the_sample_topic(port, try_dir)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    java = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert java.stdout == "", "the broker outlived make kafka"
