"""The control socket's wire format, sans-I/O: requests, replies split over datagrams.

Rules:
- Transport is AF_UNIX SOCK_DGRAM. A request is one datagram holding one JSON object
  `{"cmd": str, "id": int, "args": {...}}` (`args` optional), at most MAX_DATAGRAM_BYTES.
- A reply is the JSON object `{"ok": true, "result": {...}}` or `{"ok": false, "error": str}`,
  encoded once as UTF-8 and cut into chunks. Each chunk travels in its own datagram:
  a one-line JSON header `{"id": N, "seq": i, "total": T}`, a newline, then the chunk's bytes.
  `id` echoes the request's, `seq` counts from 0, `total` is the same in every chunk.
- Every datagram stays at or under MAX_DATAGRAM_BYTES, well below what the kernel accepts
  (the sender's SO_SNDBUF, ~208 KiB by default), so a reply of any size gets through.
- Datagrams on a local socket are not lost, but the assembler does not rely on order: it
  places chunks by `seq`, ignores duplicates and other ids, and finishes when all T are in.
  A header that contradicts an earlier one (another total, seq out of range) is an error.
- A list in a reply may be a `JsonRows`: its rows are made and encoded one at a time, so
  only their JSON is held, never every row at once (a 10,000-partition status is 10,000
  dicts of about 1 KB, issue 32). The datagrams are made one at a time as they are sent.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from replicad.errors import ControlError

# Whole datagram, header included: far below the kernel's limit, large enough that a
# 10,000-partition status is a few dozen datagrams.
MAX_DATAGRAM_BYTES = 60 * 1024
# Room kept for the header line; the largest real header is well under 64 bytes.
HEADER_RESERVE_BYTES = 128
CHUNK_BYTES = MAX_DATAGRAM_BYTES - HEADER_RESERVE_BYTES
# A reply larger than this (~120 MiB) is refused rather than buffered.
MAX_CHUNKS = 2048
HEADER_END = b"\n"


@dataclass(frozen=True, slots=True)
class Request:
    cmd: str
    id: int
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReplyPending:
    """More chunks are needed."""

    received: int
    total: int


@dataclass(frozen=True, slots=True)
class ReplyComplete:
    """Every chunk is in; `reply` is the decoded reply object."""

    reply: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ReplyIgnored:
    """The datagram belongs to another request (a late answer to an earlier query)."""

    id: int


ReplyStep = ReplyPending | ReplyComplete | ReplyIgnored


def encode_request(cmd: str, request_id: int, args: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"cmd": cmd, "id": request_id}
    if args:
        message["args"] = args
    datagram = json.dumps(message, separators=(",", ":")).encode()
    if len(datagram) > MAX_DATAGRAM_BYTES:
        raise ControlError(f"request of {len(datagram)} bytes exceeds one datagram")
    return datagram


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    """`data` as a JSON object; `ControlError` says what it is instead."""
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ControlError(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ControlError(f"{what} is not a JSON object")
    return value


def decode_request(datagram: bytes) -> Request:
    """Parse a request; `ControlError` names what is wrong with it."""
    message = _json_object(datagram, "request")
    cmd, request_id, args = message.get("cmd"), message.get("id", 0), message.get("args", {})
    if not isinstance(cmd, str) or not cmd:
        raise ControlError("request has no `cmd` string")
    if not isinstance(request_id, int) or isinstance(request_id, bool):
        raise ControlError("request `id` is not an integer")
    if not isinstance(args, dict):
        raise ControlError("request `args` is not an object")
    return Request(cmd=cmd, id=request_id, args=args)


def request_id_of(datagram: bytes) -> int:
    """The id of a request that failed to parse, when it can still be read (else 0)."""
    try:
        message = json.loads(datagram)
        request_id = message.get("id", 0) if isinstance(message, dict) else 0
    except (UnicodeDecodeError, ValueError):
        return 0
    return request_id if isinstance(request_id, int) else 0


def ok_reply(result: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "result": result}


def error_reply(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message}


class JsonRows:
    """A list of a reply whose rows are made while the reply is encoded, one at a time
    (iterated once)."""

    __slots__ = ("rows",)

    def __init__(self, rows: Iterable[Any]) -> None:
        self.rows = rows


_SEPARATORS = (",", ":")


def encode_body(reply: dict[str, Any]) -> bytes | bytearray:
    """`reply` as UTF-8 JSON; each `JsonRows` in it encoded row by row where it stands."""
    streams: list[JsonRows] = []
    # A placeholder no other string of the reply can equal (json escapes the NULs).
    mark = f"\0{uuid.uuid4().hex}\0"

    def default(value: object) -> object:
        if isinstance(value, JsonRows):
            streams.append(value)
            return mark
        return str(value)

    text = json.dumps(reply, separators=_SEPARATORS, default=default)
    if not streams:
        return text.encode()
    pieces = text.split(json.dumps(mark))
    body = bytearray()
    for piece, stream in zip(pieces, streams, strict=False):
        body += piece.encode()
        body += b"["
        comma = b""
        for row in stream.rows:
            body += comma
            body += json.dumps(row, separators=_SEPARATORS, default=str).encode()
            comma = b","
        body += b"]"
    body += pieces[-1].encode()
    return body


def reply_datagrams(request_id: int, reply: dict[str, Any]) -> Iterator[bytes]:
    """The datagrams carrying `reply`, in order (the receiver tolerates any order), each
    made when asked for. The reply is encoded at the call: a reply too large raises
    ControlError here, before any datagram."""
    body = encode_body(reply)
    total = max(1, -(-len(body) // CHUNK_BYTES))
    if total > MAX_CHUNKS:
        raise ControlError(f"reply of {len(body)} bytes exceeds {MAX_CHUNKS} datagrams")
    return _datagrams(request_id, memoryview(body), total)


def _datagrams(request_id: int, body: memoryview, total: int) -> Iterator[bytes]:
    for seq in range(total):
        header = json.dumps({"id": request_id, "seq": seq, "total": total}).encode()
        yield header + HEADER_END + body[seq * CHUNK_BYTES : (seq + 1) * CHUNK_BYTES]


def encode_reply(request_id: int, reply: dict[str, Any]) -> list[bytes]:
    """Every datagram carrying `reply`, in order."""
    return list(reply_datagrams(request_id, reply))


class ReplyAssembler:
    """Collects the chunks of the reply to request `request_id`, in any order."""

    def __init__(self, request_id: int) -> None:
        self.request_id = request_id
        self._total: int | None = None
        self._chunks: dict[int, bytes] = {}

    def feed(self, datagram: bytes) -> ReplyStep:
        header_bytes, sep, chunk = datagram.partition(HEADER_END)
        if not sep:
            raise ControlError("reply datagram has no header line")
        header = _parse_header(header_bytes)
        seq, total = header.seq, header.total
        if header.id != self.request_id:
            return ReplyIgnored(id=header.id)
        if self._total is None:
            self._total = total
        elif total != self._total:
            raise ControlError(f"reply chunk says total {total}, earlier ones said {self._total}")
        if not 0 <= seq < total:
            raise ControlError(f"reply chunk seq {seq} outside 0..{total - 1}")
        self._chunks.setdefault(seq, chunk)
        if len(self._chunks) < total:
            return ReplyPending(received=len(self._chunks), total=total)
        body = b"".join(self._chunks[i] for i in range(total))
        return ReplyComplete(reply=_json_object(body, "reassembled reply"))


@dataclass(frozen=True, slots=True)
class _ChunkHeader:
    id: int
    seq: int
    total: int


def _parse_header(header_bytes: bytes) -> _ChunkHeader:
    try:
        fields = json.loads(header_bytes)
        header = _ChunkHeader(id=fields["id"], seq=fields["seq"], total=fields["total"])
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise ControlError(f"bad reply header: {exc}") from None
    if not all(isinstance(v, int) for v in (header.id, header.seq, header.total)):
        raise ControlError("reply header fields are not integers")
    if not 1 <= header.total <= MAX_CHUNKS:
        raise ControlError(f"reply header total {header.total} outside 1..{MAX_CHUNKS}")
    return header
