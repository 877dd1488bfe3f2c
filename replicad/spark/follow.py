"""`replicad pipeline export --follow` / `--available-now`: the export as a streaming query.

- The same table and layout as the batch export (records by topic / partition / UTC date)
  written by Spark's file sink, with its checkpoint next to the output (`<out>.checkpoint`
  unless `--checkpoint` says): each run adds only the records that arrived since the last
  one, each exactly once (Spark's file sink and the checkpointed offsets; a run killed in
  the middle of a micro-batch replays it and the sink keeps one copy).
- `--available-now`: every record the replica holds now, in micro-batches under the
  limits, then it ends (for cron and CI). `--follow`: a micro-batch every
  `--trigger-interval`, until SIGTERM or Ctrl-C, which stop the query between Spark's
  calls: a micro-batch cut short is not committed and is replayed by the next run.
- Progress: one line per micro-batch that read records (rows, rows/s, offsets behind the
  replica's readable end, from the query's progress: Spark's `latestOffset` is the
  source's `reportLatestOffset`).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

POLL_S = 0.5
# Spark waits 10 s (a constant in PythonWorkerFactory) for the Python process that hosts a
# Python streaming source on the driver to connect back. That process imports PySpark from
# pyspark.zip, which Spark puts first on the workers' path and which has no bytecode cache:
# about 2 s of CPU compiling, more than 10 s on a machine loaded 15 times over its cores,
# and the query fails before its first micro-batch. Starting it again is safe (nothing was
# planned) and is what a user would do.
WORKER_START_FAILED = "Python worker failed to connect back"
START_ATTEMPTS = 3


def worker_start_failed(error: BaseException | None) -> bool:
    return error is not None and WORKER_START_FAILED in str(error)


def checkpoint_next_to(out: str) -> str:
    return out.rstrip("/") + ".checkpoint"


def offsets_behind(progress: Mapping) -> int | None:
    """Offsets between the batch's end and the latest the source reported, summed."""
    sources = progress.get("sources") or []
    if not sources or not sources[0].get("latestOffset") or not sources[0].get("endOffset"):
        return None
    latest = json.loads(sources[0]["latestOffset"])
    end = json.loads(sources[0]["endOffset"])
    if not isinstance(latest, dict) or not isinstance(end, dict):
        return None  # a batch replayed after a restart has no latest offset ("null")
    behind = 0
    for topic, partitions in latest.items():
        for partition, offset in partitions.items():
            behind += max(offset - end.get(topic, {}).get(partition, 0), 0)
    return behind


def progress_line(progress: Mapping) -> str:
    rows = progress.get("numInputRows", 0)
    rate = progress.get("processedRowsPerSecond") or 0.0
    behind = offsets_behind(progress)
    tail = "" if behind is None else f", {behind:,} offsets behind"
    return f"batch {progress.get('batchId')}: {rows:,} records, {rate:,.0f} records/s{tail}"


@dataclass
class StopSignal:
    """SIGTERM and SIGINT ask the loop to stop; the previous handlers come back after."""

    requested: str | None = None

    def __enter__(self) -> StopSignal:
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = signal.Signals(signum).name

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def watch(query: StreamingQuery, stop: StopSignal, stdout: TextIO) -> int:
    """Print a line per micro-batch with records until the query ends or a stop is asked;
    the number of records the run added."""
    seen: set[int] = set()
    added = 0

    def report() -> None:
        nonlocal added
        for progress in query.recentProgress:
            batch = progress.get("batchId")
            if batch in seen or not progress.get("numInputRows"):
                continue
            seen.add(batch)
            added += progress["numInputRows"]
            print(progress_line(progress), file=stdout, flush=True)

    while query.isActive and stop.requested is None:
        query.awaitTermination(POLL_S)
        report()
    if stop.requested is not None and query.isActive:
        print(f"{stop.requested}: stopping the query", file=stdout, flush=True)
        query.stop()
    report()
    error = query.exception()
    if error is not None:
        raise error
    return added


def export_stream(
    spark: SparkSession,
    data_dir: str,
    fmt: str,
    out: str,
    *,
    options: Mapping[str, str],
    checkpoint: str | None = None,
    available_now: bool = False,
    trigger_interval: str = "1 second",
    stdout: TextIO | None = None,
) -> int:
    from replicad.spark import register
    from replicad.spark.export_layout import PARTITION_COLUMNS, dated

    stdout = stdout or sys.stdout
    register(spark)
    checkpoint = checkpoint or checkpoint_next_to(out)
    reader = spark.readStream.format("replicad")
    for key, value in options.items():
        reader = reader.option(key, value)
    writer = (
        dated(reader.load(data_dir))
        .writeStream.format(fmt)
        .partitionBy(*PARTITION_COLUMNS)
        .option("checkpointLocation", checkpoint)
        .option("path", out)
        .queryName("replicad export")
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=trigger_interval)
    started = time.monotonic()
    with StopSignal() as stop:
        for attempt in range(1, START_ATTEMPTS + 1):
            query = writer.start()
            try:
                added = watch(query, stop, stdout)
                break
            except Exception as exc:
                if attempt == START_ATTEMPTS or not worker_start_failed(exc):
                    raise
                print(f"{WORKER_START_FAILED}: starting the query again", file=stdout)
    seconds = time.monotonic() - started
    how = "stopped" if stop.requested else "done"
    print(
        f"{how}: {added:,} records added to {out} in {seconds:.0f} s (checkpoint {checkpoint})",
        file=stdout,
        flush=True,
    )
    return 0
