"""Byte mutations for fuzzing (sans-I/O): a seed and a random source in, a damaged copy out.

The mutations are the damage real peers and real disks produce: bit flips, bytes
overwritten with boundary values (0, -1, 0x7f.., 0x80..) at int16/int32/int64 width
(lengths and counts turned absurd), truncation, bytes inserted or deleted, a slice
duplicated (a batch repeated). Used by the hypothesis tests (with a hypothesis-driven
`random.Random`) and by the long fuzz run when atheris is not installed.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Sequence

_BOUNDARIES = {
    1: (0, 0xFF, 0x7F, 0x80, 1),
    2: (0, 0xFFFF, 0x7FFF, 0x8000, 1),
    4: (0, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 1, 61),
    8: (0, 0xFFFFFFFFFFFFFFFF, 0x7FFFFFFFFFFFFFFF, 0x8000000000000000, 1),
}
_FORMATS = {1: ">B", 2: ">H", 4: ">I", 8: ">Q"}


def _flip_bit(data: bytearray, rng: random.Random) -> None:
    if data:
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)


def _flip_byte(data: bytearray, rng: random.Random) -> None:
    if data:
        data[rng.randrange(len(data))] ^= rng.randrange(1, 256)


def _boundary(data: bytearray, rng: random.Random) -> None:
    width = rng.choice((1, 2, 4, 8))
    if len(data) < width:
        return
    position = rng.randrange(len(data) - width + 1)
    struct.pack_into(_FORMATS[width], data, position, rng.choice(_BOUNDARIES[width]))


def _truncate(data: bytearray, rng: random.Random) -> None:
    if data:
        del data[rng.randrange(len(data)) :]


def _insert(data: bytearray, rng: random.Random) -> None:
    position = rng.randrange(len(data) + 1)
    data[position:position] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))


def _delete(data: bytearray, rng: random.Random) -> None:
    if data:
        start = rng.randrange(len(data))
        del data[start : start + rng.randrange(1, 9)]


def _duplicate(data: bytearray, rng: random.Random) -> None:
    if data:
        start = rng.randrange(len(data))
        end = min(len(data), start + rng.randrange(1, 256))
        position = rng.randrange(len(data) + 1)
        data[position:position] = data[start:end]


MUTATIONS: tuple[Callable[[bytearray, random.Random], None], ...] = (
    _flip_bit,
    _flip_byte,
    _boundary,
    _boundary,
    _truncate,
    _insert,
    _delete,
    _duplicate,
)


def mutate(seed: bytes, rng: random.Random, *, max_mutations: int = 4) -> bytes:
    """A copy of `seed` with 1..max_mutations mutations applied."""
    data = bytearray(seed)
    for _ in range(rng.randint(1, max_mutations)):
        rng.choice(MUTATIONS)(data, rng)
    return bytes(data)


def mutate_one_of(seeds: Sequence[bytes], rng: random.Random) -> bytes:
    return mutate(rng.choice(seeds), rng)
