"""Kafka error codes, including the ones this version of replicad has never heard of.

Rules:
- A code we do not know is UNKNOWN_SERVER_ERROR for the partition (or request) that
  carries it, and only for that one: Kafka's own rule (`Errors.forCode`), and the one that
  lets a broker newer than us add codes without breaking us. `error_code_of` applies it
  to a raw code; `error_name` names a raw code for logs without losing it.
- kio's native reader refuses a whole response that holds one unknown code (a ValueError
  for the frame). So decoding goes: kio first; if it refuses over an error code,
  `unknown_error_codes` walks the response's schema (the same kio metadata the frame
  guard walks), finds every error-code field whose value kio does not know, and
  `with_known_error_codes` returns a copy of the frame with each read as
  UNKNOWN_SERVER_ERROR. The caller decodes that copy and counts what was replaced.
- Pure: bytes in, offsets and codes out. No I/O, no clock, no logging.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from replicad.protocol.frame_guard import (
    COMPACT_NULL,
    LEGACY_ARRAY_PREFIX,
    NULL_LENGTH,
    NULLABLE_MARKER,
    field_walker,
    read_uvarint,
)

_KNOWN = frozenset(int(code) for code in ErrorCode)
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
ERROR_CODE_SIZE = 2


def error_code_of(code: int) -> ErrorCode:
    """The ErrorCode for a raw code; one this Kafka version does not know is
    UNKNOWN_SERVER_ERROR (Kafka's rule)."""
    if code in _KNOWN:
        return ErrorCode(code)
    return ErrorCode.unknown_server_error


def error_name(code: int) -> str:
    """A code's name for logs and counters; an unknown one keeps its number."""
    return ErrorCode(code).name if code in _KNOWN else f"error code {code}"


def is_unknown_error_code_failure(exc: BaseException) -> bool:
    """Whether kio's reader refused a frame over an error code it does not know."""
    return isinstance(exc, ValueError) and "is not a valid ErrorCode" in str(exc)


@dataclass(frozen=True, slots=True)
class UnknownErrorCode:
    offset: int  # of the field's two bytes in the frame
    code: int


def unknown_error_codes(
    frame: bytes | memoryview, *entity_types: type
) -> tuple[UnknownErrorCode, ...]:
    """Every error-code field of `entity_types` (walked in turn, as kio reads them) in
    `frame` whose value kio does not know. A frame the walk cannot read to its end yields
    what was found before that point (kio reports the rest)."""
    found: list[UnknownErrorCode] = []
    pos = 0
    end = len(frame)
    try:
        for entity_type in entity_types:
            pos = _walker(entity_type, False)(frame, pos, end, found)
    except _Stop:
        pass
    return tuple(found)


def with_known_error_codes(
    frame: bytes | memoryview, unknown: tuple[UnknownErrorCode, ...]
) -> bytes:
    """A copy of `frame` with each of `unknown` set to UNKNOWN_SERVER_ERROR."""
    copy = bytearray(frame)
    for u in unknown:
        _I16.pack_into(copy, u.offset, int(ErrorCode.unknown_server_error))
    return bytes(copy)  # kio's reader takes read-only buffers only


# -- the walk ---------------------------------------------------------------------------------

# (frame, position, end, found) -> position after
CodeWalker = Callable[[Any, int, int, list[UnknownErrorCode]], int]


class _Stop(Exception):
    """The frame cannot be walked further (kio will say why when it reads it)."""


def _skip(walk: Callable[[Any, int, int], int]) -> CodeWalker:
    def skip(buf: Any, pos: int, end: int, found: list[UnknownErrorCode]) -> int:
        try:
            return walk(buf, pos, end)
        except Exception as exc:  # the guard's own verdicts: unreadable or implausible
            raise _Stop from exc

    return skip


def _error_code(buf: Any, pos: int, end: int, found: list[UnknownErrorCode]) -> int:
    if pos + ERROR_CODE_SIZE > end:
        raise _Stop
    (code,) = _I16.unpack_from(buf, pos)
    if code not in _KNOWN:
        found.append(UnknownErrorCode(pos, code))
    return pos + ERROR_CODE_SIZE


def _uvarint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    try:
        return read_uvarint(buf, pos, end)
    except Exception as exc:
        raise _Stop from exc


def _entities(element: CodeWalker, compact: bool) -> CodeWalker:
    def walk(buf: Any, pos: int, end: int, found: list[UnknownErrorCode]) -> int:
        if compact:
            stored, pos = _uvarint(buf, pos, end)
            count = stored - 1 if stored != COMPACT_NULL else 0
        else:
            if pos + LEGACY_ARRAY_PREFIX > end:
                raise _Stop
            (count,) = _I32.unpack_from(buf, pos)
            pos += LEGACY_ARRAY_PREFIX
            if count == NULL_LENGTH:
                count = 0
            elif count < 0:
                raise _Stop
        for _ in range(count):
            pos = element(buf, pos, end, found)
        return pos

    return walk


def _field(f: dataclasses.Field[Any], flexible: bool, is_tag: bool) -> CodeWalker:
    kind = classify_field(f)
    if isinstance(kind, EntityField | EntityTupleField):
        element = _walker(kind.type_, isinstance(kind, EntityField) and is_optional(f))
        return _entities(element, flexible) if kind.is_array else element
    if get_schema_field_type(f) == "error_code" and not kind.is_array:
        return _error_code
    return _skip(field_walker(f, flexible, is_tag))


@cache
def _walker(entity_type: type, nullable: bool) -> CodeWalker:
    flexible = bool(entity_type.__flexible__)
    steps: list[CodeWalker] = []
    tagged: dict[int, CodeWalker] = {}
    for f in dataclasses.fields(entity_type):
        tag = get_field_tag(f)
        if tag is not None:
            tagged[int(tag)] = _field(f, flexible, True)
        else:
            steps.append(_field(f, flexible, False))

    def walk(buf: Any, pos: int, end: int, found: list[UnknownErrorCode]) -> int:
        if nullable:
            if pos >= end:
                raise _Stop
            marker = _I8.unpack_from(buf, pos)[0]
            pos += NULLABLE_MARKER
            if marker == NULL_LENGTH:
                return pos
        for step in steps:
            pos = step(buf, pos, end, found)
        if flexible:
            count, pos = _uvarint(buf, pos, end)
            for _ in range(count):
                tag, pos = _uvarint(buf, pos, end)
                _, pos = _uvarint(buf, pos, end)  # declared size: kio ignores it too
                field = tagged.get(tag)
                if field is None:
                    raise _Stop
                pos = field(buf, pos, end, found)
        return pos

    return walk
