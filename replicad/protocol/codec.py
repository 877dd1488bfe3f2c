"""Request/response framing over kio's generated message types.

Every message body is encoded and decoded by kio; this module adds only what
kio leaves to the caller: the 4-byte size prefix, the request header, and the
pairing of a response with the schema of the request that caused it.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from replicad.errors import RemoteProtocolError

SIZE = struct.Struct(">i")
CORRELATION = struct.Struct(">i")
# A frame larger than this is not a Kafka response we asked for: it is garbage
# (or another protocol, e.g. TLS or HTTP, on the port).
MAX_FRAME_BYTES = 1 << 30


@cache
def request_type(api_key: int, version: int) -> type:
    return load_request_schema(api_key, version)


@cache
def response_type(api_key: int, version: int) -> type:
    return load_response_schema(api_key, version)


@cache
def _writer(cls: type) -> Any:
    return entity_writer(cls)


@cache
def _reader(cls: type) -> Any:
    return entity_reader(cls)


def encode_request(request: Any, *, correlation_id: int, client_id: str | None) -> bytes:
    """A whole frame (size prefix included) for a kio request entity."""
    header_cls = request.__header_schema__
    header = header_cls(
        request_api_key=i16(request.__api_key__),
        request_api_version=i16(request.__version__),
        correlation_id=i32(correlation_id),
        client_id=client_id,
    )
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    _writer(header_cls)(buf, header)
    _writer(type(request))(buf, request)
    data = bytearray(buf.getbuffer())
    SIZE.pack_into(data, 0, len(data) - SIZE.size)
    return bytes(data)


def frame_size(prefix: bytes) -> int:
    """Size of the frame body announced by a 4-byte prefix, checked for sanity."""
    (size,) = SIZE.unpack(prefix)
    if size < CORRELATION.size or size > MAX_FRAME_BYTES:
        raise RemoteProtocolError(f"implausible frame size {size}")
    return size


def peek_correlation_id(frame: bytes | memoryview) -> int:
    return CORRELATION.unpack_from(frame, 0)[0]


@dataclass(frozen=True, slots=True)
class DecodedResponse:
    correlation_id: int
    body: Any


def decode_response(frame: bytes | memoryview, response_cls: type) -> DecodedResponse:
    """Decode a frame body (size prefix already removed) as `response_cls`.

    Any failure is the peer's: bad bytes become a RemoteProtocolError that the
    shell counts and recovers from, never a crash.
    """
    try:
        header_cls = response_cls.__header_schema__
        header, used = _reader(header_cls)(frame, 0)
        body, body_size = _reader(response_cls)(frame, used)
    except Exception as exc:  # kio raises several types on bad input
        raise RemoteProtocolError(
            f"undecodable {response_cls.__name__} v{response_cls.__version__}: {exc!r}"
        ) from exc
    if used + body_size != len(frame):
        raise RemoteProtocolError(
            f"{response_cls.__name__}: {len(frame) - used - body_size} trailing bytes in frame"
        )
    return DecodedResponse(correlation_id=int(header.correlation_id), body=body)
