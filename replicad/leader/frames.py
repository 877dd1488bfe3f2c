"""Response frames of `replicad serve`: what the server adds to Kafka's framing.

Framing itself (size prefixes, request heads, kio behind the frame guard) is
replicad/protocol/codec.py, shared with the follower and the fault proxy. Here:

- A response frame is a list of parts sent in order: bytes, file regions (sent with
  sendfile) and lazy down-conversions (converted while sent). Its size prefix is the sum of
  the parts, known before the first byte goes out.
- A Fetch response is encoded by kio with a unique 16-byte token as each partition's records;
  the encoded bytes are then cut at each token and the records' length prefix rewritten
  for the real records -- so kio still writes every field, and no records are copied.
"""

from __future__ import annotations

import io
import os
import secrets
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kio.serial.writers import write_unsigned_varint
from kio.static.primitive import uvarint

from replicad.errors import LocalProtocolError
from replicad.log.segment import FileRegion
from replicad.protocol import codec
from replicad.protocol.codec import SIZE
from replicad.records.downconvert import LazyDownConversion

RECORDS_TOKEN_BYTES = 16
_I32 = struct.Struct(">i")

Part = bytes | FileRegion | LazyDownConversion


@dataclass(frozen=True, slots=True)
class ResponseFrame:
    """One response, as parts to send in order (see the module docstring)."""

    parts: tuple[Part, ...]

    @property
    def size(self) -> int:
        return sum(_part_size(p) for p in self.parts)

    def with_size_prefix(self) -> tuple[Part, ...]:
        return (SIZE.pack(self.size), *self.parts)


def _part_size(part: Part) -> int:
    if isinstance(part, bytes):
        return len(part)
    return part.size


def response_header_v0(correlation_id: int) -> bytes:
    """The header every non-flexible response (and every ApiVersions response) starts with."""
    return _I32.pack(correlation_id)


def encode_response(body: Any, correlation_id: int) -> ResponseFrame:
    """A kio response entity as one frame."""
    return ResponseFrame((codec.encode_response(body, correlation_id),))


def with_throttle_time(frame: ResponseFrame, position: int, throttle_ms: int) -> ResponseFrame:
    """`frame` with its throttle_time_ms (an int32 at byte `position` of its first part,
    where the response's first field is) set to `throttle_ms`."""
    first = frame.parts[0]
    if not isinstance(first, bytes) or len(first) < position + _I32.size:
        raise LocalProtocolError("throttle_time_ms is not in the response's first part")
    patched = first[:position] + _I32.pack(throttle_ms) + first[position + _I32.size :]
    return ResponseFrame((patched, *frame.parts[1:]))


def raw_response(header: bytes, body: bytes) -> ResponseFrame:
    return ResponseFrame((header + body,))


def records_token() -> bytes:
    """A placeholder for one partition's records while kio encodes the response."""
    return secrets.token_bytes(RECORDS_TOKEN_BYTES)


def splice_records(
    encoded: bytes,
    placements: Sequence[tuple[bytes, FileRegion | LazyDownConversion]],
    *,
    flexible: bool,
) -> tuple[Part, ...]:
    """Cut `encoded` at each token (in order) and put the real records there."""
    parts: list[Part] = []
    position = 0
    for token, records in placements:
        at = encoded.find(token, position)
        if at < 0:
            raise LocalProtocolError("records token missing from the encoded Fetch response")
        prefix_at, expected = (
            (at - 1, _uvarint(RECORDS_TOKEN_BYTES + 1))
            if flexible
            else (at - _I32.size, _I32.pack(RECORDS_TOKEN_BYTES))
        )
        if encoded[prefix_at:at] != expected:
            raise LocalProtocolError("records token found without its length prefix")
        size = records.size
        prefix = _uvarint(size + 1) if flexible else _I32.pack(size)
        parts.append(encoded[position:prefix_at] + prefix)
        parts.append(records)
        position = at + RECORDS_TOKEN_BYTES
    parts.append(encoded[position:])
    return tuple(p for p in parts if not isinstance(p, bytes) or p)


def _uvarint(value: int) -> bytes:
    buf = io.BytesIO()
    write_unsigned_varint(buf, uvarint(value))
    return buf.getvalue()


def region_reader(region: FileRegion) -> Callable[[int, int], bytes]:
    """`read_at(position, size)` over a file region, for lazy down-conversion. Each call
    opens the segment anew, so nothing stays open between chunks."""

    def read_at(position: int, size: int) -> bytes:
        fd = os.open(region.path, os.O_RDONLY)
        try:
            return os.pread(fd, size, region.position + position)
        finally:
            os.close(fd)

    return read_at
