"""The one Fetch request model (replicad/protocol/fetch_request.py): every version replicad
may negotiate builds, kio reads back what we meant, and what serve reads of it is the
request again (by name up to v12, by topic id from v13)."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from replicad.errors import LocalProtocolError
from replicad.protocol.codec import decode_request, encode_request
from replicad.protocol.fetch_request import (
    FetchRequest,
    ForgottenPartition,
    RequestedPartition,
    fetch_request,
    read_fetch_request,
)
from replicad.types import TopicPartition
from replicad.wire import FETCH_TOPIC_ID_VERSION

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
IDS = {"a": uuid.uuid4(), "b": uuid.uuid4()}
C_ID = uuid.uuid4()


def _request(replica_id: int = -1, version: int = 17) -> FetchRequest:
    return FetchRequest(
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=10 << 20,
        isolation_level=1,
        session_id=77,
        session_epoch=3,
        partitions=(
            RequestedPartition.of(
                A1,
                10,
                1 << 20,
                topic_id=IDS["a"],
                log_start_offset=0,
                current_leader_epoch=4,
                last_fetched_epoch=3,
            ),
            RequestedPartition.of(B0, 5, 1 << 20, topic_id=IDS["b"], log_start_offset=2),
            RequestedPartition.of(A0, 0, 1 << 20, topic_id=IDS["a"], log_start_offset=0),
        ),
        forgotten=(ForgottenPartition("c", C_ID, 9),) if version >= 7 else (),
        replica_id=replica_id,
    )


def _roundtrip(request):
    """What a broker reads of `request` (the whole frame, nothing left over)."""
    frame = encode_request(request, correlation_id=1, client_id="t")
    return decode_request(frame[4:], type(request)).body


@pytest.mark.parametrize("version", range(4, 18))
def test_fetch_every_version(version):
    body = _roundtrip(fetch_request(version, _request(version=version)))
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


@pytest.mark.parametrize("version", range(7, 18))
def test_what_serve_reads_is_the_request_again(version):
    """Built, encoded, decoded and read: the same request, less what the version does not
    carry (the name from v13, the id before; epochs before v9 and v12)."""
    sent = _request(replica_id=3, version=version)
    got = read_fetch_request(version, _roundtrip(fetch_request(version, sent)))
    by_id = version >= FETCH_TOPIC_ID_VERSION

    def named(p):
        return dataclasses.replace(
            p, topic=None if by_id else p.topic, topic_id=p.topic_id if by_id else None
        )

    def as_written(p):
        return dataclasses.replace(
            named(p),
            current_leader_epoch=p.current_leader_epoch if version >= 9 else -1,
            last_fetched_epoch=p.last_fetched_epoch if version >= 12 else -1,
        )

    assert got.partitions == tuple(as_written(p) for p in sent.partitions)
    assert got.forgotten == tuple(named(f) for f in sent.forgotten)
    assert dataclasses.replace(got, partitions=(), forgotten=()) == dataclasses.replace(
        sent, partitions=(), forgotten=(), replica_epoch=-1
    )


@pytest.mark.parametrize("version", [4, 7, 9, 12, 13, 15, 17])
def test_every_version_reads_into_one_shape(version: int) -> None:
    got = read_fetch_request(version, _roundtrip(fetch_request(version, _request(3, version))))
    assert got.replica_id == 3
    assert (got.max_wait_ms, got.min_bytes, got.max_bytes, got.isolation_level) == (
        500,
        1,
        10 << 20,
        1,
    )
    assert [p.partition for p in got.partitions] == [1, 0, 0]
    if version >= 13:
        assert [p.topic_id for p in got.partitions] == [IDS["a"], IDS["b"], IDS["a"]]
        assert {p.topic for p in got.partitions} == {None}
        assert got.by_name() == {}
    else:
        assert [p.topic for p in got.partitions] == ["a", "b", "a"]
        assert list(got.by_name()) == [A1, B0, A0]
    assert (got.session_id, got.session_epoch) == ((77, 3) if version >= 7 else (0, -1))


@pytest.mark.parametrize("version", [14, 15, 17])
def test_fetch_replica_id_moves_to_replica_state(version):
    body = _roundtrip(fetch_request(version, _request(replica_id=3)))
    if version >= 15:
        assert body.replica_state.replica_id == 3
    else:
        assert body.replica_id == 3


def test_forgetting_without_sessions_is_our_bug():
    with pytest.raises(LocalProtocolError, match="no sessions"):
        fetch_request(6, _request(version=17))


def test_topic_ids_are_required_from_v13_and_names_before():
    named = FetchRequest(0, 1, 1, 0, 0, -1, (RequestedPartition.of(A0, 0, 1),))
    assert _roundtrip(fetch_request(12, named)).topics[0].topic == "a"
    with pytest.raises(LocalProtocolError, match="topic id"):
        fetch_request(13, named)
    by_id = dataclasses.replace(named, partitions=(RequestedPartition(None, C_ID, 0, 0, 1),))
    assert _roundtrip(fetch_request(13, by_id)).topics[0].topic_id == C_ID
    with pytest.raises(LocalProtocolError, match="topic name"):
        fetch_request(12, by_id)
