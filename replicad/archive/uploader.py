"""The uploader: rolled segments of the local log copied to the bucket, off the event loop.

Rules (the decisions are uploads.py's; this shell reads files and talks to the bucket):
- A round's partitions are shared by `upload_threads` threads of the uploader's own
  (bounded concurrency: that many uploads in flight, each partition on one thread at a
  time, its segments in order; bounded memory: a segment is streamed from its file in
  store.BLOCK_BYTES blocks, so about two blocks a thread, whatever the segment size). The
  event loop only schedules a round every `interval_ms` and never waits on the bucket;
  replication never waits for it.
- A partition's manifest is read from the bucket once (first round), then kept: this
  uploader is its only writer. A segment goes up as .log, .index, .timeindex, then the
  chunk the new manifest seals (one every CHUNK_SEGMENTS segments), then the new manifest
  naming it; a crash anywhere in between leaves objects no manifest names yet, which the
  next run writes again under the same keys (manifest.py's rules). The manifest written
  for each segment stays bounded (manifest.py), so its PUT costs the same at the
  millionth segment as at the first.
- The partition's `archive_floor` (local retention's hold) follows the manifest: it rises
  only after the manifest naming a segment is written, so a segment is deleted locally
  only once the bucket has it.
- A partition whose records are all committed but whose active segment is older than
  `log.segment_ms` is rolled (PartitionLog.roll_if_idle): Kafka rolls only on an append,
  and the bucket should trail the log by a bounded time even when the source goes quiet.
- After its uploads, a partition's remote retention runs (uploads.py's rules): the manifest
  without the expired segments is written, then their objects deleted. The first round of
  a partition with remote retention on deletes the objects below the manifest's first
  segment that a crash between the two left behind (one LIST of the partition).
- A failure (bucket down, 503 SlowDown, a timeout, a file changed under us, a manifest in
  the bucket that does not decode) is counted, logged (rate-limited by the backoff), kept
  in the status, and the partition is tried again after its backoff; nothing is skipped,
  and the other partitions go on.
- Credentials are never logged: errors name the bucket, key and the server's error code.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import structlog

from replicad.archive.manifest import (
    SEGMENT_SUFFIXES,
    ArchivedSegment,
    Manifest,
    chunk_name,
    chunk_writes,
    decode_manifest,
    dropped_chunks,
    manifest_key,
    partition_prefix,
    segment_key,
    segments_prefix,
)
from replicad.archive.store import ArchiveError, BucketSettings, ObjectStore
from replicad.archive.uploads import (
    Backoff,
    LocalSegment,
    remote_expired,
    retention_floor,
    to_upload,
)
from replicad.clock import wall_ms
from replicad.config.model import ArchiveConfig, defaults_of
from replicad.errors import LogError
from replicad.log.checkpoint import kafka_uuid
from replicad.log.layout import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from replicad.log.manager import LogManager
from replicad.log.partition import PartitionLog
from replicad.log.segment import LogSegment
from replicad.types import TopicPartition

log = structlog.get_logger("replicad.archive")
_ARCHIVE = defaults_of(ArchiveConfig)


@dataclass(frozen=True, slots=True)
class ArchiverSettings:
    """The uploader's settings (`from_config`); the defaults of those `archive:` sets are
    its own, written there only."""

    bucket: BucketSettings
    interval_ms: int = _ARCHIVE["interval_ms"]
    retry_backoff_ms: int = _ARCHIVE["retry_backoff_ms"]
    retry_backoff_max_ms: int = _ARCHIVE["retry_backoff_max_ms"]
    retention_ms: int = _ARCHIVE["retention_ms"]
    retention_bytes: int = _ARCHIVE["retention_bytes"]
    upload_threads: int = _ARCHIVE["upload_threads"]

    @classmethod
    def from_config(cls, archive: ArchiveConfig) -> ArchiverSettings:
        secret = archive.secret_access_key
        timeout_s = archive.request_timeout_ms / 1000
        return cls(
            BucketSettings(
                bucket=archive.bucket,
                prefix=archive.prefix,
                endpoint=archive.endpoint,
                region=archive.region,
                access_key_id=archive.access_key_id,
                secret_access_key=secret.reveal() if secret is not None else None,
                path_style=archive.path_style,
                connect_timeout_s=timeout_s,
                read_timeout_s=timeout_s,
                max_attempts=1,  # retried by the uploader's back-off, counted
                payload_signing=archive.payload_signing,
                upload_crc32c=archive.upload_crc32c,
            ),
            interval_ms=archive.interval_ms,
            retry_backoff_ms=archive.retry_backoff_ms,
            retry_backoff_max_ms=archive.retry_backoff_max_ms,
            retention_ms=archive.retention_ms,
            retention_bytes=archive.retention_bytes,
            upload_threads=archive.upload_threads,
        )


@dataclass(slots=True)
class _Partition:
    backoff: Backoff
    manifest: Manifest | None = None  # None: not read from the bucket yet
    pending: int = 0
    last_error: str | None = None
    swept: bool = False  # leftovers of a deletion looked for (remote retention on)


@dataclass(slots=True)
class _Totals:
    uploaded_segments: int = 0
    uploaded_bytes: int = 0
    failures: int = 0
    rounds: int = 0
    last_error: str | None = None
    last_error_ms: int | None = None
    last_upload_ms: int | None = None
    deleted_segments: int = 0
    deleted_bytes: int = 0
    # The uploading threads add to these at once.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


@dataclass
class Archiver:
    settings: ArchiverSettings
    store: ObjectStore | None = None  # made on the uploader's thread at first use
    _partitions: dict[TopicPartition, _Partition] = field(default_factory=dict)
    _totals: _Totals = field(default_factory=_Totals)
    _stopping: threading.Event = field(default_factory=threading.Event)

    # -- the round (runs on the uploader's thread) -----------------------------------------

    def round(self, logs: LogManager, now_ms: int | None = None) -> int:
        """Uploads what is due in every partition; the number of segments uploaded."""
        if self.store is None:
            self.store = ObjectStore(self.settings.bucket)
        self._totals.rounds += 1
        plogs = list(logs.partitions().values())
        for plog in plogs:  # made here, so that the threads only read the dict
            if plog.topic_partition not in self._partitions:
                s = self.settings
                self._partitions[plog.topic_partition] = _Partition(
                    Backoff(s.retry_backoff_ms, s.retry_backoff_max_ms)
                )

        def partition_round(plog: PartitionLog) -> int:
            if self._stopping.is_set():
                return 0
            return self._partition_round(plog, wall_ms() if now_ms is None else now_ms)

        threads = min(self.settings.upload_threads, len(plogs))
        if threads <= 1:
            return sum(map(partition_round, plogs))
        # Partitions are taken by whichever thread is free, so one with a long backlog
        # holds one thread, not the others' uploads.
        with ThreadPoolExecutor(threads, thread_name_prefix="archive-upload") as pool:
            return sum(pool.map(partition_round, plogs))

    def _partition_round(self, plog: PartitionLog, now_ms: int) -> int:
        tp = plog.topic_partition
        state = self._partitions[tp]
        if plog.topic_id is None or not state.backoff.ready(now_ms):
            return 0
        uploaded = 0
        try:
            topic_id = kafka_uuid(plog.topic_id)
            if state.manifest is None or state.manifest.topic_id != topic_id:
                state.manifest = self._read_manifest(tp, topic_id)
            plog.archive_floor = retention_floor(state.manifest.end_offset)
            if plog.high_watermark >= plog.log_end_offset:
                # Everything is committed: a quiet partition's last records go up too.
                plog.roll_if_idle(now_ms)
            segments = plog.segments
            local = [
                LocalSegment(
                    s.base_offset,
                    segments[i + 1].base_offset if i + 1 < len(segments) else s.base_offset,
                    s.size,
                    -1,
                )
                for i, s in enumerate(segments)
            ]
            due = to_upload(state.manifest.end_offset, local, plog.high_watermark)
            state.pending = len(due)
            by_base = {s.base_offset: s for s in segments}
            for segment in due:
                if self._stopping.is_set():
                    break
                segment_files = by_base[segment.base_offset]
                state.manifest = self._upload(plog, state.manifest, segment_files, segment)
                plog.archive_floor = retention_floor(state.manifest.end_offset)
                state.pending -= 1
                uploaded += 1
            if self._retention_on:
                if not state.swept:
                    self._sweep(tp, state.manifest)
                    state.swept = True
                state.manifest = self._expire(tp, state.manifest, now_ms)
            state.backoff.succeeded()
            state.last_error = None
        except (ArchiveError, LogError, OSError) as error:
            # LogError: a manifest in the bucket this replicad cannot read (damaged without
            # a checksum, another version's, edited by hand) or the local log refusing;
            # raised out of here it ended the round and the uploader's task for good.
            retry_at = state.backoff.failed(now_ms)
            state.last_error = str(error)
            with self._totals.lock:
                self._totals.failures += 1
                self._totals.last_error = str(error)
                self._totals.last_error_ms = now_ms
            log.warning(
                "archive upload failed, will retry",
                partition=str(tp),
                error=str(error),
                failures=state.backoff.failures,
                retry_in_ms=retry_at - now_ms,
            )
        return uploaded

    @property
    def _retention_on(self) -> bool:
        return self.settings.retention_ms >= 0 or self.settings.retention_bytes >= 0

    def _expire(self, tp: TopicPartition, manifest: Manifest, now_ms: int) -> Manifest:
        """Remote retention: the manifest without the expired segments, then their objects."""
        assert self.store is not None
        archived = [
            LocalSegment(s.base_offset, s.next_offset, s.size, s.max_timestamp)
            for s in manifest.segments
        ]
        s = self.settings
        count = remote_expired(archived, s.retention_ms, s.retention_bytes, now_ms)
        if count == 0:
            return manifest
        kept = manifest.without_first(count)
        prefix = s.bucket.prefix
        self.store.put_bytes(manifest_key(prefix, tp), kept.encode())
        gone = manifest.segments[:count]
        self.store.delete(
            [
                segment_key(prefix, tp, manifest.topic_id, g.base_offset, suffix)
                for g in gone
                for suffix in SEGMENT_SUFFIXES
            ]
            + [partition_prefix(prefix, tp) + name for name in dropped_chunks(manifest, kept)]
        )
        with self._totals.lock:
            self._totals.deleted_segments += count
            self._totals.deleted_bytes += sum(g.size for g in gone)
        log.info(
            "archived segments deleted by remote retention",
            partition=str(tp),
            segments=[g.base_offset for g in gone],
            log_start_offset=kept.log_start_offset,
        )
        return kept

    def _sweep(self, tp: TopicPartition, manifest: Manifest) -> None:
        """Deletes the objects below the manifest's first segment (a deletion's leftovers)."""
        assert self.store is not None
        if not manifest.segments:
            return
        first = manifest.segments[0].base_offset
        directory = segments_prefix(self.settings.bucket.prefix, tp, manifest.topic_id)
        named = {chunk_name(manifest.topic_id, c.base_offset) for c in manifest.chunks}
        below = [
            key
            for key in self.store.list_keys(directory)
            if (base := _base_of(key[len(directory) :])) is not None
            and base < first
            and f"{manifest.topic_id}/{key[len(directory) :]}" not in named
        ]
        if below:
            self.store.delete(below)
            log.info(
                "leftovers of a remote deletion deleted", partition=str(tp), objects=len(below)
            )

    def _read_manifest(self, tp: TopicPartition, topic_id: str) -> Manifest:
        assert self.store is not None
        key = manifest_key(self.settings.bucket.prefix, tp)
        data = self.store.get(key)
        if data is None:
            return Manifest(tp.topic, tp.partition, topic_id)
        directory = partition_prefix(self.settings.bucket.prefix, tp)
        manifest = decode_manifest(
            data,
            source=f"s3://{self.settings.bucket.bucket}/{key}",
            read=lambda name: self.store.get(directory + name) if self.store else None,
        )
        if manifest.topic_id != topic_id:
            raise ArchiveError(
                f"s3://{self.settings.bucket.bucket}/{key}: archives topic id "
                f"{manifest.topic_id}, but the local {tp} is topic id {topic_id} (the topic "
                "was deleted and created again): move the old archive away to archive the new one"
            )
        return manifest

    def _upload(
        self, plog: PartitionLog, manifest: Manifest, segment: LogSegment, local: LocalSegment
    ) -> Manifest:
        assert self.store is not None
        tp, prefix = plog.topic_partition, self.settings.bucket.prefix
        paths = {
            LOG_SUFFIX: segment.log_path,
            INDEX_SUFFIX: segment.index_path,
            TIME_INDEX_SUFFIX: segment.time_index_path,
        }
        sent = 0
        for suffix, path in paths.items():
            key = segment_key(prefix, tp, manifest.topic_id, local.base_offset, suffix)
            size = self.store.put_file(key, path)
            if suffix == LOG_SUFFIX and size != local.size:
                raise ArchiveError(
                    f"{path}: {size} bytes, not the {local.size} of the rolled segment "
                    "(truncated under the upload); it is uploaded again"
                )
            sent += size
        archived = ArchivedSegment(
            local.base_offset, local.next_offset, local.size, segment.max_timestamp.timestamp
        )
        # The archive's log start is the replica's when its first segment goes up; after
        # that, the local log start moves with local retention (which deletes only what the
        # archive holds), so it is not the archive's: the bucket still has those records.
        # (Found by the fresh-clone CI: Spark read the bucket from the local start, 1,571
        # records short, once retention ran between two uploads.)
        start = manifest.log_start_offset if manifest.segments else plog.log_start_offset
        updated = manifest.with_segment(archived, plog.epoch_entries(), start)
        for name, chunk in chunk_writes(manifest, updated):  # before the manifest naming it
            self.store.put_bytes(partition_prefix(prefix, tp) + name, chunk)
            sent += len(chunk)
        self.store.put_bytes(manifest_key(prefix, tp), updated.encode())
        with self._totals.lock:
            self._totals.uploaded_segments += 1
            self._totals.uploaded_bytes += sent
            self._totals.last_upload_ms = wall_ms()
        log.info(
            "segment archived",
            partition=str(tp),
            base_offset=local.base_offset,
            next_offset=local.next_offset,
            bytes=sent,
        )
        return updated

    # -- the shell on the event loop --------------------------------------------------------

    async def run(self, logs: Callable[[], LogManager | None], stop: asyncio.Event) -> None:
        """A round every `interval_ms` until `stop`, on the uploader's own thread."""
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="archive")
        interval_s = self.settings.interval_ms / 1000
        try:
            while not stop.is_set():
                manager = logs()
                if manager is not None:
                    await loop.run_in_executor(executor, self.round, manager)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval_s)
        finally:
            # A round in progress stops after its current request.
            self._stopping.set()
            await loop.run_in_executor(None, executor.shutdown, True)

    def snapshot(self) -> dict[str, Any]:
        t = self._totals
        states = list(self._partitions.items())  # one C call: safe beside the round
        retrying = sorted(str(tp) for tp, p in states if p.last_error)
        return {
            "bucket": self.settings.bucket.url,
            "uploaded_segments": t.uploaded_segments,
            "uploaded_bytes": t.uploaded_bytes,
            "pending_segments": sum(p.pending for _, p in states),
            "failures": t.failures,
            "retrying_partitions": retrying,
            "last_error": t.last_error,
            "last_error_ms": t.last_error_ms,
            "last_upload_ms": t.last_upload_ms,
            "deleted_segments": t.deleted_segments,
            "deleted_bytes": t.deleted_bytes,
            "requests": dict(self.store.requests) if self.store is not None else {},
        }


def _base_of(name: str) -> int | None:
    """`00000000000000000120.log` -> 120, and a chunk's `manifest-00000000000000000120.json`
    -> 120; None for another name."""
    stem, _, suffix = name.partition(".")
    if stem.startswith("manifest-") and suffix == "json":
        stem = stem.removeprefix("manifest-")
        return int(stem) if stem.isdigit() else None
    return int(stem) if stem.isdigit() and f".{suffix}" in SEGMENT_SUFFIXES else None
