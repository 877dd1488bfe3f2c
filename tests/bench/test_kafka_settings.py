"""tools/bench/kafka_settings: the line a bench prints is what its brokers ran with."""

from __future__ import annotations

from tools.bench.kafka_settings import kafka_settings
from tools.peers.kafka import harness_broker_config


def test_every_setting_of_the_harness_is_said_the_controllers_idle_interval_among_them():
    line = kafka_settings()
    assert line.startswith("Kafka (the broker): its defaults but ")
    assert "metadata.max.idle.interval.ms=5000" in line
    for key, value in harness_broker_config().items():
        assert f"{key}={value}" in line


def test_a_cluster_adds_its_own_and_the_benchs_settings_win():
    line = kafka_settings(nodes=3, bench={"num.replica.fetchers": "2", "num.io.threads": "8"})
    assert line.startswith("Kafka (each of the 3 nodes): ")
    assert "num.replica.fetchers=2" in line and "num.io.threads=8" in line
    assert "num.io.threads=3" not in line
    assert "metadata.max.idle.interval.ms=5000" in line
