"""The destination's requests against a real Apache Kafka broker: an idempotent producer
whose resent batch is not written twice, batches thinned by compaction taken with
consecutive offsets (their codec kept), topics created with configs, log ends."""

from __future__ import annotations

from typing import Any

import pytest

from replicad.errors import ProtocolError
from replicad.mirror.destination import Destination
from replicad.mirror.restamp import ProducerStamp, restamp
from replicad.protocol.admin import TopicToCreate
from replicad.protocol.client import ClientSettings, KafkaClient
from replicad.records.batch import Compression
from replicad.types import TopicPartition
from tests.mirror.test_restamp import thinned_batch
from tools.logdata.batches import producer_batch
from tools.peers.produce import READ_UNCOMMITTED, consume_all
from tools.peers.segments import broker_batches
from tools.wait import until

pytestmark = pytest.mark.kafka


async def new_producer(destination: Destination) -> ProducerStamp:
    """InitProducerId until the broker's coordinator has loaded (a fresh broker answers
    COORDINATOR_LOAD_IN_PROGRESS for a while; the shell retries the same way)."""

    async def stamp() -> ProducerStamp | None:
        try:
            return await destination.init_producer_id()
        except ProtocolError:
            return None

    return await until(stamp, interval_s=0.2, what="the coordinator to hand out a producer id")


async def test_produce_idempotently_and_thinned_batches(
    kafka_broker: Any, unique_topic: Any
) -> None:
    topic = unique_topic("dest")
    client = KafkaClient([kafka_broker.bootstrap], ClientSettings(client_id="test-mirror"))
    destination = Destination(client, produce_timeout_ms=10_000)
    try:
        created = await destination.create_topics(
            [TopicToCreate(topic, 1, {"cleanup.policy": "compact", "retention.ms": "3600000"})]
        )
        assert created == {topic: None}
        meta = await client.metadata([topic])
        tp = TopicPartition(topic, 0)
        leader = meta.leader_of(tp)
        assert leader is not None
        conn = await client.connection(leader.leader_id)
        stamp = await new_producer(destination)
        plain = producer_batch(100, [b"p%d" % i for i in range(4)], keys=[b"k"] * 4)
        batches = [restamp(plain, stamp, 0)]
        for index, codec in enumerate(Compression):
            batches.append(restamp(thinned_batch(codec), stamp, 4 + 3 * index))
        bases = []
        for batch in batches:
            answer = await destination.produce(conn, tp, batch).answer()
            assert answer.error is None, (len(bases), answer.error_name, answer.message)
            bases.append(answer.base_offset)
        assert bases == [0, 4, 7, 10, 13, 16]
        # A resend of the last batch (same producer, same sequence) is not written again.
        again = await destination.produce(conn, tp, batches[-1]).answer()
        assert again.error is None and again.base_offset == 16
        ends = await destination.log_ends(leader.leader_id, [tp])
        assert (ends[tp].log_end, ends[tp].high_watermark) == (19, 19)
        assert ends[tp].settled
        # A batch out of sequence is refused as the idempotent producer's rules say.
        wrong = await destination.produce(conn, tp, restamp(plain, stamp, 50)).answer()
        assert wrong.session_lost
    finally:
        await client.close()
    records = consume_all(kafka_broker.bootstrap, topic, partitions=1, isolation=READ_UNCOMMITTED)
    got = [(r.offset, r.value) for r in records[0]]
    thinned = [b"v%d" % d * 50 for d in (0, 2, 5)]
    want = list(enumerate([*(b"p%d" % i for i in range(4)), *thinned * len(Compression)]))
    assert got == want
    codecs = [b.codec for b in broker_batches(kafka_broker.log_dir, topic, 0)]
    assert codecs == ["none", "none", "gzip", "snappy", "lz4", "zstd"]
