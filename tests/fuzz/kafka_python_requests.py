"""Requests as kafka-python (a client no one here wrote) encodes them, for the tests that
damage real frames: serve's hostile-request test and the length-prefix fuzzer. Each asks
for some partitions of one topic, from offset 0, as a consumer; a field a version lacks
is left out by kafka-python."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.consumer.offsets import ListOffsetsRequest
from kafka.protocol.metadata.metadata import MetadataRequest


def encoded(request: Any, correlation_id: int, client_id: str) -> bytes:
    """`request` with its header, as it goes on the wire (without the size prefix)."""
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(header=True))


def fetch_request(
    topic: str,
    partitions: Sequence[int],
    version: int,
    *,
    partition_max_bytes: int,
    topic_id: uuid.UUID | None = None,
) -> Any:
    """A consumer's Fetch of `partitions` from offset 0, without a session, `max_bytes` the
    partitions' limits together."""
    fetched = [
        FetchRequest.FetchTopic.FetchPartition(
            partition=p,
            current_leader_epoch=-1,
            fetch_offset=0,
            last_fetched_epoch=-1,
            log_start_offset=-1,
            partition_max_bytes=partition_max_bytes,
        )
        for p in partitions
    ]
    return FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=partition_max_bytes * len(partitions),
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, topic_id=topic_id, partitions=fetched)],
        forgotten_topics_data=[],
        rack_id="",
        version=version,
    )


def metadata_request(topic: str, version: int) -> Any:
    """Metadata of `topic` alone, creating nothing."""
    return MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(topic_id=None, name=topic)],
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
        version=version,
    )


def list_offsets_request(topic: str, partitions: Sequence[int], version: int) -> Any:
    """The latest offset of each of `partitions` (read_uncommitted)."""
    topics = ListOffsetsRequest.ListOffsetsTopic
    asked = [
        topics.ListOffsetsPartition(
            partition_index=p, current_leader_epoch=-1, timestamp=-1, max_num_offsets=1
        )
        for p in partitions
    ]
    return ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=[topics(name=topic, partitions=asked)],
        timeout_ms=1000,
        version=version,
    )
