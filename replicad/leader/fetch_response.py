"""A FetchOutcome as the response frame the connection sends, any version.

Rules:
- Partitions go out in the outcome's order; consecutive partitions of one topic share a
  topic entry (a topic that comes back later starts a new one, as in Kafka's responses).
- v4+: the body is written field by field with kio's writers, in the order and with the
  fields kio's classes give for the version (`_BodyWriter`), with no kio entity per
  partition (200 of them cost a 200-partition Fetch several milliseconds); each partition's
  records are a file region sent as they are on disk. A partition's fixed fields (index,
  error, offsets) go out as one `struct` pack, and a partition with no aborted
  transactions and no diverging epoch (nearly all) as constant bytes for the rest: the
  layout every Fetch version so far has. A version whose partition fields are in another
  layout is refused (LocalProtocolError) when its writer is made: before serve answers a
  new Fetch version, the layout must be described here. kio's entity encoding of the same
  answer is the reference the tests hold this to, byte for byte, for every version serve
  answers.
- v0-v3 (hand-written layout): the records are down-converted lazily (KIP-283) to magic 0
  (v0-v1) or magic 1 (v2-v3). For a consumer, a topic whose `message.downconversion.enable`
  is false (per topic, else the server's) answers every partition it has with
  UNSUPPORTED_VERSION, data or not (Kafka decides by the log's format, not by what was
  read); a partition whose first batch has no magic 0/1 form (ZSTD) answers
  UNSUPPORTED_COMPRESSION_TYPE. Followers are never refused a conversion.
- An error answer carries -1 for every offset and no records (Kafka's partitionResponse).
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

from kio.schema.errors import ErrorCode
from kio.serial import entity_writer, writers

from replicad.errors import LocalProtocolError
from replicad.leader.fetch import FetchOutcome, Role
from replicad.leader.frames import (
    Part,
    ResponseFrame,
    region_reader,
    response_header_v0,
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
from replicad.protocol.codec import response_header, response_type
from replicad.records.batch import MAGIC_V0, MAGIC_V1
from replicad.records.downconvert import (
    ConversionRefused,
    LazyDownConversion,
    prepare_down_conversion,
)
from replicad.types import TopicPartition
from replicad.wire import NO_PREFERRED_READ_REPLICA

# PartitionData's tagged field for a diverging epoch (KIP-595).
DIVERGING_EPOCH_TAG = 0
ZERO_THROTTLE = datetime.timedelta(0)
# Fetch v0-v1 clients read magic 0, v2-v3 magic 1.
MAGIC_0_MAX_VERSION = 1
# The partition fields of every Fetch response version from v4 on, in order: a leading run
# of fixed-size fields (written as one struct), the aborted transactions, then (v11+) the
# preferred read replica and the records. Struct codes of the fixed-size ones.
_FIXED_FIELDS = {
    "partition_index": "i",
    "error_code": "h",
    "high_watermark": "q",
    "last_stable_offset": "q",
    "log_start_offset": "q",
}
_NULL_LEGACY_ARRAY = struct.pack(">i", -1)
_NULL_COMPACT_ARRAY = b"\x00"  # a compact nullable array's null: length + 1 = 0
_NO_PREFERRED_REPLICA = struct.pack(">i", NO_PREFERRED_READ_REPLICA)
_NO_TAGGED_FIELDS = b"\x00"
_FIXED_HEAD = ("partition_index", "error_code", "high_watermark", "last_stable_offset")
_KNOWN_TAILS = (
    ("aborted_transactions", "records"),
    ("aborted_transactions", "preferred_read_replica", "records"),
)

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
    body = _BodyWriter.of(cls)
    out = _Parts(response_header(cls, correlation_id))
    body.write(out, outcome)
    return ResponseFrame(out.finish())


class _Parts:
    """The frame's parts as they are written: bytes, then a partition's records, then bytes."""

    __slots__ = ("buffer", "parts")

    def __init__(self, head: bytes) -> None:
        self.parts: list[Part] = []
        self.buffer = io.BytesIO()
        self.buffer.write(head)

    def records(self, records: Records) -> None:
        self.parts.append(self.buffer.getvalue())
        self.parts.append(records)
        self.buffer = io.BytesIO()

    def finish(self) -> tuple[Part, ...]:
        self.parts.append(self.buffer.getvalue())
        return tuple(p for p in self.parts if not isinstance(p, bytes) or p)


class _BodyWriter:
    """A FetchResponse body of one version, written with kio's writers.

    Which fields a version has, and their order, come from kio's classes for it (the
    FetchResponse schema); how each is written is kio's writer for its type. Only the
    nested entities that are rare (an aborted transaction, a diverging epoch) are made as
    kio entities and written by kio's entity writer; a tagged field is written only when it
    differs from its default, as kio does."""

    __slots__ = (
        "aborted_entity",
        "diverging_default",
        "diverging_entity",
        "fixed",
        "flexible",
        "null_aborted",
        "preferred_replica",
        "top_fields",
        "topic_by_id",
        "with_log_start",
        "write_aborted",
        "write_diverging",
    )

    _cache: ClassVar[dict[type, _BodyWriter]] = {}

    def __init__(self, cls: type) -> None:
        module = sys.modules[cls.__module__]
        self.flexible: bool = cls.__flexible__  # type: ignore[attr-defined]
        self.top_fields = _untagged(cls)
        self.topic_by_id = "topic_id" in _untagged(module.FetchableTopicResponse)
        array = writers.compact_array_writer if self.flexible else writers.legacy_array_writer
        self.aborted_entity = getattr(module, "AbortedTransaction", None)
        self.write_aborted = (
            array(entity_writer(self.aborted_entity)) if self.aborted_entity is not None else None
        )
        tags = {f.name: f for f in dataclasses.fields(module.PartitionData) if _tag(f) is not None}
        diverging = tags.get("diverging_epoch")
        self.diverging_entity = module.EpochEndOffset if diverging is not None else None
        self.diverging_default = diverging.default if diverging is not None else None
        self.write_diverging = (
            entity_writer(module.EpochEndOffset) if diverging is not None else None
        )
        head, rest = _partition_layout(_untagged(module.PartitionData))
        self.fixed = struct.Struct(">" + "".join(_FIXED_FIELDS[f] for f in head))
        self.with_log_start = "log_start_offset" in head
        self.preferred_replica = "preferred_read_replica" in rest
        self.null_aborted = _NULL_COMPACT_ARRAY if self.flexible else _NULL_LEGACY_ARRAY

    @classmethod
    def of(cls, response_cls: type) -> _BodyWriter:
        found = cls._cache.get(response_cls)
        if found is None:
            found = cls._cache[response_cls] = cls(response_cls)
        return found

    def write(self, out: _Parts, outcome: FetchOutcome) -> None:
        buf = out.buffer
        for name in self.top_fields:
            if name == "throttle_time":
                writers.write_timedelta_i32(buf, ZERO_THROTTLE)
            elif name == "error_code":
                writers.write_error_code(buf, ErrorCode(outcome.error_code))
            elif name == "session_id":
                writers.write_int32(buf, outcome.session_id)
            elif name == "responses":
                runs = list(_topic_runs(outcome.answers, outcome.topic_ids))
                self._array_length(buf, len(runs))
                for topic, topic_id, answers in runs:
                    self._topic(out, topic, topic_id, answers)
                    buf = out.buffer
            else:
                raise LocalProtocolError(f"Fetch response field {name} is not written here")
        if self.flexible:
            writers.write_empty_tagged_fields(buf)  # node_endpoints: empty, the default

    def _array_length(self, buf: io.BytesIO, length: int) -> None:
        if self.flexible:
            writers.write_compact_array_length(buf, length)
        else:
            writers.write_legacy_array_length(buf, length)  # type: ignore[arg-type]

    def _topic(
        self,
        out: _Parts,
        topic: str,
        topic_id: uuid.UUID | None,
        answers: list[PartitionAnswer],
    ) -> None:
        buf = out.buffer
        if self.topic_by_id:
            writers.write_uuid(buf, topic_id)
        elif self.flexible:
            writers.write_compact_string(buf, topic)
        else:
            writers.write_legacy_string(buf, topic)
        self._array_length(buf, len(answers))
        for a in answers:
            self._partition(out, a)
        if self.flexible:
            writers.write_empty_tagged_fields(out.buffer)

    def _partition(self, out: _Parts, a: PartitionAnswer) -> None:
        """One partition in the known layout: one pack, constants, no kio call per field
        (the same bytes as kio's entity: tests/leader/test_fetch_response.py)."""
        buf = out.buffer
        if self.with_log_start:
            buf.write(
                self.fixed.pack(
                    a.partition.partition,
                    a.error_code,
                    a.high_watermark,
                    a.last_stable_offset,
                    a.log_start_offset,
                )
            )
        else:
            buf.write(
                self.fixed.pack(
                    a.partition.partition, a.error_code, a.high_watermark, a.last_stable_offset
                )
            )
        if a.aborted is None:
            buf.write(self.null_aborted)
        else:
            assert self.write_aborted is not None and self.aborted_entity is not None
            self.write_aborted(
                buf,
                tuple(
                    self.aborted_entity(producer_id=t.producer_id, first_offset=t.first_offset)
                    for t in a.aborted
                ),
            )
        if self.preferred_replica:
            buf.write(_NO_PREFERRED_REPLICA)
        records = a.records
        size = records.size if records is not None else 0
        if self.flexible:
            writers.write_unsigned_varint(buf, size + 1)  # type: ignore[arg-type]
        else:
            writers.write_int32(buf, size)  # type: ignore[arg-type]
        if size > 0:
            assert records is not None
            out.records(records)
            buf = out.buffer
        if self.flexible:
            if a.diverging is None:
                buf.write(_NO_TAGGED_FIELDS)
            else:
                self._partition_tags(buf, a)

    def _partition_tags(self, buf: io.BytesIO, a: PartitionAnswer) -> None:
        diverging = None
        if a.diverging is not None and self.diverging_entity is not None:
            diverging = self.diverging_entity(
                epoch=a.diverging.epoch, end_offset=a.diverging.end_offset
            )
            if diverging == self.diverging_default:
                diverging = None
        if diverging is None:
            writers.write_empty_tagged_fields(buf)
            return
        writers.write_unsigned_varint(buf, 1)  # type: ignore[arg-type]
        writers.write_tagged_field(buf, DIVERGING_EPOCH_TAG, self.write_diverging, diverging)  # type: ignore[arg-type]


def _partition_layout(fields: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A version's partition fields as (the leading fixed-size ones, the rest), when they are
    in the known layout (module constants); LocalProtocolError for any other."""
    lead = 0
    while lead < len(fields) and fields[lead] in _FIXED_FIELDS:
        lead += 1
    head, rest = fields[:lead], fields[lead:]
    if head not in (_FIXED_HEAD, (*_FIXED_HEAD, "log_start_offset")) or rest not in _KNOWN_TAILS:
        raise LocalProtocolError(
            f"Fetch response partition fields {', '.join(fields)}: not a layout written here"
        )
    return head, rest


def _untagged(cls: type) -> tuple[str, ...]:
    """The names of an entity's fields written in order (tagged fields go at the end)."""
    return tuple(f.name for f in dataclasses.fields(cls) if _tag(f) is None)


def _tag(f: dataclasses.Field[Any]) -> int | None:
    return f.metadata.get("tag")


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
