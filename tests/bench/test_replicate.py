"""tools/bench/replicate.py: the table, the idle flag, the targets; and a small run of
replicad, replicad from serve and the plain copy against the session's Kafka broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench import replicate
from tools.bench.measure import Measured
from tools.bench.replicate import (
    CEILING,
    REPLICAD,
    SERVE_READER,
    Run,
    Topic,
    run_ceiling,
    run_from_serve,
    run_replicad,
    settings_notes,
    summarize,
    table,
    targets,
)

STORED = 1_000_000_000


def run(name: str, wall: float, cpu: float, rss: float = 40.0, steady: float | None = None) -> Run:
    marks = {} if steady is None else {10: 1.0, 90: 1.0 + steady}
    return Run(name, 1_000_000, STORED, Measured(wall, cpu, rss, marks))


def test_a_reader_mostly_waiting_is_flagged_and_a_busy_one_is_not():
    waiting = run("confluent-kafka (default)", wall=20.0, cpu=5.0)
    busy = run("confluent-kafka (tuned)", wall=10.0, cpu=9.0)
    assert waiting.idle and not busy.idle
    rows = table(summarize([waiting, busy])).splitlines()[2:]
    assert "idle 75% of its wall time" in rows[0]
    assert "idle" not in rows[1]


def test_the_median_run_stands_for_a_reader_and_the_spread_is_shown():
    runs = [run(REPLICAD, wall=w, cpu=1.0) for w in (2.0, 1.0, 4.0)]
    (summary,) = summarize(runs)
    assert summary.median.seconds == 2.0
    assert summary.best.seconds == 1.0
    assert summary.spread == "250,000-1,000,000"


def test_steady_state_rate_is_the_middle_80_percent():
    r = run(REPLICAD, wall=10.0, cpu=5.0, steady=4.0)
    assert r.steady_records_per_s == 200_000
    assert run(REPLICAD, wall=10.0, cpu=5.0).steady_records_per_s is None


def test_steady_cpu_per_gb_leaves_start_up_out():
    # 1 GB stored; 0.4 CPU s between 10% and 90% of it (0.8 GB): 0.5 s per GB, while the
    # whole run's 3 CPU s (start-up included) make 3 per GB.
    marks = {10: 1.0, 90: 3.0}
    r = Run(REPLICAD, 1_000_000, STORED, Measured(4.0, 3.0, 40.0, marks, {10: 1.2, 90: 1.6}))
    assert r.cpu_s_per_gb == pytest.approx(3.0)
    assert r.steady_cpu_s_per_gb == pytest.approx(0.5)
    assert run(REPLICAD, wall=10.0, cpu=5.0, steady=4.0).steady_cpu_s_per_gb is None
    assert "| 3.00 | 0.50 |" in table(summarize([r]))


def test_targets_compare_with_the_fastest_consumer_at_its_best_run():
    runs = [
        run(REPLICAD, wall=1.0, cpu=1.5, rss=45.0),
        run(SERVE_READER, wall=0.8, cpu=1.4),
        run(CEILING, wall=0.5, cpu=0.3),
        run("kcat (tuned)", wall=2.0, cpu=1.8),
        run("kcat (tuned)", wall=2.5, cpu=1.8),
        run("kcat (tuned)", wall=3.0, cpu=1.8),
        run("kafka-python (tuned)", wall=9.0, cpu=8.5),
    ]
    found = {t.figure.split(" (")[0]: t for t in targets(summarize(runs), STORED, (112.0, 96.0))}
    vs = found["replicad records/s vs the fastest consumer"]
    assert "kcat (tuned)" in next(t.figure for t in found.values() if t is vs)
    # Median of kcat 2.5 s -> 2.5x; its best run (2.0 s) -> 2.0x, which decides: below
    # issue 32's 2.5x.
    assert vs.measured.startswith("2.50x") and "2.00x" in vs.measured
    assert not vs.met
    assert (
        found["replicad vs the plain Python socket->file copy of the same bytes"].measured == "50%"
    )
    assert not found["replicad vs the plain Python socket->file copy of the same bytes"].met
    assert found["replicad from `replicad serve` vs replicad from Apache Kafka"].met
    # Issue 32's target: 1 CPU s per GB; no steady CPU was polled in these runs.
    assert found["CPU seconds per GB replicated"].measured == "1.50; -"
    assert not found["CPU seconds per GB replicated"].met
    assert not found["peak RSS at 10,000 lagging partitions, 3 leaders"].met
    assert found["peak RSS of replicad, this run"].met


def test_settings_of_every_peer_in_the_table_are_printed():
    runs = [run("aiokafka (tuned)", 1.0, 1.0), run(REPLICAD, 1.0, 1.0)]
    notes = settings_notes(summarize(runs))
    assert "aiokafka (tuned): check_crcs=False" in notes
    assert "kafka-python" not in notes
    assert "replicad: its defaults" in notes


def test_replicad_serve_and_the_plain_copy_on_a_small_topic(
    kafka_broker, unique_topic, tmp_path: Path
):
    partitions, records = 2, 4096
    kafka_broker.create_topic(unique_topic, partitions)
    replicate.produce(kafka_broker.bootstrap, unique_topic, partitions, records)
    segments = tuple(
        f
        for p in range(partitions)
        for f in sorted(kafka_broker.partition_dir(unique_topic, p).glob("*.log"))
    )
    stored = sum(f.stat().st_size for f in segments)
    topic = Topic(kafka_broker.bootstrap, unique_topic, partitions, records, stored, segments)
    first, data_dir = run_replicad(tmp_path, topic)
    assert first.records == records and first.measured.cpu_s > 0
    assert first.measured.marks.get(100) is not None
    chained = run_from_serve(tmp_path, data_dir, topic)
    assert chained.records == records
    copy = run_ceiling(tmp_path, topic)
    assert copy.stored_bytes == stored and copy.measured.marks.get(100) is not None
