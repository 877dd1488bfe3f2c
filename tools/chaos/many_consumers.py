"""Many consumers on one `replicad run` that serves while it replicates: kafka-python and
librdkafka consumers (a thread each) read every record of a topic through serve while a
producer keeps writing to Kafka, and `replicad status` is asked twice a second throughout.

`python -m tools.chaos.many_consumers --bootstrap HOST:PORT --kafka-python 100 --librdkafka 100`
(against a broker of your own; the suite runs a short version against its session broker).
What it reports (`ManyConsumers`): how long the slowest consumer took, which failed, the
longest `replicad status` answer, the largest replication lag seen, and run's RSS.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tools.peers.process import free_port, rss_mib
from tools.peers.produce import produce_numbered
from tools.replica import replicad_run

PARTITIONS = 4
PER_PARTITION = 500


@dataclass
class ManyConsumers:
    consumers: int
    records_each: int
    slowest_s: float = 0.0
    failures: list[str] = field(default_factory=list)
    status_max_ms: float = 0.0
    status_asked: int = 0
    lag_max: int = 0
    rss_before_mb: float = 0.0
    rss_peak_mb: float = 0.0


def _kafka_python(bootstrap: str, topic: str, want: int) -> int:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
    )
    got = 0
    try:
        consumer.assign([KTP(topic, p) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 120
        while got < want and time.monotonic() < deadline:
            got += sum(len(m) for m in consumer.poll(timeout_ms=200).values())
    finally:
        consumer.close()
    return got


def _librdkafka(bootstrap: str, topic: str, want: int) -> int:
    from confluent_kafka import OFFSET_BEGINNING, Consumer
    from confluent_kafka import TopicPartition as KTP

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"unused-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    got = 0
    try:
        consumer.assign([KTP(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 120
        while got < want and time.monotonic() < deadline:
            got += sum(1 for m in consumer.consume(500, 0.2) if m.error() is None)
    finally:
        consumer.close()
    return got


def many_consumers(
    bootstrap: str,
    topic: str,
    work: Path,
    *,
    kafka_python: int,
    librdkafka: int,
    create_topic: Callable[[str, int], None] | None = None,
) -> ManyConsumers:
    """The topic is created (`create_topic`, else it must exist with PARTITIONS partitions)
    and filled, replicated by a `replicad run` serving on a free port, then read by the
    consumers while more is produced."""
    if create_topic is not None:
        create_topic(topic, PARTITIONS)
    produce_numbered(bootstrap, topic, PARTITIONS, PER_PARTITION)
    want = PARTITIONS * PER_PARTITION
    port = free_port()
    result = ManyConsumers(kafka_python + librdkafka, want)
    config = {"serve": {"listen": f"127.0.0.1:{port}"}}
    with replicad_run(
        bootstrap, topic, work / "data", config=config, control_socket=work / "control.sock"
    ) as proc:
        proc.wait_caught_up(want, timeout_s=120)
        assert proc.proc is not None
        pid = proc.proc.pid
        result.rss_before_mb = rss_mib(pid)
        served = f"127.0.0.1:{port}"
        readers = [_kafka_python] * kafka_python + [_librdkafka] * librdkafka
        durations: list[float] = []

        def consume(read: Callable[[str, str, int], int], name: str) -> None:
            start = time.monotonic()
            try:
                got = read(served, topic, want)
            except Exception as exc:  # reported, not raised: the others go on
                result.failures.append(f"{name}: {exc!r}")
                return
            if got < want:
                result.failures.append(f"{name}: {got} of {want} records")
            durations.append(time.monotonic() - start)

        threads = [
            threading.Thread(target=consume, args=(read, f"{read.__name__}-{i}"), daemon=True)
            for i, read in enumerate(readers)
        ]
        for thread in threads:
            thread.start()
        tag = 0
        while any(thread.is_alive() for thread in threads):
            tag += 1
            produce_numbered(bootstrap, topic, PARTITIONS, 5, tag=b"more%d-" % tag)
            asked = time.monotonic()
            snapshot = proc.status(timeout_s=30)
            result.status_max_ms = max(result.status_max_ms, 1000 * (time.monotonic() - asked))
            result.status_asked += 1
            if snapshot is not None:
                result.lag_max = max(result.lag_max, int(snapshot.get("lag") or 0))
            result.rss_peak_mb = max(result.rss_peak_mb, rss_mib(pid))
            time.sleep(0.5)
        result.slowest_s = max(durations, default=0.0)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools.chaos.many_consumers")
    parser.add_argument("--bootstrap", required=True, help="a Kafka broker of your own")
    parser.add_argument("--topic", default=f"many-consumers-{uuid.uuid4().hex[:8]}")
    parser.add_argument("--kafka-python", type=int, default=100)
    parser.add_argument("--librdkafka", type=int, default=100)
    args = parser.parse_args(argv)
    from tools.peers.admin import create_topic_and_wait

    with tempfile.TemporaryDirectory() as work:
        result = many_consumers(
            args.bootstrap,
            args.topic,
            Path(work),
            kafka_python=args.kafka_python,
            librdkafka=args.librdkafka,
            create_topic=lambda name, n: create_topic_and_wait(args.bootstrap, name, n),
        )
    print(result)
    return 1 if result.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
