"""How much one request may ask of `replicad serve`: bounds that keep any single request
from stopping the world (sans-I/O; the server passes in what the replica holds).

Why: every request is decoded by kio's native reader (it holds the GIL, ~15-60 ms per MiB
of request) and answered in Python on the event loop (~1 s per MiB of a Fetch naming
unknown partitions, measured). Kafka's only bound, `socket.request.max.bytes` (100 MiB),
lets one well-formed Fetch naming 6.5 million partitions hold the loop for 98 s. A replica
has no use for a request naming many more partitions than it holds, so:

Rules:
- A frame may not be larger than `plausible_frame_bytes(held)`: 1 MiB, plus 256 bytes per
  partition the replica holds (an honest request naming each of them once, each in a topic
  of its own with a 249-character name, fits), and never more than `max_request_bytes`.
  The size is known from the frame's prefix, so a larger frame is refused before a byte of
  it is read or held -- as Kafka refuses one over socket.request.max.bytes (it closes the
  connection). The largest frame allowed then costs at most ~60 ms of decoding.
- A decoded request may not name more elements (topics, partitions, group ids: every
  element of every array in it) than `plausible_elements(held)`: 1,024, plus twice the
  partitions held. It is checked before the request is answered, so answering stays
  proportional to the replica; a request over it closes the connection, as Kafka closes
  one whose request it cannot parse (InvalidRequestException): no answer exists that would
  help the client, and closing costs nothing.
- The counts are of what the replica holds now: a replica still filling up allows less.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache
from typing import Any

MIB = 1024 * 1024
PLAUSIBLE_FRAME_FLOOR_BYTES = 1 * MIB
PLAUSIBLE_BYTES_PER_PARTITION = 256
PLAUSIBLE_ELEMENTS_FLOOR = 1024
PLAUSIBLE_ELEMENTS_PER_PARTITION = 2


def plausible_frame_bytes(partitions_held: int, max_request_bytes: int) -> int:
    """The largest request frame worth reading (see the module rules)."""
    plausible = PLAUSIBLE_FRAME_FLOOR_BYTES + PLAUSIBLE_BYTES_PER_PARTITION * partitions_held
    return min(max_request_bytes, plausible)


def plausible_elements(partitions_held: int) -> int:
    """The most array elements a decoded request may name (see the module rules)."""
    return PLAUSIBLE_ELEMENTS_FLOOR + PLAUSIBLE_ELEMENTS_PER_PARTITION * partitions_held


@dataclass(frozen=True, slots=True)
class ElementCount:
    """The array elements of a decoded request, counted up to a limit."""

    elements: int
    limit: int

    @property
    def plausible(self) -> bool:
        return self.elements <= self.limit


def count_elements(body: Any, limit: int) -> ElementCount:
    """Every element of every array (tuple) in `body` -- a kio entity or one of
    legacy_codec's dataclasses -- and in the entities and tuples inside them; the walk
    stops once the count passes `limit`, so counting costs no more than answering would.
    Only fields declared as tuples are walked into (kio and legacy_codec declare every
    array so): a partition entry of scalars is counted, not opened."""
    count = 0
    stack: list[Any] = [body]
    while stack:
        value = stack.pop()
        if isinstance(value, tuple):
            count += len(value)
            if count > limit:
                break
            stack.extend(v for v in value if isinstance(v, tuple) or _array_fields(type(v)))
        else:
            for name in _array_fields(type(value)):
                inner = getattr(value, name)
                if inner is not None:
                    stack.append(inner)
    return ElementCount(count, limit)


@cache
def _array_fields(cls: type) -> tuple[str, ...]:
    """The fields of a dataclass declared as tuples (annotations are strings here)."""
    if not dataclasses.is_dataclass(cls):
        return ()
    return tuple(f.name for f in dataclasses.fields(cls) if "tuple" in str(f.type))
