"""Record batches (magic 2) and legacy message sets (magic 0/1), mutated and random:
scan_batches never raises and its batches tile the valid bytes; decode_batch and control
markers raise only CorruptRecordError; validate_fetched keeps only whole CRC-valid
batches moving forward (tools.chaos.fuzz_targets.record_batches)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tools.chaos.fuzz_targets import fuzz_inputs, seeds
from tools.chaos.strategies import bounded, mutated

BOUNDED = bounded(10)


def check(target: str, inputs: list[bytes]) -> None:
    """`inputs` through fuzz target `target`: no finding, neither unexpected nor known (a
    native abort once known is a failure now; see test_fetch_response)."""
    report = fuzz_inputs(target, inputs)
    assert not report.unexpected and not report.known, report.describe(inputs)


@pytest.mark.parametrize("target", ["record-batches", "legacy-messages"])
def test_every_seed_passes_cleanly(target: str) -> None:
    check(target, list(seeds(target)))


@BOUNDED
@given(st.lists(mutated("record-batches"), min_size=80, max_size=80))
def test_mutated_record_batches(inputs: list[bytes]) -> None:
    check("record-batches", inputs)


@BOUNDED
@given(st.lists(mutated("legacy-messages"), min_size=80, max_size=80))
def test_mutated_legacy_message_sets(inputs: list[bytes]) -> None:
    check("legacy-messages", inputs)


@BOUNDED
@given(st.lists(st.binary(max_size=400), min_size=80, max_size=80))
def test_random_bytes(inputs: list[bytes]) -> None:
    check("record-batches", inputs)
