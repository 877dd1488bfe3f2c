"""A response written straight on a plaintext connection's socket: the bytes around the
records with writev, each partition's records by sendfile from its segment file.

Kafka sends a Fetch's records this way (FileRecords.writeTo: transferTo per partition). For
serve it replaces, on plaintext connections, reading small regions into a buffer and
writing it (two copies of every byte and a zeroed buffer in the process), and asyncio's
`loop.sendfile` for large ones (a drain, a pause and a few turns of the loop each region).
TLS encrypts in the process, so a TLS connection keeps doing that (server.py).

Rules:
- Only on a plaintext connection whose transport's own buffer is empty when the response
  starts (server.py drains it first): nothing the transport holds can then come after what
  is written here, and while a response is written here the transport writes nothing
  (a connection answers one request at a time).
- The socket's descriptor is duplicated for the response. If the transport closes its
  socket meanwhile (the client reset; serve stopping), writes here fail on the duplicate
  (EPIPE, ECONNRESET) instead of landing on whatever file reused the number; and the
  duplicate is what waits for room (the loop refuses a descriptor a transport owns).
- The socket is corked (TCP_CORK) while the response is written: the few bytes before each
  region go out with the region in full segments, not as a small packet each. Uncorking
  at the end sends what is left.
- A full socket (EAGAIN, or a write that took part of what it was given) waits for room on
  the loop and goes on where it stopped: a client that reads slowly holds its own
  connection only. One that has closed turns the next write into a ConnectionError.
- sendfile's kernel read of a segment waits on the disk where a page is not in the page
  cache, even on a non-blocking socket: a region not all cached (nowait.all_cached) is read
  into the cache on a worker thread first, as serve's other reads are. Where the cache
  cannot be asked (no cachestat), this path is not taken (`available`).
- A region whose file shrank (truncation) or vanished (retention) since the answer was
  made: the bytes still owed are an overflow entry (KIP-283's trailing partial entry), so
  the frame stays the size it announced and the client drops the partial entry.
- Each segment file is opened once per response and closed at its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from replicad.log import nowait
from replicad.log.segment import FileRegion
from replicad.records.downconvert import overflow_entry

# The most buffers one writev takes (Linux's UIO_MAXIOV).
IOV_MAX = 1024
# Regions up to this size are copied into the writev beside the bytes around them when all
# their pages are cached: a copy of a few KB costs less than the cachestat, the sendfile and
# the writev each region sent by sendfile costs (a Fetch of many small partitions).
COPY_REGION_BYTES = 16 * 1024
# The most bytes gathered for one writev.
WRITE_AT_ONCE_BYTES = 1024 * 1024
_TCP_FAMILIES = (socket.AF_INET, socket.AF_INET6)


def available() -> bool:
    """Whether this platform can send regions straight and tell first whether their pages
    are cached (see the rules)."""
    return hasattr(os, "sendfile") and nowait.can_tell_cached()


def takes(transport: asyncio.BaseTransport, parts: Sequence[object]) -> bool:
    """Whether `parts` go out here on `transport`: a plaintext socket's, bytes and file
    regions only, at least one region (a response of bytes alone is one write already)."""
    if transport.get_extra_info("ssl_object") is not None:
        return False
    if transport.get_extra_info("socket") is None or transport.is_closing():
        return False
    regions = False
    for part in parts:
        if isinstance(part, FileRegion):
            regions = True
        elif not isinstance(part, bytes):
            return False
    return regions


async def send(
    transport: asyncio.WriteTransport,
    parts: Sequence[bytes | FileRegion],
    counters: Counter[str],
) -> None:
    """Write `parts` in order on `transport`'s socket (see the rules: its buffer is empty)."""
    sock = transport.get_extra_info("socket")
    raw: socket.socket = sock.dup()  # a TransportSocket's dup: a socket of our own
    out = _Out(raw, transport, counters)
    files: dict[Path, int | None] = {}
    try:
        out.cork(True)
        pending: list[bytes] = []
        pending_bytes = 0
        for part in parts:
            if isinstance(part, bytes):
                pending.append(part)
                pending_bytes += len(part)
                continue
            if part.size <= COPY_REGION_BYTES and pending_bytes + part.size <= WRITE_AT_ONCE_BYTES:
                copied = _copied(part, files)
                if copied is not None:
                    counters["copied_region_bytes_total"] += len(copied)
                    pending.append(copied)
                    pending_bytes += len(copied)
                    continue
            if pending:
                await out.write(pending)
                pending = []
                pending_bytes = 0
            owed = await out.region(part, files)
            if owed:
                pending.extend(overflow_entry(owed))
        if pending:
            await out.write(pending)
        out.cork(False)
        counters["direct_sends_total"] += 1
    finally:
        for fd in files.values():
            if fd is not None:
                os.close(fd)
        raw.close()


def _copied(region: FileRegion, files: dict[Path, int | None]) -> bytes | None:
    """A small region's bytes when all are in the page cache (preadv2 RWF_NOWAIT); None when
    they are not, or the file shrank or is gone: the region then goes by `_Out.region`,
    which reads it in off the loop, or pads it."""
    fd = _opened(region.path, files)
    if fd is None:
        return None
    try:
        return nowait.pread_cached(fd, region.size, region.position)
    except (nowait.WouldWait, OSError):
        return None


def _opened(path: Path, files: dict[Path, int | None]) -> int | None:
    """`path` opened once a response (None: it is gone)."""
    fd = files.get(path, -1)
    if fd == -1:
        try:
            fd = files[path] = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            fd = files[path] = None
    return fd


class _Out:
    """One response's writes on the duplicated socket."""

    __slots__ = ("counters", "fd", "loop", "raw", "transport")

    def __init__(
        self, raw: socket.socket, transport: asyncio.BaseTransport, counters: Counter[str]
    ) -> None:
        self.raw = raw
        self.fd = raw.fileno()
        self.transport = transport
        self.counters = counters
        self.loop = asyncio.get_running_loop()

    def cork(self, on: bool) -> None:
        if self.raw.family in _TCP_FAMILIES:
            # An error here means the connection is going: the writes say so.
            with contextlib.suppress(OSError):
                self.raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, int(on))

    async def write(self, buffers: list[bytes]) -> None:
        """All of `buffers`, in order."""
        views: list[bytes | memoryview] = list(buffers)
        while views:
            try:
                n = os.writev(self.fd, views[:IOV_MAX])
            except BlockingIOError:
                await self.room()
                continue
            views = _after(views, n)

    async def region(self, region: FileRegion, files: dict[Path, int | None]) -> int:
        """Send `region` from its file; the bytes it still owes where the file ended early."""
        fd = _opened(region.path, files)
        sent = 0
        if fd is not None:
            position, size = region.position, region.size
            if not nowait.all_cached(fd, position, size):
                # sendfile would wait on the disk on the loop: read it in first.
                self.counters["sendfile_reads_off_loop_total"] += 1
                await asyncio.to_thread(nowait.read_into_cache, fd, position, size)
            while sent < size:
                try:
                    n = os.sendfile(self.fd, fd, position + sent, size - sent)
                except BlockingIOError:
                    await self.room()
                    continue
                if n == 0:  # the file ends here
                    break
                sent += n
        self.counters["sendfile_bytes_total"] += sent
        if sent < region.size:
            self.counters["short_regions_total"] += 1
        return region.size - sent

    async def room(self) -> None:
        """Wait until the socket takes more; ConnectionResetError if the transport closed
        meanwhile (its connection is over)."""
        self.counters["send_waits_total"] += 1
        ready: asyncio.Future[None] = self.loop.create_future()
        self.loop.add_writer(self.fd, _done, ready)
        try:
            await ready
        finally:
            self.loop.remove_writer(self.fd)
        if self.transport.is_closing():
            raise ConnectionResetError("the connection closed while its response was sent")


def _done(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


def _after(views: list[bytes | memoryview], n: int) -> list[bytes | memoryview]:
    """What is left of `views` once their first `n` bytes are written."""
    for i, view in enumerate(views):
        if n < len(view):
            rest = views[i:]
            if n:
                rest[0] = memoryview(view)[n:]
            return rest
        n -= len(view)
    return []
