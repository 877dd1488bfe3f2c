"""Committing a consumer group's offsets at the destination as an administrator does
(the asyncio shell of one OffsetCommit; the decisions are group_sync.py's).

- Generation -1 and no member id: what `kafka-consumer-groups --reset-offsets` and the
  Admin client's alterConsumerGroupOffsets send. Kafka's coordinator takes such a commit
  only while the group has no members (UNKNOWN_MEMBER_ID or a like error otherwise), for
  the classic and the consumer (KIP-848) protocol alike -- a second guard beside the
  sync's own look at the members.
- The coordinator comes from the destination's `ClusterGroupsReader` (one cache for its
  reads and our writes); an answer saying it moved, or a lost connection, forgets it.
- Versions: the highest both sides speak, v2..v9 (Kafka 4 dropped v0/v1; v10 names topics
  by id only). The leader epoch is always -1 (group_sync.py says why).
- Per-partition errors are results; only an unreachable cluster raises.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping

from kio.schema.errors import ErrorCode

from replicad.errors import KafkaConnectionError, ProtocolError
from replicad.groups.cluster_reader import COORDINATOR_MOVED, ClusterGroupsReader
from replicad.mirror.group_sync import (
    ADMIN_GENERATION,
    ADMIN_MEMBER_ID,
    NO_LEADER_EPOCH,
    Commit,
)
from replicad.protocol.apis import ApiKey
from replicad.protocol.client import KafkaClient
from replicad.protocol.codec import request_type
from replicad.protocol.error_codes import error_code_of
from replicad.protocol.requests import make_entity, nested_type
from replicad.types import TopicPartition

# Kept this long by a pre-2.1 broker (v2..v4 carry it); -1: the broker's own setting.
BROKER_RETENTION = -1


class GroupOffsetWriter:
    def __init__(self, client: KafkaClient, reader: ClusterGroupsReader) -> None:
        self.client = client
        self.reader = reader

    async def commit(
        self, group: str, commits: Mapping[TopicPartition, Commit]
    ) -> dict[TopicPartition, str | None]:
        """Each destination partition's answer: None (committed) or Kafka's error name
        (or why the request could not be made, for every partition)."""
        where = (await self.reader.coordinators([group]))[group]
        if not isinstance(where, int):
            return dict.fromkeys(commits, where)
        try:
            conn = await self.client.connection(where)
            assert conn.versions is not None
            version = conn.versions.get(ApiKey.OFFSET_COMMIT)
            if version is None:
                return dict.fromkeys(commits, "unsupported_version")
            body = await conn.request(_request(version, group, commits))
        except (KafkaConnectionError, ProtocolError) as exc:
            self.reader.forget(group)
            return dict.fromkeys(commits, f"unreachable: {exc}")
        answers: dict[TopicPartition, str | None] = {}
        moved = False
        for topic in body.topics:
            for p in topic.partitions:
                code = error_code_of(int(p.error_code))
                tp = TopicPartition(str(topic.name), int(p.partition_index))
                answers[tp] = None if code == ErrorCode.none else code.name
                moved = moved or code in COORDINATOR_MOVED
        if moved:
            self.reader.forget(group)
        return {tp: answers.get(tp, "missing from the answer") for tp in commits}


def _request(version: int, group: str, commits: Mapping[TopicPartition, Commit]) -> object:
    cls = request_type(ApiKey.OFFSET_COMMIT, version)
    topic_cls = nested_type(cls, "OffsetCommitRequestTopic")
    partition_cls = nested_type(cls, "OffsetCommitRequestPartition")
    by_topic: dict[str, list[object]] = {}
    for tp, c in sorted(commits.items()):
        by_topic.setdefault(tp.topic, []).append(
            make_entity(
                partition_cls,
                partition_index=tp.partition,
                committed_offset=c.offset,
                committed_leader_epoch=NO_LEADER_EPOCH,
                committed_metadata=c.metadata,
            )
        )
    return make_entity(
        cls,
        group_id=group,
        generation_id_or_member_epoch=ADMIN_GENERATION,
        member_id=ADMIN_MEMBER_ID,
        group_instance_id=None,
        retention_time=datetime.timedelta(milliseconds=BROKER_RETENTION),
        topics=tuple(
            make_entity(topic_cls, name=topic, partitions=tuple(parts))
            for topic, parts in by_topic.items()
        ),
    )
