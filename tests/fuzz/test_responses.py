"""Metadata, ListOffsets, OffsetForLeaderEpoch and ApiVersions responses, mutated and
generated: decoding raises only RemoteProtocolError, what the follower builds from them
(ClusterMetadata, topic selection, version negotiation) raises nothing."""

from __future__ import annotations

import warnings

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.chaos.fuzz_targets import RESPONSE_APIS, fuzz_inputs, seeds
from tools.chaos.strategies import mutated, other_responses

TARGET = "responses"
BOUNDED = settings(
    max_examples=8,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def check(inputs: list[bytes]) -> None:
    report = fuzz_inputs(TARGET, inputs)
    assert not report.unexpected, report.describe(inputs)
    if report.known:
        warnings.warn(f"{len(report.known)} inputs hit the known kio abort", stacklevel=2)


def test_every_seed_passes_cleanly() -> None:
    inputs = list(seeds(TARGET))
    report = fuzz_inputs(TARGET, inputs)
    assert report.unexpected == report.known == (), report.describe(inputs)
    assert len(inputs) == sum(len(versions) for _, versions in RESPONSE_APIS)


@BOUNDED
@given(st.lists(mutated(TARGET), min_size=60, max_size=60))
def test_mutated_responses(inputs: list[bytes]) -> None:
    check(inputs)


@settings(BOUNDED, max_examples=20)
@given(other_responses())
def test_generated_responses(data: bytes) -> None:
    check([data])
