"""tools/bench/serve_vs_kafka's tables and ratios, from runs made up here (the bench itself
needs a broker, a replica and minutes: it runs by hand, its output in docs/benchmarks.md)."""

from __future__ import annotations

from tools.bench.serve_vs_kafka import FetchRun, ReaderRun, ratios, report

KAFKA, SERVE = "Apache Kafka 4.3.1", "replicad serve"
MB = 1_000_000


def runs() -> list[ReaderRun]:
    return [
        ReaderRun(KAFKA, "kcat (tuned)", 4.0, 1.0, 2.0),
        ReaderRun(KAFKA, "kcat (tuned)", 6.0, 1.2, 2.0),
        ReaderRun(SERVE, "kcat (tuned)", 4.0, 0.4, 2.0),
        ReaderRun(SERVE, "kcat (tuned)", 4.0, 0.6, 2.0),
        ReaderRun(KAFKA, "confluent-kafka (tuned)", 2.0, 2.0, 3.0),
        ReaderRun(SERVE, "confluent-kafka (tuned)", 1.0, 0.5, 3.0),
    ]


def test_each_reader_has_a_row_per_server_with_its_share_on_cpu() -> None:
    fetches = [FetchRun(KAFKA, 10, 2.0, 0.5, 10 * MB), FetchRun(SERVE, 10, 1.0, 0.2, 10 * MB)]
    table = report(runs(), fetches, 400 * MB).splitlines()
    # The medians of the runs' own figures: 100 and 67 MB/s, 2 CPU s in 4 and 6 s of wall.
    assert table[2] == (
        "| Apache Kafka 4.3.1 | kcat (tuned) | 83 (67-100) | 5.0 (4.0-6.0) | 1.10 (1.00-1.20) "
        "| 2.0 (2.0-2.0) | 42 (33-50) % |"
    )
    assert table[5].startswith("| replicad serve | confluent-kafka (tuned) | 400 (400-400) |")
    assert table[-1] == "| replicad serve | 10.0 (10.0-10.0) | 20.0 (20.0-20.0) | 1.00 |"


def test_ratios_are_serve_over_kafka_per_reader_from_medians() -> None:
    assert ratios(runs(), 400 * MB) == [
        "kcat (tuned): replicad serve / Kafka: 1.20x MB/s (target >= 1.5x), 0.45x the "
        "server's CPU seconds (target <= 0.5x)",
        "confluent-kafka (tuned): replicad serve / Kafka: 2.00x MB/s (target >= 1.5x), "
        "0.25x the server's CPU seconds (target <= 0.5x)",
    ]
