"""Metadata, ListOffsets, OffsetForLeaderEpoch and ApiVersions responses, mutated and
generated: decoding raises only RemoteProtocolError, what the follower builds from them
(ClusterMetadata, topic selection, version negotiation) raises nothing."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.errors import RemoteProtocolError
from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import decode_response, response_type
from tests.fuzz.test_record_batches import check
from tools.chaos.fuzz_targets import RESPONSE_APIS, responses, seeds
from tools.chaos.strategies import bounded, mutated, other_responses
from tools.chaos.wire_data import metadata_response_body, metadata_with_null_brokers

TARGET = "responses"
BOUNDED = bounded(8)


def test_every_seed_passes_cleanly() -> None:
    # No native abort is "known" any more: the frame guard refuses huge lengths first.
    inputs = list(seeds(TARGET))
    check(TARGET, inputs)
    assert len(inputs) == sum(len(versions) for _, versions in RESPONSE_APIS)


@BOUNDED
@given(st.lists(mutated(TARGET), min_size=60, max_size=60))
def test_mutated_responses(inputs: list[bytes]) -> None:
    check(TARGET, inputs)


@settings(BOUNDED, max_examples=20)
@given(other_responses())
def test_generated_responses(data: bytes) -> None:
    check(TARGET, [data])


def _null_array_inputs() -> dict[str, bytes]:
    """Well-formed responses with one non-nullable compact array sent as null (length 0)."""
    metadata_index = [api for api, _ in RESPONSE_APIS].index(ApiKey.METADATA)
    versions_index = [api for api, _ in RESPONSE_APIS].index(ApiKey.API_VERSIONS)
    metadata = metadata_response_body(12, [], [("orders", 1)])
    # ApiVersions v3: correlation id, error code, then api_keys (compact array).
    api_versions = struct.pack(">ih", 1, 0) + b"\x00" + struct.pack(">i", 0) + b"\x00"
    return {
        "metadata brokers": bytes([metadata_index, 8]) + metadata_with_null_brokers(metadata, 12),
        "api_versions keys": bytes([versions_index, 3]) + api_versions,
    }


@pytest.mark.parametrize(
    ("case", "field"), [("metadata brokers", "brokers"), ("api_versions keys", "api_keys")]
)
def test_null_arrays_are_protocol_errors(case: str, field: str) -> None:
    """A non-nullable array sent as null is the peer's protocol error, named, not a
    TypeError later; the fuzz target (what the follower builds from it) takes it too."""
    data = _null_array_inputs()[case]
    api, versions = RESPONSE_APIS[data[0] % len(RESPONSE_APIS)]
    version = versions[data[1] % len(versions)]
    with pytest.raises(RemoteProtocolError, match=f"{field} is null"):
        decode_response(data[2:], response_type(api, version))
    responses(data)
