"""Reading a partition's records back from the bucket: what `serve` answers below the local
log start (Kafka's RemoteLogManager.read, KIP-405).

Rules:
- Blocking (boto3): called on serve's remote-read threads, never on the event loop.
- A read at `offset` reads from the archived segment holding the first offset >= `offset`
  (a gap in the archive, left by local retention before the archive was turned on, is
  skipped as a compacted range is), from the batch holding `offset` on: its position comes
  from the segment's `.index`, then batches that end below `offset` are stepped over. A
  read never crosses a segment, returns whole batches only, and at most `max_bytes` of
  them -- except the first batch when `min_one` (KIP-74), or a cut-off first batch when
  the caller has a hard limit (Fetch v0-v2), as local reads do.
- Bytes come through the read cache (read_cache.py): indexes whole, `.log` objects by
  aligned chunks, each chunk one ranged GET.
- The manifest of a partition is read once and kept; it is read again when an offset is
  asked that it does not cover, at most every `manifest_refresh_ms` (uploads add
  segments at its end; remote retention moves its start).
- An archive of another topic id than the local partition's (a topic deleted and created
  again) is not read: None, as for an offset the archive does not hold.
- A search by timestamp (ListOffsets, Kafka's RemoteLogManager.findOffsetByTimestamp) goes
  through the archived segments in offset order, from the first whose largest timestamp
  reaches the target: its `.timeindex` says where to start, its `.index` at which byte,
  batch headers which batches to open, and inside a batch the records decide (a batch
  reaching the target may begin with older records), as local segments do. Only records
  at or past the archive's log start and below `below` (the local log start: what the
  local log holds, it answers itself) are answered.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from replicad.archive.manifest import (
    ArchivedSegment,
    Manifest,
    decode_manifest,
    manifest_key,
    partition_prefix,
    segment_key,
)
from replicad.archive.read_cache import CHUNK_BYTES, WHOLE, ReadCache
from replicad.archive.store import ObjectStore
from replicad.log.index import OffsetIndex, TimeIndex, TimestampOffset
from replicad.log.layout import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from replicad.records.batch import RECORD_BATCH_OVERHEAD, BatchHeader, header_at, scan_batches
from replicad.types import TopicPartition

MANIFEST_REFRESH_MS = 1_000


class RemoteRecords(bytes):
    """Records read from the bucket, answered as they are (a Fetch answer's records: bytes
    where a local read has a file region; `size` as a FileRegion has)."""

    @property
    def size(self) -> int:
        return len(self)


@dataclass(frozen=True, slots=True)
class RemoteRead:
    records: RemoteRecords  # empty when the allowance takes not even the first batch
    segment: ArchivedSegment
    log_start_offset: int  # the archive's


@dataclass(slots=True)
class _Known:
    manifest: Manifest | None
    read_at_ms: int


@dataclass
class RemoteLog:
    store: ObjectStore
    cache: ReadCache
    manifest_refresh_ms: int = MANIFEST_REFRESH_MS
    _manifests: dict[TopicPartition, _Known] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def prefix(self) -> str:
        return self.store.settings.prefix

    # -- manifests ----------------------------------------------------------------------------

    def manifest(
        self, tp: TopicPartition, *, now_ms: int, covering: int | None = None
    ) -> Manifest | None:
        """The partition's manifest (None: nothing archived), read again when it is older
        than `manifest_refresh_ms` and does not cover offset `covering` (or when
        `covering` is None)."""
        with self._lock:
            known = self._manifests.get(tp)
        if known is not None and (
            now_ms - known.read_at_ms < self.manifest_refresh_ms
            or (covering is not None and _covers(known.manifest, covering))
        ):
            return known.manifest
        key = manifest_key(self.prefix, tp)
        data = self.store.get(key)
        directory = partition_prefix(self.prefix, tp)
        manifest = (
            None
            if data is None
            else decode_manifest(
                data,
                source=f"s3://{self.store.settings.bucket}/{key}",
                # Chunks are never rewritten: through the cache, read once while it holds them.
                read=lambda name: self._whole_or_none(directory + name),
            )
        )
        with self._lock:
            self._manifests[tp] = _Known(manifest, now_ms)
        return manifest

    def known_manifest(self, tp: TopicPartition) -> Manifest | None:
        """The manifest read last, without asking the bucket (None: none read yet)."""
        with self._lock:
            known = self._manifests.get(tp)
        return known.manifest if known is not None else None

    def forget(self, tp: TopicPartition) -> None:
        """The manifest is read again at the next read (an object it named is gone: remote
        retention deleted it since)."""
        with self._lock:
            self._manifests.pop(tp, None)

    # -- records ------------------------------------------------------------------------------

    def read(
        self,
        tp: TopicPartition,
        offset: int,
        max_bytes: int,
        *,
        min_one: bool,
        hard_limit: bool = False,
        topic_id: str | None = None,
        now_ms: int,
    ) -> RemoteRead | None:
        """The batches from `offset` on (see the module rules); None when the archive does
        not hold `offset`."""
        manifest = self.manifest(tp, now_ms=now_ms, covering=offset)
        if manifest is None or not _covers(manifest, offset):
            return None
        if topic_id is not None and manifest.topic_id != topic_id:
            return None
        segments = manifest.segments
        segment = segments[bisect.bisect_right([s.next_offset for s in segments], offset)]
        log_key = segment_key(self.prefix, tp, manifest.topic_id, segment.base_offset, LOG_SUFFIX)
        position = 0
        if offset > segment.base_offset:
            index_key = segment_key(
                self.prefix, tp, manifest.topic_id, segment.base_offset, INDEX_SUFFIX
            )
            index = self._whole(index_key)
            position = OffsetIndex(segment.base_offset, len(index), index).lookup(offset).position
        start = manifest.log_start_offset
        for head in self._headers(log_key, segment, position):
            if head.last_offset >= offset:
                position = head.position
                break
        else:
            return RemoteRead(RemoteRecords(), segment, start)
        left = segment.size - position
        first = min(head.size, left)
        if max_bytes < first and not min_one:
            if hard_limit and max_bytes > 0:
                return RemoteRead(
                    RemoteRecords(self._range(log_key, segment.size, position, max_bytes)),
                    segment,
                    start,
                )
            return RemoteRead(RemoteRecords(), segment, start)
        data = self._range(log_key, segment.size, position, min(max(max_bytes, first), left))
        whole = scan_batches(data, verify_crc=False).valid_bytes
        return RemoteRead(RemoteRecords(data[:whole]), segment, start)

    def blocks_from(
        self, tp: TopicPartition, offset: int, *, now_ms: int, max_bytes: int
    ) -> Iterator[bytes]:
        """Whole batches of the archive from `offset` on, a chunk at a time, `max_bytes` at
        most in all (for a scan, e.g. for a transaction's marker)."""
        read_so_far = 0
        while read_so_far < max_bytes:
            read = self.read(tp, offset, CHUNK_BYTES, min_one=True, now_ms=now_ms)
            if read is None:
                return
            if not read.records:
                offset = read.segment.next_offset
                continue
            read_so_far += len(read.records)
            yield read.records
            last = scan_batches(read.records, verify_crc=False).next_offset
            offset = read.segment.next_offset if last is None else last

    # -- by timestamp -----------------------------------------------------------------------

    def offset_for_timestamp(
        self, tp: TopicPartition, manifest: Manifest, timestamp: int, *, below: int
    ) -> TimestampOffset | None:
        """The first archived record at or past the archive's log start and below `below`
        whose timestamp is >= `timestamp` (see the module rules); None when there is none."""
        start = manifest.log_start_offset
        for segment in manifest.segments:
            if segment.base_offset >= below:
                break
            if segment.next_offset <= start or segment.max_timestamp < timestamp:
                continue
            found = self._find_in_segment(tp, manifest, segment, timestamp, start)
            if found is not None:
                return found if found.offset < below else None
        return None

    def max_timestamp(self, manifest: Manifest, *, below: int) -> int:
        """The largest timestamp of the archived segments starting below `below` (-1: none)."""
        return max(
            (
                s.max_timestamp
                for s in manifest.segments
                if s.base_offset < below and s.next_offset > manifest.log_start_offset
            ),
            default=-1,
        )

    def _find_in_segment(
        self,
        tp: TopicPartition,
        manifest: Manifest,
        segment: ArchivedSegment,
        timestamp: int,
        start: int,
    ) -> TimestampOffset | None:
        from replicad.records.records import first_record_at  # only for searches by time

        base = segment.base_offset
        key = segment_key(self.prefix, tp, manifest.topic_id, base, TIME_INDEX_SUFFIX)
        time_index = self._whole(key)
        entry = TimeIndex(base, len(time_index), time_index).lookup(timestamp)
        index = self._whole(segment_key(self.prefix, tp, manifest.topic_id, base, INDEX_SUFFIX))
        from_offset = max(entry.offset, start)
        position = OffsetIndex(base, len(index), index).lookup(from_offset).position
        log_key = segment_key(self.prefix, tp, manifest.topic_id, base, LOG_SUFFIX)
        for head in self._headers(log_key, segment, position):
            if head.max_timestamp >= timestamp and head.last_offset >= start:
                data = self._range(log_key, segment.size, head.position, head.size)
                record = first_record_at(data, head, timestamp, start)
                if record is not None:
                    return TimestampOffset(record.timestamp, record.offset)
        return None

    def _headers(
        self, log_key: str, segment: ArchivedSegment, position: int
    ) -> Iterator[BatchHeader]:
        """The headers of the segment's batches from `position` on, each read alone (a
        range of the object, through the cache); ValueError for bytes that are none."""
        while position < segment.size:
            head = header_at(
                self._range(log_key, segment.size, position, RECORD_BATCH_OVERHEAD), position
            )
            if isinstance(head, str):
                raise ValueError(f"s3://{self.store.settings.bucket}/{log_key}: {head}")
            yield head
            position = head.end_position

    # -- bytes through the cache ----------------------------------------------------------

    def _whole(self, key: str) -> bytes:
        cached = self.cache.get((key, WHOLE))
        if cached is not None:
            return cached
        data = self.store.get(key)
        if data is None:
            raise FileNotFoundError(f"s3://{self.store.settings.bucket}/{key}")
        self.cache.put((key, WHOLE), data)
        return data

    def _whole_or_none(self, key: str) -> bytes | None:
        try:
            return self._whole(key)
        except FileNotFoundError:
            return None

    def _range(self, key: str, object_size: int, start: int, length: int) -> bytes:
        """Bytes [start, start + length) of an object of `object_size` bytes, by chunks."""
        end = min(start + length, object_size)
        pieces = []
        for chunk in range(
            start // CHUNK_BYTES, (end - 1) // CHUNK_BYTES + 1 if end > start else 0
        ):
            data = self.cache.get((key, chunk))
            if data is None:
                at = chunk * CHUNK_BYTES
                data = self.store.get_range(key, at, min(CHUNK_BYTES, object_size - at))
                self.cache.put((key, chunk), data)
            lo = max(start - chunk * CHUNK_BYTES, 0)
            hi = min(end - chunk * CHUNK_BYTES, len(data))
            pieces.append(data[lo:hi])
        return b"".join(pieces)


def _covers(manifest: Manifest | None, offset: int) -> bool:
    end = manifest.end_offset if manifest is not None else None
    return manifest is not None and end is not None and manifest.log_start_offset <= offset < end
