"""The bytes of the bucket that `serve` read last, kept in memory up to a bound.

Rules:
- Entries are whole objects (manifests' segments' `.index`) or aligned chunks of a
  segment's `.log` (`CHUNK_BYTES` each, the last one shorter), keyed by the object's key
  and the chunk's number: a consumer reading a segment from its start asks the bucket once
  per chunk, and the next consumer of the same range asks it nothing.
- The bound is on the bytes held (`max_bytes`, `archive.read_cache_bytes`): adding past it
  drops the least recently used entries first. An entry larger than the whole bound is
  not kept (the reader uses it once). A bound of 0 keeps nothing.
- Keys name immutable objects (archive keys follow from topic id, partition and base
  offset and are never overwritten with other bytes), so an entry never goes stale.
- Safe to share between the reading threads: one lock around the map, never held while
  the bucket is asked.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

# One ranged GET a chunk: 4 MiB is about what a consumer asks a partition for in four
# fetches (max.partition.fetch.bytes is 1 MiB), and 256 GETs a GiB read.
CHUNK_BYTES = 4 * 1024 * 1024

CacheKey = tuple[str, int]  # (object key, chunk number; -1 for a whole object)
WHOLE = -1


@dataclass(frozen=True, slots=True)
class CacheStats:
    held_bytes: int
    entries: int
    hits: int
    misses: int
    evicted_bytes: int


class ReadCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[CacheKey, bytes] = OrderedDict()
        self._held = 0
        self._hits = 0
        self._misses = 0
        self._evicted = 0
        self._lock = threading.Lock()

    def get(self, key: CacheKey) -> bytes | None:
        with self._lock:
            data = self._entries.get(key)
            if data is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return data

    def put(self, key: CacheKey, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._held -= len(old)
            self._entries[key] = data
            self._held += len(data)
            while self._held > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._held -= len(dropped)
                self._evicted += len(dropped)

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                self._held, len(self._entries), self._hits, self._misses, self._evicted
            )
