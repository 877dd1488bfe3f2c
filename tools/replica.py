"""Run `replicad` as a real subprocess and inspect the replica it writes.

Shared by the integration tests, the demo, the chaos tools and the benchmarks: they all
drive the daemon the way a user does, through its command line.

    with replicad_run(broker.bootstrap, [topic], tmp_path / "data",
                      config={"fetch": {"buffer_memory": 262144}},
                      control_socket=tmp_path / "c.sock") as proc:
        proc.wait_ready()                    # metadata known, replicating (JSON log event)
        proc.wait_caught_up({tp: 100, ...})  # or a record count; fails at once if it exits
        snapshot = proc.status()             # `replicad status --json`
    # leaving the block: SIGTERM, and ReplicadExited unless it exited 0

`replicad_run_config(config, log_path)` runs from a config file alone, `replicad_serve(...)`
starts `replicad serve` and waits until it serves, `replicad_cli(...)` runs a one-shot
command (`status`, `verify`, `config-check`) to its end; `ReplicadProcess(args, log_path=...)`
runs anything else.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from replicad.records.batch import scan_batches
from replicad.types import TopicPartition
from tools.peers.process import dies_with_us
from tools.wait import DEADLINE_S, wait_until

# `python -m replicad.cli` as installed for production: without the test extra's hypothesis,
# which kio imports when present (8 MiB of RSS no production replicad has). Benchmarks use it.
# `replicad run` and `serve` now keep hypothesis out themselves (startup.keep_test_libraries_out,
# 5a2859c), but a benchmark's `--baseline` may be a checkout from before that: this keeps
# every replicad a benchmark compares the same.
AS_INSTALLED = (
    "import sys; sys.modules['hypothesis'] = None; from replicad.cli import main; sys.exit(main())"
)


def replicad_argv(*args: str, as_installed: bool = False) -> list[str]:
    """The command line of `replicad ARGS...` with this interpreter."""
    program = ["-c", AS_INSTALLED] if as_installed else ["-m", "replicad.cli"]
    return [sys.executable, *program, *args]


def run_args(
    bootstrap: str,
    topics: str | Sequence[str] | None,
    data_dir: Path,
    *,
    config: Path | None = None,
    control_socket: Path | None = None,
    log_format: str | None = "json",
    extra: Sequence[str] = (),
) -> list[str]:
    """`run` and its flags: the source, the topics (a list or "a,b"; None: `extra` or the
    config names them), where to write."""
    args = ["run"]
    if config is not None:
        args += ["-c", str(config)]
    args += ["--bootstrap-servers", bootstrap]
    if topics is not None:
        args += ["--topics", topics if isinstance(topics, str) else ",".join(topics)]
    args += ["--data-dir", str(data_dir)]
    if control_socket is not None:
        args += ["--control-socket", str(control_socket)]
    if log_format is not None:
        args += ["--log-format", log_format]
    return [*args, *extra]


class ReplicadExited(RuntimeError):
    """The daemon ended while the caller waited for it, or ended with the wrong code."""


class ReplicadProcess:
    """`replicad ARGS...` in its own process group, output to a log file.

    As a context manager it is started on entry (unless it was started) and stopped
    (SIGTERM) on exit; when the block ended cleanly and the daemon exits other than
    `expected_exit`, ReplicadExited carries its output. `replicad_run` makes one for
    `replicad run` and knows its data dir and control socket.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        as_installed: bool = False,
        data_dir: Path | None = None,
        control_socket: Path | None = None,
    ):
        self.args = replicad_argv(*args, as_installed=as_installed)
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.data_dir = data_dir
        self.control_socket = control_socket
        self.expected_exit = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ReplicadProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        # Its own session (a signal to the test's group is not one to the daemon), and it
        # dies with the test's process: a killed test run left `replicad run` daemons.
        self.proc = subprocess.Popen(
            self.args,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
            preexec_fn=dies_with_us(),
        )
        log.close()
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

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

    def __enter__(self) -> ReplicadProcess:
        return self if self.proc is not None else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc is None:
            return
        code = self.stop(timeout_s=120)
        if exc is None and code != self.expected_exit:
            raise ReplicadExited(f"replicad exited with {code}:\n{self.output()[-5000:]}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def logged(self, event: str) -> bool:
        """Whether the daemon has logged `event` (run it with `--log-format json`)."""
        for line in self.output().splitlines():
            with contextlib.suppress(ValueError):
                if json.loads(line).get("event") == event:
                    return True
        return False

    def wait_for(
        self,
        predicate: Callable[[], bool],
        *,
        timeout_s: float = DEADLINE_S,
        interval_s: float = 0.25,
        what: str = "",
    ) -> None:
        """`wait_until`, failing at once (with the daemon's output) when the daemon exits."""

        def while_running() -> bool:
            if predicate():
                return True
            if not self.running:
                raise ReplicadExited(
                    f"replicad exited while waiting for {what or predicate}:\n"
                    f"{self.output()[-5000:]}"
                )
            return False

        wait_until(while_running, timeout_s=timeout_s, interval_s=interval_s, what=what)

    def wait_ready(self, timeout_s: float = DEADLINE_S) -> None:
        """Until the daemon has its metadata and replicates (its log says "replicating";
        systemd's READY=1 comes at the same moment). Raises when it exits first."""
        self.wait_for(
            lambda: self.logged("replicating"), timeout_s=timeout_s, what="replicad to be ready"
        )

    def wait_serving(self, timeout_s: float = DEADLINE_S) -> None:
        """Until `replicad serve` (or a run's serve: section) listens. Raises when it exits."""
        self.wait_for(
            lambda: SERVING in self.output(), timeout_s=timeout_s, what="replicad serve to listen"
        )

    def end_offsets(self) -> dict[TopicPartition, int]:
        """The log end of every partition in its data dir."""
        assert self.data_dir is not None, "made without a data dir"
        return end_offsets(self.data_dir)

    def wait_caught_up(
        self, want: Mapping[TopicPartition, int] | int, *, timeout_s: float = 120
    ) -> None:
        """Until the replica's log ends are exactly `want`, or it holds `want` records."""
        if isinstance(want, int):
            count = want
            self.wait_for(
                lambda: sum(self.end_offsets().values()) >= count,
                timeout_s=timeout_s,
                what=f"{count:,} records replicated",
            )
            return
        wanted = dict(want)
        self.wait_for(
            lambda: self.end_offsets() == wanted,
            timeout_s=timeout_s,
            what=f"{len(wanted)} partitions caught up",
        )

    def status(self, timeout_s: float = 60) -> dict | None:
        """`replicad status --json` on its control socket (None while it cannot be asked)."""
        assert self.control_socket is not None, "made without a control socket"
        return status_json(self.control_socket, timeout_s)


def replicad_run(
    bootstrap: str,
    topics: str | Sequence[str] | None,
    data_dir: Path,
    *,
    log_path: Path | None = None,
    config: Path | Mapping[str, Any] | None = None,
    control_socket: Path | None = None,
    log_format: str | None = "json",
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    as_installed: bool = False,
    start: bool = True,
) -> ReplicadProcess:
    """`replicad run` of `topics` from `bootstrap` into `data_dir`, started unless told not.

    `config` is a YAML file, or a mapping written as one beside the log (the flags win
    over it). The log goes to `log_path` (default: `<data_dir>.log` beside the data dir),
    as JSON unless `log_format` says otherwise (None: the daemon's own choice). `extra` is
    more flags. Wait with `wait_ready()`, `wait_caught_up(...)` or `wait_for(...)`.
    """
    log_path = log_path or data_dir.with_name(f"{data_dir.name}.log")
    if config is not None and not isinstance(config, Path):
        config_path = log_path.with_suffix(".yaml")
        config_path.parent.mkdir(parents=True, exist_ok=True)
        config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        config = config_path
    proc = ReplicadProcess(
        run_args(
            bootstrap,
            topics,
            data_dir,
            config=config,
            control_socket=control_socket,
            log_format=log_format,
            extra=extra,
        ),
        log_path=log_path,
        env=env,
        as_installed=as_installed,
        data_dir=data_dir,
        control_socket=control_socket,
    )
    return proc.start() if start else proc


def replicad_run_config(
    config: Path,
    log_path: Path,
    *,
    log_format: str | None = "json",
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    data_dir: Path | None = None,
    control_socket: Path | None = None,
    start: bool = True,
) -> ReplicadProcess:
    """`replicad run -c CONFIG`: the source, topics and data dir all from the file
    (`data_dir`/`control_socket` only tell the process object where they are)."""
    args = ["run", "-c", str(config)]
    if log_format is not None:
        args += ["--log-format", log_format]
    proc = ReplicadProcess(
        [*args, *extra],
        log_path=log_path,
        env=env,
        data_dir=data_dir,
        control_socket=control_socket,
    )
    return proc.start() if start else proc


# What `replicad serve` logs once it listens.
SERVING = "serving the replica over the Kafka protocol"


def replicad_serve(
    data_dir: Path,
    port: int,
    *,
    log_path: Path,
    allow_followers: Sequence[int] = (),
    flags: Sequence[str] = (),
    log_format: str | None = "json",
    env: Mapping[str, str] | None = None,
    wait: bool = True,
) -> ReplicadProcess:
    """`replicad serve` of `data_dir` on 127.0.0.1:`port`, started and (unless `wait` is
    False) listening; ReplicadExited with its output when it exits first. Stop it with
    `with` or `stop()`. Groups start their first rebalance at the first join
    (`--group-initial-rebalance-delay-ms 0`, as on the harness's Kafka brokers and in
    Kafka's own tests) unless `flags` says otherwise."""
    args = ["serve", "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{port}"]
    if not any(flag.startswith("--group-initial-rebalance-delay-ms") for flag in flags):
        args += ["--group-initial-rebalance-delay-ms", "0"]
    for follower in allow_followers:
        args += ["--allow-follower", str(follower)]
    if log_format is not None:
        args += ["--log-format", log_format]
    proc = ReplicadProcess([*args, *flags], log_path=log_path, env=env).start()
    if wait:
        try:
            proc.wait_serving()
        except BaseException:
            proc.kill()
            raise
    return proc


def replicad_cli(
    *args: str, timeout_s: float = 60, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`replicad ARGS...` run to its end as a user runs it (`status`, `verify`, ...):
    exit code, stdout and stderr as text."""
    return subprocess.run(
        replicad_argv(*args),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **env} if env is not None else None,
    )


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


def topic_ends(data_dir: Path, topic: str) -> dict[int, int]:
    """The log end of each of `topic`'s partitions in `data_dir`, by partition number."""
    return {tp.partition: end for tp, end in end_offsets(data_dir).items() if tp.topic == topic}


# `replicad status` exits 0-2 with the daemon's health, 3 when it cannot ask the daemon.
STATUS_UNREACHABLE = 3


def status_json(sock: Path, timeout_s: float = 60) -> dict | None:
    """What `replicad status --json` prints, asked in this process: the snapshot whatever
    the daemon's health (the command's exit 0, 1 or 2), None while the daemon cannot be
    asked (its exit 3: no socket, a stale one, no answer within the command's own 5 s).

    The command's own client and JSON view (`query`, `render_json`) without the command's
    process: the tests ask the status wherever they wait on a daemon, thousands of times a
    suite, and each `replicad status` was an interpreter's start (0.2-0.4 CPU-s at load 21).
    The command itself, its exit codes and output, is tested as a user runs it in
    tests/test_cli.py and tests/peers/test_replica.py. `timeout_s` caps the wait for the
    answer at the command's own."""
    from replicad.control.client import DEFAULT_TIMEOUT_S, query
    from replicad.control.status_view import render_json
    from replicad.errors import ControlError

    try:
        snapshot = query(sock, timeout_s=min(timeout_s, DEFAULT_TIMEOUT_S))
    except ControlError:  # DaemonNotRunning among them: the command's exit 3
        return None
    return json.loads(render_json(snapshot))
