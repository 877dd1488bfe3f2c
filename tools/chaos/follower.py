"""One replicad daemon under test, seen only from outside: its command line, its
`replicad status --json`, its data directory, its log and its /proc entry.

Counters (`DaemonCounters`) come from the status snapshot. A daemon that is killed
loses its counters, so `Follower` keeps the last snapshot of each process it ran and
sums them (`counters()`): take a snapshot (`status()`) just before a kill to keep what
that process saw.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from replicad.config.rules import UNIX_SOCKET_PATH_MAX
from replicad.types import TopicPartition
from tools.chaos.invariant import end_offsets
from tools.peers.process import proc_status
from tools.replica import ReplicadProcess, run_args, status_json

# Lines of a daemon's log that mean something escaped the handling it should have had.
UNEXPECTED_MARKERS = ("Traceback", "fetch loop failed", "Task exception was never retrieved")
STATUS_TIMEOUT_S = 30

# Scenario defaults: small responses (many round trips), quick retries, short timeouts,
# small segments (several per partition), frequent checkpoints.
FAST_CONFIG: Mapping[str, Any] = {
    "source": {
        "request_timeout_ms": 4000,
        "connect_timeout_ms": 3000,
        "reconnect_backoff_ms": 50,
        "reconnect_backoff_max_ms": 1000,
        "metadata_max_age_ms": 5000,
    },
    "fetch": {
        "response_max_bytes": 256 * 1024,
        "partition_max_bytes": 64 * 1024,
        "wait_max_ms": 200,
        "backoff_ms": 200,
    },
    "log": {"segment_bytes": 1024 * 1024, "segment_index_bytes": 64 * 1024},
    "checkpoint_interval_ms": 1000,
}


@dataclass(frozen=True, slots=True)
class DaemonCounters:
    """What the daemon says happened (status JSON: totals and leaders)."""

    crc_failures: int = 0
    session_recoveries: int = 0
    checkpoint_failures: int = 0
    rejected_responses: int = 0
    truncations: int = 0
    errors: int = 0
    requests: int = 0
    full_requests: int = 0
    incremental_requests: int = 0

    def __add__(self, other: DaemonCounters) -> DaemonCounters:
        return DaemonCounters(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def counters_from_status(snapshot: Mapping[str, Any]) -> DaemonCounters:
    totals = snapshot.get("totals", {})
    leaders = snapshot.get("leaders", [])

    def over_leaders(key: str) -> int:
        return sum(int(leader.get(key, 0) or 0) for leader in leaders)

    return DaemonCounters(
        crc_failures=int(totals.get("crc_failures", 0)),
        session_recoveries=int(totals.get("session_recoveries", 0)),
        checkpoint_failures=int(totals.get("checkpoint_failures", 0)),
        rejected_responses=over_leaders("rejected_responses"),
        truncations=over_leaders("truncations"),
        errors=over_leaders("errors"),
        requests=over_leaders("requests"),
        full_requests=over_leaders("full_requests"),
        incremental_requests=over_leaders("incremental_requests"),
    )


@dataclass(frozen=True, slots=True)
class ProcSample:
    """One reading of a process from /proc (nothing asked of the daemon)."""

    rss_kb: int
    fds: int
    threads: int


def proc_sample(pid: int) -> ProcSample | None:
    """RSS, open file descriptors and threads of `pid`; None once it is gone."""
    try:
        status = proc_status(pid)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    return ProcSample(rss_kb=status.get("VmRSS", 0), fds=fds, threads=status.get("Threads", 0))


def merge_config(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_config(merged[key], value)
        else:
            merged[key] = value
    return merged


def control_socket_path(workdir: Path, name: str) -> Path:
    """`workdir/NAME.sock`, or the same name in a short directory of its own (removed at exit)
    when that path is longer than a Unix socket path may be: a test's directory under pytest's
    base, a worker's `popen-gwN/` and the test's name easily pass 107 bytes."""
    path = workdir / f"{name}.sock"
    if len(os.fsencode(path)) <= UNIX_SOCKET_PATH_MAX:
        return path
    short = Path(tempfile.mkdtemp(prefix="rd-sock-"))
    atexit.register(shutil.rmtree, short, True)
    return short / f"{name}.sock"


class Follower:
    """`replicad run` with a config file written from `config` (merged over FAST_CONFIG),
    replicating `topics` from `bootstrap` into `data_dir` (default: workdir/data)."""

    def __init__(
        self,
        workdir: Path,
        bootstrap: str,
        topics: Sequence[str],
        *,
        config: Mapping[str, Any] | None = None,
        data_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        name: str = "replicad",
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.bootstrap = bootstrap
        self.topics = tuple(topics)
        self.data_dir = data_dir or self.workdir / f"{name}-data"
        self.socket = control_socket_path(self.workdir, name)
        self.log_path = self.workdir / f"{name}.log"
        self.config_path = self.workdir / f"{name}.yaml"
        self.config = merge_config(FAST_CONFIG, config or {})
        self.env = dict(env or {})
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self._proc: ReplicadProcess | None = None
        self._finished = DaemonCounters()  # summed over processes that ended
        self._current = DaemonCounters()  # last snapshot of the running process
        self.exit_codes: list[int] = []
        self.starts = 0

    # -- process -------------------------------------------------------------------

    def args(self) -> list[str]:
        return run_args(
            self.bootstrap,
            self.topics,
            self.data_dir,
            config=self.config_path,
            control_socket=self.socket,
        )

    def start(self) -> Follower:
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self._proc = ReplicadProcess(self.args(), log_path=self.log_path, env=self.env).start()
        self.starts += 1
        return self

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.running

    @property
    def pid(self) -> int | None:
        proc = self._proc.proc if self._proc is not None else None
        return proc.pid if proc is not None and proc.poll() is None else None

    def exit_code(self) -> int | None:
        proc = self._proc.proc if self._proc is not None else None
        return proc.poll() if proc is not None else None

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM and wait (the clean path); returns the exit code."""
        if self._proc is None:
            return 0
        if self.running:
            self.status()
        code = self._proc.stop(timeout_s)
        self._ended(code)
        return code

    def kill(self) -> None:
        """SIGKILL the daemon's process group (the counters of its last snapshot are kept)."""
        if self._proc is None or not self.running:
            return
        self._proc.kill()
        self._ended(-signal.SIGKILL)

    def _ended(self, code: int) -> None:
        self.exit_codes.append(code)
        self._finished = self._finished + self._current
        self._current = DaemonCounters()
        self._proc = None

    # -- what it says --------------------------------------------------------------

    def status(self) -> dict[str, Any] | None:
        """`replicad status --json`, or None while it cannot answer (starting, stopped)."""
        if not self.socket.exists():
            return None
        try:
            snapshot = status_json(self.socket, timeout_s=STATUS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None
        if snapshot is None:
            return None
        if self.running:
            self._current = counters_from_status(snapshot)
        return snapshot

    def counters(self) -> DaemonCounters:
        """Summed over every process this follower ran (each as of its last snapshot)."""
        return self._finished + self._current

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def unexpected_lines(self) -> list[str]:
        """Log lines that mean an error escaped its handling (tracebacks, loop failures)."""
        return [
            line
            for line in self.output().splitlines()
            if any(marker in line for marker in UNEXPECTED_MARKERS)
        ]

    def ends(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return end_offsets(self.data_dir, partitions)

    def sample(self) -> ProcSample | None:
        pid = self.pid
        return proc_sample(pid) if pid is not None else None

    def verify(self) -> subprocess.CompletedProcess[str]:
        """`replicad verify DATA_DIR` (run it while the daemon is stopped)."""
        return subprocess.run(
            [sys.executable, "-m", "replicad.cli", "verify", str(self.data_dir)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
