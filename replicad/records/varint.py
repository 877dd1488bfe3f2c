"""Kafka's variable-length integers, written as bytes.

Rules this module keeps (sans-I/O: ints in, bytes out):
- An unsigned varint is seven bits a byte, the lowest first, the high bit set on every byte
  but the last (Kafka's ByteUtils.writeUnsignedVarint): a flexible version's compact
  lengths, a record's fields once zigzagged.
- A signed one is zigzag-encoded first, `(v << 1) ^ (v >> 63)`, so that a small negative
  number stays short. A record's fields are varints and its timestamp delta a varlong; for
  a value in int32's range both encodings are the same bytes, so the 64-bit one serves all.
- kio reads them (kio.serial.readers), and its writers write a byte at a time into a stream;
  the mirror writes several a record mirrored (mirror/restamp.py renumbers, mirror/
  produce_frame.py frames a Produce), so these return bytes, the small ones from a table.
"""

from __future__ import annotations


def uvarint(raw: int) -> bytes:
    """`raw` (not negative) as an unsigned varint."""
    out = bytearray()
    while raw > 0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


# The unsigned varints of 0 .. 2**14 - 1 (one or two bytes), made once: a zigzag varint of
# -8192 .. 8191 is SMALL_UVARINTS[its zigzagged value].
SMALL_UVARINTS = tuple(uvarint(raw) for raw in range(1 << 14))


def varint(value: int) -> bytes:
    """`value` as a zigzag varint (a varlong for a 64-bit value)."""
    raw = (value << 1) ^ (value >> 63)
    if raw < len(SMALL_UVARINTS):
        return SMALL_UVARINTS[raw]
    return uvarint(raw)
