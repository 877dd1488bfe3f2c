"""`replicad pipeline export|verify|offsets-from-checkpoint`: Spark jobs over a data directory.

- export: the records view, partitioned by topic / partition / date (UTC day of the record
  timestamp, independent of the session's time zone) and written as parquet, orc or json.
  With `--follow` or `--available-now`, a streaming query that adds only new records on
  each run (follow.py).
- offsets-from-checkpoint: the startingOffsets JSON that continues a Spark query on the
  replica where its checkpoint stopped (handover.py).
- A local run binds Spark to 127.0.0.1 (SPARK_LOCAL_IP, unless set), keeps Spark's console
  to errors unless `--verbose`, and ends an error with one line and an exit code (64 a bad
  flag, 1 anything else, 130 interrupted); `--verbose` adds the traceback.
- verify: the batches view (every CRC checked, in parallel over the splits), then per
  partition: offset continuity along the file order (a step back or an overlap is a
  problem, a gap is counted as `replicad verify` does), batches below their segment's base,
  corrupt entries and torn tails (accepted only at the end of the last segment while a
  replicad holds the directory's lock). Prints a table; exit status 0 or 1.

Where it runs: `--master` when given; under `spark-submit` (which starts the JVM first and
says so in PYSPARK_GATEWAY_PORT) whatever spark-submit was told; otherwise local[*], with
this interpreter as the workers' Python. spark-submit's program file is
`replicad/spark/submit/replicad_pipeline.py` (`python -m replicad.spark.submit` prints it):

    spark-submit --master yarn "$(python -m replicad.spark.submit)" verify /data/replicad
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from replicad.archive.store import is_bucket_url
from replicad.errors import ConfigError, ReplicadError
from replicad.log.layout import LOCK_FILE, segment_file_name
from replicad.spark.export_layout import PARTITION_COLUMNS, dated
from replicad.spark.options import ReadOptions, View, parse_options, parse_stream_options

# Nothing here imports pyspark or pyarrow when loaded: `replicad --help` must work without
# the spark extra.
if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DEFAULT_MASTER = "local[*]"
EXPORT_FORMATS = ("parquet", "orc", "json")
WRITE_MODES = ("errorifexists", "overwrite", "append", "ignore")
EXIT_OK = 0
EXIT_PROBLEMS = 1
EX_USAGE = 64
EXIT_INTERRUPTED = 130
# Set by spark-submit (PythonRunner) for the driver program it starts.
SUBMIT_ENV = "PYSPARK_GATEWAY_PORT"


def spark_session(
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    app_name: str = "replicad pipeline",
    *,
    streams: bool = True,
) -> SparkSession:
    """A session for the jobs, with the `replicad` format registered. `streams`: whether
    it may run streaming queries, whose sources a local session forks warm (forkserver.py);
    a batch job's session (export, verify) starts no server: only a stream's source would
    use it, and its imports cost as much as the cold start they save."""
    from pyspark.sql import SparkSession

    from replicad.spark import register

    builder = SparkSession.builder.appName(app_name)
    submitted = SUBMIT_ENV in os.environ
    if master is not None or not submitted:
        master = master or DEFAULT_MASTER
        builder = builder.master(master)
        if master.startswith("local"):
            # A local run binds to loopback: otherwise Spark picks the first interface's
            # address and warns that the host name resolves to a loopback address.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            # The workers are this machine's: the interpreter that has replicad installed,
            # importing PySpark with its bytecode cache (worker_python.py says why).
            # (The environment, read when the JVM starts, reaches every kind of Python
            # worker; the setting alone does not reach the data source planner's.)
            from replicad.spark.worker_python import worker_python

            python = os.environ.setdefault("PYSPARK_PYTHON", worker_python())
            builder = builder.config("spark.pyspark.python", python)
            if python == worker_python() and streams:
                _start_forkserver()
            elif python == worker_python():
                _no_parents_forkserver()
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


if TYPE_CHECKING:
    from replicad.spark.forkserver import Server

_forkserver: list[Server] = []  # the one this process started


def _start_forkserver() -> None:
    """One warm process for the driver-side Python workers of this process's sessions to
    fork from (forkserver.py), unless REPLICAD_SPARK_FORKSERVER is `0` (the off switch:
    every worker imports PySpark and the source itself, as before). One inherited from a
    parent process (the variable holds its socket) is not used: it is the parent's, and
    ends with it; this process starts its own."""
    from replicad.spark import forkserver
    from replicad.spark.worker_python import pyspark_home

    if os.environ.get(forkserver.ENV, "") in forkserver.OFF:
        return
    if not _forkserver:
        pythonpath = os.pathsep.join(
            p for p in (str(pyspark_home()), os.environ.get("PYTHONPATH", "")) if p
        )
        _forkserver.append(forkserver.start(sys.executable, pythonpath))
    os.environ[forkserver.ENV] = _forkserver[0].path


def _no_parents_forkserver() -> None:
    """A session that starts no server passes on no parent's server either (it ends with
    its parent): the switch stays on, with no socket to hand a worker to."""
    from replicad.spark import forkserver

    value = os.environ.get(forkserver.ENV, "")
    ours = _forkserver and value == _forkserver[0].path
    if value not in forkserver.OFF and value not in forkserver.NO_PATH and not ours:
        os.environ[forkserver.ENV] = forkserver.NO_PATH[-1]


def read(spark: SparkSession, options: ReadOptions, raw: Mapping[str, str]) -> DataFrame:
    from replicad.spark import register

    register(spark)
    reader = spark.read.format("replicad")
    for key, value in raw.items():
        if key != "path":
            reader = reader.option(key, value)
    return reader.load(options.data_dir)


def export(
    data_dir: str,
    fmt: str,
    out: str,
    *,
    options: Mapping[str, str] | None = None,
    mode: str = "errorifexists",
    spark: SparkSession | None = None,
    stdout: TextIO | None = None,
) -> int:
    """Write the records view to `out` as `fmt`, partitioned by topic, partition and date."""
    stdout = stdout or sys.stdout
    if fmt not in EXPORT_FORMATS:
        raise ConfigError("format", f"{fmt!r} is not one of {', '.join(EXPORT_FORMATS)}")
    if mode not in WRITE_MODES:
        raise ConfigError("mode", f"{mode!r} is not one of {', '.join(WRITE_MODES)}")
    raw = {**(options or {}), "path": data_dir, "view": View.RECORDS.value}
    parsed = parse_options(raw)
    spark = spark or spark_session(streams=False)
    records = read(spark, parsed, raw)
    dated(records).write.format(fmt).mode(mode).partitionBy(*PARTITION_COLUMNS).save(out)
    print(f"exported {data_dir} to {out} ({fmt}, by {'/'.join(PARTITION_COLUMNS)})", file=stdout)
    return EXIT_OK


@dataclass
class PartitionCheck:
    """What verify found in one partition."""

    topic: str
    partition: int
    segments: int = 0
    batches: int = 0
    records: int = 0
    bytes: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    gaps: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(
    data_dir: str,
    *,
    options: Mapping[str, str] | None = None,
    spark: SparkSession | None = None,
    stdout: TextIO | None = None,
) -> int:
    """Check every selected partition; print the table; 0 when all are fine, else 1."""
    stdout = stdout or sys.stdout
    from replicad.spark.catalog import list_partitions

    raw = {**(options or {}), "path": data_dir, "view": View.BATCHES.value, "verifyCrc": "true"}
    parsed = parse_options(raw)
    listing = list_partitions(parsed)
    last_segments = {
        (f.topic, f.partition): f.segments[-1].base_offset for f in listing if f.segments
    }
    spark = spark or spark_session(streams=False)
    checks = check_partitions(
        read(spark, parsed, raw),
        last_segments,
        # A bucket's segments are all closed; no writer appends to them.
        in_use=not is_bucket_url(data_dir) and data_dir_in_use(Path(data_dir)),
    )
    for files in listing:
        key = (files.topic, files.partition)
        checks.setdefault(key, PartitionCheck(*key)).segments = len(files.segments)
    rows = [checks[key] for key in sorted(checks)]
    print(render_table(rows), file=stdout)
    for row in rows:
        for problem in row.problems:
            print(f"{row.topic}-{row.partition}: {problem}", file=stdout)
        for note in row.notes:
            print(f"{row.topic}-{row.partition}: note: {note}", file=stdout)
    failed = sum(not row.ok for row in rows)
    summary = f"{failed} of {len(rows)} partitions with problems" if failed else "all ok"
    print(f"{len(rows)} partitions, {summary}", file=stdout)
    return EXIT_PROBLEMS if failed else EXIT_OK


def segment_name(base_offset: int | None) -> str:
    return segment_file_name(base_offset, ".log") if base_offset is not None else "-"


def check_partitions(
    batches: DataFrame, last_segments: Mapping[tuple[str, int], int], *, in_use: bool
) -> dict[tuple[str, int], PartitionCheck]:
    """Aggregate the batches view per partition, in one pass over the data."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from replicad.spark.reader import PROBLEM_TORN_TAIL

    is_batch = F.col("problem_kind").isNull()
    order = Window.partitionBy("topic", "partition").orderBy("segment", "position")
    # The offset the entry before promises next (a problem row promises nothing).
    expected = F.lag(F.when(is_batch, F.col("last_offset") + 1)).over(order)
    steps = batches.withColumn("expected", expected)
    summary = steps.groupBy("topic", "partition").agg(
        F.count(F.when(is_batch, 1)).alias("batches"),
        F.sum(F.when(is_batch & (F.col("record_count") >= 0), F.col("record_count"))).alias(
            "records"
        ),
        F.sum("size").alias("bytes"),
        F.min("base_offset").alias("first_offset"),
        F.max("last_offset").alias("last_offset"),
        F.count(F.when(F.col("base_offset") > F.col("expected"), 1)).alias("gaps"),
        F.collect_list(
            F.when(
                F.col("base_offset") < F.col("expected"),
                F.format_string(
                    "offset %d at position %d of segment %d overlaps the batch before it "
                    "(next offset %d)",
                    "base_offset",
                    "position",
                    "segment",
                    "expected",
                ),
            )
        ).alias("overlaps"),
        F.collect_list(
            F.when(
                F.col("base_offset") < F.col("segment"),
                F.format_string(
                    "offset %d at position %d is below its segment's base %d",
                    "base_offset",
                    "position",
                    "segment",
                ),
            )
        ).alias("below_base"),
        F.collect_list(
            F.when(~is_batch, F.struct("segment", "position", "problem", "problem_kind"))
        ).alias("read_problems"),
    )
    checks: dict[tuple[str, int], PartitionCheck] = {}
    for row in summary.collect():
        key = (row["topic"], row["partition"])
        check = PartitionCheck(
            *key,
            batches=row["batches"],
            records=row["records"] or 0,
            bytes=row["bytes"] or 0,
            first_offset=row["first_offset"],
            last_offset=row["last_offset"],
            gaps=row["gaps"],
        )
        check.problems += row["overlaps"] + row["below_base"]
        for problem in row["read_problems"]:
            text = f"{segment_name(problem.segment)} at position {problem.position}: "
            text += problem.problem
            growing = in_use and problem.segment == last_segments.get(key)
            if problem.problem_kind == PROBLEM_TORN_TAIL and growing:
                check.notes.append(f"{text} (the last segment, being written)")
            else:
                check.problems.append(text)
        checks[key] = check
    return checks


def render_table(rows: Sequence[PartitionCheck]) -> str:
    header = ("topic", "partition", "segments", "batches", "records", "bytes", "offsets", "gaps")
    lines = [header]
    for row in rows:
        span = f"{row.first_offset}..{row.last_offset}" if row.first_offset is not None else "empty"
        status = "ok" if row.ok else "FAILED"
        lines.append(
            (
                row.topic,
                str(row.partition),
                str(row.segments),
                str(row.batches),
                str(row.records),
                str(row.bytes),
                span,
                str(row.gaps),
                status,
            )
        )
    lines[0] = (*header, "status")
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def data_dir_in_use(data_dir: Path) -> bool:
    """Whether a replicad holds the directory's lock (then the last segments may be growing)."""
    path = data_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


# -- command line ---------------------------------------------------------------------------


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


# Flags that set a source option of their own (flag's dest, option), by the jobs that take them.
_SELECTION_FLAGS = (
    ("topics", "topics"),
    ("topic_pattern", "topicPattern"),
    ("partitions", "partitions"),
    ("max_split_bytes", "maxSplitBytes"),
    ("s3_endpoint", "s3Endpoint"),
)
_EXPORT_FLAGS = (
    ("isolation", "isolation"),
    ("starting_offsets", "startingOffsets"),
    ("ending_offsets", "endingOffsets"),
    ("starting_timestamp", "startingTimestamp"),
    ("ending_timestamp", "endingTimestamp"),
)
_STREAM_FLAGS = (
    ("max_offsets_per_trigger", "maxOffsetsPerTrigger"),
    ("max_bytes_per_trigger", "maxBytesPerTrigger"),
)


def _given(args: argparse.Namespace, flags: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The options of `flags` whose flag was given, as text."""
    given = {option: getattr(args, flag, None) for flag, option in flags}
    return {option: str(value) for option, value in given.items() if value is not None}


def _selection(args: argparse.Namespace) -> dict[str, str]:
    """Source options from the flags both jobs share."""
    return _given(args, _SELECTION_FLAGS)


def _export_options(args: argparse.Namespace) -> dict[str, str]:
    options = {**_selection(args), **_given(args, _EXPORT_FLAGS)}
    if args.include_control:
        options["includeControl"] = "true"
    return options


# Spark's console when `--verbose` is not given: nothing but a fatal error (ours is the one
# line `_run` prints). PySpark's JVM starts logging as Spark's shell does: the root logger
# takes the level of the starting class's logger (PythonGatewayServer; WARN unless set),
# and the console says "Setting default log level to WARN". Set here, so the root stays.
QUIET_LOG4J2 = """\
rootLogger.level = fatal
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = fatal
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""
JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def quiet_log4j2_file() -> str:
    """QUIET_LOG4J2 in a file of its own (removed when this process exits)."""
    import atexit
    import tempfile

    fd, path = tempfile.mkstemp(prefix="replicad-log4j2-", suffix=".properties")
    with os.fdopen(fd, "w") as f:
        f.write(QUIET_LOG4J2)
    atexit.register(lambda: Path(path).unlink(missing_ok=True))
    return path


def _session_from(args: argparse.Namespace, *, streams: bool) -> SparkSession:
    conf = dict(args.conf or [])
    verbose = getattr(args, "verbose", False)
    if not verbose:
        quiet = f"-Dlog4j2.configurationFile={quiet_log4j2_file()}"
        conf[JAVA_OPTIONS] = f"{conf[JAVA_OPTIONS]} {quiet}" if JAVA_OPTIONS in conf else quiet
    spark = spark_session(args.master, conf, streams=streams)
    if not verbose:
        spark.sparkContext.setLogLevel("ERROR")
    return spark


# Our errors as they reach the driver inside Spark's (a Python worker's traceback).
_OUR_ERROR = re.compile(
    r"(?:DataLossError|LogError|ConfigError|CorruptRecordError|CheckpointError"
    r"|OffsetOutOfRangeError): (.+)"
)


def one_line(exc: BaseException) -> str:
    """What went wrong, in one line: ours when Spark carried it, else Spark's first line."""
    text = str(exc)
    ours = _OUR_ERROR.findall(text)
    if ours:
        return ours[-1].strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first or type(exc).__name__


def _run(args: argparse.Namespace, job: str) -> int:
    """Run a job; an error is one line on stderr and an exit code (and the traceback with
    --verbose)."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("replicad pipeline needs pyspark: pip install 'replicad[spark]'", file=sys.stderr)
        return EXIT_PROBLEMS
    try:
        return _job(args, job)
    except ConfigError as exc:
        code, line = EX_USAGE, str(exc)
    except ReplicadError as exc:
        code, line = EXIT_PROBLEMS, str(exc)
    except KeyboardInterrupt:
        code, line = EXIT_INTERRUPTED, "interrupted"
    except Exception as exc:  # Spark's: the output exists, a path it cannot reach, ...
        code, line = EXIT_PROBLEMS, one_line(exc)
    if getattr(args, "verbose", False):
        traceback.print_exc()
    print(f"replicad pipeline {job}: {line} (exit {code})", file=sys.stderr)
    return code


def _job(args: argparse.Namespace, job: str) -> int:
    if job == "offsets-from-checkpoint":
        from replicad.spark.handover import offsets_from_checkpoint

        sink = Path(args.sink) if args.sink else None
        offsets = offsets_from_checkpoint(Path(args.checkpoint), sink=sink, source=args.source)
        print(json.dumps(offsets, separators=(",", ":")))
        return EXIT_OK
    if job == "export":
        options = _export_options(args)
        streaming = args.follow or args.available_now
        if not streaming:
            # Bad flags and a missing directory fail before Spark starts.
            _listed(parse_options({**options, "path": args.data_dir}))
            return export(
                args.data_dir,
                args.format,
                args.out,
                options=options,
                mode=args.mode or "errorifexists",
                spark=_session_from(args, streams=False),
            )
        if args.mode is not None:
            raise ConfigError("mode", "a streaming export appends; --mode is for a batch export")
        options.update(_stream_options(args))
        parse_stream_options({**options, "path": args.data_dir})
        from replicad.spark.follow import export_stream

        return export_stream(
            _session_from(args, streams=True),
            args.data_dir,
            args.format,
            args.out,
            options=options,
            checkpoint=args.checkpoint,
            available_now=args.available_now,
            trigger_interval=args.trigger_interval,
        )
    options = _selection(args)
    _listed(parse_options({**options, "path": args.data_dir}))
    return verify(args.data_dir, options=options, spark=_session_from(args, streams=False))


def _listed(options: ReadOptions) -> None:
    """A local data directory that is not one is refused here, before Spark starts."""
    if not is_bucket_url(options.data_dir):
        from replicad.spark.catalog import list_partitions

        list_partitions(options)


def _stream_options(args: argparse.Namespace) -> dict[str, str]:
    options = _given(args, _STREAM_FLAGS)
    if args.no_fail_on_data_loss:
        options["failOnDataLoss"] = "false"
    return options


def _cmd_export(args: argparse.Namespace) -> int:
    return _run(args, "export")


def _cmd_verify(args: argparse.Namespace) -> int:
    return _run(args, "verify")


def _cmd_offsets(args: argparse.Namespace) -> int:
    return _run(args, "offsets-from-checkpoint")


def _common_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "data_dir",
        help="replicad's data directory, or its archive bucket (s3://bucket/prefix, s3a://...)",
    )
    parser.add_argument(
        "--s3-endpoint",
        help="the archive bucket's S3 endpoint (default: AWS's, or AWS_ENDPOINT_URL)",
    )
    parser.add_argument(
        "--master",
        help=f"Spark master URL (default {DEFAULT_MASTER}, or what spark-submit was given)",
    )
    parser.add_argument(
        "--conf",
        action="append",
        type=_key_value,
        metavar="KEY=VALUE",
        help="a Spark setting (repeatable)",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="Spark's console and full tracebacks"
    )
    parser.add_argument("--topics", help="comma-separated topics (default: all)")
    parser.add_argument("--topic-pattern", help="regex the topic names must match")
    parser.add_argument("--partitions", help='partition numbers, e.g. "0,2,5-7"')
    parser.add_argument(
        "--max-split-bytes", type=int, help="cut larger segments into splits of about this size"
    )


def add_pipeline_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Add `pipeline export|verify` to a command line's sub-commands; `args.func(args)` runs it."""
    pipeline = subparsers.add_parser(
        "pipeline",
        help="Spark jobs over a data directory (needs replicad[spark])",
        description="Spark jobs over a data directory, in Spark local mode unless --master "
        "or spark-submit says otherwise (needs replicad[spark]).",
    )
    add_jobs(pipeline)
    return pipeline


def add_jobs(parser: argparse.ArgumentParser) -> None:
    """The `export` and `verify` sub-commands, under `parser`."""
    jobs = parser.add_subparsers(dest="pipeline_command", required=True, metavar="JOB")

    export_parser = jobs.add_parser(
        "export",
        help="write the records as parquet/orc/json by topic/partition/date",
        description="Write the replica's records as parquet, orc or json files, partitioned "
        "by topic, partition and date.",
    )
    _common_flags(export_parser)
    export_parser.add_argument(
        "--format", choices=EXPORT_FORMATS, default="parquet", help="output file format"
    )
    export_parser.add_argument("--out", required=True, help="output directory (any Spark path)")
    export_parser.add_argument(
        "--mode",
        choices=WRITE_MODES,
        help="batch export: what to do when --out already holds data (Spark's save modes; "
        "default errorifexists)",
    )
    export_parser.add_argument(
        "--isolation",
        choices=("read_uncommitted", "read_committed"),
        help="read_committed drops aborted records (default: read_uncommitted)",
    )
    export_parser.add_argument(
        "--include-control", action="store_true", help="export transaction markers too"
    )
    export_parser.add_argument("--starting-offsets", help='"earliest", N or Spark Kafka JSON')
    export_parser.add_argument("--ending-offsets", help='"latest", N or JSON (exclusive)')
    export_parser.add_argument("--starting-timestamp", help="epoch ms or ISO 8601")
    export_parser.add_argument("--ending-timestamp", help="epoch ms or ISO 8601 (exclusive)")
    streaming = export_parser.add_argument_group(
        "streaming",
        "a streaming query, checkpointed in OUT.checkpoint: each run adds only new records, "
        "exactly once",
    )
    how = streaming.add_mutually_exclusive_group()
    how.add_argument("--follow", action="store_true", help="keep exporting until SIGTERM or Ctrl-C")
    how.add_argument(
        "--available-now",
        action="store_true",
        help="export what the replica holds now, in micro-batches, then stop",
    )
    streaming.add_argument("--checkpoint", help="the query's checkpoint (default OUT.checkpoint)")
    streaming.add_argument(
        "--trigger-interval", default="1 second", help="--follow: how often (default 1 second)"
    )
    streaming.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        help="at most about this many offsets a micro-batch (maxOffsetsPerTrigger)",
    )
    streaming.add_argument(
        "--max-bytes-per-trigger",
        type=int,
        help="at most about this many bytes of batches a micro-batch (maxBytesPerTrigger)",
    )
    streaming.add_argument(
        "--no-fail-on-data-loss",
        action="store_true",
        help="skip (and log) records retention deleted before they were read",
    )
    export_parser.set_defaults(func=_cmd_export)

    offsets_parser = jobs.add_parser(
        "offsets-from-checkpoint",
        help="startingOffsets JSON from a Spark query's checkpoint (to continue on the replica)",
        description="Print the startingOffsets JSON that continues a Spark query on the "
        "replica where its checkpoint (and, with --sink, its file sink) stopped.",
    )
    offsets_parser.add_argument("checkpoint", help="the query's checkpoint directory")
    offsets_parser.add_argument(
        "--sink", help="its file sink's output directory: a batch already written counts"
    )
    offsets_parser.add_argument(
        "--source", type=int, default=0, help="which of the query's sources (default 0)"
    )
    offsets_parser.add_argument("--verbose", action="store_true", help="full tracebacks")
    offsets_parser.set_defaults(func=_cmd_offsets)

    verify_parser = jobs.add_parser(
        "verify",
        help="CRCs and offset continuity of every partition, in parallel",
        description="Check every batch's CRC and the offsets' continuity of every partition, "
        "as a Spark job; prints a table.",
    )
    _common_flags(verify_parser)
    verify_parser.set_defaults(func=_cmd_verify)


def main(argv: Sequence[str] | None = None) -> int:
    """`export|verify ...`: what spark-submit's program (submit/replicad_pipeline.py) runs."""
    parser = argparse.ArgumentParser(prog="replicad pipeline", description="replicad's Spark jobs")
    add_jobs(parser)
    args = parser.parse_args(argv)
    return int(args.func(args))
