"""What the server serves: the local partitions by topic, their topic ids and leader epochs.

Rules:
- This node leads every partition of the data directory. Its leader epoch for a partition
  is the latest epoch in the partition's leader-epoch cache (the source's epochs, carried in
  the batches), or 0 for a partition without one.
- Topic ids are stable on disk: a topic's id is the one its partitions' `partition.metadata`
  holds. A topic none of whose partitions has one gets a random id (never the zero id, nor
  Kafka's reserved metadata-topic id, nor one whose base64 form starts with "-"), written to
  every partition's `partition.metadata` at once; partitions that lack an id get the one
  their siblings have. Partitions of one topic that disagree keep their files; the id of the
  lowest-numbered partition is served and the disagreement is logged.
- The view is refreshed from the LogManager when `note_changed` names a partition it does
  not know or whose log is no longer the LogManager's (removed, or removed and created
  again under the same directory name before the change was noted), or when a lookup misses
  and the last refresh is older than `miss_refresh_ms` (a partition the follower just
  created). Lookups are O(1).
"""

from __future__ import annotations

import base64
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from replicad.errors import LogError
from replicad.log.manager import LogManager
from replicad.log.partition import PartitionLog
from replicad.types import TopicPartition

log = structlog.get_logger("replicad.leader")

ZERO_TOPIC_ID = uuid.UUID(int=0)
# Kafka's Uuid.METADATA_TOPIC_ID (the KRaft metadata log): never given to a topic.
METADATA_TOPIC_ID = uuid.UUID(int=1)
NO_EPOCH_LEADER_EPOCH = 0
DEFAULT_MISS_REFRESH_MS = 1000


@dataclass(frozen=True, slots=True)
class TopicEntry:
    name: str
    topic_id: uuid.UUID
    # Partition index -> its log, by index.
    partitions: Mapping[int, PartitionLog]


def new_topic_id(rng: random.Random) -> uuid.UUID:
    """A random topic id Kafka would also accept as a fresh one."""
    while True:
        candidate = uuid.UUID(int=rng.getrandbits(128), version=4)
        text = base64.urlsafe_b64encode(candidate.bytes).decode()
        if candidate not in (ZERO_TOPIC_ID, METADATA_TOPIC_ID) and not text.startswith("-"):
            return candidate


class Catalog:
    def __init__(
        self,
        logs: LogManager,
        *,
        rng: random.Random,
        miss_refresh_ms: int = DEFAULT_MISS_REFRESH_MS,
    ) -> None:
        self._logs = logs
        self._rng = rng
        self._miss_refresh_ms = miss_refresh_ms
        self._partitions: dict[TopicPartition, PartitionLog] = {}
        self._topics: dict[str, TopicEntry] = {}
        self._names_by_id: dict[uuid.UUID, str] = {}
        self._stale = True
        self._refreshed_ms: int | None = None
        self.refreshes = 0

    # -- lookups ---------------------------------------------------------------------------

    def partition(self, tp: TopicPartition, *, now_ms: int) -> PartitionLog | None:
        self._maybe_refresh(now_ms)
        found = self._partitions.get(tp)
        if found is None and self._miss_may_refresh(now_ms):
            self._refresh(now_ms)
            found = self._partitions.get(tp)
        return found

    def partition_count(self, *, now_ms: int) -> int:
        """How many partitions the replica holds (request_limits scales with it)."""
        self._maybe_refresh(now_ms)
        return len(self._partitions)

    def topics(self, *, now_ms: int) -> Mapping[str, TopicEntry]:
        self._maybe_refresh(now_ms)
        return self._topics

    def topic(self, name: str, *, now_ms: int) -> TopicEntry | None:
        self._maybe_refresh(now_ms)
        found = self._topics.get(name)
        if found is None and self._miss_may_refresh(now_ms):
            self._refresh(now_ms)
            found = self._topics.get(name)
        return found

    def topic_name(self, topic_id: uuid.UUID, *, now_ms: int) -> str | None:
        self._maybe_refresh(now_ms)
        found = self._names_by_id.get(topic_id)
        if found is None and self._miss_may_refresh(now_ms):
            self._refresh(now_ms)
            found = self._names_by_id.get(topic_id)
        return found

    def topic_id(self, name: str, *, now_ms: int) -> uuid.UUID | None:
        entry = self.topic(name, now_ms=now_ms)
        return entry.topic_id if entry else None

    @staticmethod
    def leader_epoch(partition: PartitionLog) -> int:
        latest = partition.latest_epoch()
        return NO_EPOCH_LEADER_EPOCH if latest is None else latest

    # -- changes ---------------------------------------------------------------------------

    def note_changed(self, tp: TopicPartition) -> None:
        """A partition was appended to, truncated, created or removed."""
        # Identity, not the directory's existence: a partition removed and created again
        # before this call has a directory, but the log held here is closed.
        known = self._partitions.get(tp)
        if known is None or known is not self._logs.get(tp):
            self._stale = True

    def _maybe_refresh(self, now_ms: int) -> None:
        if self._stale:
            self._refresh(now_ms)

    def _miss_may_refresh(self, now_ms: int) -> bool:
        last = self._refreshed_ms
        return last is None or now_ms - last >= self._miss_refresh_ms

    def _refresh(self, now_ms: int) -> None:
        self._stale = False
        self._refreshed_ms = now_ms
        self.refreshes += 1
        partitions = dict(self._logs.partitions())
        by_topic: dict[str, dict[int, PartitionLog]] = {}
        for tp, plog in sorted(partitions.items()):
            by_topic.setdefault(tp.topic, {})[tp.partition] = plog
        topics: dict[str, TopicEntry] = {}
        for name, parts in by_topic.items():
            topics[name] = TopicEntry(name, self._topic_id_for(name, parts), parts)
        self._partitions = partitions
        self._topics = topics
        self._names_by_id = {entry.topic_id: name for name, entry in topics.items()}

    def _topic_id_for(self, name: str, parts: Mapping[int, PartitionLog]) -> uuid.UUID:
        known = {index: p.topic_id for index, p in parts.items() if p.topic_id is not None}
        if known:
            chosen = known[min(known)]
            if len(set(known.values())) > 1:
                log.warning(
                    "partitions of one topic have different topic ids; serving the lowest "
                    "partition's",
                    topic=name,
                    topic_id=str(chosen),
                    ids={str(i): str(t) for i, t in sorted(known.items())},
                )
        else:
            chosen = new_topic_id(self._rng)
            log.info("topic had no topic id; generated one", topic=name, topic_id=str(chosen))
        for index, plog in parts.items():
            if plog.topic_id is None:
                try:
                    plog.set_topic_id(chosen)
                except (LogError, OSError) as exc:
                    log.warning(
                        "could not persist the topic id",
                        topic=name,
                        partition=index,
                        error=str(exc),
                    )
        return chosen
