"""Frame guard: every length prefix in a Kafka message held to the bytes left, before
kio's native reader sees the frame.

Why it exists: kio's reader reserves room for an array's claimed element count before it
reads one element; a count near 2^32 (one damaged or hostile varint) makes that
reservation fail, and Rust aborts the whole process -- no Python exception, nothing a
shell could catch. Kafka's own readers cap such counts by the bytes left. This module does
the same from Python, walking the schema that kio's entity classes carry as field metadata.

Rules the walk keeps:
- It reads what kio reads, in kio's order: the fields in declaration order, then (flexible
  versions) the tagged-field section -- a count, then per field its tag, its declared size
  and its value read by the field's schema. kio ignores the declared size, so the walk
  does too: skipping by it would leave unchecked whatever kio then reads in its place.
  An entity field of a nullable type starts with a one-byte presence marker (-1: absent;
  so its smallest size is that byte alone).
  RequestHeader.client_id is a nullable legacy string in every header version. A tagged
  primitive field is read as non-nullable (kio's rule, odd as it is).
- An array claiming n elements, whose smallest element is m >= 1 bytes, needs n*m bytes.
  A claim beyond the bytes left is impossible in any honest frame: it is the verdict that
  rejects a frame (`ImplausibleLength`). Strings and bytes are held to the same rule
  (kio bounds those itself, but a claim past the end is the same lie).
- Fixed-size fields, and arrays of them, are skipped, never decoded; string and record
  bytes are skipped by their length: the cost is one step per field, not per byte.
- Where the walk cannot go on, kio cannot either (bytes run out, a varint over 5 bytes,
  a negative length, a tag kio has no field for): the walk stops and says where
  (`unreadable`), and kio is left to raise its own typed error there -- everything kio
  reads before that point has been checked. Other faults kio finds (a null where none is
  allowed, bad UTF-8) are kio's alone; the walk goes on past them.
- Pure: a frame in, a `FrameCheck` out. No I/O, no clock, no decoding of values.
- The schema comes from kio's own introspection helpers (kio.serial._introspect, the
  ones its reader is compiled from), so both read a field the same way; the tests hold
  the walk to kio's reader over every API and version.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from replicad.errors import RemoteProtocolError

# Wire sizes of the kio primitive types that have one.
FIXED_SIZES: dict[str, int] = {
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "float64": 8,
    "bool": 1,
    "uuid": 16,
    "error_code": 2,
    "timedelta_i32": 4,
    "timedelta_i64": 8,
    "datetime_i64": 8,
}
VARIABLE_TYPES = frozenset({"string", "bytes", "records"})
NULL_LENGTH = -1  # legacy arrays, strings and bytes; also the absent-entity marker
COMPACT_NULL = 0  # compact lengths are stored plus one, so 0 is null
MAX_VARINT_BYTES = 5  # kio's (and Kafka's) limit for an unsigned varint
LEGACY_STRING_PREFIX = 2
LEGACY_BYTES_PREFIX = 4
LEGACY_ARRAY_PREFIX = 4
MIN_VARINT_PREFIX = 1
NULLABLE_MARKER = 1

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class ImplausibleLength:
    """A length prefix that claims more than the frame has left."""

    field: str  # where, e.g. "responses[0].partitions[3].aborted_transactions"
    offset: int  # where its length prefix starts in the frame
    claimed: int  # elements (arrays) or bytes (strings, bytes) claimed
    needs: int  # bytes the claim takes at the least
    remaining: int  # bytes the frame has after the prefix

    def describe(self) -> str:
        return (
            f"{self.field} at byte {self.offset} claims {self.claimed} "
            f"({self.needs} bytes at least) with {self.remaining} bytes left"
        )


@dataclass(frozen=True, slots=True)
class FrameCheck:
    """What the walk over one message found.

    `end` is where the walk stopped: the message's end when `complete`, else the offset
    of the field kio will fail on too (`unreadable` says why) or of the implausible claim.
    """

    end: int
    implausible: ImplausibleLength | None = None
    unreadable: str | None = None

    @property
    def complete(self) -> bool:
        return self.implausible is None and self.unreadable is None


def check_message(frame: bytes | memoryview, *entity_types: type, offset: int = 0) -> FrameCheck:
    """Walk `entity_types` (e.g. a header class, then a body class) in turn over `frame`
    from `offset`, checking every length prefix against the bytes left."""
    buf = _bytes_view(frame)
    end = len(buf)
    pos = offset
    try:
        for entity_type in entity_types:
            pos = _entity_walker(entity_type, False)(buf, pos, end)
    except _Implausible as exc:
        return FrameCheck(end=exc.offset, implausible=exc.finding())
    except _Unreadable as exc:
        return FrameCheck(end=exc.offset, unreadable=exc.reason)
    return FrameCheck(end=pos)


def reject_implausible_lengths(frame: bytes | memoryview, *entity_types: type) -> None:
    """Raise the peer's RemoteProtocolError if a length prefix in `frame` claims more
    than the frame holds; the rest of what is wrong with a frame is kio's to find."""
    verdict = check_message(frame, *entity_types)
    if verdict.implausible is not None:
        name = entity_types[-1].__name__ if entity_types else "message"
        version = getattr(entity_types[-1], "__version__", "?") if entity_types else "?"
        raise RemoteProtocolError(
            f"{name} v{version}: implausible length: {verdict.implausible.describe()}"
        )


def field_walker(f: dataclasses.Field[Any], flexible: bool, is_tag: bool) -> Walker:
    """How the walk steps over one field of a response entity: (buffer, position, end) ->
    position after, raising on a length it cannot follow (error_codes.py reuses it)."""
    return _field_plan(f, flexible, False, is_tag).walk


def read_uvarint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """(value, position after) of an unsigned varint, read as kio reads it."""
    return _read_uvarint(buf, pos, end)


def min_wire_size(entity_type: type, *, nullable: bool = False) -> int:
    """The fewest bytes one `entity_type` can take on the wire (>= 1 for every flexible
    entity: its tagged-field count)."""
    return _entity_plan(entity_type, nullable).min_size


# -- the walk ---------------------------------------------------------------------------------

Walker = Callable[[Any, int, int], int]  # (buffer, position, end) -> position after


class _Implausible(Exception):
    def __init__(self, field: str, offset: int, claimed: int, needs: int, remaining: int):
        super().__init__(field)
        self.path = [field]
        self.offset = offset
        self.claimed = claimed
        self.needs = needs
        self.remaining = remaining

    def inside(self, name: str) -> _Implausible:
        self.path.append(name)
        return self

    def finding(self) -> ImplausibleLength:
        field = ".".join(reversed(self.path)).replace(".[", "[")
        return ImplausibleLength(field, self.offset, self.claimed, self.needs, self.remaining)


class _Unreadable(Exception):
    def __init__(self, offset: int, reason: str):
        super().__init__(reason)
        self.offset = offset
        self.reason = reason


def _bytes_view(frame: bytes | memoryview) -> bytes | memoryview:
    if isinstance(frame, memoryview) and (frame.format != "B" or frame.ndim != 1):
        return frame.cast("B")
    return frame


def _read_uvarint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """(value, position after), as kio reads it: at most 5 bytes, 7 bits each."""
    value = 0
    shift = 0
    for i in range(MAX_VARINT_BYTES):
        if pos + i >= end:
            raise _Unreadable(pos, "bytes run out inside a varint")
        byte = buf[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + i + 1
        shift += 7
    raise _Unreadable(pos, "varint longer than 5 bytes")


def _fixed(size: int) -> Walker:
    def walk(buf: Any, pos: int, end: int) -> int:
        after = pos + size
        if after > end:
            raise _Unreadable(pos, f"bytes run out inside a {size}-byte field")
        return after

    return walk


def _compact_bytes(name: str) -> Walker:
    def walk(buf: Any, pos: int, end: int) -> int:
        if pos < end and buf[pos] < 0x80:  # one-byte length: the common case, inline
            stored, after = buf[pos], pos + 1
        else:
            stored, after = _read_uvarint(buf, pos, end)
        if stored == COMPACT_NULL:
            return after
        size = stored - 1
        if size > end - after:
            raise _Implausible(name, pos, size, size, end - after)
        return after + size

    return walk


def _legacy_bytes(name: str, prefix: struct.Struct) -> Walker:
    width = prefix.size

    def walk(buf: Any, pos: int, end: int) -> int:
        after = pos + width
        if after > end:
            raise _Unreadable(pos, "bytes run out inside a length")
        (size,) = prefix.unpack_from(buf, pos)
        if size == NULL_LENGTH:
            return after
        if size < 0:
            raise _Unreadable(pos, f"negative length {size}")
        if size > end - after:
            raise _Implausible(name, pos, size, size, end - after)
        return after + size

    return walk


def _array(name: str, element: _Plan, compact: bool) -> Walker:
    least = max(element.min_size, 1)
    fixed = element.fixed_size
    walk_element = element.walk

    def walk(buf: Any, pos: int, end: int) -> int:
        if compact:
            stored, after = _read_uvarint(buf, pos, end)
            if stored == COMPACT_NULL:
                return after
            count = stored - 1
        else:
            after = pos + LEGACY_ARRAY_PREFIX
            if after > end:
                raise _Unreadable(pos, "bytes run out inside an array length")
            (count,) = _I32.unpack_from(buf, pos)
            if count == NULL_LENGTH:
                return after
            if count < 0:
                raise _Unreadable(pos, f"negative array length {count}")
        needs = count * least
        if needs > end - after:
            raise _Implausible(name, pos, count, needs, end - after)
        if fixed is not None:
            return after + count * fixed
        for i in range(count):
            try:
                after = walk_element(buf, after, end)
            except _Implausible as exc:
                raise exc.inside(f"[{i}]").inside(name) from None
        return after

    return walk


def _named(name: str, walk: Walker) -> Walker:
    """An entity-typed field: findings inside it get its name in their path."""

    def walk_named(buf: Any, pos: int, end: int) -> int:
        try:
            return walk(buf, pos, end)
        except _Implausible as exc:
            raise exc.inside(name) from None

    return walk_named


@dataclass(frozen=True, slots=True)
class _Plan:
    walk: Walker
    min_size: int
    fixed_size: int | None  # set when every value of the type takes exactly this many bytes
    step: Step  # how an entity's walk takes this field


@cache
def _entity_walker(entity_type: type, nullable: bool) -> Walker:
    return _entity_plan(entity_type, nullable).walk


# Step kinds of an entity's walk. The common ones are interpreted inline by `_sequence`
# (a function call per field is most of the walk's cost on a 10,000-partition Fetch).
_SKIP = 0  # arg: a byte count (a run of neighbouring fixed-size fields)
_COMPACT_BYTES = 1  # arg: the field name (compact string, bytes or records)
_COMPACT_ARRAY = 2  # arg: the array's walker (an empty array is skipped inline)
_TAGS = 3  # arg: the tagged-field section's walker (no tags is skipped inline)
_CALL = 4  # arg: a walker
_COMPACT_FIXED_ARRAY = 5  # arg: (field name, element size): e.g. replica node ids

Step = tuple[int, Any]


@cache
def _entity_plan(entity_type: type, nullable: bool) -> _Plan:
    flexible = bool(entity_type.__flexible__)
    is_request_header = entity_type.__name__ == "RequestHeader"
    steps: list[Step] = []
    tagged: dict[int, Walker] = {}
    min_size = 0
    fixed_run = 0
    all_fixed = not flexible
    for f in dataclasses.fields(entity_type):
        tag = get_field_tag(f)
        plan = _field_plan(f, flexible, is_request_header, tag is not None)
        if tag is not None:
            tagged[int(tag)] = plan.walk
            continue
        min_size += plan.min_size
        if plan.fixed_size is not None:
            fixed_run += plan.fixed_size  # neighbouring fixed fields: one bounds check
            continue
        all_fixed = False
        if fixed_run:
            steps.append((_SKIP, fixed_run))
            fixed_run = 0
        steps.append(plan.step)
    if fixed_run:
        steps.append((_SKIP, fixed_run))
    if flexible:
        min_size += MIN_VARINT_PREFIX  # the tagged-field count
        steps.append((_TAGS, _tagged_section(entity_type.__name__, tagged)))
    walk = _sequence(tuple(steps), nullable)
    if nullable:  # an absent struct is its marker alone
        return _Plan(walk, NULLABLE_MARKER, None, (_CALL, walk))
    return _Plan(walk, min_size, min_size if all_fixed else None, (_CALL, walk))


def _sequence(steps: tuple[Step, ...], nullable: bool) -> Walker:
    def walk(buf: Any, pos: int, end: int) -> int:
        if nullable:
            if pos >= end:
                raise _Unreadable(pos, "bytes run out at a presence marker")
            marker = _I8.unpack_from(buf, pos)[0]
            pos += NULLABLE_MARKER
            if marker == NULL_LENGTH:
                return pos
        for kind, arg in steps:
            if kind == _SKIP:
                if pos + arg > end:
                    raise _Unreadable(pos, f"bytes run out inside {arg} bytes of fixed fields")
                pos += arg
            elif kind == _COMPACT_BYTES:
                # Lengths of one and two varint bytes (records up to 16 KiB) inline.
                if pos + 1 < end and buf[pos] < 0x80:
                    stored, after = buf[pos], pos + 1
                elif pos + 1 < end and buf[pos + 1] < 0x80:
                    stored, after = (buf[pos] & 0x7F) | (buf[pos + 1] << 7), pos + 2
                else:
                    stored, after = _read_uvarint(buf, pos, end)
                if stored != COMPACT_NULL:
                    if stored - 1 > end - after:
                        raise _Implausible(arg, pos, stored - 1, stored - 1, end - after)
                    after += stored - 1
                pos = after
            elif kind == _COMPACT_FIXED_ARRAY:
                if pos + 1 < end and buf[pos] < 0x80:
                    stored, after = buf[pos], pos + 1
                else:
                    stored, after = _read_uvarint(buf, pos, end)
                if stored != COMPACT_NULL:
                    name, size = arg
                    needs = (stored - 1) * size
                    if needs > end - after:
                        raise _Implausible(name, pos, stored - 1, needs, end - after)
                    after += needs
                pos = after
            elif kind == _COMPACT_ARRAY and pos < end and buf[pos] <= 1:
                pos += 1  # a null (0) or empty (1) array: nothing to walk
            elif kind == _TAGS and pos < end and buf[pos] == 0:
                pos += 1  # no tagged fields
            else:
                pos = arg(buf, pos, end)
        return pos

    return walk


def _field_plan(
    f: dataclasses.Field[Any], flexible: bool, is_request_header: bool, is_tag: bool
) -> _Plan:
    name = f.name
    if is_request_header and name == "client_id":
        return _called(_legacy_bytes(name, _I16), LEGACY_STRING_PREFIX)
    kind = classify_field(f)
    if isinstance(kind, PrimitiveField | PrimitiveTupleField):
        inner = _primitive_plan(name, get_schema_field_type(f), flexible)
    elif isinstance(kind, EntityField):
        nested = _entity_plan(kind.type_, is_optional(f))
        named = _named(name, nested.walk)
        inner = _Plan(named, nested.min_size, nested.fixed_size, (_CALL, named))
    elif isinstance(kind, EntityTupleField):
        inner = _entity_plan(kind.type_, False)
    else:  # pragma: no cover - kio's classify_field returns one of the four
        raise TypeError(f"unknown field class {kind!r}")
    if not kind.is_array:
        return inner
    if flexible:
        walk = _array(name, inner, compact=True)
        if inner.fixed_size is not None:
            return _Plan(
                walk, MIN_VARINT_PREFIX, None, (_COMPACT_FIXED_ARRAY, (name, inner.fixed_size))
            )
        return _Plan(walk, MIN_VARINT_PREFIX, None, (_COMPACT_ARRAY, walk))
    return _called(_array(name, inner, compact=False), LEGACY_ARRAY_PREFIX)


def _primitive_plan(name: str, kafka_type: str, flexible: bool) -> _Plan:
    size = FIXED_SIZES.get(kafka_type)
    if size is not None:
        return _Plan(_fixed(size), size, size, (_SKIP, size))
    if kafka_type not in VARIABLE_TYPES:
        raise TypeError(f"kio field {name} has kafka_type {kafka_type!r}, unknown to the guard")
    if flexible:
        return _Plan(_compact_bytes(name), MIN_VARINT_PREFIX, None, (_COMPACT_BYTES, name))
    if kafka_type == "string":
        return _called(_legacy_bytes(name, _I16), LEGACY_STRING_PREFIX)
    return _called(_legacy_bytes(name, _I32), LEGACY_BYTES_PREFIX)


def _called(walk: Walker, min_size: int) -> _Plan:
    return _Plan(walk, min_size, None, (_CALL, walk))


def _tagged_section(entity_name: str, tagged: dict[int, Walker]) -> Walker:
    def walk(buf: Any, pos: int, end: int) -> int:
        count, pos = _read_uvarint(buf, pos, end)
        for _ in range(count):  # each round reads >= 2 bytes: bounded by the frame
            tag, after = _read_uvarint(buf, pos, end)
            _, after = _read_uvarint(buf, after, end)  # declared size: kio ignores it
            field = tagged.get(tag)
            if field is None:
                raise _Unreadable(pos, f"tag {tag} is not a field of {entity_name}")
            pos = field(buf, after, end)
        return pos

    return walk
