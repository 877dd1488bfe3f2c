"""Kafka's checkpoint text format: round trips, strict rejection, atomic writes."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicad.errors import LogError
from replicad.log.checkpoint import (
    EpochEntry,
    format_epochs,
    format_offsets,
    format_partition_metadata,
    kafka_uuid,
    parse_epochs,
    parse_offsets,
    parse_partition_metadata,
    write_atomically,
)
from replicad.types import TopicPartition

topics = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=30)


@given(
    st.dictionaries(
        st.builds(TopicPartition, topics, st.integers(0, 10_000)),
        st.integers(0, 2**63 - 1),
        max_size=20,
    )
)
def test_offsets_round_trip(offsets: dict[TopicPartition, int]) -> None:
    assert parse_offsets(format_offsets(offsets), source="x") == offsets


def test_offsets_text_is_kafkas() -> None:
    text = format_offsets({TopicPartition("b", 1): 7, TopicPartition("a", 0): 1500})
    assert text == "0\n2\na 0 1500\nb 1 7\n"


def test_epochs_round_trip_and_text() -> None:
    entries = [EpochEntry(0, 0), EpochEntry(3, 120), EpochEntry(4, 500)]
    text = format_epochs(entries)
    assert text == "0\n3\n0 0\n3 120\n4 500\n"
    assert parse_epochs(text, source="x") == entries


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "fewer than 2 header lines"),
        ("1\n0\n", "unsupported checkpoint version '1'"),
        ("0\nx\n", "malformed entry count"),
        ("0\n2\nt 0 5\n", "expected 2 entries, found 1"),
        ("0\n1\nt 0 5\nt 1 6\n", "expected 1 entries, found 2"),
        ("0\n1\nt 0\n", "malformed line 3"),
        ("0\n1\nt zero 5\n", "malformed line 3"),
        ("0\n1\nt 0 -5\n", "malformed line 3"),
        ("0\n1\nt 0 5 9\n", "malformed line 3"),
        ("0\n2\nt 0 5\nt 0 6\n", "appears twice"),
    ],
)
def test_malformed_offsets_are_rejected_with_file_and_line(text: str, message: str) -> None:
    with pytest.raises(LogError, match=message) as info:
        parse_offsets(text, source="/d/recovery-point-offset-checkpoint")
    assert str(info.value).startswith("/d/recovery-point-offset-checkpoint: ")


@pytest.mark.parametrize("text", ["0\n2\n3 10\n2 20\n", "0\n2\n1 10\n2 5\n", "0\n1\n1\n"])
def test_malformed_epochs_are_rejected(text: str) -> None:
    with pytest.raises(LogError, match="leader-epoch-checkpoint"):
        parse_epochs(text, source="leader-epoch-checkpoint")


def test_partition_metadata_round_trip_in_kafka_uuid_form() -> None:
    topic_id = uuid.UUID("5f2b7a1c-0d4e-4c3b-9a8f-1e2d3c4b5a69")
    text = format_partition_metadata(topic_id)
    assert text == f"version: 0\ntopic_id: {kafka_uuid(topic_id)}\n"
    assert "=" not in kafka_uuid(topic_id) and len(kafka_uuid(topic_id)) == 22
    assert parse_partition_metadata(text, source="p") == topic_id
    with pytest.raises(LogError, match="unsupported version"):
        parse_partition_metadata("version: 9\ntopic_id: x\n", source="p")


def test_write_atomically_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "replication-offset-checkpoint"
    write_atomically(target, "old\n")
    write_atomically(target, "new\n")
    assert target.read_text() == "new\n"
    assert os.listdir(tmp_path) == ["replication-offset-checkpoint"]
