"""The group APIs on the wire: kio requests to the coordinator's requests, its answers to kio
responses, in each version Kafka 4 answers (pure; the shell is groups.py).

Rules (Kafka's KafkaApis and the request schemas):
- FindCoordinator: this node coordinates every group (key type 0); v0-v3 name one key,
  v4+ a batch. Transaction coordinators (key type 1) are COORDINATOR_NOT_AVAILABLE (a
  read-only replica has none); any other key type INVALID_REQUEST.
- JoinGroup v2-v3 take a new member at once; v4+ ask for its member id first (KIP-394);
  v9+ can tell a returning static leader to skip the assignment (KIP-814).
  Up to v6 the protocol name is not nullable (an error answers ""), from v7 it is null.
  A member's client host is written as Kafka writes it, "/" and the address.
- LeaveGroup v0-v2 name one member and answer its error at the top; v3+ a batch.
- OffsetCommit: a partition of a topic this node does not hold is
  UNKNOWN_TOPIC_OR_PARTITION (the others are committed). v2-v4's retention time is
  ignored, as Kafka 4 ignores it. No leader epoch before v6 (-1).
- OffsetFetch v1-v7 ask for one group (v2+: null topics means all); v8+ for several. A
  partition without a committed offset is -1 with no error.
- OffsetCommit v10 and OffsetFetch v10 name topics by id only (served with the consumer
  protocol, `CONSUMER_PROTOCOL_VERSIONS`): a topic id this node does not know is
  UNKNOWN_TOPIC_ID for each of its partitions; fetching all of a group's offsets leaves out
  the topics this node has no id for.
- DescribeGroups: an unknown group is Dead with no error, before v6; from v6
  GROUP_ID_NOT_FOUND with a message (KIP-1043).
- ListGroups filters by state (v4+) and by type (v5+).
- ConsumerGroupHeartbeat and ConsumerGroupDescribe (KIP-848, `CONSUMER_PROTOCOL_VERSIONS`,
  answered only when groups.consumer_protocol is on) name topics by id: an owned topic id
  this node does not know is left out (the member is told its assignment, which does not
  name it); assignments go out by this node's topic ids. The member id of v0 may be
  empty on a join: the coordinator's own then (v1+ clients make their own).
- Refused (`refused_response`: a connection without an authenticated principal when
  serve.security is on): every group, key, member or partition the request names gets the
  error (GROUP_AUTHORIZATION_FAILED), as Kafka answers without the group ACL; ListGroups
  lists no group, as Kafka lists only the groups the principal may describe.
"""

from __future__ import annotations

import dataclasses
import datetime
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from replicad.groups.consumer_group import ConsumerHeartbeat, HeartbeatResult
from replicad.groups.coordinator import (
    CommitResult,
    DescribedConsumerGroup,
    DescribedGroup,
    FetchedOffsets,
    JoinRequest,
    JoinResult,
    LeaveResult,
    ListedGroup,
    MemberRef,
    OffsetDeleteResult,
    SyncRequest,
    SyncResult,
)
from replicad.protocol.apis import ApiKey, VersionRange
from replicad.protocol.codec import response_type
from replicad.protocol.requests import make_entity
from replicad.types import OffsetAndMetadata, TopicPartition
from replicad.wire import (
    FIND_COORDINATOR_BATCHED_VERSION,
    GROUP_KEY_TYPE,
    NO_EPOCH,
    OFFSET_FETCH_BATCHED_VERSION,
    UNKNOWN_OFFSET,
)

# What serve answers of the group APIs: every version kio types that Kafka 4.0 answers.
GROUP_VERSIONS: Mapping[int, VersionRange] = {
    ApiKey.OFFSET_COMMIT: VersionRange(2, 9),
    ApiKey.OFFSET_FETCH: VersionRange(1, 9),
    ApiKey.FIND_COORDINATOR: VersionRange(0, 6),
    ApiKey.JOIN_GROUP: VersionRange(2, 9),
    ApiKey.HEARTBEAT: VersionRange(0, 4),
    ApiKey.LEAVE_GROUP: VersionRange(0, 5),
    ApiKey.SYNC_GROUP: VersionRange(0, 5),
    ApiKey.DESCRIBE_GROUPS: VersionRange(0, 6),
    ApiKey.LIST_GROUPS: VersionRange(0, 5),
    ApiKey.DELETE_GROUPS: VersionRange(0, 2),
    ApiKey.OFFSET_DELETE: VersionRange(0, 0),
}
# KIP-848's, served beside GROUP_VERSIONS when the consumer protocol is on.
CONSUMER_PROTOCOL_VERSIONS: Mapping[int, VersionRange] = {
    ApiKey.CONSUMER_GROUP_HEARTBEAT: VersionRange(0, 1),
    ApiKey.CONSUMER_GROUP_DESCRIBE: VersionRange(0, 1),
    # v10: topics by id (KIP-848's clients ask for it once topic ids are known).
    ApiKey.OFFSET_COMMIT: VersionRange(2, 10),
    ApiKey.OFFSET_FETCH: VersionRange(1, 10),
}

TRANSACTION_KEY_TYPE = 1
JOIN_REQUIRES_MEMBER_ID_VERSION = 4
JOIN_NULLABLE_PROTOCOL_VERSION = 7
JOIN_SKIP_ASSIGNMENT_VERSION = 9
LEAVE_BATCHED_VERSION = 3
OFFSET_BY_TOPIC_ID_VERSION = 10
DESCRIBE_NOT_FOUND_VERSION = 6
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
# ConsumerGroupDescribe v1's member type: a member of the consumer protocol.
CONSUMER_MEMBER_TYPE = 1
NO_TRANSACTIONS_MESSAGE = "replicad serves a read-only replica: it has no transaction coordinator"


@dataclass(frozen=True, slots=True)
class TopicIds:
    """This node's topic ids, both ways (the catalog's), for the APIs that name topics by id."""

    name_of: Callable[[uuid.UUID], str | None]
    id_of: Callable[[str], uuid.UUID | None]


# A name no topic can have (Kafka's names are [a-zA-Z0-9._-]): a topic id not known here.
_UNKNOWN_ID_MARK = "?"


def _unknown_id_name(topic_id: uuid.UUID | None) -> str:
    return f"{_UNKNOWN_ID_MARK}{topic_id}"


def _is_unknown_id(name: str) -> bool:
    return name.startswith(_UNKNOWN_ID_MARK)


def _no_name(_topic_id: uuid.UUID) -> str | None:
    return None


def _no_id(_name: str) -> uuid.UUID | None:
    return None


NO_TOPIC_IDS = TopicIds(_no_name, _no_id)


def _topic_name(topic: Any, ids: TopicIds) -> str:
    """A request topic's name: its own, or its id's here (by id from OffsetCommit and
    OffsetFetch v10), or a name no topic has when the id is not known here."""
    name = getattr(topic, "name", None)
    if name is not None:
        return str(name)
    topic_id = topic.topic_id
    known = ids.name_of(topic_id) if topic_id is not None else None
    return known if known is not None else _unknown_id_name(topic_id)


def _topic_id(name: str, ids: TopicIds) -> uuid.UUID | None:
    if _is_unknown_id(name):
        return uuid.UUID(name[len(_UNKNOWN_ID_MARK) :])
    return ids.id_of(name)


@dataclass(frozen=True, slots=True)
class Node:
    node_id: int
    host: str
    port: int


def _module(api: ApiKey, version: int) -> Any:
    """The kio module of `api`'s response in `version` (its nested entity types)."""
    return sys.modules[response_type(api, version).__module__]


def _ms(value: Any) -> int:
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


def _no_throttle() -> datetime.timedelta:
    return datetime.timedelta(0)


def _answer(api: ApiKey, version: int, **fields: Any) -> Any:
    """A top-level response of `api` in `version`, never throttled."""
    return make_entity(response_type(api, version), throttle_time=_no_throttle(), **fields)


def _members(cls: type, members: Iterable[Any], **fields: Callable[[Any], Any]) -> tuple[Any, ...]:
    """One `cls` per member: its member id and instance id, and each of `fields` read from
    it (JoinGroup's members, LeaveGroup's answers, DescribeGroups' members)."""
    return tuple(
        make_entity(
            cls,
            member_id=m.member_id,
            group_instance_id=m.group_instance_id,
            **{name: value(m) for name, value in fields.items()},
        )
        for m in members
    )


def _partition_errors(
    module: Any,
    prefix: str,
    topics: Iterable[Any],
    error_of: Callable[[TopicPartition], ErrorCode],
    ids: TopicIds = NO_TOPIC_IDS,
) -> tuple[Any, ...]:
    """Every partition a request named, in its order, with its error (OffsetCommit's and
    OffsetDelete's answers: `<prefix>Topic` of `<prefix>Partition`s), by name or by id as
    the request named it."""
    topic_cls, partition_cls = (
        getattr(module, f"{prefix}{kind}") for kind in ("Topic", "Partition")
    )
    return tuple(
        make_entity(
            topic_cls,
            name=getattr(topic, "name", None),
            topic_id=getattr(topic, "topic_id", None),
            partitions=tuple(
                make_entity(
                    partition_cls,
                    partition_index=p.partition_index,
                    error_code=error_of(
                        TopicPartition(_topic_name(topic, ids), int(p.partition_index))
                    ),
                )
                for p in topic.partitions
            ),
        )
        for topic in topics
    )


# -- FindCoordinator --------------------------------------------------------------------------


def find_coordinator_response(
    version: int, body: Any, node: Node, refused: ErrorCode | None = None
) -> Any:
    module = _module(ApiKey.FIND_COORDINATOR, version)
    key_type = int(getattr(body, "key_type", GROUP_KEY_TYPE))
    if refused is not None:
        error, message = refused, None
    elif key_type == GROUP_KEY_TYPE:
        error, message = ErrorCode.none, None
    elif key_type == TRANSACTION_KEY_TYPE:
        error, message = ErrorCode.coordinator_not_available, NO_TRANSACTIONS_MESSAGE
    else:
        error, message = ErrorCode.invalid_request, f"unknown key type {key_type}"
    found = error == ErrorCode.none
    where = {
        "node_id": node.node_id if found else -1,
        "host": node.host if found else "",
        "port": node.port if found else -1,
        "error_code": error,
        "error_message": message,
    }
    if version < FIND_COORDINATOR_BATCHED_VERSION:
        return _answer(ApiKey.FIND_COORDINATOR, version, **where)
    coordinators = tuple(
        make_entity(module.Coordinator, key=key, **where) for key in body.coordinator_keys
    )
    return _answer(ApiKey.FIND_COORDINATOR, version, coordinators=coordinators)


# -- JoinGroup, SyncGroup, Heartbeat, LeaveGroup ----------------------------------------------


def join_request(version: int, body: Any, client_id: str | None, client_host: str) -> JoinRequest:
    return JoinRequest(
        group_id=str(body.group_id),
        member_id=body.member_id,
        session_timeout_ms=_ms(body.session_timeout),
        rebalance_timeout_ms=_ms(body.rebalance_timeout),
        protocol_type=body.protocol_type,
        protocols=tuple((p.name, bytes(p.metadata)) for p in body.protocols),
        group_instance_id=getattr(body, "group_instance_id", None),
        client_id=client_id or "",
        client_host=f"/{client_host}",
        require_known_member_id=version >= JOIN_REQUIRES_MEMBER_ID_VERSION,
        supports_skip_assignment=version >= JOIN_SKIP_ASSIGNMENT_VERSION,
    )


def join_response(version: int, result: JoinResult) -> Any:
    module = _module(ApiKey.JOIN_GROUP, version)
    nullable = version >= JOIN_NULLABLE_PROTOCOL_VERSION
    members = _members(
        module.JoinGroupResponseMember, result.members, metadata=lambda m: m.metadata
    )
    return _answer(
        ApiKey.JOIN_GROUP,
        version,
        error_code=result.error,
        generation_id=result.generation_id,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name if nullable else result.protocol_name or "",
        leader=result.leader_id,
        skip_assignment=result.skip_assignment,
        member_id=result.member_id,
        members=members,
    )


def sync_request(body: Any) -> SyncRequest:
    return SyncRequest(
        group_id=str(body.group_id),
        generation_id=int(body.generation_id),
        member_id=body.member_id,
        assignments={a.member_id: bytes(a.assignment) for a in body.assignments},
        group_instance_id=getattr(body, "group_instance_id", None),
        protocol_type=getattr(body, "protocol_type", None),
        protocol_name=getattr(body, "protocol_name", None),
    )


def sync_response(version: int, result: SyncResult) -> Any:
    return _answer(
        ApiKey.SYNC_GROUP,
        version,
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )


def heartbeat_response(version: int, error: ErrorCode) -> Any:
    return _answer(ApiKey.HEARTBEAT, version, error_code=error)


def leaving_members(version: int, body: Any) -> tuple[MemberRef, ...]:
    if version < LEAVE_BATCHED_VERSION:
        return (MemberRef(body.member_id),)
    return tuple(MemberRef(m.member_id, m.group_instance_id) for m in body.members)


def leave_response(version: int, result: LeaveResult) -> Any:
    module = _module(ApiKey.LEAVE_GROUP, version)
    if version < LEAVE_BATCHED_VERSION:
        error = result.error
        if error == ErrorCode.none and result.members:
            error = result.members[0].error
        return _answer(ApiKey.LEAVE_GROUP, version, error_code=error)
    members = _members(module.MemberResponse, result.members, error_code=lambda m: m.error)
    return _answer(ApiKey.LEAVE_GROUP, version, error_code=result.error, members=members)


# -- OffsetCommit, OffsetFetch, OffsetDelete ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommitAsk:
    group_id: str
    generation_id: int
    member: MemberRef
    offsets: Mapping[TopicPartition, OffsetAndMetadata]
    # Partitions refused before the coordinator is asked (a topic not held here).
    refused: Mapping[TopicPartition, ErrorCode]


def commit_request(
    body: Any, holds: Callable[[TopicPartition], bool], ids: TopicIds = NO_TOPIC_IDS
) -> CommitAsk:
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    refused: dict[TopicPartition, ErrorCode] = {}
    for topic in body.topics:
        name = _topic_name(topic, ids)
        for p in topic.partitions:
            tp = TopicPartition(name, int(p.partition_index))
            if _is_unknown_id(name):
                refused[tp] = ErrorCode.unknown_topic_id
                continue
            if not holds(tp):
                refused[tp] = ErrorCode.unknown_topic_or_partition
                continue
            offsets[tp] = OffsetAndMetadata(
                int(p.committed_offset),
                int(getattr(p, "committed_leader_epoch", NO_EPOCH)),
                p.committed_metadata,
            )
    return CommitAsk(
        str(body.group_id),
        int(body.generation_id_or_member_epoch),
        MemberRef(body.member_id, getattr(body, "group_instance_id", None)),
        offsets,
        refused,
    )


def commit_response(
    version: int, body: Any, ask: CommitAsk, result: CommitResult, ids: TopicIds = NO_TOPIC_IDS
) -> Any:
    """Every partition the request named, in its order, with its error."""
    module = _module(ApiKey.OFFSET_COMMIT, version)
    errors = {**result.errors, **ask.refused}
    topics = _partition_errors(module, "OffsetCommitResponse", body.topics, errors.__getitem__, ids)
    return _answer(ApiKey.OFFSET_COMMIT, version, topics=topics)


@dataclass(frozen=True, slots=True)
class FetchAsk:
    group_id: str
    # None: every partition with a committed offset.
    partitions: tuple[TopicPartition, ...] | None
    # v9+: the consumer group member asking (KIP-848), checked by the coordinator.
    member_id: str | None = None
    member_epoch: int = -1


def fetch_requests(version: int, body: Any, ids: TopicIds = NO_TOPIC_IDS) -> tuple[FetchAsk, ...]:
    groups = (body,) if version < OFFSET_FETCH_BATCHED_VERSION else body.groups
    return tuple(
        FetchAsk(
            str(g.group_id),
            None
            if g.topics is None
            else tuple(
                TopicPartition(_topic_name(t, ids), int(i))
                for t in g.topics
                for i in t.partition_indexes
            ),
            getattr(g, "member_id", None),
            int(getattr(g, "member_epoch", -1)),
        )
        for g in groups
    )


def fetch_response(
    version: int,
    answers: tuple[tuple[FetchAsk, FetchedOffsets], ...],
    ids: TopicIds = NO_TOPIC_IDS,
) -> Any:
    module = _module(ApiKey.OFFSET_FETCH, version)
    by_id = version >= OFFSET_BY_TOPIC_ID_VERSION
    batched = version >= OFFSET_FETCH_BATCHED_VERSION
    names = (
        ("OffsetFetchResponseTopics", "OffsetFetchResponsePartitions")
        if batched
        else ("OffsetFetchResponseTopic", "OffsetFetchResponsePartition")
    )
    topic_cls, partition_cls = (getattr(module, n) for n in names)

    def topics_of(fetched: FetchedOffsets) -> tuple[Any, ...]:
        by_topic: dict[str, list[Any]] = {}
        for tp, entry in fetched.offsets.items():
            if by_id and _topic_id(tp.topic, ids) is None:
                continue  # no id to name it by: a topic this node does not hold
            unknown = _is_unknown_id(tp.topic)
            by_topic.setdefault(tp.topic, []).append(
                make_entity(
                    partition_cls,
                    partition_index=tp.partition,
                    committed_offset=UNKNOWN_OFFSET if entry is None else entry.offset,
                    committed_leader_epoch=NO_EPOCH if entry is None else entry.leader_epoch,
                    metadata="" if entry is None else entry.metadata,
                    error_code=ErrorCode.unknown_topic_id if unknown else ErrorCode.none,
                )
            )
        return tuple(
            make_entity(
                topic_cls, name=name, topic_id=_topic_id(name, ids), partitions=tuple(parts)
            )
            for name, parts in by_topic.items()
        )

    if not batched:
        ((_, fetched),) = answers
        return _answer(
            ApiKey.OFFSET_FETCH, version, topics=topics_of(fetched), error_code=fetched.error
        )
    groups = tuple(
        make_entity(
            module.OffsetFetchResponseGroup,
            group_id=ask.group_id,
            topics=topics_of(fetched),
            error_code=fetched.error,
        )
        for ask, fetched in answers
    )
    return _answer(ApiKey.OFFSET_FETCH, version, groups=groups)


def offset_delete_partitions(body: Any) -> tuple[TopicPartition, ...]:
    return tuple(
        TopicPartition(t.name, int(p.partition_index)) for t in body.topics for p in t.partitions
    )


def offset_delete_response(
    body: Any, result: OffsetDeleteResult, refused: Mapping[TopicPartition, ErrorCode]
) -> Any:
    module = _module(ApiKey.OFFSET_DELETE, 0)
    if result.error != ErrorCode.none:
        return _answer(ApiKey.OFFSET_DELETE, 0, error_code=result.error, topics=())
    errors = {**result.errors, **refused}
    topics = _partition_errors(
        module, "OffsetDeleteResponse", body.topics, lambda tp: errors.get(tp, ErrorCode.none)
    )
    return _answer(ApiKey.OFFSET_DELETE, 0, error_code=ErrorCode.none, topics=topics)


# -- ListGroups, DescribeGroups, DeleteGroups -------------------------------------------------


def list_groups_response(version: int, groups: tuple[ListedGroup, ...]) -> Any:
    module = _module(ApiKey.LIST_GROUPS, version)
    listed = tuple(
        make_entity(
            module.ListedGroup,
            group_id=g.group_id,
            protocol_type=g.protocol_type,
            group_state=g.state,
            group_type=g.group_type,
        )
        for g in groups
    )
    return _answer(ApiKey.LIST_GROUPS, version, error_code=ErrorCode.none, groups=listed)


def describe_groups_response(
    version: int,
    answers: tuple[tuple[str, DescribedGroup | None], ...],
    refused: ErrorCode | None = None,
) -> Any:
    module = _module(ApiKey.DESCRIBE_GROUPS, version)
    not_found = version >= DESCRIBE_NOT_FOUND_VERSION
    described = []
    for group_id, group in answers:
        # A group that does not exist is described as Dead (from v6 with an error, KIP-1043).
        found = group or DescribedGroup(group_id, "Dead", "", "", ())
        missing = group is None and not_found
        error = ErrorCode.group_id_not_found if missing else ErrorCode.none
        members = _members(
            module.DescribedGroupMember,
            found.members,
            client_id=lambda m: m.client_id,
            client_host=lambda m: m.client_host,
            member_metadata=lambda m: m.metadata,
            member_assignment=lambda m: m.assignment,
        )
        described.append(
            make_entity(
                module.DescribedGroup,
                error_code=refused if refused is not None else error,
                error_message=f"Group {group_id} not found." if missing and not refused else None,
                group_id=found.group_id,
                group_state=found.state,
                protocol_type=found.protocol_type,
                protocol_data=found.protocol_name,
                members=members,
                authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
            )
        )
    return _answer(ApiKey.DESCRIBE_GROUPS, version, groups=tuple(described))


def delete_groups_response(version: int, errors: Mapping[str, ErrorCode]) -> Any:
    module = _module(ApiKey.DELETE_GROUPS, version)
    results = tuple(
        make_entity(module.DeletableGroupResult, group_id=group_id, error_code=error)
        for group_id, error in errors.items()
    )
    return _answer(ApiKey.DELETE_GROUPS, version, results=results)


# -- refused ----------------------------------------------------------------------------------


def refused_response(api: int, version: int, body: Any, error: ErrorCode) -> Any:
    """The answer to a group API request refused as a whole with `error` (see the rules)."""
    if api == ApiKey.FIND_COORDINATOR:
        return find_coordinator_response(version, body, Node(-1, "", -1), refused=error)
    if api == ApiKey.JOIN_GROUP:
        return join_response(version, JoinResult(error, body.member_id))
    if api == ApiKey.SYNC_GROUP:
        return sync_response(version, SyncResult(error))
    if api == ApiKey.HEARTBEAT:
        return heartbeat_response(version, error)
    if api == ApiKey.LEAVE_GROUP:
        return leave_response(version, LeaveResult(error))
    if api == ApiKey.OFFSET_COMMIT:
        ask = commit_request(body, lambda _tp: True)
        every = dict.fromkeys([*ask.offsets, *ask.refused], error)
        refused = dataclasses.replace(ask, refused={})
        return commit_response(version, body, refused, CommitResult(every))
    if api == ApiKey.OFFSET_FETCH:
        asks = fetch_requests(version, body)
        return fetch_response(version, tuple((a, FetchedOffsets(error)) for a in asks))
    if api == ApiKey.LIST_GROUPS:
        return list_groups_response(version, ())
    if api == ApiKey.DESCRIBE_GROUPS:
        answers = tuple((str(g), None) for g in body.groups)
        return describe_groups_response(version, answers, refused=error)
    if api == ApiKey.DELETE_GROUPS:
        return delete_groups_response(version, dict.fromkeys(map(str, body.groups_names), error))
    if api == ApiKey.OFFSET_DELETE:
        return offset_delete_response(body, OffsetDeleteResult(error), {})
    if api == ApiKey.CONSUMER_GROUP_HEARTBEAT:
        return consumer_heartbeat_response(version, HeartbeatResult(error), _no_id)
    if api == ApiKey.CONSUMER_GROUP_DESCRIBE:
        refused = tuple(DescribedConsumerGroup(str(g), error) for g in body.group_ids)
        return consumer_describe_response(version, refused, _no_id)
    raise AssertionError(f"not a group api: {api}")


# -- ConsumerGroupHeartbeat, ConsumerGroupDescribe (KIP-848) ---------------------------------


def consumer_heartbeat_request(
    body: Any,
    client_id: str | None,
    client_host: str,
    name_of: Callable[[uuid.UUID], str | None],
    new_member_id: Callable[[], str],
) -> ConsumerHeartbeat:
    owned: frozenset[TopicPartition] | None = None
    if body.topic_partitions is not None:
        owned = frozenset(
            TopicPartition(name, int(p))
            for t in body.topic_partitions
            if t.topic_id is not None and (name := name_of(t.topic_id)) is not None
            for p in t.partitions
        )
    member_id = body.member_id
    if not member_id and int(body.member_epoch) == 0:
        member_id = new_member_id()  # v0: the coordinator names a joining member
    names = body.subscribed_topic_names
    return ConsumerHeartbeat(
        group_id=str(body.group_id),
        member_id=member_id,
        member_epoch=int(body.member_epoch),
        instance_id=body.instance_id,
        rack_id=body.rack_id,
        rebalance_timeout_ms=_ms(body.rebalance_timeout),
        subscribed_topic_names=None if names is None else tuple(str(n) for n in names),
        subscribed_topic_regex=getattr(body, "subscribed_topic_regex", None),
        server_assignor=body.server_assignor,
        owned=owned,
        client_id=client_id or "",
        client_host=f"/{client_host}",
    )


def _by_topic_id(
    module: Any,
    cls_name: str,
    partitions: Iterable[TopicPartition],
    id_of: Callable[[str], uuid.UUID | None],
    **extra: Callable[[str], Any],
) -> tuple[Any, ...]:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    cls = getattr(module, cls_name)
    return tuple(
        make_entity(
            cls,
            topic_id=id_of(topic),
            partitions=tuple(parts),
            **{name: value(topic) for name, value in extra.items()},
        )
        for topic, parts in by_topic.items()
        if id_of(topic) is not None
    )


def consumer_heartbeat_response(
    version: int, result: HeartbeatResult, id_of: Callable[[str], uuid.UUID | None]
) -> Any:
    module = _module(ApiKey.CONSUMER_GROUP_HEARTBEAT, version)
    assignment = None
    if result.assignment is not None:
        assignment = make_entity(
            module.Assignment,
            topic_partitions=_by_topic_id(module, "TopicPartitions", result.assignment, id_of),
        )
    return _answer(
        ApiKey.CONSUMER_GROUP_HEARTBEAT,
        version,
        error_code=result.error,
        error_message=result.message,
        member_id=result.member_id or None,
        member_epoch=result.member_epoch,
        heartbeat_interval=datetime.timedelta(milliseconds=result.heartbeat_interval_ms),
        assignment=assignment,
    )


def consumer_describe_response(
    version: int,
    groups: Iterable[DescribedConsumerGroup],
    id_of: Callable[[str], uuid.UUID | None],
) -> Any:
    module = _module(ApiKey.CONSUMER_GROUP_DESCRIBE, version)

    def assignment(partitions: frozenset[TopicPartition]) -> Any:
        topics = _by_topic_id(module, "TopicPartitions", partitions, id_of, topic_name=str)
        return make_entity(module.Assignment, topic_partitions=topics)

    described = tuple(
        make_entity(
            module.DescribedGroup,
            error_code=g.error,
            error_message=g.message,
            group_id=g.group_id,
            group_state=g.state,
            group_epoch=g.group_epoch,
            assignment_epoch=g.assignment_epoch,
            assignor_name=g.assignor_name,
            members=tuple(
                make_entity(
                    module.Member,
                    member_id=m.member_id,
                    instance_id=m.instance_id,
                    rack_id=m.rack_id,
                    member_epoch=m.member_epoch,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    subscribed_topic_names=m.subscribed_topic_names,
                    subscribed_topic_regex=m.subscribed_topic_regex,
                    assignment=assignment(m.assignment),
                    target_assignment=assignment(m.target_assignment),
                    member_type=CONSUMER_MEMBER_TYPE,
                )
                for m in g.members
            ),
            authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
        )
        for g in groups
    )
    return _answer(ApiKey.CONSUMER_GROUP_DESCRIBE, version, groups=described)
