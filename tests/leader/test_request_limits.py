"""request_limits: how large a frame, and how many elements a request, the replica's size
makes plausible."""

from __future__ import annotations

import datetime

from kio.schema.fetch.v4.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.static.primitive import i8, i32, i32Timedelta, i64

from replicad.leader.legacy_codec import LegacyListOffsetsPartition, LegacyListOffsetsRequest
from replicad.leader.request_limits import (
    MIB,
    count_elements,
    plausible_elements,
    plausible_frame_bytes,
)


def fetch(topics: int, partitions: int) -> FetchRequest:
    return FetchRequest(
        replica_id=i32(-1),
        max_wait=i32Timedelta.parse(datetime.timedelta(0)),
        min_bytes=i32(1),
        max_bytes=i32(1 << 20),
        isolation_level=i8(0),
        topics=tuple(
            FetchTopic(
                topic=f"t{t}",
                partitions=tuple(
                    FetchPartition(
                        partition=i32(p), fetch_offset=i64(0), partition_max_bytes=i32(1)
                    )
                    for p in range(partitions)
                ),
            )
            for t in range(topics)
        ),
    )


def test_the_frame_bound_grows_with_the_replica_and_never_passes_the_request_limit() -> None:
    assert plausible_frame_bytes(0, 100 * MIB) == MIB
    assert plausible_frame_bytes(4096, 100 * MIB) == 2 * MIB
    assert plausible_frame_bytes(10**9, 100 * MIB) == 100 * MIB
    assert plausible_frame_bytes(0, 1000) == 1000


def test_every_element_of_every_array_is_counted() -> None:
    counted = count_elements(fetch(3, 5), limit=100)
    assert counted.elements == 3 + 15 and counted.plausible
    assert not count_elements(fetch(3, 5), limit=17).plausible


def test_counting_stops_past_the_limit() -> None:
    counted = count_elements(fetch(1, 50_000), limit=plausible_elements(10))
    assert not counted.plausible
    assert counted.elements == 50_001  # the partitions array was not walked into


def test_metadata_topics_and_legacy_tuples_count_too() -> None:
    request = MetadataRequest(
        topics=tuple(MetadataRequestTopic(topic_id=None, name=f"t{i}") for i in range(7)),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    assert count_elements(request, 100).elements == 7
    every_topic = MetadataRequest(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    assert count_elements(every_topic, 100).elements == 0
    legacy = LegacyListOffsetsRequest(
        replica_id=-1,
        topics=(("t", (LegacyListOffsetsPartition(0, -1, 1),) * 4),),
    )
    assert count_elements(legacy, 100).elements == 1 + 2 + 4
