"""The Kafka-follower bench's own arithmetic and its reading of a node's log dir (the runs
need a cluster of their own and minutes: `python -m tools.bench.kafka_follower`)."""

from __future__ import annotations

from pathlib import Path

from tools.bench.kafka_follower import (
    TOPIC,
    Run,
    _steady,
    fetch_config,
    kafka_name,
    kafka_settings,
    summary,
    table,
    topic_bytes,
)


def _run(name: str, wall: float, cpu: float) -> Run:
    return Run(name, "s", wall, wall / 2, cpu, 1.0)


def test_only_the_topics_own_partition_dirs_count(tmp_path: Path) -> None:
    for name, size in [
        (f"{TOPIC}-0", 100),
        (f"{TOPIC}-1", 50),
        # A replica Kafka is deleting is renamed away: not counted.
        (f"{TOPIC}-0.abc123-delete", 1000),
        ("other-0", 7),
    ]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "00000000000000000000.log").write_bytes(b"x" * size)
        (tmp_path / name / "00000000000000000000.index").write_bytes(b"i" * 3)
    assert topic_bytes(tmp_path, 2) == 150
    assert topic_bytes(tmp_path, 1) == 100


def test_the_steady_window_needs_both_marks() -> None:
    assert _steady({10: 1.0, 90: 5.0}) == 4.0
    assert _steady({10: 1.0}) is None


def test_the_summary_compares_best_passes_and_judges_the_tuned_row_only() -> None:
    runs = [
        _run("replicad", 10.0, 4.0),
        _run("replicad", 12.0, 5.0),
        _run(kafka_name(1), 30.0, 20.0),
        _run(kafka_name(2), 16.0, 10.0),
        _run(kafka_name(2), 14.0, 9.0),
    ]
    text = summary(runs)
    assert "3.00x its speed at 0.20 of its CPU" in text
    # Best pass each: 14 / 10 = 1.4x, 4 / 9 CPU: under 1.5x, so not met.
    assert "1.40x its speed at 0.44 of its CPU" in text
    assert text.count("not met") == 1 and ": met)" not in text
    faster = summary([_run("replicad", 9.0, 4.0), _run(kafka_name(2), 14.0, 9.0)])
    assert "(issue 32's target >= 1.5x at <= 0.5 of its CPU: met)" in faster


def test_the_table_gives_a_row_per_pass_in_mb_per_second() -> None:
    text = table([_run("replicad", 10.0, 4.0)], stored=200_000_000)
    assert "| replicad | s | 10.0 | 20.0 | 32.0 | 4.0 | 1.0 |" in text


def test_raised_fetch_sizes_reach_the_broker_config_and_the_printed_settings() -> None:
    assert fetch_config(None, 8) == {}
    fetch = fetch_config(4, 8)
    assert fetch["replica.fetch.max.bytes"] == str(4 * 2**20)
    assert fetch["replica.fetch.response.max.bytes"] == str(32 * 2**20)
    settings = kafka_settings(2, fetch)
    assert settings.startswith("num.replica.fetchers=2, ")
    assert "replica.fetch.max.bytes=4194304" in settings
    assert kafka_settings(1, {}) == "num.replica.fetchers=1 (default)"
