"""`replicad pipeline export --follow / --available-now` as a user runs it (a subprocess
driver of its own) over a replica a real `replicad run` is writing: progress lines, a clean
stop on SIGTERM, and exactly once across a driver SIGKILLed in the middle of a micro-batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from replicad.spark.follow import offsets_behind, progress_line
from tools.replica import replicad_argv

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
        "--master",
        "local[1]",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1",
        *flags,
    )
    with open(log, "w") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env)


def finish(proc: subprocess.Popen, log: Path) -> str:
    try:
        proc.wait(RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return log.read_text()


def batch_in_flight(checkpoint: Path) -> int | None:
    """A micro-batch planned (offsets/N written) and not committed (no commits/N), N > 0."""
    planned = {int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*")}
    committed = {int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")}
    waiting = sorted(planned - committed)
    return waiting[-1] if waiting and waiting[-1] > 0 else None


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
