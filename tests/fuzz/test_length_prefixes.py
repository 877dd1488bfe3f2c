"""Length prefixes corrupted in real frames: requests as kafka-python (a client no one here
wrote) encodes them, and the answers a real Kafka broker gives to those requests. Each
damaged frame goes through the decoder replicad runs on it -- `decode_request` for what
`replicad serve` receives, `decode_response` for what `replicad run` receives (and for
Fetch responses the follower's own scanner, scan_fetch_response, too) -- in a forked
child (tools.chaos.isolate), since the bug this pins (kio's native reader reserving memory
for a claimed count of 2^32 and aborting the process) cannot be caught in-process.

The rule: a damaged frame is decoded or refused as the peer's RemoteProtocolError;
nothing else escapes, and no child dies.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from kafka.protocol.consumer.offsets import OffsetForLeaderEpochRequest
from kafka.protocol.metadata.api_versions import ApiVersionsRequest

from replicad.errors import RemoteProtocolError
from replicad.follower.fetch_response import scan_fetch_response
from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import decode_request, decode_response, request_type, response_type
from replicad.protocol.frame_guard import check_message
from tests.fuzz.kafka_python_requests import (
    encoded,
    fetch_request,
    list_offsets_request,
    metadata_request,
)
from tools.chaos.isolate import Outcome, run_batch
from tools.chaos.scenarios import fill, new_topic
from tools.chaos.strategies import bounded
from tools.peers.wire import read_frame

pytestmark = pytest.mark.kafka

HUGE_VARINT = b"\xff\xff\xff\xff\x0f"  # 2^32 - 1 as an unsigned varint
HUGE_I32 = struct.pack(">i", 2**31 - 1)
HUGE_I16 = struct.pack(">h", 2**15 - 1)
SIZE = struct.Struct(">i")
CLIENT_ID = "kafka-python"
# The partitions each request asks for (the topic has two).
PARTITIONS = (0, 1)


@dataclass(frozen=True, slots=True)
class Sample:
    """One real frame (no size prefix) and the kio class replicad decodes it as."""

    name: str
    is_request: bool
    cls: type
    frame: bytes

    @property
    def types(self) -> tuple[type, type]:
        return (self.cls.__header_schema__, self.cls)


def kafka_python_requests(topic: str, topic_id: uuid.UUID) -> list[tuple[int, int, Any]]:
    """(api key, version, kafka-python request) for the APIs replicad's two sides decode,
    flexible versions and old ones (legacy i32/i16 lengths) alike."""
    et = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    ep = et.OffsetForLeaderPartition

    def fetch(version: int) -> Any:
        return fetch_request(
            topic, PARTITIONS, version, partition_max_bytes=1500, topic_id=topic_id
        )

    def epochs(version: int) -> Any:
        parts = [ep(partition=p, current_leader_epoch=-1, leader_epoch=0) for p in PARTITIONS]
        return OffsetForLeaderEpochRequest(
            replica_id=-2, topics=[et(topic=topic, partitions=parts)], version=version
        )

    return [
        (
            ApiKey.API_VERSIONS,
            3,
            ApiVersionsRequest(
                client_software_name="kafka-python", client_software_version="3", version=3
            ),
        ),
        (ApiKey.METADATA, 4, metadata_request(topic, 4)),
        (ApiKey.METADATA, 12, metadata_request(topic, 12)),
        (ApiKey.LIST_OFFSETS, 2, list_offsets_request(topic, PARTITIONS, 2)),
        (ApiKey.LIST_OFFSETS, 7, list_offsets_request(topic, PARTITIONS, 7)),
        (ApiKey.OFFSET_FOR_LEADER_EPOCH, 3, epochs(3)),
        (ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, epochs(4)),
        (ApiKey.FETCH, 11, fetch(11)),
        (ApiKey.FETCH, 12, fetch(12)),
        (ApiKey.FETCH, 16, fetch(16)),
    ]


def exchange(sock: socket.socket, frame: bytes) -> bytes:
    sock.sendall(SIZE.pack(len(frame)) + frame)
    return read_frame(sock)


@pytest.fixture(scope="module")
def samples(kafka_broker) -> list[Sample]:
    topic = new_topic(kafka_broker, "prefixes", 2)
    fill(kafka_broker, {topic: 2}, 60, seed=1300)
    found: list[Sample] = []
    with socket.create_connection(("127.0.0.1", kafka_broker.port), timeout=30) as sock:
        # The topic id, for Fetch v13+, from the broker's own Metadata answer.
        meta = encoded(metadata_request(topic, 12), 1, CLIENT_ID)
        body = decode_response(exchange(sock, meta), response_type(ApiKey.METADATA, 12)).body
        topic_id = body.topics[0].topic_id
        for i, (api, version, request) in enumerate(kafka_python_requests(topic, topic_id)):
            frame = encoded(request, 100 + i, CLIENT_ID)
            name = f"{ApiKey(api).name} v{version}"
            found.append(Sample(f"{name} request", True, request_type(api, version), frame))
            answer = exchange(sock, frame)
            found.append(Sample(f"{name} response", False, response_type(api, version), answer))
    return found


def decoder(samples: list[Sample]) -> Callable[[bytes], None]:
    """The fuzz target: first byte picks the sample (its class and side), the rest is the
    frame; only the peer's RemoteProtocolError may come out of replicad's decoder."""

    def run(data: bytes) -> None:
        sample = samples[data[0]]
        try:
            if sample.is_request:
                decode_request(data[1:], sample.cls)
            else:
                decode_response(data[1:], sample.cls)
        except RemoteProtocolError:
            pass
        if not sample.is_request and sample.cls.__api_key__ == ApiKey.FETCH:
            # The follower reads Fetch responses with its own scanner, not with kio.
            with contextlib.suppress(RemoteProtocolError):
                scan_fetch_response(memoryview(data[1:]), int(sample.cls.__version__))

    return run


def run_in_children(samples: list[Sample], inputs: list[bytes]) -> list[Outcome]:
    return run_batch(decoder(samples), inputs, timeout_s=60)


def describe(failures: list[Outcome], inputs: list[bytes], samples: list[Sample]) -> str:
    lines = []
    for outcome in failures[:5]:
        data = inputs[outcome.index]
        lines.append(
            f"{samples[data[0]].name}: {outcome.kind} (signal {outcome.signal_number}) "
            f"on {data[1:200].hex()}: {outcome.detail[-1500:]}"
        )
    return "\n".join(lines)


def test_the_real_frames_are_whole_to_the_guard_and_to_kio(samples) -> None:
    assert len(samples) == 20
    for sample in samples:
        verdict = check_message(sample.frame, *sample.types)
        assert verdict.complete and verdict.end == len(sample.frame), (sample.name, verdict)
        if sample.is_request:
            decode_request(sample.frame, sample.cls)
            continue
        body = decode_response(sample.frame, sample.cls).body
        if sample.cls.__api_key__ == ApiKey.FETCH:  # the broker's records are in the frame
            assert any(p.records for t in body.responses for p in t.partitions), sample.name


def test_a_huge_length_written_at_every_offset_of_every_frame(samples) -> None:
    """Exhaustive: at each offset, a 5-byte varint of 2^32 - 1 replaces one byte (a compact
    length), and a 2^31 - 1 i32 and a 2^15 - 1 i16 overwrite what is there (legacy
    array, bytes and string lengths)."""
    inputs = []
    for index, sample in enumerate(samples):
        frame = sample.frame
        for at in range(len(frame)):
            prefix = bytes([index]) + frame[:at]
            inputs.append(prefix + HUGE_VARINT + frame[at + 1 :])
            inputs.append(prefix + HUGE_I32 + frame[at + 4 :])
            inputs.append(prefix + HUGE_I16 + frame[at + 2 :])
    failures = run_in_children(samples, inputs)
    assert failures == [], describe(failures, inputs, samples)
    # Not vacuous: many of these claims are ones the guard had to refuse before kio.
    refused = sum(
        1 for data in inputs if check_message(data[1:], *samples[data[0]].types).implausible
    )
    assert refused > len(samples) * 10, refused


BOUNDED = bounded(12, HealthCheck.function_scoped_fixture)


@BOUNDED
@given(st.data())
def test_random_length_corruption_of_real_frames(samples, data: st.DataObject) -> None:
    """Several length-like values written into each of 40 frames: big or small, varint
    or fixed-width, over or inserted -- lengths that lie in both directions."""
    inputs = []
    for _ in range(40):
        index = data.draw(st.integers(0, len(samples) - 1))
        frame = bytearray(samples[index].frame)
        for _ in range(data.draw(st.integers(1, 3))):
            at = data.draw(st.integers(0, len(frame)))
            value = data.draw(
                st.one_of(
                    st.integers(0, 2**35 - 1).map(varint),
                    st.integers(-(2**31), 2**31 - 1).map(lambda n: struct.pack(">i", n)),
                    st.integers(-(2**15), 2**15 - 1).map(lambda n: struct.pack(">h", n)),
                )
            )
            width = 0 if data.draw(st.booleans()) else len(value)
            frame[at : at + width] = value
        inputs.append(bytes([index]) + bytes(frame))
    failures = run_in_children(samples, inputs)
    assert failures == [], describe(failures, inputs, samples)


def varint(value: int) -> bytes:
    """Unsigned varint up to 5 bytes (kio's limit), as Kafka writes them."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value and len(out) < 4:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
