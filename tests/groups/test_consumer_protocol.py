"""The consumer protocol read as the coordinator reads it: version 0's fields from any version,
None for bytes that are not the protocol (including hostile lengths), never an exception."""

from __future__ import annotations

import importlib
import io
import struct

import pytest
from kio.serial import entity_writer

from replicad.groups.consumer_protocol import assigned_partitions, subscribed_topics
from replicad.types import TopicPartition


def encoded(schema: str, version: int, **values: object) -> bytes:
    module = importlib.import_module(f"kio.schema.{schema}.v{version}")
    cls = next(getattr(module, n) for n in module.__all__)
    buf = io.BytesIO()
    buf.write(struct.pack(">h", version))
    if schema == "consumer_protocol_assignment":
        part_cls = importlib.import_module(f"kio.schema.{schema}.v{version}.data").TopicPartition
        values["assigned_partitions"] = tuple(
            part_cls(topic=t, partitions=tuple(p)) for t, p in values.pop("assigned").items()
        )
    elif version >= 1:
        values.setdefault("owned_partitions", ())
    entity_writer(cls)(buf, cls(**values))
    return buf.getvalue()


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_every_version_reads_as_version_zero(version: int) -> None:
    sub = encoded("consumer_protocol_subscription", version, topics=("a", "b"), user_data=b"u")
    assert subscribed_topics(sub) == {"a", "b"}
    assignment = encoded("consumer_protocol_assignment", version, assigned={"a": [0, 2], "b": [1]})
    assert assigned_partitions(assignment) == (
        TopicPartition("a", 0),
        TopicPartition("a", 2),
        TopicPartition("b", 1),
    )


def test_empty_assignment_is_no_partitions() -> None:
    assert assigned_partitions(b"") == ()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00",
        b"\xff\xff\x00\x00\x00\x00",  # negative version
        b"\x00\x00\x7f\xff\xff\xff",  # 2^31-1 topics claimed in six bytes
        b"\x00\x00\x00\x00\x00\x01\x00\x09abc",  # a string longer than the bytes left
    ],
)
def test_bytes_that_are_not_the_protocol_read_as_unknown(data: bytes) -> None:
    assert subscribed_topics(data) is None
    if data:
        assert assigned_partitions(data) is None
