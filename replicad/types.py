"""Small value types shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class TopicPartition(NamedTuple):
    """A partition by topic name; the key of every per-partition map in replicad."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """A group's committed position in one partition, as Kafka's OffsetAndMetadata: what a
    member commits (OffsetCommit), what OffsetFetch reads back from any cluster, and what a
    source group's sync hands serve's coordinator. The coordinator stores it as a
    groups.classic_group.CommittedOffset, which adds the commit time."""

    offset: int
    leader_epoch: int = -1  # unknown: the committer named no epoch
    metadata: str | None = ""  # None: the client sent a null string
