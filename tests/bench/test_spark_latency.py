"""tools/bench/spark_latency.py: when offsets reach a replica's segment files, the latency of
each row from there or from its timestamp, and the table. The queries themselves run from
the tool (`python -m tools.bench.spark_latency`)."""

from __future__ import annotations

from pathlib import Path

from tools.bench.spark_latency import (
    Cpu,
    Measured,
    Progress,
    ReplicaArrivals,
    Row,
    Sink,
    breakdown,
    breakdown_table,
    cpu_table,
    percentile,
    table,
)
from tools.logdata.batches import producer_batch


def test_arrivals_note_each_offset_once_when_its_whole_batch_is_in_the_segment(tmp_path: Path):
    segment = tmp_path / "t-0" / "00000000000000000000.log"
    segment.parent.mkdir()
    (tmp_path / "t-1").mkdir()
    first, second = producer_batch(0, [b"a", b"b"]), producer_batch(2, [b"c"])
    segment.write_bytes(first + second[:10])  # the second batch is still being written
    arrivals = ReplicaArrivals(tmp_path, "t")
    arrivals.look()
    assert set(arrivals.arrived_ms) == {(0, 0), (0, 1)}
    noted = dict(arrivals.arrived_ms)
    with segment.open("ab") as f:
        f.write(second[10:])
    arrivals.look()
    assert set(arrivals.arrived_ms) == {(0, 0), (0, 1), (0, 2)}
    assert {k: arrivals.arrived_ms[k] for k in noted} == noted  # first sight is kept


def test_latency_is_held_minus_arrival_or_minus_the_records_timestamp():
    sink = Sink("s")
    sink.held_ms = {(0, 0): 5_000, (0, 1): 5_000, (1, 0): 6_000}
    sink.timestamp_ms = {(0, 0): 3_000, (0, 1): 3_500, (1, 0): 4_000}
    assert sorted(sink.latencies_from(None)) == [1_500, 2_000, 2_000]
    # A row whose arrival was not seen is left out, not guessed.
    assert sorted(sink.latencies_from({(0, 0): 4_000, (1, 0): 5_900})) == [100, 1_000]
    sink.clear()  # the warm-up's rows are not measured
    assert sink.count() == 0 and sink.latencies_from(None) == []


def test_the_table_gives_percentiles_and_says_when_a_sink_got_nothing():
    values = list(range(1, 101))
    assert (percentile(values, 50), percentile(values, 99)) == (51, 100)
    out = table([Row("ours", "the replica", 100, 100, values), Row("theirs", "x", 5, 0, [])])
    assert "| ours | the replica | 100 of 100 | 51 | 96 | 100 | 100 |" in out
    assert "| theirs | x | 0 of 5 | | | |" in out


def test_arrivals_note_when_the_high_watermark_file_first_covered_each_offset(tmp_path: Path):
    (tmp_path / "t-0").mkdir()
    (tmp_path / "t-1").mkdir()
    marks = tmp_path / "replication-offset-checkpoint"
    marks.write_text("0\n3\nt 0 2\nt 1 0\nother 0 9\n")
    arrivals = ReplicaArrivals(tmp_path, "t")
    arrivals.look()
    assert set(arrivals.safe_ms) == {(0, 0), (0, 1)}  # not the other topic's
    noted = dict(arrivals.safe_ms)
    marks.write_text("0\n2\nt 0 3\nt 1 1\n")
    arrivals.look()
    assert set(arrivals.safe_ms) == {(0, 0), (0, 1), (0, 2), (1, 0)}
    assert {k: arrivals.safe_ms[k] for k in noted} == noted
    marks.write_text("0\n2\nt 0")  # replaced as it was read: the next look
    arrivals.look()
    assert len(arrivals.safe_ms) == 4


def test_a_rows_latency_is_cut_at_its_high_watermark_and_its_micro_batchs_trigger():
    sink = Sink("s")
    sink.held_ms = {(0, 0): 5_000, (0, 1): 5_000, (1, 0): 6_300}
    sink.timestamp_ms = {(0, 0): 3_000, (0, 1): 3_500, (1, 0): 4_000}
    sink.batch_of = {(0, 0): 4, (0, 1): 4, (1, 0): 5}
    progress = [
        Progress(3, 3_000, {"triggerExecution": 100}),  # held no measured row
        Progress(4, 4_000, {"walCommit": 50, "addBatch": 900, "triggerExecution": 1_000}),
        Progress(5, 6_000, {"walCommit": 60, "addBatch": 200, "triggerExecution": 300}),
    ]
    measured = Measured(3, progress, Cpu(1.0, 0.5, 0.2, 0.1))
    arrived = {(0, 0): 3_100, (0, 1): 3_600, (1, 0): 4_100}
    safe = {(0, 0): 3_200, (0, 1): 3_800, (1, 0): 4_500}
    got = breakdown(sink, measured, arrived, safe)
    assert sorted(got.records["hw"]) == [100, 200, 400]
    assert sorted(got.records["wait"]) == [200, 800, 1_500]
    assert sorted(got.records["batch"]) == [300, 1_000, 1_000]
    assert got.batches["triggerExecution"] == [1_000, 300]
    assert got.batches["between triggers"] == [1_000, 2_000]
    # The file last moved at 3,800 before the trigger at 4,000, at 4,500 before 6,000.
    assert got.batches["high watermark's age at the trigger"] == [200, 1_500]
    # From the record's timestamp (the Kafka source): no high watermark part.
    theirs = breakdown(sink, measured, None, None)
    assert theirs.records["hw"] == [] and sorted(theirs.records["wait"]) == [500, 1_000, 2_000]
    out = breakdown_table([got])
    assert "| s | 2 | 200 / 400 | 800 / 1,500 | 1,000 / 1,000 |" in out
    assert "| s | 2 | 1.00 | 0.50 | 0.750 | 0.20 | 0.10 |" in cpu_table([got])


def test_progress_is_read_from_what_spark_reports():
    got = Progress.of(
        {
            "batchId": 7,
            "timestamp": "2026-11-27T23:30:01.250Z",
            "durationMs": {"addBatch": 120, "triggerExecution": 180},
        }
    )
    assert got.batch_id == 7 and got.started_ms == 1_795_822_201_250
    assert got.duration_ms == {"addBatch": 120, "triggerExecution": 180}
