"""Walking the log entries of a byte range of a segment file, in bounded chunks.

Rules:
- The range [start, end) starts at an entry boundary (a position from the offset index, or
  0). It is read by position (pread on a file, a ranged GET on a bucket's object: files.py)
  in chunks of about CHUNK_BYTES; an entry larger than a chunk is
  read whole in a chunk of its own. Memory stays bounded by the larger of the two.
- Each chunk is framed and checked by `records.batch.scan_batches` (length, magic, CRC32C
  unless turned off); the walk yields the whole entries of each chunk with the chunk's
  bytes, positions relative to the chunk.
- The walk ends (`Walk.tail`) with END when the range was consumed exactly, PARTIAL when it
  ends inside an entry (a torn tail: a writer was appending while the size was taken, or
  the file shrank under us), CORRUPT at the first malformed entry, with its file position.
- pread, not mmap: a segment truncated by a running replicad must not SIGBUS a reader.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from replicad.records.batch import LOG_OVERHEAD, BatchHeader, ScanStop, scan_batches
from replicad.records.header import LENGTH_POSITION
from replicad.spark.files import LocalFile, RandomAccess

CHUNK_BYTES = 8 * 1024 * 1024
_LENGTH = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class Chunk:
    """Bytes of the file from `position`, and the whole entries in them."""

    data: bytes
    position: int  # file position of data[0]
    batches: list[BatchHeader]  # positions relative to data


@dataclass(frozen=True, slots=True)
class Tail:
    """Where and how a walk stopped."""

    position: int  # file position after the last whole entry
    stop: ScanStop
    error: str | None = None


class Walk:
    """Iterate once for the chunks; `tail` is set when the iteration is over."""

    def __init__(
        self,
        source: RandomAccess | int,
        start: int,
        end: int,
        *,
        verify_crc: bool = True,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        # A bare descriptor is a local file.
        self._source = LocalFile(source) if isinstance(source, int) else source
        self._start = start
        self._end = end
        self._verify_crc = verify_crc
        self._chunk_bytes = chunk_bytes
        self.tail: Tail | None = None

    def __iter__(self) -> Iterator[Chunk]:
        pos = self._start
        want = self._chunk_bytes
        while pos < self._end:
            want = min(want, self._end - pos)
            data = self._source.pread(want, pos)
            scan = scan_batches(data, verify_crc=self._verify_crc)
            if scan.batches:
                yield Chunk(data, pos, scan.batches)
            after = pos + scan.valid_bytes
            if scan.stop is ScanStop.CORRUPT:
                self.tail = Tail(after, ScanStop.CORRUPT, scan.error)
                return
            if len(data) < want or (scan.stop is ScanStop.PARTIAL and pos + len(data) >= self._end):
                # The range ends inside an entry, or the file ends before the range: it
                # shrank, or a writer's last entry was cut when its size was taken.
                self.tail = Tail(after, ScanStop.PARTIAL)
                return
            if scan.stop is ScanStop.PARTIAL and scan.valid_bytes == 0:
                # An entry larger than the chunk: read it whole next time round (the read
                # grows every time, so a tiny chunk size cannot loop).
                need = _entry_size(data) if len(data) >= LOG_OVERHEAD else LOG_OVERHEAD
                want = max(need, len(data) + 1)
            else:
                want = self._chunk_bytes
            pos = after
        self.tail = Tail(pos, ScanStop.END)


def _entry_size(data: bytes) -> int:
    (length,) = _LENGTH.unpack_from(data, LENGTH_POSITION)
    return LOG_OVERHEAD + max(length, 0)
