"""The source cluster as the follower sees it, and which partitions it replicates.

Sans-I/O: built from a decoded Metadata response, queried by the shell.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from replicad.config.model import TopicsConfig
from replicad.protocol.connection import BrokerAddress
from replicad.protocol.error_codes import error_code_of
from replicad.types import TopicPartition

NO_LEADER = -1
_NULL_UUID = uuid.UUID(int=0)


@dataclass(frozen=True, slots=True)
class PartitionLeader:
    leader_id: int
    leader_epoch: int
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    topic_id: uuid.UUID | None
    is_internal: bool
    error: ErrorCode
    partitions: Mapping[int, PartitionLeader]


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    cluster_id: str | None
    brokers: Mapping[int, BrokerAddress]
    topics: Mapping[str, TopicMetadata]

    @classmethod
    def from_response(cls, body: Any) -> ClusterMetadata:
        brokers = {
            int(b.node_id): BrokerAddress(int(b.node_id), b.host, int(b.port)) for b in body.brokers
        }
        topics: dict[str, TopicMetadata] = {}
        for t in body.topics:
            if t.name is None:
                continue
            topic_id = getattr(t, "topic_id", None)
            if topic_id == _NULL_UUID:
                topic_id = None
            topics[t.name] = TopicMetadata(
                name=t.name,
                topic_id=topic_id,
                is_internal=bool(getattr(t, "is_internal", False)),
                error=error_code_of(t.error_code),
                partitions={
                    int(p.partition_index): PartitionLeader(
                        leader_id=int(p.leader_id),
                        leader_epoch=int(getattr(p, "leader_epoch", -1)),
                        error=error_code_of(p.error_code),
                    )
                    for p in t.partitions
                },
            )
        return cls(cluster_id=getattr(body, "cluster_id", None), brokers=brokers, topics=topics)

    def leader_of(self, tp: TopicPartition) -> PartitionLeader | None:
        topic = self.topics.get(tp.topic)
        if topic is None:
            return None
        return topic.partitions.get(tp.partition)

    def topic_id(self, topic: str) -> uuid.UUID | None:
        meta = self.topics.get(topic)
        return meta.topic_id if meta else None


@dataclass(frozen=True, slots=True)
class TopicSelection:
    """Which topics to replicate: an explicit list, or a regex over all topics.

    A regex never selects internal topics (__consumer_offsets, __transaction_state):
    they belong to the source cluster, not to its data.
    """

    include: Sequence[str] = ()
    regex: str | None = None

    @classmethod
    def from_config(cls, topics: TopicsConfig) -> TopicSelection:
        return cls(include=tuple(topics.include), regex=topics.regex)

    def metadata_topics(self) -> list[str] | None:
        """Topics to name in a Metadata request (None: all, needed for a regex)."""
        return None if self.regex is not None else list(self.include)

    def selects(self, topic: TopicMetadata) -> bool:
        if self.regex is not None:
            return not topic.is_internal and re.fullmatch(self.regex, topic.name) is not None
        return topic.name in self.include

    def partitions(self, cluster: ClusterMetadata) -> dict[TopicPartition, PartitionLeader]:
        """Every selected partition that the metadata knows, with its leader."""
        chosen: dict[TopicPartition, PartitionLeader] = {}
        for topic in cluster.topics.values():
            if topic.error != ErrorCode.none or not self.selects(topic):
                continue
            for index, leader in sorted(topic.partitions.items()):
                chosen[TopicPartition(topic.name, index)] = leader
        return chosen

    def missing(self, cluster: ClusterMetadata) -> list[str]:
        """Listed topics the cluster does not have (yet)."""
        if self.regex is not None:
            return []
        return [
            t
            for t in self.include
            if t not in cluster.topics or cluster.topics[t].error != ErrorCode.none
        ]
