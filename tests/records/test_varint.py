"""replicad/records/varint.py: the bytes are what Kafka's writers write (kio's, written
after Kafka's ByteUtils, as the reference), the small ones from the table included."""

from __future__ import annotations

import io
import random

from kio.serial.readers import read_signed_varlong, read_unsigned_varlong
from kio.serial.writers import write_signed_varlong, write_unsigned_varlong

from replicad.records.varint import SMALL_UVARINTS, uvarint, varint

EDGES = [0, 1, 63, 64, 127, 128, 8191, 8192, 16383, 16384, 2**21, 2**31 - 1, 2**31, 2**63 - 1]


def _kio(write, value: int) -> bytes:  # type: ignore[no-untyped-def]
    out = io.BytesIO()
    write(out, value)
    return out.getvalue()


def _values() -> list[int]:
    rng = random.Random(33)
    return EDGES + [rng.randrange(2**63) >> rng.randrange(63) for _ in range(2000)]


def test_an_unsigned_varint_is_kafkas() -> None:
    for raw in [*_values(), *range(1 << 14)]:
        assert uvarint(raw) == _kio(write_unsigned_varlong, raw), raw
        assert read_unsigned_varlong(uvarint(raw), 0) == (raw, len(uvarint(raw)))


def test_a_zigzag_varint_is_kafkas_for_either_sign() -> None:
    for value in [*_values(), *(-v - 1 for v in _values()), *range(-9000, 9000)]:
        assert varint(value) == _kio(write_signed_varlong, value), value
        assert read_signed_varlong(varint(value), 0) == (value, len(varint(value)))


def test_the_table_holds_the_one_and_two_byte_varints() -> None:
    assert len(SMALL_UVARINTS) == 1 << 14
    assert {len(b) for b in SMALL_UVARINTS[:128]} == {1}
    assert {len(b) for b in SMALL_UVARINTS[128:]} == {2}
    assert len(varint(8191)) == len(varint(-8192)) == 2 and len(varint(8192)) == 3
