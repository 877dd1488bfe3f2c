"""The proxy's frame helpers over kio-built frames of every version replicad speaks."""

from __future__ import annotations

import random
import zlib

import pytest
from crc32c import crc32c

from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import (
    RequestHead,
    decode_response,
    encode_request,
    peek_correlation_id,
    peek_request_head,
    response_type,
    with_size_prefix,
)
from replicad.protocol.fetch_request import FetchRequest, fetch_request
from replicad.records.batch import Compression, ScanStop, scan_batches
from tools.chaos.frames import (
    FrameError,
    fetch_batch_spans,
    flip_anywhere,
    flip_in_batch,
    rewrite_metadata,
    whole_batches,
)
from tools.chaos.proxy import ChaosProxy
from tools.chaos.wire_data import (
    BrokerEntry,
    PartitionAnswer,
    fetch_response_body,
    metadata_response_body,
)
from tools.logdata.batches import batch_stream, legacy_message_set

FETCH_VERSIONS = range(4, 18)
METADATA_VERSIONS = range(4, 13)


def _answers(version: int) -> list[PartitionAnswer]:
    a = b"".join(batch_stream(1, 3))
    b = b"".join(batch_stream(2, 2, first_offset=500, codecs=[Compression.LZ4]))
    return [
        PartitionAnswer("orders", 0, a, high_watermark=99),
        PartitionAnswer("orders", 1, None),
        PartitionAnswer("audit", 3, b + b[:40], high_watermark=600),  # ends in a partial batch
    ]


def test_request_head_reads_what_replicad_sends() -> None:
    request = fetch_request(
        12,
        FetchRequest(
            max_wait_ms=500,
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=0,
            session_id=0,
            session_epoch=0,
            partitions=(),
        ),
    )
    body = encode_request(request, correlation_id=77, client_id="replicad")[4:]
    head = peek_request_head(body)
    assert (head.api_key, head.api_version, head.correlation_id) == (ApiKey.FETCH, 12, 77)
    with pytest.raises(FrameError):
        peek_request_head(body[:7])


@pytest.mark.parametrize("version", METADATA_VERSIONS)
def test_metadata_rewrite_moves_only_the_named_broker(version: int) -> None:
    body = metadata_response_body(
        version,
        [BrokerEntry(1, "127.0.0.1", 9092), BrokerEntry(2, "10.0.0.2", 9092)],
        [("orders", 2)],
        correlation_id=41,
    )
    result = rewrite_metadata(body, version, {("127.0.0.1", 9092): ("127.0.0.1", 40001)})
    assert result.brokers_rewritten == 1
    assert peek_correlation_id(result.body) == 41
    decoded = decode_response(result.body, response_type(ApiKey.METADATA, version)).body
    hosts = {int(b.node_id): (b.host, int(b.port)) for b in decoded.brokers}
    assert hosts == {1: ("127.0.0.1", 40001), 2: ("10.0.0.2", 9092)}
    assert [t.name for t in decoded.topics] == ["orders"]
    assert len(decoded.topics[0].partitions) == 2


def test_metadata_without_the_broker_is_left_byte_for_byte() -> None:
    body = metadata_response_body(12, [BrokerEntry(1, "127.0.0.1", 9092)])
    result = rewrite_metadata(body, 12, {("127.0.0.1", 1): ("127.0.0.1", 2)})
    assert result.brokers_rewritten == 0
    assert result.body == body


def test_a_proxy_in_front_of_one_node_of_a_cluster_advertises_every_nodes_proxy() -> None:
    """One proxy per node: whichever node answers Metadata, every node is named at its own
    proxy, so no connection goes around the faults (the soak on a three-node cluster)."""
    nodes = {("127.0.0.1", 9001 + i): ("127.0.0.1", 40001 + i) for i in range(3)}
    proxy = ChaosProxy(("127.0.0.1", 9001), advertise=lambda: nodes)
    body = metadata_response_body(
        12, [BrokerEntry(1 + i, "127.0.0.1", 9001 + i) for i in range(3)], [("orders", 3)]
    )
    rewritten = proxy._rewrite_metadata(RequestHead(ApiKey.METADATA, 12, 1), body)
    decoded = decode_response(rewritten, response_type(ApiKey.METADATA, 12)).body
    assert {(b.host, int(b.port)) for b in decoded.brokers} == set(nodes.values())


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_batch_spans_are_the_whole_batches_of_every_partition(version: int) -> None:
    answers = _answers(version)
    body = fetch_response_body(version, answers, correlation_id=5)
    spans = fetch_batch_spans(body, version)
    # 3 + 2 whole batches; the partial tail of the last partition is not one.
    assert len(spans) == 5
    expected = [
        bytes(raw) for answer in (answers[0], answers[2]) for raw in _split(answer.records or b"")
    ]
    assert [body[s.start : s.end] for s in spans] == expected
    assert all(s.magic == 2 for s in spans)


def _split(records: bytes) -> list[bytes]:
    scan = scan_batches(records)
    return [records[b.position : b.end_position] for b in scan.batches]


def test_legacy_entries_are_found_with_their_own_checksum_start() -> None:
    data = legacy_message_set(10, [b"a", b"bb"], magic=1) + legacy_message_set(12, [b"c"], magic=0)
    spans = whole_batches(data)
    assert [s.magic for s in spans] == [1, 1, 0]
    assert all(s.checked_start == s.start + 16 for s in spans)


@pytest.mark.parametrize("seed", range(40))
def test_a_flip_in_a_batch_is_always_a_checksum_failure(seed: int) -> None:
    rng = random.Random(seed)
    version = rng.choice(list(FETCH_VERSIONS))
    body = fetch_response_body(version, _answers(version))
    spans = fetch_batch_spans(body, version)
    flip = flip_in_batch(body, rng.choice(spans), rng)
    assert flip.batch.checked_start <= flip.position < flip.batch.end
    assert len(flip.body) == len(body) and flip.body != body
    damaged = flip.body[flip.batch.start : flip.batch.end]
    scan = scan_batches(damaged)
    # The damaged batch fails its CRC (or a check before it), never passes.
    assert scan.stop is ScanStop.CORRUPT, scan
    # The frame still decodes: only the batch's bytes changed.
    decoded = decode_response(flip.body, response_type(ApiKey.FETCH, version)).body
    assert len(decoded.responses) == 2


def test_legacy_flip_breaks_the_crc32() -> None:
    data = legacy_message_set(10, [b"payload" * 10], magic=1)
    span = whole_batches(data)[0]
    flip = flip_in_batch(data, span, random.Random(3))
    entry = flip.body[span.start : span.end]
    assert zlib.crc32(entry[16:]) != int.from_bytes(entry[12:16], "big")


def test_flip_anywhere_keeps_the_correlation_id() -> None:
    body = fetch_response_body(12, _answers(12), correlation_id=9)
    for seed in range(20):
        flip = flip_anywhere(body, random.Random(seed))
        assert peek_correlation_id(flip.body) == 9
        assert flip.position >= 4


def test_crc32c_sanity_of_the_seed_batches() -> None:
    raw = batch_stream(7, 1)[0]
    assert crc32c(raw[21:]) == int.from_bytes(raw[17:21], "big")


def test_frame_prefix_and_undecodable_bodies() -> None:
    assert with_size_prefix(b"abc") == b"\x00\x00\x00\x03abc"
    with pytest.raises(FrameError):
        fetch_batch_spans(b"\x00\x00\x00\x01garbage", 12)
    with pytest.raises(FrameError):
        peek_correlation_id(b"\x00")
