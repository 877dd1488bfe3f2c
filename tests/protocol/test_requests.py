"""The request builders (Metadata, ListOffsets, OffsetForLeaderEpoch) encode, and kio
reads back what we meant; Fetch's are in test_fetch_request.py."""

import pytest
from kio.schema.metadata.v12.request import MetadataRequest

from replicad.protocol.codec import decode_request, encode_request
from replicad.protocol.requests import (
    OffsetQuery,
    list_offsets_request,
    make_entity,
    metadata_request,
    offset_for_leader_epoch_request,
)
from replicad.types import TopicPartition

A0, B0 = TopicPartition("a", 0), TopicPartition("b", 0)


def _roundtrip(request):
    """What a broker reads of `request` (the whole frame, nothing left over)."""
    frame = encode_request(request, correlation_id=1, client_id="t")
    return decode_request(frame[4:], type(request)).body


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
