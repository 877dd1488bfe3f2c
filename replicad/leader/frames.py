"""Response frames of `replicad serve`: what the server adds to Kafka's framing.

Framing itself (size prefixes, request heads, kio behind the frame guard) is
replicad/protocol/codec.py, shared with the follower and the fault proxy. Here:

- A response frame is a list of parts sent in order: bytes, file regions (sent with
  sendfile) and lazy down-conversions (converted while sent). Its size prefix is the sum of
  the parts, known before the first byte goes out. (A Fetch response's parts are written
  by fetch_response.py: the bytes around each partition's records, then the records.)
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from replicad.errors import LocalProtocolError
from replicad.log.segment import FileRegion
from replicad.protocol import codec
from replicad.protocol.codec import SIZE
from replicad.records.downconvert import LazyDownConversion

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


def region_reader(region: FileRegion | bytes) -> Callable[[int, int], bytes]:
    """`read_at(position, size)` over a file region, for lazy down-conversion. Each call
    opens the segment anew, so nothing stays open between chunks. Records read from the
    archive's bucket (remote_fetch.py) are bytes already."""
    if isinstance(region, bytes):
        return lambda position, size: region[position : position + size]

    def read_at(position: int, size: int) -> bytes:
        fd = os.open(region.path, os.O_RDONLY)
        try:
            return os.pread(fd, size, region.position + position)
        finally:
            os.close(fd)

    return read_at
