"""Record batches as a real producer writes them, with the offsets a broker assigns.

kafka-python's record builders (the code its producer sends with) make the bytes; the
broker's part is then done here as Kafka does it: the base offset and partition leader epoch
of a v2 batch are set in place (neither is covered by the CRC32C), a legacy wrapper gets the
offset of its last inner message (the offset is outside the CRC32 as well).
"""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Sequence

from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from replicad.records.batch import (
    CONTROL_FLAG_MASK,
    LEGACY_CRC_POSITION,
    LEGACY_CRC_START,
    MAGIC_V2,
    TIMESTAMP_TYPE_MASK,
    V1_TIMESTAMP_POSITION,
    V2_ATTRIBUTES_POSITION,
    V2_CRC_POSITION,
    V2_CRC_START,
    V2_LEADER_EPOCH_POSITION,
    V2_MAX_TIMESTAMP_POSITION,
    Compression,
)
from replicad.records.records import ControlType

_BASE_OFFSET = struct.Struct(">q")
_LEADER_EPOCH = struct.Struct(">i")
_UNLIMITED = 1 << 30
_TIMESTAMP = struct.Struct(">q")
_CRC = struct.Struct(">I")
_ATTRIBUTES = struct.Struct(">h")
# A control record's key (version, type) and a transaction marker's value (version,
# coordinator epoch): Kafka's ControlRecordType and EndTransactionMarker, version 0.
_CONTROL_KEY = struct.Struct(">hh")
_END_TXN_MARKER = struct.Struct(">hi")


def producer_batch(
    base_offset: int,
    values: Sequence[bytes | None],
    *,
    codec: Compression = Compression.NONE,
    leader_epoch: int = 0,
    timestamp_ms: int = 1_700_000_000_000,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[tuple[str, bytes | None]] = (),
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    timestamps: Sequence[int] | None = None,
    transactional: bool = False,
) -> bytes:
    """One magic 2 batch holding `values` at offsets base_offset, base_offset + 1, ...
    (`transactional`: in a transaction of `producer_id`)."""
    builder = DefaultRecordBatchBuilder(
        magic=MAGIC_V2,
        compression_type=int(codec),
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=_UNLIMITED,
    )
    for i, value in enumerate(values):
        key = keys[i] if keys is not None else None
        ts = timestamps[i] if timestamps is not None else timestamp_ms + i
        if builder.append(i, ts, key, value, list(headers)) is None:
            raise ValueError("kafka-python's builder refused a record")
    data = bytearray(builder.build())
    _BASE_OFFSET.pack_into(data, 0, base_offset)
    _LEADER_EPOCH.pack_into(data, V2_LEADER_EPOCH_POSITION, leader_epoch)
    return bytes(data)


def control_batch(
    offset: int,
    *,
    producer_id: int,
    control_type: ControlType = ControlType.COMMIT,
    producer_epoch: int = 0,
    coordinator_epoch: int = 0,
    leader_epoch: int = 0,
    timestamp_ms: int = 1_700_000_000_000,
) -> bytes:
    """The COMMIT or ABORT marker a transaction coordinator writes at `offset` for
    `producer_id`: a transactional control batch of one record and no sequence.
    kafka-python builds no control batch: the flag is set here, then the CRC32C it is under."""
    key = _CONTROL_KEY.pack(0, control_type)
    value = _END_TXN_MARKER.pack(0, coordinator_epoch)
    data = bytearray(
        producer_batch(
            offset,
            [value],
            keys=[key],
            leader_epoch=leader_epoch,
            timestamp_ms=timestamp_ms,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            transactional=True,
        )
    )
    (attributes,) = _ATTRIBUTES.unpack_from(data, V2_ATTRIBUTES_POSITION)
    _ATTRIBUTES.pack_into(data, V2_ATTRIBUTES_POSITION, attributes | CONTROL_FLAG_MASK)
    _CRC.pack_into(data, V2_CRC_POSITION, crc32c(bytes(data[V2_CRC_START:])))
    return bytes(data)


def log_append_time(raw: bytes, append_ms: int) -> bytes:
    """A magic 2 batch as a broker with message.timestamp.type=LogAppendTime stores it: the
    type bit set and the max timestamp replaced (record deltas untouched), the CRC32C
    recomputed."""
    data = bytearray(raw)
    (attributes,) = _ATTRIBUTES.unpack_from(data, V2_ATTRIBUTES_POSITION)
    _ATTRIBUTES.pack_into(data, V2_ATTRIBUTES_POSITION, attributes | TIMESTAMP_TYPE_MASK)
    _TIMESTAMP.pack_into(data, V2_MAX_TIMESTAMP_POSITION, append_ms)
    _CRC.pack_into(data, V2_CRC_POSITION, crc32c(bytes(data[V2_CRC_START:])))
    return bytes(data)


def legacy_message_set(
    base_offset: int,
    values: Sequence[bytes | None],
    *,
    magic: int,
    codec: Compression = Compression.NONE,
    timestamp_ms: int = 1_700_000_000_000,
) -> bytes:
    """Magic 0/1 messages at base_offset...; compressed ones in one wrapper, as a broker stores."""
    builder = LegacyRecordBatchBuilder(
        magic=magic, compression_type=int(codec), batch_size=_UNLIMITED
    )
    relative = magic >= 1 and codec != Compression.NONE
    for i, value in enumerate(values):
        offset = i if relative else base_offset + i
        if builder.append(offset, timestamp_ms + i, None, value) is None:
            raise ValueError("kafka-python's builder refused a message")
    data = bytearray(builder.build())
    if codec != Compression.NONE:
        _BASE_OFFSET.pack_into(data, 0, base_offset + len(values) - 1)
        if magic >= 1:
            # A broker gives a magic 1 wrapper the max timestamp of its messages (the client
            # leaves it 0); the timestamp is under the CRC32, so that is recomputed.
            _TIMESTAMP.pack_into(data, V1_TIMESTAMP_POSITION, timestamp_ms + len(values) - 1)
            crc = zlib.crc32(bytes(data[LEGACY_CRC_START:]))
            _CRC.pack_into(data, LEGACY_CRC_POSITION, crc)
    return bytes(data)


def batch_stream(
    seed: int,
    count: int,
    *,
    first_offset: int = 0,
    codecs: Sequence[Compression] = tuple(Compression),
    max_records: int = 20,
    max_value: int = 600,
    epoch_every: int = 50,
    gap_every: int = 0,
    timestamp_ms: int = 1_700_000_000_000,
) -> list[bytes]:
    """`count` real producer batches with consecutive offsets (or a gap every `gap_every`).

    Deterministic for a seed: values are pseudo-random text (compressible, like real data),
    codecs rotate through `codecs`, the leader epoch grows every `epoch_every` batches and
    timestamps mostly grow, sometimes step back (as producers' clocks do).
    """
    rng = random.Random(seed)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"kafka", b"replica", b"offset", b"42"]
    out = []
    offset = first_offset
    ts = timestamp_ms
    for i in range(count):
        n = rng.randint(1, max_records)
        values = [
            b" ".join(rng.choice(words) for _ in range(rng.randint(1, max(max_value // 6, 1))))
            for _ in range(n)
        ]
        ts += rng.randint(-50, 200)
        out.append(
            producer_batch(
                offset,
                values,
                codec=codecs[i % len(codecs)],
                leader_epoch=i // epoch_every,
                timestamps=[ts + j for j in range(n)],
                keys=[f"k{offset + j}".encode() for j in range(n)],
            )
        )
        offset += n
        if gap_every and i % gap_every == gap_every - 1:
            offset += rng.randint(1, 100)
    return out
