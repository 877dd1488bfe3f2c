"""A source with tiered storage (KIP-405): a topic whose first segments exist only in remote
storage, replicated by `replicad run` from offset 0, byte for byte.

The broker is one of its own config (tiered storage is a broker setting), with Kafka's own
LocalTieredStorage as its remote storage (tests/follower/conftest.py, tools/peers/tiered.py).
Once the broker has copied the first segments out and deleted them locally, ListOffsets tells
the two starts apart: EARLIEST (-2) is the remote log start, EARLIEST_LOCAL (-4) the first
local offset, LATEST_TIERED (-5) the last offset in remote storage. The follower asks only -2
and -1, so it starts at 0, and the broker serves the remote segments to its Fetch as to any
consumer's.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from replicad.protocol.apis import ApiKey
from replicad.protocol.client import ClientSettings, KafkaClient
from replicad.protocol.requests import OffsetQuery, list_offsets_request
from replicad.types import TopicPartition
from replicad.wire import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from tools.peers.produce import CheckedProducer
from tools.peers.tiered import TIERED_TOPIC_CONFIG, batches_by_offset, remote_segment_files
from tools.replica import replicad_cli, replicad_run, segment_bytes
from tools.wait import wait_until

pytestmark = pytest.mark.kafka

EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5
SEGMENT_BYTES = 8 * 1024
ROUND_RECORDS = 60


def list_offsets(bootstrap: str, tp: TopicPartition, timestamps: list[int]) -> dict[int, int]:
    """The source's answer to ListOffsets for each special timestamp, by timestamp; none
    while the metadata names no leader for `tp` (at load ~60 the broker's answer said
    leader -1 for a while after the topic was made)."""

    async def ask() -> dict[int, int]:
        client = KafkaClient([bootstrap], ClientSettings())
        try:
            cluster = await client.metadata([tp.topic])
            leader = cluster.leader_of(tp)
            if leader is None or leader.leader_id < 0:
                return {}
            conn = await client.connection(leader.leader_id)
            assert conn.versions is not None
            version = conn.versions.require(ApiKey.LIST_OFFSETS)
            found = {}
            for timestamp in timestamps:
                body = await conn.request(
                    list_offsets_request(version, {tp: OffsetQuery(timestamp)})
                )
                answer = body.topics[0].partitions[0]
                assert int(answer.error_code) == 0, (timestamp, answer)
                found[timestamp] = int(answer.offset)
            return found
        finally:
            await client.close()

    return asyncio.run(ask())


def produce_round(bootstrap: str, topic: str, first: int) -> int:
    producer = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 2, "batch.size": 2048})
    for i in range(first, first + ROUND_RECORDS):
        producer.produce(topic, value=b"%08d" % i + b"y" * 200, partition=0)
    assert producer.flush(60) == 0
    return first + ROUND_RECORDS


def test_a_topic_whose_first_segments_are_remote_only_is_copied_from_offset_0(
    tiered_kafka_broker, unique_topic, tmp_path
):
    broker, storage = tiered_kafka_broker
    topic = unique_topic()
    tp = TopicPartition(topic, 0)
    broker.create_topic(topic, 1, TIERED_TOPIC_CONFIG, segment_bytes=SEGMENT_BYTES)
    produced = 0

    def first_segments_remote_only() -> bool:
        nonlocal produced
        produced = produce_round(broker.bootstrap, topic, produced)
        found = list_offsets(broker.bootstrap, tp, [EARLIEST_LOCAL_TIMESTAMP])
        return found.get(EARLIEST_LOCAL_TIMESTAMP, 0) > 0

    wait_until(first_segments_remote_only, interval_s=0.5, what="segments only in remote storage")
    offsets = list_offsets(
        broker.bootstrap,
        tp,
        [EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP, LATEST_TIERED_TIMESTAMP, LATEST_TIMESTAMP],
    )
    local_start = offsets[EARLIEST_LOCAL_TIMESTAMP]
    assert offsets[EARLIEST_TIMESTAMP] == 0 < local_start
    assert offsets[LATEST_TIERED_TIMESTAMP] >= local_start - 1
    assert offsets[LATEST_TIMESTAMP] == produced
    local_files = sorted(broker.partition_dir(topic, 0).glob("*.log"))
    assert min(int(f.stem) for f in local_files) > 0  # offset 0 is no longer on the broker

    data_dir = tmp_path / "data"
    with replicad_run(broker.bootstrap, [topic], data_dir) as proc:
        proc.wait_caught_up({tp: produced})

    # Byte for byte: the remote segments, then the local ones where remote storage ends.
    # (Local retention may take more segments meanwhile: the remote copy has them.)
    source = batches_by_offset(remote_segment_files(storage, topic, 0))
    for base, batch in batches_by_offset(
        sorted(broker.partition_dir(topic, 0).glob("*.log"))
    ).items():
        source.setdefault(base, batch)
    assert min(source) == 0
    expected = b"".join(source[base] for base in sorted(source))
    assert segment_bytes(data_dir / f"{topic}-0") == expected

    done = replicad_cli(
        "verify",
        str(data_dir),
        "--against-source",
        "--bootstrap-servers",
        broker.bootstrap,
        "--json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (entry,) = json.loads(done.stdout)["partitions"]
    assert entry["clean"] and entry["gone_at_source"] == [] and entry["verified_to"] == produced
