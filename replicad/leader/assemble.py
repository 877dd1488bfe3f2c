"""A run of a response's small parts as one buffer, read on serve's loop from the page
cache, or on a worker thread.

Rules:
- A run is bytes (the response's own fields) and file regions up to SMALL_REGION_BYTES (a
  partition's records; server.py says which). It becomes one buffer of exactly the run's
  size: the bytes copied in, each region read from its file straight into its place
  (`os.preadv` into a view: one copy, no bytes object per region), so the connection
  writes it once. A Fetch of 200 small partitions was 200 reads into bytes of their own,
  then 400 writes copying them again into the transport's buffer (issue 32: 13.5% of
  serve's samples for that Fetch).
- A region whose file shrank (truncation) or vanished (retention) since the answer was
  made fills what is missing with an overflow entry (KIP-283's trailing partial entry): the
  buffer is always the size the frame announced, and the client drops the partial entry.
- Each file is opened once per run, and closed before the run is returned.
- Inside log/nowait.py's `not_waiting()` (serve's loop) a region not all in the page cache
  raises WouldWait (the files are closed, the buffer dropped): the caller assembles the run
  again on a worker thread, where a file that ends early is found out (above).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from replicad.log import nowait
from replicad.log.segment import FileRegion
from replicad.records.downconvert import overflow_entry


class Assembled(NamedTuple):
    buffer: bytearray
    # Bytes read from files, and the regions found shorter than announced.
    region_bytes: int
    short_regions: int


def assemble(parts: Sequence[bytes | FileRegion]) -> Assembled:
    """On a worker thread: `parts` in one buffer (see the module rules)."""
    size = sum(len(p) if isinstance(p, bytes) else p.size for p in parts)
    buffer = bytearray(size)
    view = memoryview(buffer)
    fds: dict[Path, int | None] = {}
    at = region_bytes = short = 0
    try:
        for part in parts:
            if isinstance(part, bytes):
                end = at + len(part)
                view[at:end] = part
                at = end
                continue
            fd = fds.get(part.path, -1)
            if fd == -1:
                try:
                    fd = fds[part.path] = os.open(part.path, os.O_RDONLY)
                except FileNotFoundError:
                    fd = fds[part.path] = None
            got = 0 if fd is None else _read_into(fd, view[at : at + part.size], part.position)
            region_bytes += got
            if got < part.size:
                short += 1
                at += got
                for piece in overflow_entry(part.size - got):
                    view[at : at + len(piece)] = piece
                    at += len(piece)
            else:
                at += got
    finally:
        for fd in fds.values():
            if fd is not None:
                os.close(fd)
    return Assembled(buffer, region_bytes, short)


def _read_into(fd: int, into: memoryview, position: int) -> int:
    """Read into all of `into` from `position` on; fewer bytes at the file's end (inside
    log/nowait.py's `not_waiting()`: WouldWait where a byte is not in the page cache)."""
    got = 0
    while got < len(into):
        n = nowait.preadv(fd, into[got:], position + got)
        if n == 0:
            break
        got += n
    return got
