"""`make kafka`: a broker on a fixed port with a sample topic, stopped cleanly by Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tools.peers.process import free_port
from tools.peers.produce import READ_UNCOMMITTED, consume_all

READY = "Kafka is up at"


def test_serves_a_sample_topic_on_the_port_asked_for_until_interrupted(tmp_path: Path) -> None:
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
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    java = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert java.stdout == "", "the broker outlived make kafka"
