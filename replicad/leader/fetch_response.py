"""A FetchOutcome as the response frame the connection sends, any version.

Rules:
- Partitions go out in the outcome's order; consecutive partitions of one topic share a
  topic entry (a topic that comes back later starts a new one, as in Kafka's responses).
- v4+: the body is kio's encoding with each partition's records spliced in (frames.py);
  the records are a file region sent with sendfile (the client reads the on-disk format).
- v0-v3 (hand-written layout): the records are down-converted lazily (KIP-283) to magic 0
  (v0-v1) or magic 1 (v2-v3). For a consumer, a topic whose `message.downconversion.enable`
  is false (per topic, else the server's) answers every partition it has with
  UNSUPPORTED_VERSION, data or not (Kafka decides by the log's format, not by what was
  read); a partition whose first batch has no magic 0/1 form (ZSTD) answers
  UNSUPPORTED_COMPRESSION_TYPE. Followers are never refused a conversion.
- An error answer carries -1 for every offset and no records (Kafka's partitionResponse).
"""

from __future__ import annotations

import datetime
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from replicad.leader.fetch import FetchOutcome, Role
from replicad.leader.frames import (
    Part,
    ResponseFrame,
    records_token,
    region_reader,
    response_header_v0,
    splice_records,
)
from replicad.leader.legacy_codec import (
    LEGACY_FETCH_VERSIONS,
    LegacyFetchPartitionHead,
    encode_fetch_response,
)
from replicad.leader.reads import PartitionAnswer
from replicad.leader.settings import ServeSettings
from replicad.log.segment import FileRegion
from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import encode_response, response_type
from replicad.protocol.requests import make_entity
from replicad.records.batch import MAGIC_V0, MAGIC_V1
from replicad.records.downconvert import (
    ConversionRefused,
    LazyDownConversion,
    prepare_down_conversion,
)
from replicad.types import TopicPartition
from replicad.wire import FETCH_TOPIC_ID_VERSION, NO_PREFERRED_READ_REPLICA

FLEXIBLE_VERSION = 12
# Fetch v0-v1 clients read magic 0, v2-v3 magic 1.
MAGIC_0_MAX_VERSION = 1

Records = FileRegion | LazyDownConversion


def fetch_response_frame(
    outcome: FetchOutcome,
    *,
    version: int,
    correlation_id: int,
    settings: ServeSettings,
) -> ResponseFrame:
    if version in LEGACY_FETCH_VERSIONS:
        return _legacy_frame(outcome, version, correlation_id, settings)
    return _kio_frame(outcome, version, correlation_id)


# -- v4+ ------------------------------------------------------------------------------------


def _kio_frame(outcome: FetchOutcome, version: int, correlation_id: int) -> ResponseFrame:
    cls = response_type(ApiKey.FETCH, version)
    module = sys.modules[cls.__module__]
    by_id = version >= FETCH_TOPIC_ID_VERSION
    placements: list[tuple[bytes, Records]] = []
    topics = []
    for topic, topic_id, answers in _topic_runs(outcome.answers, outcome.topic_ids):
        partitions = []
        for a in answers:
            records: bytes = b""
            if a.records is not None and a.records.size > 0:
                records = records_token()
                placements.append((records, a.records))
            partitions.append(_partition_data(module, a, records))
        topics.append(
            make_entity(
                module.FetchableTopicResponse,
                topic=None if by_id else topic,
                topic_id=topic_id if by_id else None,
                partitions=tuple(partitions),
            )
        )
    body = make_entity(
        cls,
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode(outcome.error_code),
        session_id=outcome.session_id,
        responses=tuple(topics),
        node_endpoints=(),
    )
    encoded = encode_response(body, correlation_id)
    parts = splice_records(encoded, placements, flexible=version >= FLEXIBLE_VERSION)
    return ResponseFrame(parts)


def _partition_data(module: Any, a: PartitionAnswer, records: bytes) -> Any:
    values: dict[str, Any] = dict(
        partition_index=a.partition.partition,
        error_code=ErrorCode(a.error_code),
        high_watermark=a.high_watermark,
        last_stable_offset=a.last_stable_offset,
        log_start_offset=a.log_start_offset,
        aborted_transactions=(
            None
            if a.aborted is None
            else tuple(
                make_entity(
                    module.AbortedTransaction,
                    producer_id=t.producer_id,
                    first_offset=t.first_offset,
                )
                for t in a.aborted
            )
        ),
        preferred_read_replica=NO_PREFERRED_READ_REPLICA,
        records=records,
    )
    if a.diverging is not None and hasattr(module, "EpochEndOffset"):
        values["diverging_epoch"] = make_entity(
            module.EpochEndOffset, epoch=a.diverging.epoch, end_offset=a.diverging.end_offset
        )
    return make_entity(module.PartitionData, **values)


def _topic_runs(
    answers: Sequence[PartitionAnswer], topic_ids: Any
) -> Iterator[tuple[str, uuid.UUID | None, list[PartitionAnswer]]]:
    run: list[PartitionAnswer] = []
    for a in answers:
        if run and run[-1].partition.topic != a.partition.topic:
            yield _run(run, topic_ids)
            run = []
        run.append(a)
    if run:
        yield _run(run, topic_ids)


def _run(
    run: list[PartitionAnswer], topic_ids: Any
) -> tuple[str, uuid.UUID | None, list[PartitionAnswer]]:
    first: TopicPartition = run[0].partition
    return first.topic, topic_ids.get(first), run


# -- v0-v3 ------------------------------------------------------------------------------------


def _legacy_frame(
    outcome: FetchOutcome, version: int, correlation_id: int, settings: ServeSettings
) -> ResponseFrame:
    to_magic = MAGIC_V0 if version <= MAGIC_0_MAX_VERSION else MAGIC_V1
    converted = [
        _down_convert(a, to_magic, outcome.role, settings, region_reader) for a in outcome.answers
    ]
    records_of = {answer.partition: records for answer, records in converted}
    runs = []
    in_order: list[Records | None] = []
    for topic, _, answers in _topic_runs([answer for answer, _ in converted], {}):
        heads = []
        for a in answers:
            records = records_of[a.partition]
            size = records.size if records is not None else 0
            heads.append(
                LegacyFetchPartitionHead(
                    a.partition.partition, a.error_code, a.high_watermark, size
                )
            )
            in_order.append(records)
        runs.append((topic, heads))
    pieces = encode_fetch_response(version, runs)
    parts: list[Part] = []
    pending = response_header_v0(correlation_id)
    for head, records in zip(pieces.heads, in_order, strict=True):
        pending += head
        if records is not None and records.size > 0:
            parts += [pending, records]
            pending = b""
    parts.append(pending + pieces.tail)
    return ResponseFrame(tuple(p for p in parts if not isinstance(p, bytes) or p))


def _down_convert(
    answer: PartitionAnswer,
    to_magic: int,
    role: Role,
    settings: ServeSettings,
    reader: Callable[[FileRegion], Callable[[int, int], bytes]],
) -> tuple[PartitionAnswer, Records | None]:
    tp = answer.partition
    exists = answer.error_code != ErrorCode.unknown_topic_or_partition
    if exists and role is Role.CONSUMER and not settings.downconversion_enabled(tp.topic):
        return _error(answer, ErrorCode.unsupported_version), None
    region = answer.records
    if region is None or region.size == 0:
        return answer, None
    prepared = prepare_down_conversion(
        reader(region),
        region.size,
        to_magic=to_magic,
        first_offset=answer.fetch_offset,
        chunk_bytes=settings.downconversion_chunk_bytes,
    )
    if isinstance(prepared, ConversionRefused):
        return _error(answer, ErrorCode.unsupported_compression_type), None
    return answer, prepared


def _error(answer: PartitionAnswer, code: int) -> PartitionAnswer:
    return PartitionAnswer(answer.partition, answer.fetch_offset, error_code=code)
