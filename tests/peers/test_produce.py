"""tools/peers/produce.py on the real Kafka broker, checked with Kafka's own DumpLogSegments."""

from __future__ import annotations

import dataclasses
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import zstandard

from replicad.records.batch import RECORD_BATCH_OVERHEAD
from tools.peers.admin import probe_consumer
from tools.peers.kafka import dump_log_segments
from tools.peers.process import PeerError
from tools.peers.produce import (
    CODECS,
    CheckedProducer,
    ConsumedRecord,
    ProduceSummary,
    broker_batches,
    consume_all,
    produce_mixed,
    produce_numbered,
    read_broker_batches,
    records_digest,
)

PARTITIONS = 4
RECORDS = 8000
SEED = 7

DUMP_BATCH = re.compile(
    r"^baseOffset: (?P<base>\d+) lastOffset: (?P<last>\d+) .*"
    r"isTransactional: (?P<txn>\w+) isControl: (?P<control>\w+) .*"
    r"compresscodec: (?P<codec>\w+) .*isvalid: (?P<valid>\w+)",
    re.MULTILINE,
)
DUMP_MARKER = re.compile(r"endTxnMarker: (COMMIT|ABORT)")


@dataclass(frozen=True)
class Mixed:
    topic: str
    summary: ProduceSummary


@pytest.fixture(scope="module")
def mixed(kafka_broker) -> Mixed:
    topic = f"produce-mixed-{os.getpid():x}"
    kafka_broker.create_topic(topic, PARTITIONS)
    summary = produce_mixed(
        kafka_broker.bootstrap, topic, partitions=PARTITIONS, records=RECORDS, seed=SEED
    )
    return Mixed(topic, summary)


def test_the_summary_adds_up(mixed):
    summary = mixed.summary
    assert summary.records == RECORDS
    assert [p.partition for p in summary.partitions] == list(range(PARTITIONS))
    for p in summary.partitions:
        # A fresh topic: every offset is a record or a transaction marker.
        assert p.log_end_offset == p.records + p.commit_markers + p.abort_markers
        assert p.commit_markers >= 1 and p.abort_markers >= 1
        assert p.committed_records > 0 and p.aborted_records > 0
        assert set(p.records_by_codec) == set(CODECS)
        assert sum(p.records_by_codec.values()) == p.records


def test_log_end_offsets_are_what_the_broker_says(kafka_broker, mixed):
    from confluent_kafka import TopicPartition

    consumer = probe_consumer(kafka_broker.bootstrap)
    try:
        for p in mixed.summary.partitions:
            where = TopicPartition(mixed.topic, p.partition)
            assert consumer.get_watermark_offsets(where, 10) == (0, p.log_end_offset)
            batches = broker_batches(kafka_broker.log_dir, mixed.topic, p.partition)
            assert batches[-1].last_offset == p.last_offset
    finally:
        consumer.close()


def test_every_codec_and_both_markers_are_in_the_brokers_segments(kafka_broker, mixed):
    for p in mixed.summary.partitions:
        batches = broker_batches(kafka_broker.log_dir, mixed.topic, p.partition)
        data = [b for b in batches if not b.is_control]
        assert {b.codec for b in data} == set(CODECS)
        assert any(b.is_transactional for b in data)
        assert any(not b.is_transactional for b in data)
        assert sum(b.is_control for b in batches) == p.commit_markers + p.abort_markers


def test_kafkas_own_dump_agrees_batch_by_batch(kafka_broker, mixed):
    """DumpLogSegments decodes every record: codecs, markers and CRCs as Kafka sees them."""
    for p in mixed.summary.partitions:
        files = sorted(kafka_broker.partition_dir(mixed.topic, p.partition).glob("*.log"))
        dump = dump_log_segments(*files)
        dumped = [m.groupdict() for m in DUMP_BATCH.finditer(dump)]
        ours = broker_batches(kafka_broker.log_dir, mixed.topic, p.partition)
        assert [(int(d["base"]), int(d["last"])) for d in dumped] == [
            (b.base_offset, b.last_offset) for b in ours
        ]
        assert [d["codec"] for d in dumped] == [b.codec for b in ours]
        assert [d["control"] == "true" for d in dumped] == [b.is_control for b in ours]
        assert {d["valid"] for d in dumped} == {"true"}
        markers = Counter(DUMP_MARKER.findall(dump))
        assert markers == Counter(COMMIT=p.commit_markers, ABORT=p.abort_markers)


def test_read_committed_reads_everything_but_aborted_records(kafka_broker, mixed):
    read = consume_all(kafka_broker.bootstrap, mixed.topic)
    for p in mixed.summary.partitions:
        records = read[p.partition]
        assert len(records) == p.visible_records
        assert records_digest(records) == p.committed_digest
        assert [r.offset for r in records] == sorted(r.offset for r in records)
    everything = [r for records in read.values() for r in records]
    assert any(r.key is None for r in everything)
    assert any(r.value is None for r in everything)
    assert any(r.key is not None and r.value is None for r in everything)  # tombstones
    assert any(r.headers for r in everything)
    assert any(value is None for r in everything for _, value in r.headers)
    assert max(len(r.value or b"") for r in everything) > 16 * 1024


def test_read_uncommitted_also_reads_aborted_records(kafka_broker, mixed):
    read = consume_all(kafka_broker.bootstrap, mixed.topic, isolation="read_uncommitted")
    for p in mixed.summary.partitions:
        assert len(read[p.partition]) == p.records
        assert records_digest(read[p.partition]) == p.uncommitted_digest
        assert p.uncommitted_digest != p.committed_digest


def test_records_digest_sees_every_field() -> None:
    base = ConsumedRecord(offset=5, key=b"k", value=b"v", headers=(("h", b"x"),), timestamp=1)
    variants = [
        ConsumedRecord(6, b"k", b"v", (("h", b"x"),), 1),
        ConsumedRecord(5, None, b"v", (("h", b"x"),), 1),
        ConsumedRecord(5, b"k", b"", (("h", b"x"),), 1),
        ConsumedRecord(5, b"k", b"v", (("h", None),), 1),
        ConsumedRecord(5, b"k", b"v", (), 1),
    ]
    digests = {records_digest([r]) for r in [base, *variants]}
    assert len(digests) == 1 + len(variants)
    # Timestamps are the client's clock, not the seed's: they do not count.
    assert records_digest([base]) == records_digest(
        [ConsumedRecord(5, b"k", b"v", base.headers, 9)]
    )


def test_the_same_seed_gives_the_same_records_and_offsets(kafka_broker, unique_topic):
    summaries = []
    for seed in (SEED, SEED, SEED + 1):
        topic = unique_topic(f"seed-{seed}")
        kafka_broker.create_topic(topic, 2)
        summaries.append(
            produce_mixed(kafka_broker.bootstrap, topic, partitions=2, records=1500, seed=seed)
        )
    first, again, other = summaries
    for a, b, c in zip(first.partitions, again.partitions, other.partitions, strict=True):
        assert (a.committed_digest, a.uncommitted_digest, a.log_end_offset) == (
            b.committed_digest,
            b.uncommitted_digest,
            b.log_end_offset,
        )
        assert a.committed_digest != c.committed_digest


def test_without_transactions_or_headers_and_with_one_codec(kafka_broker, unique_topic):
    kafka_broker.create_topic(unique_topic, 2)
    summary = produce_mixed(
        kafka_broker.bootstrap,
        unique_topic,
        partitions=2,
        records=1000,
        seed=1,
        codecs=("zstd",),
        transactional=False,
        headers=False,
    )
    assert summary.commit_markers == summary.abort_markers == 0
    for p in summary.partitions:
        assert p.log_end_offset == p.records
        batches = broker_batches(kafka_broker.log_dir, unique_topic, p.partition)
        assert {(b.is_transactional, b.is_control) for b in batches} == {(False, False)}
        assert "zstd" in {b.codec for b in batches}
        for b in batches:
            if b.codec != "zstd":
                # librdkafka sends a batch uncompressed when compressing would grow it (a
                # record or two of a short value): which batches that is depends on timing.
                assert b.codec == "none"
                records = b.raw[RECORD_BATCH_OVERHEAD:]
                assert len(zstandard.ZstdCompressor().compress(records)) >= len(records)
    read = consume_all(kafka_broker.bootstrap, unique_topic)
    assert not any(r.headers for records in read.values() for r in records)


def test_read_broker_batches_is_the_segment_files_in_offset_order(kafka_broker, mixed):
    partition_dir = kafka_broker.partition_dir(mixed.topic, 0)
    whole = b"".join(f.read_bytes() for f in sorted(partition_dir.glob("*.log")))
    assert read_broker_batches(kafka_broker.log_dir, mixed.topic, 0) == whole
    batches = broker_batches(kafka_broker.log_dir, mixed.topic, 0)
    middle = batches[len(batches) // 2]
    tail = read_broker_batches(
        kafka_broker.log_dir, mixed.topic, 0, start_offset=middle.last_offset
    )
    assert tail == b"".join(b.raw for b in batches[len(batches) // 2 :])


def test_bad_arguments_are_refused_before_any_connection() -> None:
    unreachable = "127.0.0.1:9"
    with pytest.raises(ValueError, match="codecs"):
        produce_mixed(unreachable, "t", partitions=1, records=1, seed=1, codecs=("brotli",))
    with pytest.raises(ValueError, match="partition"):
        produce_mixed(unreachable, "t", partitions=0, records=1, seed=1)
    with pytest.raises(ValueError, match="isolation"):
        consume_all(unreachable, "t", partitions=1, isolation="dirty")


def test_records_not_delivered_fail_the_flush(free_port: int) -> None:
    """librdkafka drops a record it gave up on from its queue (here: no broker, a message
    timeout of 200 ms) and tells only its delivery callback, so flush() returned 0 and
    produce_numbered passed over records that never reached the broker."""
    with pytest.raises(PeerError, match=r"lost: records not delivered: 0 unsent, 2 failed"):
        produce_numbered(f"127.0.0.1:{free_port}", "lost", 1, 2, config={"message.timeout.ms": 200})
    seen = []
    config = {"bootstrap.servers": f"127.0.0.1:{free_port}", "message.timeout.ms": 200}
    producer = CheckedProducer(config)
    producer.produce("lost", b"v", on_delivery=lambda error, _: seen.append(error))
    with pytest.raises(PeerError, match="1 failed"):
        producer.flush(30)
    assert len(seen) == 1 and seen[0] is not None  # the caller's own callback too


def test_the_log_ends_are_read_in_one_list_offsets_round_not_one_a_partition(
    kafka_broker, unique_topic
):
    """The ends at the start and after each transaction, every partition in one ListOffsets
    round: the old reads, one partition at a time (1,234 requests with 200 partitions, more
    than 3 x 100 here), took most of a 10,000-partition soak's producing."""
    from replicad.protocol.apis import ApiKey
    from tools.chaos.proxy import ChaosProxy

    topic, partitions = unique_topic(), 100
    kafka_broker.create_topic(topic, partitions)
    asked = []
    with ChaosProxy(lambda: ("127.0.0.1", kafka_broker.port)) as proxy:
        proxy.rewrite_responses(ApiKey.LIST_OFFSETS, lambda head, body: asked.append(head) or body)
        proxy.rewrite_responses(ApiKey.FIND_COORDINATOR, _coordinator_at(proxy.port))
        # 9 rounds spread over every partition, one of them committed and one aborted.
        summary = produce_mixed(proxy.address, topic, partitions=partitions, records=900, seed=4)
    assert summary.commit_markers == summary.abort_markers == partitions
    assert [p.log_end_offset for p in summary.partitions] == [
        p.records + p.commit_markers + p.abort_markers for p in summary.partitions
    ]
    assert 3 <= len(asked) < partitions, len(asked)


def _coordinator_at(port: int) -> Callable[[Any, bytes], bytes]:
    """A FindCoordinator answer rewritten to name the proxy at `port`: the proxy moves only
    Metadata's brokers, and a client with a group id (the old code's probe consumer) or a
    transaction then went to the broker itself, around the proxy's count."""
    from kio.static.primitive import i32

    from replicad.protocol.apis import ApiKey
    from replicad.protocol.codec import encode_entities
    from tools.chaos.frames import decode_response

    def rewrite(head: Any, body: bytes) -> bytes:
        header, entity = decode_response(body, ApiKey.FIND_COORDINATOR, head.api_version)
        if head.api_version >= 4:  # KIP-699: one entry a key
            moved = tuple(
                dataclasses.replace(c, host="127.0.0.1", port=i32(port))
                for c in entity.coordinators
            )
            entity = dataclasses.replace(entity, coordinators=moved)
        else:
            entity = dataclasses.replace(entity, host="127.0.0.1", port=i32(port))
        return encode_entities(header, entity)

    return rewrite


def test_a_transaction_waits_for_markers_only_where_it_wrote(tansu_broker, unique_topic):
    """Tansu's ListOffsets "latest" is a partition's last batch base plus one: a partition the
    transaction did not touch, whose last batch holds several records, never reached its
    tally, and produce_mixed failed with "transaction markers not written in time" (here on
    the old code: partitions written by random rounds, seed 3)."""
    from replicad.types import TopicPartition
    from tools.peers.wire import high_watermarks

    topic, partitions = unique_topic(), 20
    tansu_broker.create_topic(topic, partitions)
    summary = produce_mixed(
        tansu_broker.bootstrap, topic, partitions=partitions, records=2000, seed=3
    )
    assert summary.commit_markers > 0 and summary.abort_markers > 0
    ends = high_watermarks(
        tansu_broker.bootstrap, [TopicPartition(topic, p) for p in range(partitions)]
    )
    assert {tp.partition: end for tp, end in ends.items()} == summary.log_end_offsets
