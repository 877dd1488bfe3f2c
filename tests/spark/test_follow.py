"""`replicad pipeline export --follow / --available-now` over a replica a real `replicad run`
is writing: exactly once across a driver (a subprocess of its own, as a user runs it)
SIGKILLed in the middle of a micro-batch, then the export followed from the same checkpoint
with progress lines until a real SIGTERM stops it cleanly."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from replicad.spark.follow import export_stream, offsets_behind, progress_line
from replicad.types import TopicPartition
from tests.spark.conftest import LOCAL_SPARK_ARGS
from tests.spark.test_stream import (
    REPLICA_CONFIG,
    committed,
    every_offset,
    sink_offsets,
    wait_replicated,
)
from tools.peers.process import kill, spawn
from tools.peers.produce import produce_numbered
from tools.replica import replicad_argv, replicad_run
from tools.wait import wait_until

RUN_TIMEOUT_S = 600


def pipeline(data_dir: Path, out: Path, *flags: str, log: Path) -> subprocess.Popen:
    """`replicad pipeline export DATA --out OUT FLAGS` in local[1], its output into `log`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = replicad_argv(
        "pipeline",
        "export",
        str(data_dir),
        "--out",
        str(out),
        *LOCAL_SPARK_ARGS,
        *flags,
    )
    with open(log, "wb") as f:
        # A session of its own (tools.peers.process.spawn): the driver is the Python process,
        # its JVM and the Python workers, killed together as a machine's crash would. The
        # driver dies with this test's process, and its JVM with it (PySpark's gateway exits
        # when its stdin, a pipe from the driver, closes).
        return spawn(argv, env=env, output=f)


def finish(proc: subprocess.Popen, log: Path) -> str:
    try:
        proc.wait(RUN_TIMEOUT_S)
    finally:
        kill_driver(proc)
    return log.read_text()


def kill_driver(proc: subprocess.Popen) -> None:
    """SIGKILL to the driver's whole process group (its JVM and workers too), then reaped."""
    kill(proc)


def batch_in_flight(checkpoint: Path) -> int | None:
    """A micro-batch planned (offsets/N written) and not committed (no commits/N), N > 0."""
    planned = {int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*")}
    committed = {int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")}
    waiting = sorted(planned - committed)
    return waiting[-1] if waiting and waiting[-1] > 0 else None


def test_export_is_exactly_once_across_a_sigkill_mid_batch_and_stops_on_sigterm(
    kafka_broker, unique_topic, tmp_path, spark
):
    topic = unique_topic()
    kafka_broker.create_topic(topic, 2)
    produce_numbered(kafka_broker.bootstrap, topic, 2, 150)
    data_dir, out = tmp_path / "data", tmp_path / "export"
    checkpoint = Path(f"{out}.checkpoint")
    with replicad_run(kafka_broker.bootstrap, [topic], data_dir, config=REPLICA_CONFIG) as proc:
        wait_replicated(proc, data_dir, {TopicPartition(topic, p): 150 for p in range(2)})

        # --available-now in micro-batches of 30; killed once a batch after the first is
        # planned (offsets/N) and not committed (no commits/N): its files may be in the sink.
        log = tmp_path / "killed.log"
        limit = ["--max-offsets-per-trigger", "30"]
        driver = pipeline(data_dir, out, "--available-now", *limit, log=log)
        try:
            wait_until(
                lambda: batch_in_flight(checkpoint) is not None or driver.poll() is not None,
                timeout_s=RUN_TIMEOUT_S,
                interval_s=0.05,
                what="a micro-batch in flight",
            )
            killed_in = batch_in_flight(checkpoint)
        finally:
            kill_driver(driver)
        assert killed_in is not None, log.read_text()[-3000:]

        # Spark's console kept quiet: no log4j banner, no loopback warning.
        text = log.read_text()
        assert "default log4j profile" not in text and "loopback address" not in text
        assert "Setting default log level" not in text

        # More records while no driver runs; then --follow from the same checkpoint, in this
        # process's session (a JVM start fewer): the batch cut short is replayed, the sink
        # keeps one copy, the rest follows; a real SIGTERM to this process stops it cleanly.
        produce_numbered(kafka_broker.bootstrap, topic, 2, 50, b"w")
        want = {TopicPartition(topic, p): 200 for p in range(2)}
        wait_replicated(proc, data_dir, want)
        stdout = io.StringIO()
        with sigterm_once(lambda: committed(checkpoint) == {topic: {"0": 200, "1": 200}}):
            code = export_stream(
                spark, str(data_dir), "parquet", str(out), options={}, stdout=stdout
            )
    text = stdout.getvalue()
    assert code == 0, text
    assert "SIGTERM: stopping the query" in text and "stopped: " in text
    assert " offsets behind" in text  # the progress lines
    rows, offsets = sink_offsets(spark, out)
    assert rows == len(offsets) == 400
    assert offsets == every_offset(want)


@contextlib.contextmanager
def sigterm_once(when: Callable[[], bool]) -> Iterator[None]:
    """SIGTERM to this process once `when()` holds (or a hang's deadline passed), from a
    thread; this process ignores SIGTERM meanwhile unless a handler of the code under test
    (follow.StopSignal) is in place, so a stray one never ends the test run."""
    assert threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    done = threading.Event()

    def send() -> None:
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: when() or done.is_set(), timeout_s=RUN_TIMEOUT_S, what="when")
        if not done.is_set():
            os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=send, name="sigterm", daemon=True)
    sender.start()
    try:
        yield
    finally:
        done.set()
        sender.join(RUN_TIMEOUT_S)
        signal.signal(signal.SIGTERM, previous)


def test_progress_lines_say_records_rate_and_lag():
    progress = {
        "batchId": 4,
        "numInputRows": 1200,
        "processedRowsPerSecond": 850.4,
        "sources": [
            {
                "endOffset": '{"t": {"0": 100, "1": 50}}',
                "latestOffset": '{"t": {"0": 150, "1": 50, "2": 7}}',
            }
        ],
    }
    assert offsets_behind(progress) == 57
    assert progress_line(progress) == "batch 4: 1,200 records, 850 records/s, 57 offsets behind"
    assert offsets_behind({"sources": []}) is None
    # A batch replayed after a restart (the SIGKILL case): Spark reports no latest offset.
    replayed = {"sources": [{"endOffset": '{"t": {"0": 1}}', "latestOffset": "null"}]}
    assert offsets_behind(replayed) is None


def test_bad_stream_flags_are_one_line_usage_errors(tmp_path, capsys):
    from replicad.spark.pipeline import main

    code = main(["export", str(tmp_path), "--out", "/o", "--follow", "--ending-offsets", "5"])
    assert code == 64
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "endingOffsets" in err and "exit 64" in err
    code = main(["export", str(tmp_path), "--out", "/o", "--follow", "--mode", "overwrite"])
    assert code == 64
