"""Kafka's framing over kio's generated message types: the one module for both ends.

The follower's connections, `replicad serve` (leader/frames.py builds its multi-part
responses on top) and the fault proxy (tools/chaos/frames.py) all frame through here.
Every message body is encoded and decoded by kio; this module adds only what kio leaves
to the caller:

- the 4-byte size prefix (`frame_size` holds an announced size to the plausible,
  `with_size_prefix` puts one in front);
- the heads: a request body starts with api_key i16, api_version i16, correlation_id i32
  in every header version (`peek_request_head`); a response body with correlation_id i32
  (`peek_correlation_id`);
- decoding with kio behind the frame guard (a length prefix past the frame's end would
  make kio's native reader abort the process: frame_guard.py), with trailing bytes
  refused; a peer's bad bytes are its `RemoteProtocolError`, never kio's raw exception;
- the pairing of a response with the schema of the request that caused it.
"""

from __future__ import annotations

import dataclasses
import io
import struct
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from replicad.errors import RemoteProtocolError
from replicad.protocol.error_codes import (
    UnknownErrorCode,
    is_unknown_error_code_failure,
    unknown_error_codes,
    with_known_error_codes,
)
from replicad.protocol.frame_guard import reject_implausible_lengths

SIZE = struct.Struct(">i")
CORRELATION = struct.Struct(">i")
REQUEST_HEAD = struct.Struct(">hhi")
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


def encode_entities(*entities: Any) -> bytes:
    """kio entities (a header, a body) encoded one after the other, without a size prefix."""
    buf = io.BytesIO()
    for entity in entities:
        _writer(type(entity))(buf, entity)
    return buf.getvalue()


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


def response_header(response_cls: type, correlation_id: int) -> bytes:
    """The encoded header of a response of `response_cls`."""
    header_cls = response_cls.__header_schema__
    return encode_entities(header_cls(correlation_id=i32(correlation_id)))


def encode_response(body: Any, correlation_id: int) -> bytes:
    """A kio response entity with its header, without a size prefix."""
    return response_header(type(body), correlation_id) + encode_entities(body)


def with_size_prefix(body: bytes) -> bytes:
    """The frame body with its size prefix."""
    return SIZE.pack(len(body)) + body


def frame_size(prefix: bytes) -> int:
    """Size of the frame body announced by a 4-byte prefix, checked for sanity."""
    (size,) = SIZE.unpack(prefix)
    if size < CORRELATION.size or size > MAX_FRAME_BYTES:
        raise RemoteProtocolError(f"implausible frame size {size}")
    return size


@dataclass(frozen=True, slots=True)
class RequestHead:
    """What every request header version starts with."""

    api_key: int
    api_version: int
    correlation_id: int


def peek_request_head(frame: bytes | memoryview) -> RequestHead:
    """The head of a request frame (size prefix removed)."""
    if len(frame) < REQUEST_HEAD.size:
        raise RemoteProtocolError(f"request frame of {len(frame)} bytes has no header")
    api_key, version, correlation_id = REQUEST_HEAD.unpack_from(frame, 0)
    return RequestHead(api_key, version, correlation_id)


def peek_correlation_id(frame: bytes | memoryview) -> int:
    """The correlation id a response frame (size prefix removed) starts with."""
    if len(frame) < CORRELATION.size:
        raise RemoteProtocolError(f"response frame of {len(frame)} bytes has no correlation id")
    return int(CORRELATION.unpack_from(frame, 0)[0])


def decode_entities(frame: bytes | memoryview, entity_cls: type) -> tuple[Any, Any]:
    """(header, body) of a request or response frame of `entity_cls`, read by kio after the
    frame guard; bad bytes or trailing bytes are the peer's RemoteProtocolError."""
    header_cls = entity_cls.__header_schema__
    reject_implausible_lengths(frame, header_cls, entity_cls)
    try:
        header, used = _reader(header_cls)(frame, 0)
        body, size = _reader(entity_cls)(frame, used)
    except Exception as exc:  # kio raises several types on bad input
        raise RemoteProtocolError(_undecodable(entity_cls, exc)) from exc
    _refuse_trailing(frame, entity_cls, used + size)
    return header, body


def _undecodable(entity_cls: type, exc: Exception) -> str:
    return f"undecodable {entity_cls.__name__} v{entity_cls.__version__}: {exc!r}"


def _refuse_trailing(frame: bytes | memoryview, entity_cls: type, used: int) -> None:
    if used != len(frame):
        raise RemoteProtocolError(
            f"{entity_cls.__name__}: {len(frame) - used} trailing bytes in frame"
        )


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    head: RequestHead
    client_id: str | None
    body: Any


def decode_request(frame: bytes | memoryview, request_cls: type) -> DecodedRequest:
    """A request frame (size prefix removed) as `request_cls`, header and body."""
    head = peek_request_head(frame)
    header, body = decode_entities(frame, request_cls)
    return DecodedRequest(head, header.client_id, body)


@dataclass(frozen=True, slots=True)
class DecodedResponse:
    correlation_id: int
    body: Any
    # Error codes this version does not know, each read as UNKNOWN_SERVER_ERROR where it
    # stood (error_codes.py): a broker newer than us, for the caller to count and log.
    unknown_error_codes: tuple[int, ...] = ()


def decode_response(frame: bytes | memoryview, response_cls: type) -> DecodedResponse:
    """Decode a frame body (size prefix already removed) as `response_cls`.

    Any failure is the peer's: bad bytes become a RemoteProtocolError that the
    shell counts and recovers from, never a crash. The frame guard goes first: a length
    prefix claiming more than the frame holds would make kio's native reader abort the
    process (see frame_guard.py).
    """
    header_cls = response_cls.__header_schema__
    reject_implausible_lengths(frame, header_cls, response_cls)
    unknown: tuple[UnknownErrorCode, ...] = ()
    try:
        try:
            header, used = _reader(header_cls)(frame, 0)
            body, body_size = _reader(response_cls)(frame, used)
        except ValueError as exc:
            # kio refuses a whole frame over one error code newer than it: read each such
            # code as UNKNOWN_SERVER_ERROR where it stands (Kafka's rule), and decode again.
            unknown = unknown_error_codes(frame, header_cls, response_cls)
            if not is_unknown_error_code_failure(exc) or not unknown:
                raise
            known = with_known_error_codes(frame, unknown)
            header, used = _reader(header_cls)(known, 0)
            body, body_size = _reader(response_cls)(known, used)
    except Exception as exc:  # kio raises several types on bad input
        raise RemoteProtocolError(_undecodable(response_cls, exc)) from exc
    _refuse_trailing(frame, response_cls, used + body_size)
    null = _null_in_required(body)
    if null is not None:
        raise RemoteProtocolError(
            f"{response_cls.__name__} v{response_cls.__version__}: {null} is null, "
            "which the schema does not allow"
        )
    return DecodedResponse(
        correlation_id=int(header.correlation_id),
        body=body,
        unknown_error_codes=tuple(u.code for u in unknown),
    )


@dataclass(frozen=True, slots=True)
class _Shape:
    required: tuple[str, ...]  # fields that may not be None
    nested: tuple[str, ...]  # fields holding entities (or tuples of them) to check too


@cache
def _shape(cls: type) -> _Shape:
    hints = typing.get_type_hints(cls)
    required, nested = [], []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint)
        if not (isinstance(hint, types.UnionType) and type(None) in args):
            required.append(f.name)
        inner = [a for a in args if a is not type(None) and a is not Ellipsis]
        if typing.get_origin(hint) is tuple or isinstance(hint, types.UnionType):
            candidates = [x for a in inner for x in (typing.get_args(a) or (a,))]
        else:
            candidates = [hint]
        if any(dataclasses.is_dataclass(c) for c in candidates):
            nested.append(f.name)
    return _Shape(tuple(required), tuple(nested))


def _null_in_required(entity: Any, path: str = "") -> str | None:
    """The first non-nullable field a peer sent as null (kio decodes a null compact array
    to None even where the schema forbids it; nothing downstream expects that)."""
    shape = _shape(type(entity))
    for name in shape.required:
        if getattr(entity, name) is None:
            return f"{path}{name}"
    for name in shape.nested:
        value = getattr(entity, name)
        items = value if isinstance(value, tuple) else (value,)
        for i, item in enumerate(items):
            if item is not None and dataclasses.is_dataclass(item):
                found = _null_in_required(item, f"{path}{name}[{i}].")
                if found is not None:
                    return found
    return None
