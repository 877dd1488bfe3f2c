"""`replicad pipeline export|verify` in Spark local mode, and through spark-submit."""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import io
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from replicad.errors import ConfigError
from replicad.spark.pipeline import (
    PartitionCheck,
    add_pipeline_parser,
    data_dir_in_use,
    export,
    main,
    render_table,
)
from replicad.spark.submit import submit_script
from replicad.types import TopicPartition
from tests.spark.conftest import LOCAL_SPARK_ARGS
from tools.replica import replicad_argv


def test_pyspark_accepts_the_installed_pandas():
    """The spark extra pins pandas below 3: PySpark warns (FutureWarning) that it does not yet
    fully support pandas 3, in the driver and in every Python worker; nothing filters it."""
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        require_minimum_pandas_version()


def test_export_writes_parquet_by_topic_partition_and_utc_date(spark, replicated, tmp_path):
    out = tmp_path / "export"
    stdout = io.StringIO()
    code = export(
        str(replicated.data_dir),
        "parquet",
        str(out),
        options={"isolation": "read_committed"},
        spark=spark,
        stdout=stdout,
    )
    assert code == 0 and str(out) in stdout.getvalue()
    topics = sorted(replicated.partitions)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [f"topic={t}" for t in topics]
    back = spark.read.parquet(str(out))
    rows = back.select("topic", "partition", "date", "offset", "key", "value", "headers").collect()
    for topic, partitions in replicated.committed.items():
        for partition, records in partitions.items():
            got = sorted(
                (r.offset, r.key, r.value, [(h.key, h.value) for h in r.headers], r.date)
                for r in rows
                if r.topic == topic and r.partition == partition
            )
            want = [
                (
                    r.offset,
                    r.key,
                    r.value,
                    [tuple(h) for h in r.headers],
                    dt.datetime.fromtimestamp(r.timestamp / 1000, dt.UTC).date(),
                )
                for r in records
            ]
            assert got == want, (topic, partition)
            directory = out / f"topic={topic}" / f"partition={partition}"
            assert {p.name for p in directory.iterdir() if p.is_dir()} == {
                f"date={d}" for d in {w[4] for w in want}
            }


# The one line the JVM prints itself when it starts (Spark loads an incubator module).
JVM_INCUBATOR_NOTE = "WARNING: Using incubator modules: jdk.incubator.vector"


def pipeline_run(*args: str) -> subprocess.CompletedProcess:
    """`replicad pipeline ARGS` as a user runs it: its own process, its own JVM."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = replicad_argv(
        "pipeline",
        *args,
        *LOCAL_SPARK_ARGS,
    )
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)


def test_export_refuses_to_overwrite_in_one_line_and_a_quiet_console(replicated, tmp_path):
    """Spark's own error (the output exists), as a user meets it: our one line with the exit
    code, no log4j output, no JVM traceback (--verbose adds the traceback)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("not ours")
    data = str(replicated.data_dir)
    result = pipeline_run("export", data, "--out", str(out), "--topics", replicated.plain)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line != JVM_INCUBATOR_NOTE]
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("replicad pipeline export: [PATH_ALREADY_EXISTS]")
    assert lines[0].endswith("(exit 1)") and result.stdout == ""
    assert (out / "keep").read_text() == "not ours"


def test_a_local_session_binds_to_loopback_unless_spark_local_ip_is_set(spark, monkeypatch):
    """SPARK_LOCAL_IP defaults to 127.0.0.1 for a local master (the session's JVM took it
    from the environment), and a value the user set is left as it is. A second
    spark_session() returns the running session: only the environment is looked at."""
    from replicad.spark.pipeline import spark_session

    jvm_env = spark.sparkContext._jvm.java.lang.System.getenv("SPARK_LOCAL_IP")
    assert jvm_env == os.environ.get("SPARK_LOCAL_IP") is not None
    monkeypatch.delenv("SPARK_LOCAL_IP")
    assert spark_session("local[2]") is spark
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    monkeypatch.setenv("SPARK_LOCAL_IP", "192.0.2.7")
    assert spark_session("local[2]") is spark
    assert os.environ["SPARK_LOCAL_IP"] == "192.0.2.7"


def test_a_missing_directory_is_one_line_before_spark_starts(tmp_path, capsys):
    missing = str(tmp_path / "nothing")
    for job in (["export", missing, "--out", str(tmp_path / "o")], ["verify", missing]):
        assert main(job) == 1
        err = capsys.readouterr().err
        assert err.splitlines() == [
            f"replicad pipeline {job[0]}: {missing}: not a replicad data directory "
            "(no such directory) (exit 1)"
        ]


def test_verify_command_finds_the_replica_sound(spark, replicated, capsys):
    assert main(["verify", str(replicated.data_dir)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == [
        "topic",
        "partition",
        "segments",
        "batches",
        "records",
        "bytes",
        "offsets",
        "gaps",
        "status",
    ]
    for topic, summary in replicated.summaries.items():
        for p in summary.partitions:
            row = next(
                line.split() for line in lines if line.split()[:2] == [topic, str(p.partition)]
            )
            # every offset is a record or a marker: the count of both, no gaps
            assert row[4] == str(p.log_end_offset)
            assert row[6:] == [f"0..{p.log_end_offset - 1}", "0", "ok"]
    assert lines[-1] == f"{sum(replicated.partitions.values())} partitions, all ok"


@pytest.fixture
def damaged(tmp_path, make_batches, write_partition):
    """Three partitions: a CRC broken in a's, an overlap in b's, a torn tail in c's last segment."""
    data_dir = tmp_path / "data"
    for name in ("a", "b", "c"):
        batches = [make_batches.data(i * 10, 10, value_size=300) for i in range(30)]
        write_partition(data_dir, TopicPartition(name, 0), batches, segment_bytes=16 * 1024)
    a_segment = sorted((data_dir / "a-0").glob("*.log"))[1]
    data = bytearray(a_segment.read_bytes())
    data[200] ^= 0x01
    a_segment.write_bytes(bytes(data))
    b_segments = sorted((data_dir / "b-0").glob("*.log"))
    # the second segment again, named as if it came after the last: offsets step back
    copy = data_dir / "b-0" / f"{int(b_segments[-1].stem) + 1000:020d}.log"
    shutil.copy(b_segments[1], copy)
    c_last = sorted((data_dir / "c-0").glob("*.log"))[-1]
    with c_last.open("ab") as f:
        f.write(make_batches.data(300, 5)[:50])
    return data_dir


def test_verify_names_each_problem_and_fails(spark, damaged, capsys):
    assert main(["verify", str(damaged)]) == 1
    out = capsys.readouterr().out
    status = {line.split()[0]: line.split()[-1] for line in out.splitlines()[1:4]}
    assert status == {"a": "FAILED", "b": "FAILED", "c": "FAILED"}
    assert "a-0: 00000000000000000" in out and "CRC32C mismatch" in out
    assert "overlaps the batch before it" in out
    assert "below its segment's base" in out
    assert "c-0:" in out and "torn" in out
    assert out.splitlines()[-1] == "3 partitions, 3 of 3 partitions with problems"


def test_a_torn_tail_is_only_noted_while_a_replicad_holds_the_lock(spark, damaged, capsys):
    lock = os.open(damaged / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert data_dir_in_use(damaged)
        assert main(["verify", str(damaged), "--topics", "c"]) == 0
    finally:
        os.close(lock)
    assert not data_dir_in_use(damaged)
    out = capsys.readouterr().out
    assert "c-0: note:" in out and "being written" in out
    assert out.splitlines()[-1] == "1 partitions, all ok"


def test_pipeline_parser_plugs_into_a_command_line(tmp_path):
    parser = argparse.ArgumentParser(prog="replicad")
    add_pipeline_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        [
            "pipeline",
            "export",
            str(tmp_path),
            "--out",
            "/o",
            "--format",
            "orc",
            "--topics",
            "a,b",
            "--isolation",
            "read_committed",
            "--conf",
            "spark.x=1",
            "--starting-timestamp",
            "2024-01-01T00:00:00Z",
        ]
    )
    assert args.format == "orc" and args.out == "/o" and args.conf == [("spark.x", "1")]
    assert args.func.__name__ == "_cmd_export"
    with pytest.raises(SystemExit):
        parser.parse_args(["pipeline", "export", str(tmp_path)])  # --out is required
    with pytest.raises(SystemExit):
        parser.parse_args(["pipeline", "verify", str(tmp_path), "--conf", "novalue"])


def test_the_flags_given_become_the_sources_options_by_their_spark_names(tmp_path):
    from replicad.spark.pipeline import _export_options, _stream_options

    parser = argparse.ArgumentParser(prog="replicad")
    add_pipeline_parser(parser.add_subparsers(dest="command", required=True))
    export = ["pipeline", "export", str(tmp_path), "--out", "/o"]
    args = parser.parse_args(
        [*export, "--topics", "a,b", "--max-split-bytes", "1024", "--isolation", "read_committed",
         "--ending-offsets", "latest", "--include-control",
         "--max-offsets-per-trigger", "100", "--no-fail-on-data-loss"]
    )  # fmt: skip
    assert _export_options(args) == {
        "topics": "a,b",
        "maxSplitBytes": "1024",
        "isolation": "read_committed",
        "endingOffsets": "latest",
        "includeControl": "true",
    }
    assert _stream_options(args) == {"maxOffsetsPerTrigger": "100", "failOnDataLoss": "false"}
    plain = parser.parse_args(export)
    assert _export_options(plain) == {} and _stream_options(plain) == {}


def test_bad_flags_are_usage_errors_before_spark_starts(tmp_path, capsys):
    code = main(["export", str(tmp_path), "--out", "/o", "--starting-offsets", "soon"])
    assert code == 64
    assert "startingOffsets" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        export(str(tmp_path), "csv", "/o")


def test_table_lines_up():
    rows = [PartitionCheck("orders", 0, 2, 10, 100, 4096, 0, 99), PartitionCheck("x", 11)]
    rows[1].problems.append("bad")
    table = render_table(rows).splitlines()
    assert len({line.index("partition") for line in table[:1]}) == 1
    assert table[1].split() == ["orders", "0", "2", "10", "100", "4096", "0..99", "0", "ok"]
    assert table[2].split() == ["x", "11", "0", "0", "0", "0", "empty", "0", "FAILED"]
    assert table[1].index("0..99") == table[2].index("empty")


def test_spark_submit_runs_the_jobs(replicated, tmp_path):
    """The cluster route: spark-submit starts the JVM and runs the program file."""
    import pyspark

    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    result = subprocess.run(
        [
            str(spark_submit),
            *LOCAL_SPARK_ARGS,
            str(submit_script()),
            "verify",
            str(replicated.data_dir),
            "--topics",
            replicated.plain,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    lines = result.stdout.splitlines()
    assert lines[-1] == f"{replicated.partitions[replicated.plain]} partitions, all ok"


def test_the_command_line_loads_without_spark():
    """cli.py adds these sub-commands always: loading them must not need the spark extra."""
    probe = (
        "import sys, replicad.spark.pipeline, replicad.spark.submit; "
        "print(sorted(m for m in ('pyspark', 'pyarrow') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
