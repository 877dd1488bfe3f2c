"""Every Fetch version replicad may negotiate encodes, and kio reads back what we meant."""

import uuid

import pytest
from kio.schema.metadata.v12.request import MetadataRequest

from replicad.errors import LocalProtocolError
from replicad.protocol.codec import decode_request, encode_request
from replicad.protocol.requests import (
    FetchPartitionSpec,
    FetchSpec,
    OffsetQuery,
    fetch_request,
    list_offsets_request,
    make_entity,
    metadata_request,
    offset_for_leader_epoch_request,
)
from replicad.types import TopicPartition

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
IDS = {"a": uuid.uuid4(), "b": uuid.uuid4()}
C_ID = uuid.uuid4()


def _spec(replica_id=-1, version=17):
    return FetchSpec(
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=10 << 20,
        isolation_level=0,
        session_id=77,
        session_epoch=3,
        partitions={
            A1: FetchPartitionSpec(
                10, 0, 1 << 20, current_leader_epoch=4, last_fetched_epoch=3, topic_id=IDS["a"]
            ),
            B0: FetchPartitionSpec(5, 2, 1 << 20, topic_id=IDS["b"]),
            A0: FetchPartitionSpec(0, 0, 1 << 20, topic_id=IDS["a"]),
        },
        forgotten=[TopicPartition("c", 9)] if version >= 7 else [],
        forgotten_ids=[(C_ID, 9)] if version >= 7 else [],
        replica_id=replica_id,
    )


def _roundtrip(request):
    """What a broker reads of `request` (the whole frame, nothing left over)."""
    frame = encode_request(request, correlation_id=1, client_id="t")
    return decode_request(frame[4:], type(request)).body


@pytest.mark.parametrize("version", range(4, 18))
def test_fetch_every_version(version):
    body = _roundtrip(fetch_request(version, _spec(version=version)))
    # request order is kept: a1, then b0, then a0 (a topic may appear twice)
    order = []
    for t in body.topics:
        name = t.topic if version < 13 else {v: k for k, v in IDS.items()}[t.topic_id]
        order += [(name, int(p.partition)) for p in t.partitions]
    assert order == [("a", 1), ("b", 0), ("a", 0)]
    first = body.topics[0].partitions[0]
    assert first.fetch_offset == 10
    if version >= 5:
        assert first.log_start_offset == 0
    if version >= 7:
        assert (body.session_id, body.session_epoch) == (77, 3)
        (forgotten,) = body.forgotten_topics_data
        assert tuple(forgotten.partitions) == (9,)
        if version >= 13:
            assert forgotten.topic_id == C_ID
        else:
            assert forgotten.topic == "c"
    if version >= 9:
        assert first.current_leader_epoch == 4
    if version >= 12:
        assert first.last_fetched_epoch == 3


@pytest.mark.parametrize("version", [14, 15, 17])
def test_fetch_replica_id_moves_to_replica_state(version):
    body = _roundtrip(fetch_request(version, _spec(replica_id=3)))
    if version >= 15:
        assert body.replica_state.replica_id == 3
    else:
        assert body.replica_id == 3


@pytest.mark.parametrize("version", [4, 9, 10, 12])
def test_metadata_named_and_all(version):
    assert _roundtrip(metadata_request(version, None)).topics is None
    named = _roundtrip(metadata_request(version, ["x", "y"]))
    assert [t.name for t in named.topics] == ["x", "y"]
    assert named.allow_auto_topic_creation is False


@pytest.mark.parametrize("version", [1, 4, 7, 9])
def test_list_offsets(version):
    body = _roundtrip(list_offsets_request(version, {A0: OffsetQuery(-2, 5), B0: OffsetQuery(-1)}))
    got = {
        (t.name, int(p.partition_index)): int(p.timestamp)
        for t in body.topics
        for p in t.partitions
    }
    assert got == {("a", 0): -2, ("b", 0): -1}


@pytest.mark.parametrize("version", [2, 3, 4])
def test_offset_for_leader_epoch(version):
    body = _roundtrip(offset_for_leader_epoch_request(version, {A0: (7, 5)}))
    p = body.topics[0].partitions[0]
    assert (p.current_leader_epoch, p.leader_epoch) == (7, 5)


def test_forgetting_without_sessions_is_our_bug():
    with pytest.raises(LocalProtocolError, match="no sessions"):
        fetch_request(6, _spec(version=17))


def test_topic_ids_are_required_from_v13():
    spec = FetchSpec(
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        partitions={A0: FetchPartitionSpec(0, 0, 1)},
    )
    assert _roundtrip(fetch_request(12, spec)).topics[0].topic == "a"
    with pytest.raises(LocalProtocolError, match="topic id"):
        fetch_request(13, spec)


def test_make_entity_drops_what_a_version_lacks() -> None:
    request = make_entity(
        MetadataRequest,
        topics=None,
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
        include_cluster_authorized_operations=True,  # v8-v10 only
    )
    assert isinstance(request, MetadataRequest)
    assert not hasattr(request, "include_cluster_authorized_operations")
    assert request.allow_auto_topic_creation is True
    assert encode_request(request, correlation_id=1, client_id="t")
