"""ChaosProxy in front of a real Apache Kafka broker, driven by raw kio clients."""

from __future__ import annotations

import socket

import pytest

from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import decode_response, encode_request, response_type
from replicad.protocol.requests import metadata_request
from replicad.records.batch import ScanStop, scan_batches
from tools.chaos.proxy import ChaosProxy, wait_for_delivery
from tools.peers.process import PeerError
from tools.peers.produce import CheckedProducer
from tools.peers.wire import fetch_once, read_frame

pytestmark = pytest.mark.kafka

METADATA_VERSION = 12


@pytest.fixture
def topic(kafka_broker, unique_topic) -> str:
    kafka_broker.create_topic(unique_topic, 1)
    producer = CheckedProducer({"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 0})
    for i in range(30):
        producer.produce(unique_topic, value=b"record-%d" % i * 20, partition=0)
        producer.flush(10)  # one batch per record: many whole batches to damage
    return unique_topic


@pytest.fixture
def proxy(kafka_broker):
    with ChaosProxy(("127.0.0.1", kafka_broker.port), seed=7) as p:
        yield p


def _roundtrip(sock: socket.socket, request, correlation_id: int = 1):
    sock.sendall(encode_request(request, correlation_id=correlation_id, client_id="t"))
    return read_frame(sock)


def _metadata(address: str, topic: str):
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        body = _roundtrip(sock, metadata_request(METADATA_VERSION, [topic]))
    return decode_response(body, response_type(ApiKey.METADATA, METADATA_VERSION)).body


def test_metadata_through_the_proxy_names_the_proxy(proxy, kafka_broker, topic) -> None:
    direct = _metadata(kafka_broker.bootstrap, topic)
    proxied = _metadata(proxy.address, topic)
    assert [(b.host, int(b.port)) for b in direct.brokers] == [("127.0.0.1", kafka_broker.port)]
    assert [(b.host, int(b.port)) for b in proxied.brokers] == [("127.0.0.1", proxy.port)]
    assert proxied.topics == direct.topics
    assert proxy.stats().metadata_rewrites == 1


def test_fetch_passes_unchanged_without_faults(proxy, kafka_broker, topic) -> None:
    direct = fetch_once(kafka_broker.bootstrap, topic, 0, 0)
    proxied = fetch_once(proxy.address, topic, 0, 0)
    assert proxied.records == direct.records
    assert len(direct.batches()) == 30
    stats = proxy.stats()
    assert stats.faults == 0 and stats.requests == stats.responses == 1


def test_flipped_batch_fails_its_checksum(proxy, topic) -> None:
    proxy.flip_batches(1)
    damaged = fetch_once(proxy.address, topic, 0, 0)
    clean = fetch_once(proxy.address, topic, 0, 0)
    assert wait_for_delivery(proxy, timeout_s=60)
    assert proxy.stats().flipped_batches == 1
    assert len(damaged.records) == len(clean.records)
    pairs = zip(damaged.records, clean.records, strict=True)
    differing = [i for i, (a, b) in enumerate(pairs) if a != b]
    assert len(differing) == 1
    scan = scan_batches(damaged.records)
    assert scan.stop is ScanStop.CORRUPT and "CRC32C mismatch" in (scan.error or "")
    assert scan_batches(clean.records).stop is ScanStop.END


def test_truncated_and_closed(proxy, topic) -> None:
    proxy.truncate_responses(1, close=True)
    with pytest.raises(PeerError, match="closed"):
        fetch_once(proxy.address, topic, 0, 0)
    assert proxy.stats().truncated_closed == 1
    assert fetch_once(proxy.address, topic, 0, 0).records  # next connection is clean


def test_truncated_short_frame_does_not_decode(proxy, topic) -> None:
    proxy.truncate_responses(1, close=False)
    with pytest.raises(PeerError, match="undecodable"):
        fetch_once(proxy.address, topic, 0, 0)
    assert proxy.stats().truncated_short == 1


def test_cut_closes_open_connections(proxy, topic) -> None:
    host, _, port = proxy.address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        _roundtrip(sock, metadata_request(METADATA_VERSION, [topic]))
        assert proxy.cut() == 1
        sock.settimeout(5)
        assert sock.recv(1) == b""
    assert proxy.stats().cuts == 1


# Held means "not answered while the client waits": a client that gives up after a second
# sees nothing from a stall or a delay far longer than the test, which a busy machine can
# only make more certain. How long a stall or a delay of a given length holds a response
# is the proxy's asyncio clock, not something the suite times.
HELD_FOR_GOOD_S = 3600


def test_a_stall_holds_responses(proxy, topic) -> None:
    proxy.stall(HELD_FOR_GOOD_S)
    with pytest.raises(PeerError, match="timed out"):
        fetch_once(proxy.address, topic, 0, 0, timeout_s=1)
    assert proxy.stats().stalls == 1


def test_a_delay_holds_each_response_until_healed(proxy, topic) -> None:
    proxy.set_delay_ms(50)
    assert fetch_once(proxy.address, topic, 0, 0).records
    assert proxy.stats().delayed_responses == 1  # it went the delayed way
    proxy.set_delay_ms(HELD_FOR_GOOD_S * 1000)
    with pytest.raises(PeerError, match="timed out"):
        fetch_once(proxy.address, topic, 0, 0, timeout_s=1)
    proxy.heal()
    assert fetch_once(proxy.address, topic, 0, 0).records  # a new connection, no delay
    assert proxy.stats().delayed_responses == 1


def test_refused_connections_look_like_a_dead_broker(proxy, topic) -> None:
    proxy.refuse_connections(True)
    with pytest.raises(PeerError):
        fetch_once(proxy.address, topic, 0, 0)
    proxy.refuse_connections(False)
    assert fetch_once(proxy.address, topic, 0, 0).records
    assert proxy.stats().refused_connections == 1


def test_upstream_down_closes_the_client(free_port) -> None:
    with ChaosProxy(("127.0.0.1", free_port)) as proxy, pytest.raises(PeerError):
        fetch_once(proxy.address, "t", 0, 0, timeout_s=5)
