"""Fixtures of the follower's tests against a broker of their own config."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.peers.kafka import KafkaBroker


@pytest.fixture(scope="session")
def tiered_kafka_broker(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[KafkaBroker, Path]]:
    """(broker, remote storage dir): a Kafka broker with tiered storage on (Kafka's
    LocalTieredStorage in that dir, tools/peers/tiered.py) that checks retention and copies
    rolled segments every 500 ms, from the start. Kafka's 5-minute retention check is a broker
    setting no topic can lower, so the retention tests share this broker too: a topic without
    remote.storage.enable is an ordinary topic on it. Started only by the tests that ask."""
    from tools.peers.tiered import tiered_broker_config

    work = tmp_path_factory.mktemp("kafka-tiered")
    storage = work / "remote"
    storage.mkdir()
    broker = KafkaBroker(work / "broker", broker_config=tiered_broker_config(storage))
    broker.start()
    try:
        yield broker, storage
    finally:
        # Thrown away with its data, as every session peer (tests/conftest.py): a controlled
        # shutdown only costs the worker's last seconds.
        broker.kill()
