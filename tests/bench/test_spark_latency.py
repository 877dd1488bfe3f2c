"""tools/bench/spark_latency.py: when offsets reach a replica's segment files, the latency of
each row from there or from its timestamp, and the table. The queries themselves run from
the tool (`python -m tools.bench.spark_latency`)."""

from __future__ import annotations

from pathlib import Path

from tools.bench.spark_latency import ReplicaArrivals, Row, Sink, percentile, table
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
