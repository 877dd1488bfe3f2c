"""Fetch responses, mutated and generated, through the follower's path: decode, session
handler, validate_fetched. Only RemoteProtocolError may come out of decoding, nothing out
of the rest, and nothing corrupt is ever kept (tools.chaos.fuzz_targets.fetch_response).

Every input runs in a forked child (tools.chaos.isolate): kio's native decoder can abort
the process, which is a finding, not the end of the run. The frame guard
(replicad.protocol.frame_guard) keeps the one abort found here (a huge array length) from
reaching kio, so a native abort -- the once "known" finding included -- fails these tests.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.test_record_batches import check
from tools.chaos.fuzz_targets import FETCH_VERSIONS, fetch_response, seeds
from tools.chaos.strategies import bounded, fetch_responses, mutated
from tools.chaos.wire_data import PartitionAnswer, fetch_response_body, fetch_response_claiming

TARGET = "fetch-response"
BOUNDED = bounded(8)


def test_every_seed_passes_cleanly() -> None:
    check(TARGET, list(seeds(TARGET)))
    assert len(seeds(TARGET)) == 2 * len(FETCH_VERSIONS)


@BOUNDED
@given(st.lists(mutated(TARGET), min_size=60, max_size=60))
def test_mutated_fetch_responses(inputs: list[bytes]) -> None:
    check(TARGET, inputs)


@settings(BOUNDED, max_examples=15)
@given(fetch_responses())
def test_generated_fetch_responses(data: bytes) -> None:
    check(TARGET, [data])


@BOUNDED
@given(st.lists(st.binary(max_size=300), min_size=60, max_size=60))
def test_random_bytes(inputs: list[bytes]) -> None:
    check(TARGET, inputs)


# A 40-byte Fetch v12 response: one topic, one partition whose aborted_transactions
# compact array claims 2^32 - 1 entries. Kafka's own readers cap such lengths by the bytes
# left; kio's native reader reserves count * 8 bytes first and Rust aborts the process
# ('memory allocation of 34359738360 bytes failed') -- unless the frame guard refuses the
# frame first, which is what this pins.
HUGE_ARRAY_RESPONSE = fetch_response_claiming(12, 2**32 - 1, correlation_id=1, topic="orders")

DECODE_IN_A_CHILD = """
import sys
from replicad.errors import RemoteProtocolError
from replicad.protocol.codec import decode_response, response_type
try:
    decode_response(bytes.fromhex(sys.argv[1]), response_type(1, int(sys.argv[2])))
except RemoteProtocolError as exc:
    print("RemoteProtocolError:", exc)
"""


def decode_in_a_child(frame: bytes, version: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", DECODE_IN_A_CHILD, frame.hex(), str(version)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_huge_array_length_in_a_response_is_an_error() -> None:
    done = decode_in_a_child(HUGE_ARRAY_RESPONSE, 12)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-500:]}"
    assert done.stdout.startswith("RemoteProtocolError"), done.stdout
    assert "implausible length" in done.stdout, done.stdout


@pytest.mark.parametrize("version", [12, 13, 16, 17])
def test_a_huge_aborted_transactions_count_in_a_whole_response_is_an_error(version: int) -> None:
    """The same claim in a frame that is whole past it (the partition's other fields, the
    records, the tags all there): only the count itself is a lie."""
    body = fetch_response_body(version, [PartitionAnswer("orders", p, b"r" * 64) for p in range(3)])
    # aborted_transactions of the last partition: after its 30 bytes of fixed fields.
    at = body.rindex(b"\x00\x00\x00\x02" + b"\x00\x00") + 4 + 2 + 3 * 8
    assert body[at] == 1  # an empty compact array
    hostile = body[:at] + b"\xff\xff\xff\xff\x0f" + body[at + 1 :]
    done = decode_in_a_child(hostile, version)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-500:]}"
    assert "partitions[2].aborted_transactions" in done.stdout, done.stdout


def test_a_null_topic_array_is_a_protocol_error() -> None:
    body = fetch_response_body(17, [])
    assert body.endswith(b"\x01\x00")  # an empty compact array, then the tag section
    null_topics = body[:-2] + b"\x00" + body[-1:]
    fetch_response(bytes([FETCH_VERSIONS.index(17)]) + null_topics)  # in-process
