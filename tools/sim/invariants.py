"""What must hold after every event of the simulation, read from the follower's real logs.

1. Lineage: each partition's local log, batch by batch, is a prefix of a log some
   leader of the same topic (by topic id) really had: every batch is one a leader wrote,
   whole and byte-identical (so none that failed its CRC), and follows the batch that
   preceded it in that leader's log (if that leader's log held one). The first batch
   may start anywhere (retention, start_from, gaps reset).
2. No gap, offsets monotone: each batch starts where the one before it ends.
3. High watermark: within [log start, log end]; it never moves back unless the log
   itself went below it (truncation, a crash losing unsynced data) or was started over.
4. The memory bound: no Fetch response is larger than fetch.buffer_memory unless a
   single batch is (KIP-74 gives one whole batch whatever the limit).
5. The memory pool shared by every leader is never overdrawn, and
6. grants in the order asked, so no leader is starved (tools/sim/memory.py).
7. A checkpoint never names a recovery point past what was fsynced (`FsyncWitness`
   watches every fsync of a segment file on its own).
8. The leader-epoch file on disk holds the epoch of every batch below the recovery point
   the checkpoint file on disk names: after a crash, loading reads those epochs from the
   file and rescans only what lies above (log/partition.py's epoch-file rules).
9. A HALTED partition was halted for a reason that was true, and keeps its log as it was
   (HALTED is final for the process: partition_phase.py). Its log is not compared with the
   leader's at the end (the halt says it cannot go on), so what the halt claimed is judged
   instead, against what the cluster really did (`judge_halt`): a gap (on_gap=halt) needs
   a leader log start that some leader really had above the local log end; another lineage
   (R8) needs a batch some leader of the topic id wrote that starts below the local log end
   and holds it; a re-created topic needs the topic's id to be another than the log's.
   Rule 1 goes on holding for its log (it was checked at every change before the halt).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replicad.errors import LogError
from replicad.log.checkpoint import parse_epochs
from replicad.log.layout import LEADER_EPOCH_CHECKPOINT
from replicad.records.batch import MAGIC_V2, ScanStop, scan_batches
from replicad.types import TopicPartition
from tools.sim.cluster import History
from tools.sim.seeds import InvariantError  # one class for every simulation (seeds.stepped)


@dataclass(frozen=True, slots=True)
class LogFacts:
    log_start: int
    log_end: int
    high_watermark: int


def local_bytes(plog) -> bytes:
    """A partition's whole log as stored: its segments' .log files, in order, each up to
    the size the log store holds it at (a deferred truncation across segments cuts the
    segment left in memory first and its file only once the removed ones' renames are
    durable: log/partition.py)."""
    out = bytearray()
    for segment in plog.segments:
        with open(segment.log_path, "rb") as f:
            out += f.read(segment.size)
    return bytes(out)


def check_lineage(tp: TopicPartition, data: bytes, topic_id, history: History) -> None:
    scan = scan_batches(memoryview(data))
    if scan.stop is not ScanStop.END:
        raise InvariantError(
            f"{tp}: local log does not scan to its end ({scan.stop}: {scan.error})"
        )
    previous: bytes | None = None
    expected: int | None = None
    for batch in scan.batches:
        raw = bytes(data[batch.position : batch.position + batch.size])
        if expected is not None and batch.base_offset != expected:
            raise InvariantError(
                f"{tp}: batch at {batch.base_offset} follows one ending at {expected} "
                "(gap or overlap)"
            )
        parent = history.parent_of(topic_id, tp.partition, raw)
        if parent is None:
            raise InvariantError(
                f"{tp}: batch at offset {batch.base_offset} was never written by a leader "
                f"of topic id {topic_id}"
            )
        # b"": the leader's log held nothing (known) before it: any predecessor that ends
        # where it starts is consistent with it.
        # Below the highest log start retention gave the leader, a replica keeps what it
        # had (log.retention -1) and the leader no longer knows what preceded its start:
        # its epoch cache begins there (as Kafka's does), so a divergence below it cannot
        # be seen, and is not asked of the follower.
        forgotten = batch.base_offset <= history.retained_to(topic_id, tp.partition)
        if previous is not None and parent and parent != previous and not forgotten:
            raise InvariantError(
                f"{tp}: batch at offset {batch.base_offset} does not follow the batch before "
                "it in any leader's log (a divergent tail kept)"
            )
        previous = raw
        expected = batch.next_offset


def batches_from(data: bytes, offset: int) -> bytes:
    """The bytes of the batches starting at or after `offset`."""
    scan = scan_batches(memoryview(data))
    first = next((b.position for b in scan.batches if b.base_offset >= offset), len(data))
    return data[first:]


def judge_halt(
    tp: TopicPartition, reason: str, plog: Any, topics: Mapping, history: History
) -> None:
    """Rule 9: the reason a partition was halted for, against the cluster's history."""
    end = plog.log_end_offset
    if reason.startswith("gap:"):
        if history.retained_to(plog.topic_id, tp.partition) <= end:
            raise InvariantError(
                f"{tp}: halted ({reason}), but no leader's log ever started above the local "
                f"log end {end} (retention and DeleteRecords moved it to at most "
                f"{history.retained_to(plog.topic_id, tp.partition)})"
            )
    elif reason.startswith("another lineage:"):
        if not any(
            b.base_offset < end < b.next_offset
            for data in history.parents.get((plog.topic_id, tp.partition), {})
            for b in scan_batches(memoryview(data)).batches
        ):
            raise InvariantError(
                f"{tp}: halted ({reason}), but no leader of topic id {plog.topic_id} ever "
                f"wrote a batch that starts below the local log end {end} and holds it"
            )
    elif reason.startswith(("topic recreated", "topic re-created")):
        if topics.get(tp.topic) == plog.topic_id:
            raise InvariantError(
                f"{tp}: halted ({reason}), but the topic's id is still the log's ({plog.topic_id})"
            )
    else:
        raise InvariantError(f"{tp}: halted for a reason the simulation cannot judge: {reason}")


class HighWatermarkWatch:
    """Rule 3, across events: remembers each partition's last facts and the lowest log end
    seen since (the shell reports every change)."""

    def __init__(self) -> None:
        self.last: dict[TopicPartition, LogFacts] = {}
        self.low_end: dict[TopicPartition, int] = {}
        self.restarted_at: dict[TopicPartition, int] = {}

    def saw_end(self, tp: TopicPartition, log_end: int, log_start: int) -> None:
        low = self.low_end.get(tp)
        self.low_end[tp] = log_end if low is None else min(low, log_end)
        last = self.last.get(tp)
        if last is not None and log_start < last.log_start:
            self.low_end[tp] = min(self.low_end[tp], log_start)

    def check(self, facts: Mapping[TopicPartition, LogFacts], event: str) -> None:
        for tp, now in facts.items():
            if not now.log_start <= now.high_watermark <= now.log_end:
                raise InvariantError(
                    f"{tp}: high watermark {now.high_watermark} outside "
                    f"[{now.log_start}, {now.log_end}] after {event}"
                )
            before = self.last.get(tp)
            floor = None
            if before is not None:
                floor = min(before.high_watermark, self.low_end.get(tp, now.log_end), now.log_end)
                if now.log_start != before.log_start and now.log_start < before.high_watermark:
                    floor = min(floor, now.log_start)
            if floor is not None and now.high_watermark < floor:
                raise InvariantError(
                    f"{tp}: high watermark moved back from {before.high_watermark} to "
                    f"{now.high_watermark} without a truncation below it (log end "
                    f"{before.log_end} -> {now.log_end}) after {event}"
                )
            self.last[tp] = now
        self.low_end = {}
        for tp in list(self.last):
            if tp not in facts:
                del self.last[tp]


def check_response_size(frame: int, sizes: list[int], buffer_memory: int, asked: int) -> None:
    """Rule 4: the frame fits the pool, or it is one partition's data over the limit
    (KIP-74: the first batch comes whole; the leader cuts the rest at max_bytes)."""
    if frame <= buffer_memory:
        return
    if sum(sizes) > asked and sum(1 for s in sizes if s) == 1:
        return
    raise InvariantError(
        f"a Fetch response of about {frame} bytes ({sum(sizes)} of records, {asked} asked) "
        f"does not fit fetch.buffer_memory {buffer_memory}"
    )


class FsyncWitness:
    """Rule 7's witness: while installed (`with`), every os.fsync of a segment's .log file
    records the file's bytes as durable. A batch is durable when the bytes at its place in
    the file are those of the last fsync (a truncation and a rewrite are not durable until
    synced again). After a restart, what the disk holds is durable (the simulated crash
    already dropped what was not)."""

    def __init__(self) -> None:
        self.synced: dict[str, bytes] = {}
        # The inode each snapshot was taken of: a file deleted and created again under the
        # same name (a segment of the same base offset) has none of its predecessor's.
        self.inodes: dict[str, int] = {}
        # Each directory's names (name -> inode) as of its last fsync: what a crash keeps of
        # the creations and renames in it since (`names_synced`).
        self.listings: dict[str, dict[str, int]] = {}
        # The bytes of each file a rename replaced (by inode): a crash that loses that rename
        # brings the file back under its name. Each is held open until its directory is
        # fsynced (`_held`), so that no new file takes its inode number meanwhile.
        self.replaced: dict[int, bytes] = {}
        self._held: dict[str, list[int]] = {}
        self._real_fsync: Any = None
        self._real_renames: tuple[Any, Any] = (None, None)
        self._depth = 0

    def __enter__(self) -> FsyncWitness:
        self._depth += 1
        if self._depth == 1:
            self._real_fsync = os.fsync
            os.fsync = self._fsync  # type: ignore[assignment]
            self._real_renames = (os.rename, os.replace)
            os.rename = self._renaming(os.rename)  # type: ignore[assignment]
            os.replace = self._renaming(os.replace)  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            os.fsync = self._real_fsync
            os.rename, os.replace = self._real_renames
            self._release()

    def _renaming(self, real: Any) -> Any:
        def rename(source: Any, target: Any, **kwargs: Any) -> None:
            try:
                fd = os.open(target, os.O_RDONLY)
            except OSError:
                fd = None  # no file there: nothing replaced
            if fd is not None:
                with open(target, "rb") as f:
                    self.replaced[os.fstat(fd).st_ino] = f.read()
                where = os.path.realpath(os.path.dirname(os.fspath(target)))
                self._held.setdefault(where, []).append(fd)
            real(source, target, **kwargs)

        return rename

    def _release(self, directory: str | None = None) -> None:
        for where in [directory] if directory is not None else list(self._held):
            for fd in self._held.pop(where, []):
                os.close(fd)

    def _fsync(self, fd: int) -> None:
        self._real_fsync(fd)
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        if path.endswith(".log"):
            with open(path, "rb") as f:
                self.synced[path] = f.read()
            self.inodes[path] = os.fstat(fd).st_ino
        elif os.path.isdir(path):
            self.listings[path] = _listing(Path(path))
            self._release(path)  # no crash can bring back what it replaced now

    def settle_on_disk(self, data_dir: Path) -> None:
        paths = list(data_dir.glob("*/*.log"))
        self.synced = {str(p): p.read_bytes() for p in paths}
        self.inodes = {str(p): p.stat().st_ino for p in paths}
        self.listings = {os.path.realpath(d): _listing(d) for d in data_dir.iterdir() if d.is_dir()}
        self._release()

    def names_synced(self, directory: Path) -> dict[str, int] | None:
        """The names (name -> inode) `directory` held at its last fsync (None: never seen)."""
        return self.listings.get(os.path.realpath(directory))  # as /proc names an fd

    def synced_bytes(self, path: Path) -> bytes:
        """The bytes of the file at `path` as of its last fsync (b"": never synced, or
        only a deleted file of that name was)."""
        key = str(path)
        if key not in self.synced or self.inodes.get(key) != path.stat().st_ino:
            return b""
        return self.synced[key]

    def durable_bytes(self, path: Path) -> int:
        """How many bytes of the segment file at `path` are durable: up to the first batch
        whose bytes are not those of the last fsync."""
        data = path.read_bytes()
        synced = self.synced_bytes(path)
        for batch in scan_batches(memoryview(data)).batches:
            at, to = batch.position, batch.position + batch.size
            if synced[at:to] != data[at:to]:
                return at
        return len(data)

    def durable_end(self, plog: Any) -> int:
        """The offset below which every batch of the log is durable."""
        end = plog.log_start_offset
        for segment in plog.segments:
            path = str(segment.log_path)
            data = Path(path).read_bytes()
            synced = self.synced.get(path, b"")
            for batch in scan_batches(memoryview(data)).batches:
                at, to = batch.position, batch.position + batch.size
                if synced[at:to] != data[at:to]:
                    return end
                end = max(end, batch.next_offset)
        return end


def _listing(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in directory.iterdir() if p.is_file()}


def check_epoch_file(tp: TopicPartition, plog: Any, checkpointed: int) -> None:
    """Rule 8, for one partition: the file on disk against the batches below the
    recovery point the checkpoint file on disk names."""
    below = min(checkpointed, plog.log_end_offset)
    if below <= plog.log_start_offset:
        return
    path = plog.directory / LEADER_EPOCH_CHECKPOINT
    try:
        entries = parse_epochs(path.read_text(), source=str(path))
    except (OSError, LogError) as exc:
        raise InvariantError(f"{tp}: leader-epoch file unreadable: {exc}") from None
    data = local_bytes(plog)
    for batch in scan_batches(memoryview(data)).batches:
        if batch.base_offset >= below:
            break
        if batch.base_offset < plog.log_start_offset or batch.magic < MAGIC_V2:
            continue
        covering = [e for e in entries if e.start_offset <= batch.base_offset]
        epoch = covering[-1].epoch if covering else None
        if epoch != batch.partition_leader_epoch:
            raise InvariantError(
                f"{tp}: the batch at {batch.base_offset} is of leader epoch "
                f"{batch.partition_leader_epoch}, the leader-epoch file on disk says {epoch} "
                f"({[(e.epoch, e.start_offset) for e in entries]}), and the checkpoint file "
                f"names recovery point {checkpointed}: a crash now loses that epoch"
            )
