"""ApiVersions, Metadata, ListOffsets and OffsetForLeaderEpoch answers over a real data dir,
requests built by the follower's own request builders (as a replicad follower sends them)."""

from __future__ import annotations

import random
import uuid

import pytest
from kio.schema.errors import ErrorCode

from replicad.leader.catalog import Catalog
from replicad.leader.handlers import (
    SUPPORTED_VERSIONS,
    NodeInfo,
    api_versions_response,
    cluster_id_for,
    legacy_list_offsets,
    list_offsets_response,
    metadata_response,
    offset_for_leader_epoch_response,
)
from replicad.leader.legacy_codec import LegacyListOffsetsPartition, LegacyListOffsetsRequest
from replicad.leader.reads import TransactionTracker
from replicad.protocol.apis import ApiKey, VersionRange, negotiate
from replicad.protocol.codec import encode_entities
from replicad.protocol.requests import (
    OffsetQuery,
    list_offsets_request,
    metadata_request,
    offset_for_leader_epoch_request,
)
from replicad.records.records import ControlType
from replicad.types import TopicPartition
from tools.logdata.batches import producer_batch

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)
TID = uuid.UUID(int=0x1D)
NODE = NodeInfo(3, "replica.example", 9092, "cluster-x")
TS = 1_700_000_000_000


@pytest.fixture
def catalog(logs, fill, txn) -> Catalog:
    # t-0: offsets 0..5 in epochs 0 (0-2) and 4 (3-5), timestamps TS+offset*1000; HW 4.
    fill(
        logs,
        T0,
        [
            producer_batch(i, [b"v"], leader_epoch=0 if i < 3 else 4, timestamp_ms=TS + i * 1000)
            for i in range(6)
        ],
        hw=4,
        topic_id=TID,
    )
    fill(
        logs,
        T1,
        [
            txn.data(0, [b"a"], producer_id=8),
            txn.marker(1, producer_id=8, control_type=ControlType.COMMIT),
            txn.data(2, [b"b"], producer_id=9),
        ],
        topic_id=TID,
    )
    fill(logs, TopicPartition("__consumer_offsets", 0), [])
    return Catalog(logs, rng=random.Random(0))


def test_api_versions_lists_what_the_server_answers_and_a_replicad_follower_agrees() -> None:
    body = api_versions_response(3)
    listed = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}
    assert listed == {int(k): (r.min, r.max) for k, r in SUPPORTED_VERSIONS.items()}
    chosen = negotiate({k: VersionRange(*r) for k, r in listed.items()})
    assert chosen.require(ApiKey.FETCH) == 17
    assert encode_entities(api_versions_response(0, error=ErrorCode.unsupported_version))


@pytest.mark.parametrize("version", [0, 1, 4, 7, 9, 10, 12, 13])
def test_metadata_names_this_node_leader_of_every_local_partition(catalog, version) -> None:
    request = metadata_request(max(version, 0), None if version >= 1 else [])
    body = metadata_response(version, request, catalog, NODE, now_ms=0)
    assert [(b.node_id, b.host, b.port) for b in body.brokers] == [(3, "replica.example", 9092)]
    topics = {t.name: t for t in body.topics}
    assert sorted(topics) == ["__consumer_offsets", "t"]
    t = topics["t"]
    assert [
        (p.partition_index, p.leader_id, tuple(p.replica_nodes), tuple(p.isr_nodes))
        for p in t.partitions
    ] == [
        (0, 3, (3,), (3,)),
        (1, 3, (3,), (3,)),
    ]
    if version >= 7:
        assert [p.leader_epoch for p in t.partitions] == [4, 0]
    if version >= 10:
        assert t.topic_id == TID
    if version >= 1:
        assert body.controller_id == 3
        assert topics["__consumer_offsets"].is_internal and not t.is_internal
    if version >= 2:
        assert body.cluster_id == "cluster-x"
    assert encode_entities(body)


def test_metadata_for_topics_not_held_here_creates_nothing(catalog) -> None:
    body = metadata_response(12, metadata_request(12, ["t", "missing"]), catalog, NODE, now_ms=0)
    assert [(t.name, t.error_code) for t in body.topics] == [
        ("t", ErrorCode.none),
        ("missing", ErrorCode.unknown_topic_or_partition),
    ]
    assert catalog.topic("missing", now_ms=10**9) is None


def test_the_cluster_id_is_stable_for_a_data_directory() -> None:
    assert cluster_id_for("/var/lib/a") == cluster_id_for("/var/lib/a") != cluster_id_for("/b")


def offsets(catalog, queries, *, version=9, replica_id=-1, isolation=0, tp=T0) -> list[tuple]:
    request = list_offsets_request(
        version,
        {tp: OffsetQuery(queries)} if isinstance(queries, int) else queries,
        replica_id=replica_id,
        isolation_level=isolation,
    )
    body = list_offsets_response(version, request, catalog, TransactionTracker(), now_ms=0)
    return [
        (p.error_code, p.timestamp, p.offset, getattr(p, "leader_epoch", -1))
        for t in body.topics
        for p in t.partitions
    ]


def test_list_offsets_earliest_latest_and_by_timestamp(catalog) -> None:
    assert offsets(catalog, -2) == [(0, -1, 0, 0)]
    assert offsets(catalog, -1) == [(0, -1, 4, 4)]  # a consumer: the high watermark
    assert offsets(catalog, -1, replica_id=5) == [(0, -1, 6, 4)]  # a replica: the log end
    assert offsets(catalog, TS + 1500) == [(0, TS + 2000, 2, 0)]
    assert offsets(catalog, TS + 3000) == [(0, TS + 3000, 3, 4)]
    assert offsets(catalog, TS + 4000) == [(0, -1, -1, -1)]  # not readable by consumers yet
    assert offsets(catalog, TS + 4000, replica_id=5) == [(0, TS + 4000, 4, 4)]
    assert offsets(catalog, TS + 99_000) == [(0, -1, -1, -1)]
    assert offsets(catalog, -3, version=7, replica_id=5) == [(0, TS + 5000, 5, 4)]


def test_list_offsets_latest_for_read_committed_is_the_last_stable_offset(catalog) -> None:
    assert offsets(catalog, -1, tp=T1) == [(0, -1, 3, 0)]
    assert offsets(catalog, -1, tp=T1, isolation=1) == [(0, -1, 2, 0)]


def test_list_offsets_checks_the_partition_and_the_leader_epoch(catalog) -> None:
    missing = {TopicPartition("t", 7): OffsetQuery(-1)}
    assert offsets(catalog, missing)[0][0] == ErrorCode.unknown_topic_or_partition
    assert (
        offsets(catalog, {T0: OffsetQuery(-1, current_leader_epoch=3)})[0][0]
        == ErrorCode.fenced_leader_epoch
    )
    assert (
        offsets(catalog, {T0: OffsetQuery(-1, current_leader_epoch=5)})[0][0]
        == ErrorCode.unknown_leader_epoch
    )
    assert offsets(catalog, {T0: OffsetQuery(-1, current_leader_epoch=4)})[0][:3] == (0, -1, 4)


def test_list_offsets_v0_answers_lists_of_offsets(catalog) -> None:
    request = LegacyListOffsetsRequest(
        -1,
        (
            (
                "t",
                (
                    LegacyListOffsetsPartition(0, -1, 1),
                    LegacyListOffsetsPartition(0, -2, 1),
                    LegacyListOffsetsPartition(0, -1, 0),
                ),
            ),
            ("nope", (LegacyListOffsetsPartition(0, -1, 1),)),
        ),
    )
    answers = legacy_list_offsets(request, catalog, TransactionTracker(), now_ms=0)
    assert [(a.error_code, a.offsets) for _, parts in answers for a in parts] == [
        (0, (4,)),
        (0, (0,)),
        (0, ()),
        (ErrorCode.unknown_topic_or_partition, ()),
    ]


def test_offset_for_leader_epoch_gives_each_epochs_end(catalog) -> None:
    queries = {T0: (4, 0), T1: (-1, 0), TopicPartition("t", 9): (-1, 0)}
    request = offset_for_leader_epoch_request(4, queries, replica_id=7)
    body = offset_for_leader_epoch_response(4, request, catalog, now_ms=0)
    got = [
        (p.partition, p.error_code, p.leader_epoch, p.end_offset)
        for t in body.topics
        for p in t.partitions
    ]
    assert got == [(0, 0, 0, 3), (1, 0, 0, 3), (9, ErrorCode.unknown_topic_or_partition, -1, -1)]
    fenced = offset_for_leader_epoch_request(4, {T0: (2, 4)})
    [[p]] = [
        t.partitions for t in offset_for_leader_epoch_response(4, fenced, catalog, now_ms=0).topics
    ]
    assert p.error_code == ErrorCode.fenced_leader_epoch
    latest = offset_for_leader_epoch_request(2, {T0: (-1, 4)})
    [[p]] = [
        t.partitions for t in offset_for_leader_epoch_response(2, latest, catalog, now_ms=0).topics
    ]
    assert (p.leader_epoch, p.end_offset) == (4, 6)
