"""One Fetch request of any version in one shape (`FetchRequest`), both ways: built into
kio's entity for the negotiated version (`fetch_request`: the follower, verify, the tools)
and read from a decoded one (`read_fetch_request`: serve). The follower and serve are
siblings that share only the layers below them, so the one model lives here.

Rules:
- A partition is named by its topic's name (v0-v12) or its topic id (v13+). A request
  built here may carry both (the follower knows both): the version's one is written, and
  a partition without it is refused (LocalProtocolError). A request read from the wire
  holds what it named: a v13+ partition's topic is None until serve resolves its id.
- Partitions keep the request's order, its priority (KIP-74); consecutive partitions of
  one topic share an entry, and a topic that reappears later (after rotation) starts a
  new one, which Kafka accepts. A partition named twice is read twice: what that means
  is the reader's to decide (serve: its first place, its last values).
- `forgotten` (v7+, KIP-227): by name up to v12, by id from v13 (KIP-516); forgetting in
  a sessionless version (v0-v6) is refused.
- `replica_id` is in the body up to v14 and in ReplicaState, with `replica_epoch`, from
  v15 (KIP-903).
- A field the version lacks is dropped when building and read as Kafka's default: no
  response limit before v3 (max_bytes), read_uncommitted before v4, no session before v7,
  no log start offset before v5, no leader epochs before v9 and v12, no rack before v11.
"""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass
from typing import Any

from replicad.errors import LocalProtocolError
from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import request_type
from replicad.protocol.requests import make_entity, nested_type
from replicad.types import TopicPartition
from replicad.wire import (
    CONSUMER_REPLICA_ID,
    FETCH_TOPIC_ID_VERSION,
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    READ_UNCOMMITTED,
)

# Fetch v7 introduced fetch sessions (KIP-227).
FETCH_SESSION_VERSION = 7
# Fetch v15 moved replica_id from the body into the tagged ReplicaState (KIP-903).
FETCH_REPLICA_STATE_VERSION = 15
# What a request without max_bytes (v0-v2) may take.
NO_RESPONSE_LIMIT = 2**31 - 1


@dataclass(frozen=True, slots=True)
class RequestedPartition:
    """One partition as the request names it: by topic name, topic id, or both."""

    topic: str | None
    topic_id: uuid.UUID | None
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    log_start_offset: int = -1
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1

    @classmethod
    def of(
        cls,
        tp: TopicPartition,
        fetch_offset: int,
        partition_max_bytes: int,
        *,
        topic_id: uuid.UUID | None = None,
        log_start_offset: int = -1,
        current_leader_epoch: int = -1,
        last_fetched_epoch: int = -1,
    ) -> RequestedPartition:
        """`tp` as a requester that knows its name (and maybe its topic id) asks for it."""
        return cls(
            tp.topic,
            topic_id,
            tp.partition,
            fetch_offset,
            partition_max_bytes,
            log_start_offset,
            current_leader_epoch,
            last_fetched_epoch,
        )

    @property
    def topic_partition(self) -> TopicPartition | None:
        """The partition by name (None: named by topic id only)."""
        return TopicPartition(self.topic, self.partition) if self.topic is not None else None


@dataclass(frozen=True, slots=True)
class ForgottenPartition:
    """A partition an incremental fetch drops from its session: by name or topic id."""

    topic: str | None
    topic_id: uuid.UUID | None
    partition: int


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """Everything one Fetch request says, independent of its version."""

    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    session_id: int
    session_epoch: int
    partitions: tuple[RequestedPartition, ...]  # request order matters (KIP-74)
    forgotten: tuple[ForgottenPartition, ...] = ()
    replica_id: int = CONSUMER_REPLICA_ID
    replica_epoch: int = -1
    rack_id: str = ""

    def by_name(self) -> dict[TopicPartition, RequestedPartition]:
        """The partitions named by topic name, by partition (the last of a repeat)."""
        return {tp: p for p in self.partitions if (tp := p.topic_partition) is not None}


def fetch_request(version: int, request: FetchRequest) -> Any:
    """`request` as kio's FetchRequest entity of `version` (see the module rules)."""
    cls = request_type(ApiKey.FETCH, version)
    topic_cls = nested_type(cls, "FetchTopic")
    part_cls = nested_type(cls, "FetchPartition")
    use_ids = version >= FETCH_TOPIC_ID_VERSION
    topics = []
    for key, parts in _runs(version, request.partitions):
        entities = tuple(
            make_entity(
                part_cls,
                partition=p.partition,
                current_leader_epoch=p.current_leader_epoch,
                fetch_offset=p.fetch_offset,
                last_fetched_epoch=p.last_fetched_epoch,
                log_start_offset=p.log_start_offset,
                partition_max_bytes=p.partition_max_bytes,
            )
            for p in parts
        )
        name = "topic_id" if use_ids else "topic"
        topics.append(make_entity(topic_cls, **{name: key}, partitions=entities))
    if request.forgotten and version < FETCH_SESSION_VERSION:
        raise LocalProtocolError(f"Fetch v{version} has no sessions: cannot forget partitions")
    forgotten = []
    if version >= FETCH_SESSION_VERSION:
        forgotten_cls = nested_type(cls, "ForgottenTopic")
        by_topic: dict[Any, list[int]] = {}
        for f in request.forgotten:
            by_topic.setdefault(_key(version, f.topic, f.topic_id), []).append(f.partition)
        name = "topic_id" if use_ids else "topic"
        forgotten = [
            make_entity(forgotten_cls, **{name: k}, partitions=tuple(v))
            for k, v in by_topic.items()
        ]
    values: dict[str, Any] = dict(
        max_wait=datetime.timedelta(milliseconds=request.max_wait_ms),
        min_bytes=request.min_bytes,
        max_bytes=request.max_bytes,
        isolation_level=request.isolation_level,
        session_id=request.session_id,
        session_epoch=request.session_epoch,
        topics=tuple(topics),
        forgotten_topics_data=tuple(forgotten),
        rack_id=request.rack_id,
    )
    if version >= FETCH_REPLICA_STATE_VERSION:
        state_cls = nested_type(cls, "ReplicaState")
        values["replica_state"] = state_cls(
            replica_id=request.replica_id, replica_epoch=request.replica_epoch
        )
    else:
        values["replica_id"] = request.replica_id
    return make_entity(cls, **values)


def read_fetch_request(version: int, body: Any) -> FetchRequest:
    """A decoded kio FetchRequest entity of `version` in the one shape."""
    if version >= FETCH_REPLICA_STATE_VERSION:
        replica_id = int(body.replica_state.replica_id)
        replica_epoch = int(body.replica_state.replica_epoch)
    else:
        replica_id = int(getattr(body, "replica_id", CONSUMER_REPLICA_ID))
        replica_epoch = -1
    by_id = version >= FETCH_TOPIC_ID_VERSION
    partitions = tuple(
        RequestedPartition(
            topic=None if by_id else topic.topic,
            topic_id=topic.topic_id if by_id else None,
            partition=int(p.partition),
            fetch_offset=int(p.fetch_offset),
            partition_max_bytes=int(p.partition_max_bytes),
            log_start_offset=int(getattr(p, "log_start_offset", -1)),
            current_leader_epoch=int(getattr(p, "current_leader_epoch", -1)),
            last_fetched_epoch=int(getattr(p, "last_fetched_epoch", -1)),
        )
        for topic in body.topics
        for p in topic.partitions
    )
    forgotten = tuple(
        ForgottenPartition(
            topic=None if by_id else f.topic,
            topic_id=f.topic_id if by_id else None,
            partition=int(index),
        )
        for f in getattr(body, "forgotten_topics_data", ())
        for index in f.partitions
    )
    return FetchRequest(
        max_wait_ms=int(body.max_wait.total_seconds() * 1000),
        min_bytes=int(body.min_bytes),
        max_bytes=int(getattr(body, "max_bytes", NO_RESPONSE_LIMIT)),
        isolation_level=int(getattr(body, "isolation_level", READ_UNCOMMITTED)),
        session_id=int(getattr(body, "session_id", INVALID_SESSION_ID)),
        session_epoch=int(getattr(body, "session_epoch", FINAL_EPOCH)),
        partitions=partitions,
        forgotten=forgotten,
        replica_id=replica_id,
        replica_epoch=replica_epoch,
        rack_id=str(getattr(body, "rack_id", "") or ""),
    )


def _key(version: int, topic: str | None, topic_id: uuid.UUID | None) -> Any:
    """What names a topic in `version`: its id from v13, its name before."""
    if version >= FETCH_TOPIC_ID_VERSION:
        if topic_id is None:
            raise LocalProtocolError(f"Fetch v{version} needs a topic id for {topic!r}")
        return topic_id
    if topic is None:
        raise LocalProtocolError(f"Fetch v{version} needs a topic name for {topic_id}")
    return topic


def _runs(
    version: int, partitions: tuple[RequestedPartition, ...]
) -> list[tuple[Any, list[RequestedPartition]]]:
    """Consecutive partitions of one topic, each run under the name `version` uses."""
    runs: list[tuple[Any, list[RequestedPartition]]] = []
    for p in partitions:
        key = _key(version, p.topic, p.topic_id)
        if runs and runs[-1][0] == key:
            runs[-1][1].append(p)
        else:
            runs.append((key, [p]))
    return runs
