"""Many consumers on one `replicad run` serving while it replicates (the short version of
`python -m tools.chaos.many_consumers`, against the session broker)."""

from __future__ import annotations

from tools.chaos.many_consumers import PARTITIONS, many_consumers


def test_forty_consumers_read_everything_while_run_replicates_and_answers_status(
    kafka_broker, unique_topic, tmp_path
) -> None:
    topic = unique_topic()
    result = many_consumers(
        kafka_broker.bootstrap,
        topic,
        tmp_path,
        kafka_python=20,
        librdkafka=20,
        create_topic=kafka_broker.create_topic,
    )
    assert not result.failures, result.failures
    assert result.consumers == 40 and result.records_each == PARTITIONS * 500
    assert result.status_asked >= 1
    # How fast status answers and how far the replica trails the source while 40 consumers
    # read are figures of `python -m tools.chaos.many_consumers` (docs/reliability.md: status
    # within 2 s, within 5,000 records, on 2 shared cores); a busy machine stretches both.
    assert result.rss_peak_mb < 400, result
