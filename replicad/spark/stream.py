"""`spark.readStream.format("replicad")`: Structured Streaming over the replica (the shell).

    spark.readStream.format("replicad").option("maxOffsetsPerTrigger", 10000)
        .load("/var/lib/replicad/data")

What it does where:
- The driver's stream reader (one Python process for the query's lifetime) looks at the
  data directory for every micro-batch: the high watermarks from
  `replication-offset-checkpoint` (written by `replicad run` with every checkpoint, and every
  `high_watermark_interval_ms` between them when set: everything below is in the segment
  files and committed at the source; after a machine crash the follower fetches an unflushed
  tail again, the same records at the same offsets), the log starts, the segment listing,
  and with read_committed the last stable offset (stable.py). How soon a record reaches the
  stream is bounded by how often that file is written.
  admission.py decides the batch's end offsets; the batch planner (catalog.py, plan.py)
  turns [start, end) of each partition into splits, as for a batch read.
- One look per micro-batch: `partitions()` plans the batch `latestOffset` just chose from
  the look that chose it (its listing covers the end it returned, since the high watermarks
  are read before the listing), and the offset indexes that look read (byte limits,
  read_committed) are read once (catalog.Planner's `remember_bytes`). A batch planned
  without that look (a restart replaying the last batch) looks afresh. Segments retention
  deletes meanwhile are met by the read, as any read after planning meets them.
- One look at the query's start: prepareForTriggerAvailableNow, initialOffset and the first
  latestOffset (and a reportLatestOffset before it) share it, unless read_committed's last
  stable offsets were looked for from elsewhere than the first batch's start.
- The executors read the splits with the batch reader (reader.py): same decoding, pruning
  by the offset index, read_committed visibility.
- Replaying a batch after a crash plans the same offsets again: the records are the same,
  so Spark's file sink writes each once (its own commit log decides which batch is new).
- A directory without `replication-offset-checkpoint` is refused: nothing says which of its
  records are safe to stream.
- An archive bucket (`s3://bucket/prefix`, replicad/archive) streams too: its manifests give
  each partition's segments, log start and end (every archived segment went up wholly
  below the high watermark), read again for every micro-batch; the bucket trails the
  replica by about `log.segment_ms`.

Data loss (admission.py's rules) is raised as DataLossError with one line, or, with
failOnDataLoss=false, logged (logger `replicad.spark.stream`) and counted in
`lost_offsets`. A partition whose readable end is below the stream's position is only
called truncated if this reader saw it further before; otherwise (startingOffsets ahead of
the replica, as after a failover from a source that was ahead) the stream waits for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from replicad.archive.store import is_bucket_url
from replicad.errors import LogError
from replicad.log.checkpoint import parse_offsets
from replicad.log.layout import REPLICATION_OFFSET_CHECKPOINT
from replicad.spark.admission import (
    Available,
    DataLoss,
    Limits,
    Offsets,
    TriggerDelay,
    from_json,
    next_ends,
    pending,
    start_of,
    to_json,
    truncation,
)
from replicad.spark.catalog import (
    Planner,
    archived_with_ends,
    list_partitions,
    log_start_offsets,
    opener_for,
)
from replicad.spark.files import FileOpener
from replicad.spark.options import EARLIEST, LATEST, Isolation, StreamOptions
from replicad.spark.plan import PartitionFiles, Split, pack
from replicad.spark.stable import last_stable_offset
from replicad.types import TopicPartition

log = logging.getLogger("replicad.spark.stream")


class DataLossError(LogError):
    """Offsets the stream has not read are gone (failOnDataLoss=true)."""


# A micro-batch's splits are read together, one task for up to this many bytes (plan.pack
# says why): a micro-batch of a few hundred records is one task, not one per partition.
PACK_BYTES = 16 * 1024 * 1024
# Offset indexes kept from one look at the directory to the next (catalog.Planner): the
# entries of the segments a micro-batch spans, read when choosing its end and again when
# planning it.
REMEMBERED_INDEX_BYTES = 32 * 1024 * 1024


class StreamSplit(InputPartition):
    """Splits of a micro-batch read by one task (pickled to the executor that reads them)."""

    def __init__(self, splits: tuple[Split, ...]) -> None:
        super().__init__(splits)
        self.splits = splits


def high_watermarks(data_dir: str) -> dict[TopicPartition, int]:
    if is_bucket_url(data_dir):
        raise LogError(f"{data_dir}: an archive bucket has no high watermark file (manifests)")
    path = Path(data_dir) / REPLICATION_OFFSET_CHECKPOINT
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LogError(
            f"{data_dir}: no {REPLICATION_OFFSET_CHECKPOINT}, so no high watermark says which "
            f"records are safe to stream (is this a data directory of `replicad run`?)"
        ) from None
    return parse_offsets(text, source=str(path))


@dataclass(frozen=True, slots=True)
class Look:
    """One look at the data directory; with read_committed, `stable_from` says where each
    partition's last stable offset was looked for from (empty without it)."""

    files: dict[TopicPartition, PartitionFiles]
    available: dict[TopicPartition, Available]
    stable_from: dict[TopicPartition, int] = field(default_factory=dict)

    def serves(self, begins: Offsets | None) -> bool:
        """Whether a look from `begins` would have found the same last stable offsets: it
        would look for them from the same places (always, without read_committed)."""
        for tp, looked_from in self.stable_from.items():
            log_start = self.available[tp].log_start
            if max((begins or {}).get(tp, log_start), log_start) != looked_from:
                return False
        return True


class ReplicadStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: StreamOptions) -> None:
        self.options = options
        self.read_options = options.read
        self.limits = Limits(
            max_offsets=options.max_offsets_per_trigger,
            min_offsets=options.min_offsets_per_trigger,
            max_trigger_delay_ms=options.max_trigger_delay_ms,
            max_bytes=options.max_bytes_per_trigger,
        )
        self.planner = Planner(options.read, remember_bytes=REMEMBERED_INDEX_BYTES)
        self.delay = TriggerDelay()
        self.target: Offsets | None = None  # Trigger.AvailableNow's ceiling
        self.seen_end: Offsets = {}  # the highest readable end seen per partition
        self.last_available: Offsets | None = None
        self.lost_offsets = 0
        # The end latestOffset last chose and the look it chose it from: partitions() of
        # that batch plans from the same look.
        self.chosen: tuple[Offsets, Look] | None = None
        # The query's start (below, `_look_at_start`) until its first latestOffset.
        self.starting = True
        self.start_look: Look | None = None

    # -- looking at the replica ------------------------------------------------------------

    def look(self, begins: Offsets | None = None, *, stable: bool = True) -> Look:
        """Listing, log starts and readable ends; the last stable offsets (read_committed)
        are looked for from `begins` (else the log start), unless `stable` is False."""
        data_dir = self.read_options.data_dir
        self.planner.forget()  # indexes of the last look: their segments may have changed
        if is_bucket_url(data_dir):
            # An archive: its manifests give the segments, log starts and ends at once.
            archived = archived_with_ends(self.read_options)
            listed = [files for files, _, _ in archived]
            starts = {files.topic_partition: start for files, start, _ in archived}
            hws = {files.topic_partition: end for files, _, end in archived}
        else:
            hws = high_watermarks(data_dir)  # before the listing: the listing then covers it
            starts = log_start_offsets(data_dir)
            listed = list_partitions(self.read_options)
        files: dict[TopicPartition, PartitionFiles] = {}
        available: dict[TopicPartition, Available] = {}
        stable_from: dict[TopicPartition, int] = {}
        for found in listed:
            tp = found.topic_partition
            first = found.segments[0].base_offset if found.segments else 0
            log_start = max(first, starts.get(tp, 0))
            end = max(hws.get(tp, log_start), log_start)
            committed = self.read_options.isolation is Isolation.READ_COMMITTED
            if committed and stable and found.segments:
                begin = max((begins or {}).get(tp, log_start), log_start)
                stable_from[tp] = begin
                if begin < end:
                    splits = self.planner.splits(found, begin, end)
                    end = last_stable_offset(splits, begin, end, self.planner._opener)
            files[tp] = found
            available[tp] = Available(log_start, end)
        return Look(files, available, stable_from)

    def _look_at_start(self, begins: Offsets | None = None) -> Look:
        """One look serves the query's start: prepareForTriggerAvailableNow, initialOffset,
        a reportLatestOffset before any batch, and the first latestOffset, which Spark calls
        one after the other before the first micro-batch. Each looked afresh before: four
        listings of the directory for an AvailableNow query (with the last latestOffset's),
        and with read_committed three walks of every partition's headers from its log start
        before reading it. Using the look of a moment before is what a replica that did not
        change in that moment gives; a look that searched for the last stable offsets from
        elsewhere than `begins` would is not used (Look.serves)."""
        if self.start_look is not None and self.start_look.serves(begins):
            return self.start_look
        self.start_look = self.look(begins)
        return self.start_look

    def lost(self, loss: DataLoss) -> None:
        if self.options.fail_on_data_loss:
            raise DataLossError(loss.line())
        self.lost_offsets += loss.count
        log.warning("%s (%d offsets skipped so far)", loss.line(), self.lost_offsets)

    # -- Spark's calls ---------------------------------------------------------------------

    def initialOffset(self) -> dict:
        look = self._look_at_start()
        offsets: Offsets = {}
        for tp, available in look.available.items():
            offsets[tp] = self._initial(look.files[tp], available)
        return to_json(offsets)

    def _initial(self, files: PartitionFiles, available: Available) -> int:
        timestamp = self.read_options.starting_timestamp
        if timestamp is not None:
            found = self.planner.offset_for_timestamp(files, timestamp, available.log_start)
            return available.end if found is None else min(found, available.end)
        wanted = self.read_options.starting_offsets.for_partition(files.topic_partition)
        if wanted == EARLIEST:
            return available.log_start
        if wanted == LATEST:
            return available.end
        return wanted

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.limits.max_offsets is not None:
            return ReadMaxRows(self.limits.max_offsets)
        if self.limits.max_bytes is not None:
            return ReadMaxBytes(self.limits.max_bytes)
        if self.limits.min_offsets is not None:
            return ReadMinRows(self.limits.min_offsets)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {tp: a.end for tp, a in self._at_start().available.items()}

    def reportLatestOffset(self) -> dict | None:
        if self.last_available is None:
            self.last_available = {tp: a.end for tp, a in self._at_start().available.items()}
        return to_json(self.last_available)

    def _at_start(self) -> Look:
        return self._look_at_start() if self.starting else self.look()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        starts = from_json(start)
        self.chosen = None
        look = self._look_at_start(starts) if self.starting else self.look(starts)
        self.starting, self.start_look = False, None
        self.last_available = {tp: a.end for tp, a in look.available.items()}
        begins: Offsets = {}
        ends: Offsets = {}
        for tp, available in look.available.items():
            if self.target is not None and tp not in self.target:
                continue  # joined after this Trigger.AvailableNow run began
            begin, _ = start_of(tp, starts, available, joined=tp not in starts)
            end = available.end
            if end < begin:
                if self.seen_end.get(tp, end) > end:
                    loss = truncation(tp, begin, available)
                    assert loss is not None
                    self.lost(loss)
                    begin = end  # failOnDataLoss=false: on from the new end
                else:
                    end = begin  # the replica has not reached the stream's position yet
            self.seen_end[tp] = max(self.seen_end.get(tp, end), end)
            if self.target is not None:
                end = min(end, max(self.target[tp], begin))
            begins[tp], ends[tp] = begin, end
        now_ms = time.monotonic_ns() // 1_000_000
        limits = None if isinstance(limit, ReadAllAvailable) else self.limits
        waits_for_minimum = limits is not None and self.target is None
        if waits_for_minimum and not self.delay.admits(pending(begins, ends), self.limits, now_ms):
            return start
        chosen = next_ends(
            begins,
            ends,
            limits,
            offset_after_bytes=lambda tp, at, n: self._offset_after_bytes(look, tp, at, n),
            bytes_between=lambda tp, a, b: self.planner.bytes_between(look.files[tp], a, b),
        )
        if any(chosen[tp] != starts.get(tp) for tp in chosen):
            self.delay.batch_planned(now_ms)
        ends = {**starts, **chosen}
        self.chosen = (ends, look)
        return to_json(ends)

    def _offset_after_bytes(self, look: Look, tp: TopicPartition, at: int, budget: int) -> int:
        found = self.planner.offset_after_bytes(look.files[tp], at, budget)
        return look.available[tp].end if found is None else found

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        starts, ends = from_json(start), from_json(end)
        chosen, self.chosen = self.chosen, None
        if not ends:
            look = Look({}, {})
        elif chosen is not None and chosen[0] == ends:
            look = chosen[1]  # the look latestOffset chose this end from
        else:
            look = self.look(stable=False)
        splits: list[Split] = []
        for tp, stop in ends.items():
            files = look.files.get(tp)
            available = look.available.get(tp)
            begin, loss = start_of(tp, starts, available, joined=tp not in starts)
            if loss is not None:
                self.lost(loss)
            if files is None or stop <= begin:
                continue
            splits += self.planner.splits(files, begin, stop)
        self.planner.forget()
        return [StreamSplit(group) for group in pack(splits, PACK_BYTES)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, StreamSplit)
        opener = opener_for(self.read_options)
        for split in partition.splits:
            yield from self._read_split(split, opener)

    def _read_split(self, split: Split, opener: FileOpener) -> Iterator[pa.RecordBatch]:
        from replicad.spark.reader import read_records  # on the executors only (source.py)

        try:
            for batch in read_records(split, self.read_options, opener):
                if not self.read_options.include_headers:
                    batch = batch.drop_columns(["headers"])
                yield batch
        except FileNotFoundError:
            tp = TopicPartition(split.topic, split.partition)
            end = split.end_offset if split.end_offset is not None else split.start_offset
            reason = f"{split.path} was deleted by retention before the stream read it"
            first = max(split.start_offset, split.segment)
            self.lost(DataLoss(tp, first, max(end, first), reason))

    def commit(self, end: dict) -> None:
        """Nothing to release: the replica's retention does not wait for streams."""
