"""Request/response framing over kio's generated message types.

Every message body is encoded and decoded by kio; this module adds only what
kio leaves to the caller: the 4-byte size prefix, the request header, and the
pairing of a response with the schema of the request that caused it.
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
        raise RemoteProtocolError(
            f"undecodable {response_cls.__name__} v{response_cls.__version__}: {exc!r}"
        ) from exc
    if used + body_size != len(frame):
        raise RemoteProtocolError(
            f"{response_cls.__name__}: {len(frame) - used - body_size} trailing bytes in frame"
        )
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
