"""The group APIs on the wire: every version serve advertises turns its kio request into the
coordinator's and the coordinator's answer into a response kio encodes and reads back."""

from __future__ import annotations

import datetime
import sys
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from replicad import wire
from replicad.groups.consumer_group import ConsumerHeartbeat, HeartbeatResult
from replicad.groups.coordinator import (
    CoordinatorConfig,
    GroupCoordinator,
    JoinResult,
    MemberRef,
    SyncResult,
)
from replicad.leader import group_wire
from replicad.leader.group_wire import GROUP_VERSIONS, Node
from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import (
    decode_response,
    encode_entities,
    request_type,
    response_header,
    response_type,
)
from replicad.protocol.requests import make_entity
from replicad.types import OffsetAndMetadata, TopicPartition
from tests.groups.test_consumer_protocol import encoded

NODE = Node(3, "replica.example", 9092)
TP = TopicPartition("t", 0)


def versions(api: ApiKey) -> list[int]:
    r = GROUP_VERSIONS[api]
    return list(range(r.min, r.max + 1))


def roundtrip(api: ApiKey, version: int, body: Any) -> Any:
    """`body` encoded as kio encodes it and read back."""
    cls = response_type(api, version)
    frame = response_header(cls, 7) + encode_entities(body)
    return decode_response(frame, cls).body


def request(api: ApiKey, version: int, **values: Any) -> Any:
    return make_entity(request_type(api, version), **values)


def nested(api: ApiKey, version: int, name: str) -> type:
    return getattr(sys.modules[request_type(api, version).__module__], name)


def test_every_group_api_is_served_in_the_versions_kafka_4_answers() -> None:
    assert GROUP_VERSIONS[ApiKey.JOIN_GROUP].min == 2  # KIP-896 removed v0-v1
    assert GROUP_VERSIONS[ApiKey.OFFSET_COMMIT].min == 2
    assert GROUP_VERSIONS[ApiKey.OFFSET_FETCH].min == 1
    for api, served in GROUP_VERSIONS.items():
        for version in range(served.min, served.max + 1):
            assert request_type(api, version) and response_type(api, version)


@pytest.mark.parametrize("version", versions(ApiKey.FIND_COORDINATOR))
def test_find_coordinator_names_this_node_for_groups_only(version: int) -> None:
    batched = version >= wire.FIND_COORDINATOR_BATCHED_VERSION
    keys = {"coordinator_keys": ("a", "b")} if batched else {"key": "a"}
    body = roundtrip(
        ApiKey.FIND_COORDINATOR,
        version,
        group_wire.find_coordinator_response(
            version, request(ApiKey.FIND_COORDINATOR, version, key_type=0, **keys), NODE
        ),
    )
    found = body.coordinators if batched else (body,)
    assert [(c.node_id, c.host, c.port, c.error_code) for c in found] == [
        (3, "replica.example", 9092, ErrorCode.none)
    ] * len(found)
    if batched:
        assert [c.key for c in found] == ["a", "b"]
    if version >= 1:
        txn = group_wire.find_coordinator_response(
            version, request(ApiKey.FIND_COORDINATOR, version, key_type=1, **keys), NODE
        )
        first = txn.coordinators[0] if batched else txn
        assert first.error_code == ErrorCode.coordinator_not_available


def join_request(
    version: int, member_id: str = "", instance: str | None = None, group_id: str = "g"
) -> Any:
    """A consumer's JoinGroup (range, subscribed to "t"); also test_groups.py's."""
    protocol = nested(ApiKey.JOIN_GROUP, version, "JoinGroupRequestProtocol")
    return request(
        ApiKey.JOIN_GROUP,
        version,
        group_id=group_id,
        session_timeout=datetime.timedelta(seconds=10),
        rebalance_timeout=datetime.timedelta(seconds=30),
        member_id=member_id,
        group_instance_id=instance,
        protocol_type="consumer",
        protocols=(
            protocol(
                name="range",
                metadata=encoded(
                    "consumer_protocol_subscription", 0, topics=("t",), user_data=None
                ),
            ),
        ),
        reason=None,
    )


@pytest.mark.parametrize("version", versions(ApiKey.JOIN_GROUP))
def test_join_and_sync_in_every_version(version: int) -> None:
    coordinator = GroupCoordinator(CoordinatorConfig(initial_rebalance_delay_ms=0))
    answers: dict[object, JoinResult | SyncResult] = {}

    def take(step: Any) -> None:
        answers.update({r.token: r.result for r in step.replies})

    join = group_wire.join_request(version, join_request(version), "client", "10.0.0.1")
    assert join.client_host == "/10.0.0.1"
    assert join.require_known_member_id is (version >= 4)
    take(coordinator.join(join, "j1", now_ms=0))
    if version >= 4:
        required = roundtrip(
            ApiKey.JOIN_GROUP, version, group_wire.join_response(version, answers["j1"])
        )
        assert required.error_code == ErrorCode.member_id_required
        again = group_wire.join_request(
            version, join_request(version, required.member_id), "client", "10.0.0.1"
        )
        take(coordinator.join(again, "j2", now_ms=0))
        answers["j1"] = answers["j2"]
    joined = roundtrip(ApiKey.JOIN_GROUP, version, group_wire.join_response(version, answers["j1"]))
    assert (joined.error_code, joined.generation_id, joined.protocol_name) == (
        ErrorCode.none,
        1,
        "range",
    )
    assert joined.leader == joined.member_id and len(joined.members) == 1

    sync_version = min(version, GROUP_VERSIONS[ApiKey.SYNC_GROUP].max)
    assignment = nested(ApiKey.SYNC_GROUP, sync_version, "SyncGroupRequestAssignment")
    sync = group_wire.sync_request(
        request(
            ApiKey.SYNC_GROUP,
            sync_version,
            group_id="g",
            generation_id=1,
            member_id=joined.member_id,
            group_instance_id=None,
            protocol_type="consumer",
            protocol_name="range",
            assignments=(assignment(member_id=joined.member_id, assignment=b"A"),),
        )
    )
    take(coordinator.sync(sync, "s", now_ms=0))
    synced = roundtrip(
        ApiKey.SYNC_GROUP, sync_version, group_wire.sync_response(sync_version, answers["s"])
    )
    assert (synced.error_code, synced.assignment) == (ErrorCode.none, b"A")


@pytest.mark.parametrize("version", [2, 6, 7])
def test_a_join_error_answers_a_protocol_name_each_version_can_carry(version: int) -> None:
    body = roundtrip(
        ApiKey.JOIN_GROUP,
        version,
        group_wire.join_response(version, JoinResult(ErrorCode.unknown_member_id, "m")),
    )
    assert body.error_code == ErrorCode.unknown_member_id
    assert body.protocol_name == ("" if version < 7 else None)


@pytest.mark.parametrize("version", versions(ApiKey.LEAVE_GROUP))
def test_leave_group_single_and_batched(version: int) -> None:
    coordinator = GroupCoordinator()
    if version < group_wire.LEAVE_BATCHED_VERSION:
        body = request(ApiKey.LEAVE_GROUP, version, group_id="g", member_id="m")
    else:
        identity = nested(ApiKey.LEAVE_GROUP, version, "MemberIdentity")
        body = request(
            ApiKey.LEAVE_GROUP,
            version,
            group_id="g",
            members=(
                identity(member_id="m", group_instance_id=None, reason=None)
                if version >= 5
                else identity(member_id="m", group_instance_id=None),
            ),
        )
    leaving = group_wire.leaving_members(version, body)
    result = coordinator.leave("g", leaving, now_ms=0).result
    answer = roundtrip(ApiKey.LEAVE_GROUP, version, group_wire.leave_response(version, result))
    if version < group_wire.LEAVE_BATCHED_VERSION:
        assert answer.error_code == ErrorCode.unknown_member_id
    else:
        assert answer.error_code == ErrorCode.none
        assert [m.error_code for m in answer.members] == [ErrorCode.unknown_member_id]


@pytest.mark.parametrize("version", versions(ApiKey.HEARTBEAT))
def test_heartbeat_in_every_version(version: int) -> None:
    body = roundtrip(
        ApiKey.HEARTBEAT,
        version,
        group_wire.heartbeat_response(version, ErrorCode.rebalance_in_progress),
    )
    assert body.error_code == ErrorCode.rebalance_in_progress


def commit_body(version: int) -> Any:
    topic = nested(ApiKey.OFFSET_COMMIT, version, "OffsetCommitRequestTopic")
    partition = nested(ApiKey.OFFSET_COMMIT, version, "OffsetCommitRequestPartition")
    return request(
        ApiKey.OFFSET_COMMIT,
        version,
        group_id="g",
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        retention_time=-1,
        topics=(
            topic(
                name="t",
                partitions=tuple(
                    make_entity(
                        partition,
                        partition_index=i,
                        committed_offset=40 + i,
                        committed_leader_epoch=5,
                        committed_metadata="m",
                    )
                    for i in (0, 1)
                ),
            ),
            topic(
                name="absent",
                partitions=(
                    make_entity(
                        partition,
                        partition_index=0,
                        committed_offset=1,
                        committed_leader_epoch=-1,
                        committed_metadata=None,
                    ),
                ),
            ),
        ),
    )


@pytest.mark.parametrize("version", versions(ApiKey.OFFSET_COMMIT))
def test_commit_and_fetch_offsets_in_every_version(version: int) -> None:
    coordinator = GroupCoordinator()
    body = commit_body(version)
    ask = group_wire.commit_request(body, lambda tp: tp.topic == "t")
    assert ask.refused == {TopicPartition("absent", 0): ErrorCode.unknown_topic_or_partition}
    result = coordinator.commit(
        ask.group_id, ask.generation_id, ask.member, ask.offsets, now_ms=0
    ).result
    answer = roundtrip(
        ApiKey.OFFSET_COMMIT, version, group_wire.commit_response(version, body, ask, result)
    )
    assert [[(p.partition_index, p.error_code) for p in t.partitions] for t in answer.topics] == [
        [(0, ErrorCode.none), (1, ErrorCode.none)],
        [(0, ErrorCode.unknown_topic_or_partition)],
    ]
    assert coordinator.fetch_offsets("g", [TP]).offsets[TP].leader_epoch == (
        5 if version >= 6 else -1
    )


@pytest.mark.parametrize("version", versions(ApiKey.OFFSET_FETCH))
def test_offset_fetch_single_group_and_batched(version: int) -> None:
    coordinator = GroupCoordinator()
    coordinator.commit(
        "g",
        -1,
        MemberRef(""),
        {TP: OffsetAndMetadata(42, 7, "meta")},
        now_ms=0,
    )
    batched = version >= wire.OFFSET_FETCH_BATCHED_VERSION
    topics_cls = nested(
        ApiKey.OFFSET_FETCH,
        version,
        "OffsetFetchRequestTopics" if batched else "OffsetFetchRequestTopic",
    )
    asked = (topics_cls(name="t", partition_indexes=(0, 1)),)
    if batched:
        group_cls = nested(ApiKey.OFFSET_FETCH, version, "OffsetFetchRequestGroup")
        groups = tuple(
            make_entity(group_cls, group_id=g, member_id=None, member_epoch=-1, topics=asked)
            for g in ("g", "other")
        )
        body = request(ApiKey.OFFSET_FETCH, version, groups=groups, require_stable=False)
    else:
        body = request(
            ApiKey.OFFSET_FETCH, version, group_id="g", topics=asked, require_stable=False
        )
    asks = group_wire.fetch_requests(version, body)
    answers = tuple((a, coordinator.fetch_offsets(a.group_id, a.partitions)) for a in asks)
    answer = roundtrip(ApiKey.OFFSET_FETCH, version, group_wire.fetch_response(version, answers))
    groups_answered = answer.groups if batched else (answer,)
    first = groups_answered[0].topics[0].partitions
    assert [(p.partition_index, p.committed_offset) for p in first] == [(0, 42), (1, -1)]
    if version >= 5:
        assert first[0].committed_leader_epoch == 7
    if batched:
        other = groups_answered[1].topics[0].partitions
        assert [p.committed_offset for p in other] == [-1, -1]


@pytest.mark.parametrize("version", versions(ApiKey.OFFSET_FETCH)[1:])
def test_offset_fetch_of_all_partitions(version: int) -> None:
    coordinator = GroupCoordinator()
    coordinator.commit("g", -1, MemberRef(""), {TP: OffsetAndMetadata(42)}, now_ms=0)
    if version >= wire.OFFSET_FETCH_BATCHED_VERSION:
        group_cls = nested(ApiKey.OFFSET_FETCH, version, "OffsetFetchRequestGroup")
        body = request(
            ApiKey.OFFSET_FETCH,
            version,
            groups=(
                make_entity(group_cls, group_id="g", member_id=None, member_epoch=-1, topics=None),
            ),
            require_stable=False,
        )
    else:
        body = request(
            ApiKey.OFFSET_FETCH, version, group_id="g", topics=None, require_stable=False
        )
    (ask,) = group_wire.fetch_requests(version, body)
    assert ask.partitions is None
    fetched = coordinator.fetch_offsets(ask.group_id, ask.partitions)
    assert roundtrip(
        ApiKey.OFFSET_FETCH, version, group_wire.fetch_response(version, ((ask, fetched),))
    )


@pytest.mark.parametrize("version", versions(ApiKey.LIST_GROUPS))
def test_list_describe_and_delete_in_every_version(version: int) -> None:
    coordinator = GroupCoordinator()
    coordinator.commit("g", -1, MemberRef(""), {TP: OffsetAndMetadata(1)}, now_ms=0)
    listed = roundtrip(
        ApiKey.LIST_GROUPS,
        version,
        group_wire.list_groups_response(version, coordinator.list_groups()),
    )
    assert [g.group_id for g in listed.groups] == ["g"]
    if version >= 4:
        assert listed.groups[0].group_state == "Empty"
    for describe_version in versions(ApiKey.DESCRIBE_GROUPS):
        described = roundtrip(
            ApiKey.DESCRIBE_GROUPS,
            describe_version,
            group_wire.describe_groups_response(
                describe_version, (("g", coordinator.describe("g")), ("x", None))
            ),
        )
        found, missing = described.groups
        assert (found.group_id, found.group_state, found.error_code) == (
            "g",
            "Empty",
            ErrorCode.none,
        )
        assert missing.group_state == "Dead"
        assert missing.error_code == (
            ErrorCode.group_id_not_found if describe_version >= 6 else ErrorCode.none
        )
    delete_version = min(version, GROUP_VERSIONS[ApiKey.DELETE_GROUPS].max)
    errors = coordinator.delete_groups(["g", "x"], now_ms=0)
    deleted = roundtrip(
        ApiKey.DELETE_GROUPS,
        delete_version,
        group_wire.delete_groups_response(delete_version, errors),
    )
    assert [(r.group_id, r.error_code) for r in deleted.results] == [
        ("g", ErrorCode.none),
        ("x", ErrorCode.group_id_not_found),
    ]


def test_offset_delete_answers_each_partition_and_refuses_topics_not_held() -> None:
    coordinator = GroupCoordinator()
    coordinator.commit("g", -1, MemberRef(""), {TP: OffsetAndMetadata(1)}, now_ms=0)
    topic = nested(ApiKey.OFFSET_DELETE, 0, "OffsetDeleteRequestTopic")
    partition = nested(ApiKey.OFFSET_DELETE, 0, "OffsetDeleteRequestPartition")
    body = request(
        ApiKey.OFFSET_DELETE,
        0,
        group_id="g",
        topics=(
            topic(name="t", partitions=(partition(partition_index=0),)),
            topic(name="absent", partitions=(partition(partition_index=0),)),
        ),
    )
    wanted = [tp for tp in group_wire.offset_delete_partitions(body) if tp.topic == "t"]
    result = coordinator.delete_offsets("g", wanted, now_ms=0)
    refused = {TopicPartition("absent", 0): ErrorCode.unknown_topic_or_partition}
    answer = roundtrip(
        ApiKey.OFFSET_DELETE, 0, group_wire.offset_delete_response(body, result, refused)
    )
    assert answer.error_code == ErrorCode.none
    assert [(t.name, t.partitions[0].error_code) for t in answer.topics] == [
        ("t", ErrorCode.none),
        ("absent", ErrorCode.unknown_topic_or_partition),
    ]
    gone = coordinator.delete_offsets("g", wanted, now_ms=0)
    answer = roundtrip(ApiKey.OFFSET_DELETE, 0, group_wire.offset_delete_response(body, gone, {}))
    assert answer.error_code == ErrorCode.group_id_not_found


REFUSED = ErrorCode.group_authorization_failed


@pytest.mark.parametrize("version", versions(ApiKey.FIND_COORDINATOR))
def test_a_refused_find_coordinator_names_no_coordinator(version: int) -> None:
    batched = version >= wire.FIND_COORDINATOR_BATCHED_VERSION
    keys = {"coordinator_keys": ("a", "b")} if batched else {"key": "a"}
    asked = request(ApiKey.FIND_COORDINATOR, version, key_type=0, **keys)
    body = roundtrip(
        ApiKey.FIND_COORDINATOR,
        version,
        group_wire.refused_response(ApiKey.FIND_COORDINATOR, version, asked, REFUSED),
    )
    found = body.coordinators if batched else (body,)
    assert [(c.node_id, c.error_code) for c in found] == [(-1, REFUSED)] * len(found)


@pytest.mark.parametrize("version", versions(ApiKey.OFFSET_COMMIT))
def test_refused_joins_heartbeats_and_commits_carry_the_error(version: int) -> None:
    join_version = min(version, GROUP_VERSIONS[ApiKey.JOIN_GROUP].max)
    joined = roundtrip(
        ApiKey.JOIN_GROUP,
        join_version,
        group_wire.refused_response(
            ApiKey.JOIN_GROUP, join_version, join_request(join_version, "m-1"), REFUSED
        ),
    )
    assert (joined.error_code, joined.member_id) == (REFUSED, "m-1")
    beat_version = min(version, GROUP_VERSIONS[ApiKey.HEARTBEAT].max)
    beat = roundtrip(
        ApiKey.HEARTBEAT,
        beat_version,
        group_wire.refused_response(ApiKey.HEARTBEAT, beat_version, None, REFUSED),
    )
    assert beat.error_code == REFUSED
    committed = roundtrip(
        ApiKey.OFFSET_COMMIT,
        version,
        group_wire.refused_response(ApiKey.OFFSET_COMMIT, version, commit_body(version), REFUSED),
    )
    assert [(t.name, [p.error_code for p in t.partitions]) for t in committed.topics] == [
        ("t", [REFUSED, REFUSED]),
        ("absent", [REFUSED]),
    ]


@pytest.mark.parametrize("version", versions(ApiKey.DESCRIBE_GROUPS))
def test_refused_admin_requests_list_nothing_and_refuse_each_group(version: int) -> None:
    list_version = min(version, GROUP_VERSIONS[ApiKey.LIST_GROUPS].max)
    listed = roundtrip(
        ApiKey.LIST_GROUPS,
        list_version,
        group_wire.refused_response(ApiKey.LIST_GROUPS, list_version, None, REFUSED),
    )
    assert (listed.error_code, listed.groups) == (ErrorCode.none, ())
    asked = request(
        ApiKey.DESCRIBE_GROUPS, version, groups=("g", "h"), include_authorized_operations=False
    )
    described = roundtrip(
        ApiKey.DESCRIBE_GROUPS,
        version,
        group_wire.refused_response(ApiKey.DESCRIBE_GROUPS, version, asked, REFUSED),
    )
    assert [(g.group_id, g.error_code) for g in described.groups] == [
        ("g", REFUSED),
        ("h", REFUSED),
    ]
    delete_version = min(version, GROUP_VERSIONS[ApiKey.DELETE_GROUPS].max)
    deleted = roundtrip(
        ApiKey.DELETE_GROUPS,
        delete_version,
        group_wire.refused_response(
            ApiKey.DELETE_GROUPS,
            delete_version,
            request(ApiKey.DELETE_GROUPS, delete_version, groups_names=("g",)),
            REFUSED,
        ),
    )
    assert [(r.group_id, r.error_code) for r in deleted.results] == [("g", REFUSED)]


# -- ConsumerGroupHeartbeat, ConsumerGroupDescribe (KIP-848) -----------------------------------

TOPIC_ID = uuid.UUID(int=0xBEEF)
NAMES = {TOPIC_ID: "t"}


def consumer_versions(api: ApiKey) -> list[int]:
    r = group_wire.CONSUMER_PROTOCOL_VERSIONS[api]
    return list(range(r.min, r.max + 1))


@pytest.mark.parametrize("version", consumer_versions(ApiKey.CONSUMER_GROUP_HEARTBEAT))
def test_a_consumer_heartbeat_names_topics_by_id_both_ways(version: int) -> None:
    api = ApiKey.CONSUMER_GROUP_HEARTBEAT
    owned_cls = nested(api, version, "TopicPartitions")
    body = request(
        api,
        version,
        group_id="g",
        member_id="" if version == 0 else "m",
        member_epoch=0,
        rebalance_timeout=datetime.timedelta(seconds=30),
        subscribed_topic_names=("t",),
        topic_partitions=(
            make_entity(owned_cls, topic_id=TOPIC_ID, partitions=(1,)),
            make_entity(owned_cls, topic_id=uuid.UUID(int=9), partitions=(0,)),  # unknown here
        ),
    )
    beat = group_wire.consumer_heartbeat_request(body, "cid", "10.0.0.1", NAMES.get, lambda: "new")
    # v0: a joining member without an id is given one.
    assert beat.member_id == ("new" if version == 0 else "m")
    assert beat.owned == frozenset({TopicPartition("t", 1)})
    assert (beat.client_id, beat.client_host, beat.rebalance_timeout_ms) == (
        "cid",
        "/10.0.0.1",
        30_000,
    )
    result = HeartbeatResult(ErrorCode.none, None, "m", 3, 500, frozenset({TP}))
    back = roundtrip(api, version, group_wire.consumer_heartbeat_response(version, result, ids))
    assert (back.member_epoch, back.heartbeat_interval) == (3, datetime.timedelta(milliseconds=500))
    [assigned] = back.assignment.topic_partitions
    assert (assigned.topic_id, tuple(assigned.partitions)) == (TOPIC_ID, (0,))
    unchanged = HeartbeatResult(ErrorCode.none, None, "m", 3, 500, None)
    none = roundtrip(api, version, group_wire.consumer_heartbeat_response(version, unchanged, ids))
    assert none.assignment is None


def ids(name: str) -> uuid.UUID | None:
    return {v: k for k, v in NAMES.items()}.get(name)


@pytest.mark.parametrize("version", consumer_versions(ApiKey.CONSUMER_GROUP_DESCRIBE))
def test_consumer_group_describe_shows_members_and_refuses_other_groups(version: int) -> None:
    api = ApiKey.CONSUMER_GROUP_DESCRIBE
    coordinator = GroupCoordinator()
    beat = ConsumerHeartbeat(
        "g", "m", 0, rebalance_timeout_ms=30_000, subscribed_topic_names=("t",), owned=frozenset()
    )
    coordinator.consumer_heartbeat(beat, {"t": 1}, now_ms=1)
    described = (coordinator.describe_consumer_group("g"), coordinator.describe_consumer_group("x"))
    back = roundtrip(api, version, group_wire.consumer_describe_response(version, described, ids))
    found, missing = back.groups
    assert (found.error_code, found.group_state, found.assignor_name) == (
        ErrorCode.none,
        "Stable",
        "uniform",
    )
    [member] = found.members
    [topic] = member.assignment.topic_partitions
    assert (member.member_epoch, topic.topic_name, tuple(topic.partitions)) == (1, "t", (0,))
    assert missing.error_code == ErrorCode.group_id_not_found


def test_refused_consumer_protocol_requests_carry_the_error() -> None:
    beat = request(
        ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, group_id="g", member_id="m", member_epoch=1,
        topic_partitions=None,
    )  # fmt: skip
    answer = group_wire.refused_response(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, beat, REFUSED)
    assert roundtrip(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, answer).error_code == REFUSED
    asked = request(
        ApiKey.CONSUMER_GROUP_DESCRIBE, 1, group_ids=("a", "b"), include_authorized_operations=False
    )
    answer = group_wire.refused_response(ApiKey.CONSUMER_GROUP_DESCRIBE, 1, asked, REFUSED)
    back = roundtrip(ApiKey.CONSUMER_GROUP_DESCRIBE, 1, answer)
    assert [(g.group_id, g.error_code) for g in back.groups] == [("a", REFUSED), ("b", REFUSED)]


TOPIC_IDS = group_wire.TopicIds(NAMES.get, ids)
UNKNOWN_ID = uuid.UUID(int=9)


def test_offset_commit_v10_names_topics_by_id_and_refuses_unknown_ids() -> None:
    api, version = ApiKey.OFFSET_COMMIT, 10
    topic_cls = nested(api, version, "OffsetCommitRequestTopic")
    partition_cls = nested(api, version, "OffsetCommitRequestPartition")
    one = (
        make_entity(
            partition_cls,
            partition_index=0,
            committed_offset=12,
            committed_leader_epoch=3,
            committed_metadata="",
        ),
    )
    body = request(
        api,
        version,
        group_id="g",
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=(
            make_entity(topic_cls, topic_id=TOPIC_ID, partitions=one),
            make_entity(topic_cls, topic_id=UNKNOWN_ID, partitions=one),
        ),
    )
    coordinator = GroupCoordinator()
    ask = group_wire.commit_request(body, lambda tp: tp.topic == "t", TOPIC_IDS)
    assert set(ask.offsets) == {TP}
    result = coordinator.commit("g", -1, MemberRef(""), ask.offsets, now_ms=0, version=10).result
    answer = roundtrip(
        api, version, group_wire.commit_response(version, body, ask, result, TOPIC_IDS)
    )
    assert [(t.topic_id, t.partitions[0].error_code) for t in answer.topics] == [
        (TOPIC_ID, ErrorCode.none),
        (UNKNOWN_ID, ErrorCode.unknown_topic_id),
    ]
    refused = roundtrip(api, version, group_wire.refused_response(api, version, body, REFUSED))
    assert {t.partitions[0].error_code for t in refused.topics} == {REFUSED}

    # OffsetFetch v10: the same topics by id, and all of a group's offsets by id.
    fetch_group = nested(ApiKey.OFFSET_FETCH, 10, "OffsetFetchRequestGroup")
    fetch_topic = nested(ApiKey.OFFSET_FETCH, 10, "OffsetFetchRequestTopics")
    coordinator.commit(
        "g", -1, MemberRef(""), {TopicPartition("gone", 0): OffsetAndMetadata(1)}, now_ms=0
    )
    for topics in (
        (
            make_entity(fetch_topic, topic_id=TOPIC_ID, partition_indexes=(0,)),
            make_entity(fetch_topic, topic_id=UNKNOWN_ID, partition_indexes=(0,)),
        ),
        None,
    ):
        group = make_entity(
            fetch_group, group_id="g", member_id=None, member_epoch=-1, topics=topics
        )
        fetch = request(ApiKey.OFFSET_FETCH, 10, groups=(group,), require_stable=False)
        asks = group_wire.fetch_requests(10, fetch, TOPIC_IDS)
        answers = tuple((a, coordinator.fetch_offsets(a.group_id, a.partitions)) for a in asks)
        back = roundtrip(ApiKey.OFFSET_FETCH, 10, group_wire.fetch_response(10, answers, TOPIC_IDS))
        shown = {
            t.topic_id: (t.partitions[0].committed_offset, t.partitions[0].error_code)
            for t in back.groups[0].topics
        }
        want = {TOPIC_ID: (12, ErrorCode.none)}
        if topics is not None:
            want[UNKNOWN_ID] = (-1, ErrorCode.unknown_topic_id)
        # "gone" has no id here: an all-offsets fetch by id leaves it out.
        assert shown == want
