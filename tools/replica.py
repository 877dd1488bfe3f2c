"""Run `replicad` as a real subprocess and inspect the replica it writes.

Shared by the integration tests, the demo and the benchmarks: they all drive
the daemon the way a user does, through its command line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from replicad.records.batch import scan_batches
from replicad.types import TopicPartition


class ReplicadProcess:
    """`replicad run ...` in its own process group, output to a log file."""

    def __init__(self, args: Sequence[str], *, log_path: Path, env: dict[str, str] | None = None):
        self.args = [sys.executable, "-m", "replicad.cli", *args]
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ReplicadProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM and wait: the daemon's clean shutdown path."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL, no chance to flush: the crash path."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def logged(self, event: str) -> bool:
        """Whether the daemon has logged `event` (run it with `--log-format json`)."""
        for line in self.output().splitlines():
            with contextlib.suppress(ValueError):
                if json.loads(line).get("event") == event:
                    return True
        return False

    def wait_ready(self, timeout_s: float = 60) -> None:
        """Until the daemon has its metadata and replicates (its log says "replicating";
        systemd's READY=1 comes at the same moment). Raises when it exits first."""

        def ready() -> bool:
            if not self.running:
                raise RuntimeError(f"replicad exited before it was ready:\n{self.output()}")
            return self.logged("replicating")

        wait_until(ready, timeout_s=timeout_s, what="replicad to be ready")


def partition_dirs(data_dir: Path) -> dict[TopicPartition, Path]:
    found: dict[TopicPartition, Path] = {}
    if not data_dir.exists():
        return found
    for d in data_dir.iterdir():
        topic, sep, part = d.name.rpartition("-")
        if d.is_dir() and sep and part.isdigit():
            found[TopicPartition(topic, int(part))] = d
    return found


def segment_bytes(partition_dir: Path) -> bytes:
    """All of a partition's .log segments, in offset order (works for Kafka's dirs too)."""
    return b"".join(p.read_bytes() for p in sorted(partition_dir.glob("*.log")))


def batches_from(data: bytes, start_offset: int = 0, end_offset: int | None = None) -> bytes:
    """The whole batches of `data` whose offsets fall in [start_offset, end_offset)."""
    scan = scan_batches(memoryview(data), verify_crc=False)
    kept = [
        b
        for b in scan.batches
        if b.last_offset >= start_offset and (end_offset is None or b.base_offset < end_offset)
    ]
    if not kept:
        return b""
    return data[kept[0].position : kept[-1].position + kept[-1].size]


def log_end_offset(partition_dir: Path) -> int:
    """Offset after the last whole batch on disk (0 for an empty partition)."""
    segments = sorted(partition_dir.glob("*.log"))
    for seg in reversed(segments):
        scan = scan_batches(memoryview(seg.read_bytes()), verify_crc=False)
        if scan.batches:
            return scan.batches[-1].next_offset
    return int(segments[0].stem) if segments else 0


def end_offsets(data_dir: Path) -> dict[TopicPartition, int]:
    return {tp: log_end_offset(d) for tp, d in partition_dirs(data_dir).items()}


def wait_until(
    predicate: Callable[[], bool], *, timeout_s: float, interval_s: float = 0.25, what: str = ""
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what or predicate}")


# `replicad status` exits 0-2 with the daemon's health, 3 when it cannot ask the daemon.
STATUS_UNREACHABLE = 3


def status_json(sock: Path, timeout_s: float = 60) -> dict | None:
    """`replicad status --json` as a user runs it: the snapshot whatever the daemon's
    health (exit 0, 1 or 2), None while the daemon cannot be asked yet (exit 3)."""
    out = subprocess.run(
        [sys.executable, "-m", "replicad.cli", "status", "--socket", str(sock), "--json"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if out.returncode == STATUS_UNREACHABLE:
        return None
    if out.returncode not in (0, 1, 2):
        raise RuntimeError(f"replicad status failed ({out.returncode}): {out.stderr}")
    return json.loads(out.stdout)
