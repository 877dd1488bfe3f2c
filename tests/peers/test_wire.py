"""tools/peers/wire.py: one raw Fetch, checked against the Kafka broker's own segment files."""

from __future__ import annotations

import pytest

from replicad.session.metadata import INITIAL_EPOCH
from replicad.wire import READ_COMMITTED, READ_UNCOMMITTED
from tools.peers.process import PeerError
from tools.peers.produce import produce_mixed, read_broker_batches
from tools.peers.wire import FRAME_SIZE, fetch_once, read_frame, request_frame

# Kafka's error codes that these tests expect by number.
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3


@pytest.fixture(scope="module")
def topic(kafka_broker) -> str:
    name = "wire-probe"
    kafka_broker.create_topic(name, 1)
    produce_mixed(kafka_broker.bootstrap, name, partitions=1, records=1200, seed=9)
    return name


def test_a_sessionless_fetch_returns_the_brokers_batch_bytes(kafka_broker, topic):
    answer = fetch_once(kafka_broker.bootstrap, topic, 0, 0, isolation_level=READ_UNCOMMITTED)
    assert (answer.error_code, answer.partition_error_code, answer.session_id) == (0, 0, 0)
    batches = answer.batches()
    assert len(batches) > 10
    end = batches[-1].last_offset + 1
    got = b"".join(b.raw for b in batches)
    assert got == read_broker_batches(kafka_broker.log_dir, topic, 0, end_offset=end)
    assert answer.high_watermark == answer.last_stable_offset
    assert answer.log_start_offset == 0


def test_a_partial_trailing_batch_is_left_out(kafka_broker, topic):
    whole = fetch_once(kafka_broker.bootstrap, topic, 0, 0).batches()
    # Room for the first batch and half of the second: Kafka sends the half too.
    cut = len(whole[0].raw) + len(whole[1].raw) // 2
    answer = fetch_once(kafka_broker.bootstrap, topic, 0, 0, max_bytes=cut)
    assert len(answer.records) > len(whole[0].raw)
    assert [b.raw for b in answer.batches()] == [whole[0].raw]


def test_kafka_opens_a_session_when_asked(kafka_broker, topic):
    answer = fetch_once(kafka_broker.bootstrap, topic, 0, 0, session_epoch=INITIAL_EPOCH)
    assert answer.error_code == 0
    assert answer.session_id != 0


def test_read_committed_lists_the_aborted_transactions(kafka_broker, topic):
    answer = fetch_once(kafka_broker.bootstrap, topic, 0, 0, isolation_level=READ_COMMITTED)
    assert answer.aborted_transactions
    assert all(a.producer_id >= 0 for a in answer.aborted_transactions)


def test_errors_come_back_as_codes(kafka_broker, topic):
    beyond = fetch_once(kafka_broker.bootstrap, topic, 0, 10**9)
    assert beyond.partition_error_code == OFFSET_OUT_OF_RANGE
    missing = fetch_once(kafka_broker.bootstrap, topic, 7, 0)
    assert missing.partition_error_code == UNKNOWN_TOPIC_OR_PARTITION


def test_nobody_listening_is_a_peer_error(free_port):
    with pytest.raises(PeerError, match=r"Fetch to 127\.0\.0\.1"):
        fetch_once(f"127.0.0.1:{free_port}", "t", 0, 0, timeout_s=2)


def test_a_frame_is_read_whole_across_short_reads() -> None:
    """read_frame gathers a frame that arrives a few bytes at a time; a peer closing inside
    one is a ConnectionError naming what was missing."""
    import socket
    import threading

    ours, theirs = socket.socketpair()
    with ours, theirs:
        frame = FRAME_SIZE.pack(300) + bytes(range(256)) + bytes(44)

        def trickle() -> None:
            for i in range(0, len(frame), 7):
                theirs.sendall(frame[i : i + 7])
            theirs.sendall(FRAME_SIZE.pack(10) + b"short")
            theirs.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=trickle)
        sender.start()
        assert read_frame(ours) == frame[FRAME_SIZE.size :]
        with pytest.raises(ConnectionError, match="5 of 10 bytes unread"):
            read_frame(ours)
        sender.join()


def test_a_request_frame_is_its_size_the_header_and_the_body() -> None:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.static.primitive import i16, i32

    from replicad.protocol.codec import decode_request

    request = ApiVersionsRequest(client_software_name="t", client_software_version="1")
    header = RequestHeader(
        request_api_key=i16(18), request_api_version=i16(3), correlation_id=i32(5), client_id="c"
    )
    frame = request_frame(header, request)
    (size,) = FRAME_SIZE.unpack_from(frame)
    assert size == len(frame) - FRAME_SIZE.size
    decoded = decode_request(frame[FRAME_SIZE.size :], ApiVersionsRequest)
    assert (decoded.head.correlation_id, decoded.body) == (5, request)
