"""tools/peers/admin.py: a created topic is ready for clients the moment the call returns."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import Producer, TopicPartition

from tools.peers.admin import create_topic_and_wait, librdkafka_log, probe_consumer
from tools.peers.process import PeerError

PARTITIONS = 8


def test_every_partition_serves_list_offsets_and_produce_at_once(kafka_broker, unique_topic):
    create_topic_and_wait(kafka_broker.bootstrap, unique_topic, PARTITIONS)
    consumer = probe_consumer(kafka_broker.bootstrap)
    try:
        for partition in range(PARTITIONS):
            where = TopicPartition(unique_topic, partition)
            assert consumer.get_watermark_offsets(where, 5) == (0, 0)
    finally:
        consumer.close()
    errors = []
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "retries": 0})
    for partition in range(PARTITIONS):
        producer.produce(
            unique_topic, value=b"x", partition=partition, on_delivery=lambda e, m: errors.append(e)
        )
    assert producer.flush(30) == 0
    assert errors == [None] * PARTITIONS


def test_a_refused_topic_is_a_peer_error_with_the_brokers_reason(kafka_broker, unique_topic):
    with pytest.raises(PeerError, match="INVALID_CONFIG"):
        create_topic_and_wait(
            kafka_broker.bootstrap, unique_topic, 1, {"segment.bytes": "1"}, timeout_s=10
        )


def test_the_coordinators_first_load_is_not_shown_and_other_warnings_are(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=librdkafka_log.name):
        librdkafka_log.warning(
            "GETPID [rdkafka#producer-1] [thrd:main]: Failed to acquire idempotence PID from "
            "broker 127.0.0.1:9092/1: Coordinator load in progress: retrying"
        )
        librdkafka_log.warning("FAIL [rdkafka#producer-1]: Connection refused")
    assert [record.getMessage() for record in caplog.records] == [
        "FAIL [rdkafka#producer-1]: Connection refused"
    ]
