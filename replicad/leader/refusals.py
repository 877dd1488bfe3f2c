"""Answers to requests the server does not serve: the protocol's own error, in a response of
the request's own version, never a dropped connection.

Rules:
- ApiVersions of a version newer than ours: the v0 layout with UNSUPPORTED_VERSION and the
  list of what we support (KIP-511), so the client can retry with a version we know.
- Produce: refused as Kafka refuses a principal without WRITE access,
  TOPIC_AUTHORIZATION_FAILED for every partition named, with an error message (v8+) saying
  that this is a read-only replica. acks=0 expects no answer: Kafka closes the connection
  so the producer notices, and so does replicad.
- Any other API kio can encode: UNSUPPORTED_VERSION (the API is not in our ApiVersions
  answer) as the response's top-level error code; responses without one get it in every
  entry that mirrors an entry of the request (same field name, or a known pairing such as
  Produce's topic_data -> responses), so the client sees an error for everything it asked.
- An API or version kio cannot encode and no hand-written codec covers cannot be answered
  at all; the connection is closed (Kafka does the same).
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Mapping
from dataclasses import MISSING, fields, is_dataclass
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
)

from replicad.wire import UNKNOWN_OFFSET

READ_ONLY_MESSAGE = "replicad serves a read-only replica: produce to the source cluster"
# Response arrays that answer a request array of another name.
MIRRORED_ARRAYS: Mapping[str, tuple[str, ...]] = {
    "responses": ("topic_data", "topics", "topic_names", "resources"),
    "partition_responses": ("partition_data", "partitions"),
    "coordinators": ("coordinator_keys",),
    "results": ("topics", "resources", "groups_names", "groups", "entries"),
    "topics": ("topics",),
    "partitions": ("partitions", "partition_indexes"),
    "groups": ("groups", "group_ids"),
}
# Entry fields that name what the request named, under another name.
MIRRORED_KEYS: Mapping[str, tuple[str, ...]] = {
    "name": ("name", "topic"),
    "topic": ("topic", "name"),
    "index": ("index", "partition_index", "partition"),
    "partition_index": ("partition_index", "partition", "index"),
    "partition": ("partition", "partition_index", "index"),
    "key": ("key",),
    "group_id": ("group_id",),
}


def error_response(
    response_cls: type, error: int, request: Any = None, *, message: str | None = None
) -> Any:
    """A `response_cls` entity that answers `request` with `error` everywhere it can."""
    return _build(response_cls, ErrorCode(error), request, message, top_level=True)


def _build(cls: type, error: ErrorCode, source: Any, message: str | None, top_level: bool) -> Any:
    values: dict[str, Any] = {}
    for f in fields(cls):
        kafka_type = f.metadata.get("kafka_type")
        if kafka_type == "error_code":
            values[f.name] = error
            continue
        if f.name == "error_message" and message is not None:
            values[f.name] = message
            continue
        kind = classify_field(f)
        if isinstance(kind, EntityTupleField):
            values[f.name] = tuple(
                _build(kind.type_, error, entry, message, top_level=False)
                for entry in _mirrored(source, f.name, top_level)
            )
            continue
        if isinstance(kind, PrimitiveTupleField):
            if not top_level and source is not None:
                values[f.name] = tuple(getattr(source, f.name, ()) or ())
            elif f.default is MISSING and f.default_factory is MISSING:
                values[f.name] = ()
            continue
        copied = _mirrored_key(source, f.name) if not top_level else None
        if copied is not None:
            values[f.name] = copied
            continue
        if f.default is not MISSING or f.default_factory is not MISSING:
            continue
        if isinstance(kind, EntityField):
            values[f.name] = _build(kind.type_, error, None, message, top_level=False)
            continue
        values[f.name] = _zero(f.name, kafka_type, f.type)
    return cls(**values)


def _mirrored(source: Any, name: str, top_level: bool) -> tuple[Any, ...]:
    if source is None or not is_dataclass(source):
        return ()
    for candidate in (name, *MIRRORED_ARRAYS.get(name, ())):
        value = getattr(source, candidate, None)
        if isinstance(value, tuple) and all(is_dataclass(v) or _is_key(v) for v in value):
            return tuple(v if is_dataclass(v) else _Key(v) for v in value)
    return ()


class _Key:
    """A request array of plain values (names, indexes, ids) seen as entries of one key."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __getattr__(self, name: str) -> Any:
        if isinstance(self.value, uuid.UUID):
            matches = name == "topic_id"
        elif isinstance(self.value, int):
            matches = name in ("index", "partition_index", "partition")
        else:
            matches = name in ("name", "topic", "key", "group_id", "transactional_id")
        if matches:
            return self.value
        raise AttributeError(name)


def _is_key(value: Any) -> bool:
    return isinstance(value, str | int | uuid.UUID)


def _mirrored_key(source: Any, name: str) -> Any:
    if source is None:
        return None
    for candidate in (name, *MIRRORED_KEYS.get(name, ())):
        try:
            value = getattr(source, candidate)
        except AttributeError:
            continue
        if value is not None and not isinstance(value, tuple) and not is_dataclass(value):
            return value
    return None


def _zero(name: str, kafka_type: str | None, annotation: Any) -> Any:
    nullable = "None" in str(annotation)
    if kafka_type == "int64" and name.endswith("offset"):
        return UNKNOWN_OFFSET
    if kafka_type in ("string", "bytes", "records", "uuid") and nullable:
        return None
    zeros: dict[str | None, Any] = {
        "string": "",
        "bytes": b"",
        "records": b"",
        "uuid": uuid.UUID(int=0),
        "bool": False,
        "float64": 0.0,
        "timedelta_i32": datetime.timedelta(0),
        "timedelta_i64": datetime.timedelta(0),
        "datetime_i64": datetime.datetime.fromtimestamp(0, datetime.UTC),
    }
    return zeros.get(kafka_type, 0)
