"""Reading a cluster's consumer groups and their committed offsets (the asyncio shell).

`ClusterGroupsReader(client)` asks any Kafka cluster, through a `KafkaClient`:
- `list_groups()`: every group, as each broker lists the groups it coordinates (ListGroups
  to every broker, answers merged; a broker that does not answer is named in
  `GroupListing.unreachable`, so a caller never takes a partial list for the whole).
- `committed_offsets(group_ids)`: each group's committed offsets (FindCoordinator, batched
  from v4; then OffsetFetch to each coordinator, several groups per request from v8).
- `describe(group_ids)`: state, protocol and members with their assignments (DescribeGroups
  to each coordinator).
- `topic_configs(topics)`: the topics' configuration entries as the cluster reports them
  (DescribeConfigs to any broker).

Rules:
- A group's coordinator is found once and kept; an answer saying it moved
  (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE) or a connection failure forgets it, so the
  next call asks again. COORDINATOR_LOAD_IN_PROGRESS keeps it (the coordinator is right,
  only busy).
- Per-group failures are results, not exceptions: a `GroupOffsets` or `GroupDescription`
  carries the error name and no data; the other groups of the same call are unaffected.
  Only "no broker answers at all" raises (KafkaConnectionError, from the client).
- Offsets are the cluster's as they are: an offset of -1 (no commit) is left out, every
  other one kept with its leader epoch and metadata.
- Versions: the highest both sides speak (protocol/apis.py); a broker without these APIs
  makes the calls return per-group errors ("unsupported"), never crash.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog
from kio.schema.errors import ErrorCode

from replicad.errors import KafkaConnectionError, ProtocolError
from replicad.groups.consumer_protocol import PROTOCOL_TYPE, assigned_partitions
from replicad.protocol.admin import admin_version, describe_topic_configs_request
from replicad.protocol.apis import ApiKey
from replicad.protocol.client import KafkaClient
from replicad.protocol.codec import request_type
from replicad.protocol.connection import BrokerAddress, BrokerConnection
from replicad.protocol.error_codes import error_code_of, error_name
from replicad.protocol.requests import make_entity, nested_type
from replicad.types import OffsetAndMetadata, TopicPartition
from replicad.wire import (
    FIND_COORDINATOR_BATCHED_VERSION,
    GROUP_KEY_TYPE,
    OFFSET_FETCH_BATCHED_VERSION,
    UNKNOWN_OFFSET,
)

log = structlog.get_logger("replicad.groups.reader")

# Errors meaning "ask FindCoordinator again".
COORDINATOR_MOVED = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_not_available})
UNSUPPORTED = "unsupported_version"
# The protocol type of a group that only commits offsets.
NO_PROTOCOL = ""
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    # ListGroups v4+ (None from older brokers) ...
    state: str | None = None
    # ... and v5+: "classic" or "consumer" (KIP-848).
    group_type: str | None = None


@dataclass(frozen=True, slots=True)
class GroupListing:
    groups: tuple[ListedGroup, ...]
    # Brokers (node ids) whose groups are missing: no answer, or an error (named).
    unreachable: Mapping[int, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.unreachable

    def consumer_groups(self, selects: Callable[[str], bool]) -> list[str]:
        """The ids of the listed groups `selects` chooses whose protocol is a consumer's or
        none (a group that only commits offsets: assign() consumers, Spark, an admin) --
        the groups whose offsets a sync may carry."""
        return [
            g.group_id
            for g in self.groups
            if g.protocol_type in (PROTOCOL_TYPE, NO_PROTOCOL) and selects(g.group_id)
        ]


@dataclass(frozen=True, slots=True)
class GroupOffsets:
    group_id: str
    offsets: Mapping[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)
    # An error name ("coordinator_load_in_progress", "unreachable: ...") when the group's
    # offsets could not be read; partitions that failed alone are in `partition_errors`.
    error: str | None = None
    partition_errors: Mapping[TopicPartition, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GroupMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    assignment: bytes
    # The assignment read as the "consumer" protocol; None for other protocols.
    partitions: tuple[TopicPartition, ...] | None


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str = "Dead"
    protocol_type: str = ""
    protocol: str = ""
    members: tuple[GroupMember, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One topic config as DescribeConfigs reports it (Kafka's ConfigSource numbers)."""

    name: str
    value: str | None
    read_only: bool = False
    source: int = -1
    sensitive: bool = False
    config_type: int = 0


@dataclass(frozen=True, slots=True)
class TopicConfigs:
    topic: str
    entries: tuple[ConfigEntry, ...] = ()
    error: str | None = None


class ClusterGroupsReader:
    """Groups and committed offsets of one cluster; see the module docstring."""

    def __init__(self, client: KafkaClient) -> None:
        self.client = client
        self._coordinators: dict[str, int] = {}

    async def _some_connection(self) -> BrokerConnection:
        """A connection to any known broker (the brokers are learnt first if need be)."""
        return await self.client.broker_connection()

    # -- ListGroups -----------------------------------------------------------------------

    async def list_groups(self) -> GroupListing:
        await self.client.metadata(())
        node_ids = sorted(self.client.brokers)
        answers = await asyncio.gather(
            *(self._list_groups_on(n) for n in node_ids), return_exceptions=True
        )
        groups: dict[str, ListedGroup] = {}
        unreachable: dict[int, str] = {}
        for node_id, answer in zip(node_ids, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, (KafkaConnectionError, ProtocolError)):
                    raise answer
                unreachable[node_id] = str(answer)
                continue
            if isinstance(answer, str):
                unreachable[node_id] = answer
                continue
            for g in answer:
                groups.setdefault(g.group_id, g)
        return GroupListing(tuple(groups[g] for g in sorted(groups)), unreachable)

    async def _list_groups_on(self, node_id: int) -> list[ListedGroup] | str:
        conn = await self.client.connection(node_id)
        version = admin_version(conn, ApiKey.LIST_GROUPS)
        if version is None:
            return UNSUPPORTED
        body = await conn.request(
            make_entity(
                request_type(ApiKey.LIST_GROUPS, version), states_filter=(), types_filter=()
            )
        )
        code = error_code_of(int(body.error_code))
        if code != ErrorCode.none:
            return code.name
        return [
            ListedGroup(
                group_id=str(g.group_id),
                protocol_type=str(g.protocol_type),
                state=getattr(g, "group_state", None),
                group_type=getattr(g, "group_type", None),
            )
            for g in body.groups
        ]

    # -- FindCoordinator ------------------------------------------------------------------

    async def coordinators(self, group_ids: Iterable[str]) -> dict[str, int | str]:
        """Each group's coordinator node id, or the error name that kept it unknown."""
        wanted = list(dict.fromkeys(group_ids))
        found: dict[str, int | str] = {
            g: self._coordinators[g] for g in wanted if g in self._coordinators
        }
        missing = [g for g in wanted if g not in found]
        if not missing:
            return found
        try:
            conn = await self._some_connection()
        except (KafkaConnectionError, ProtocolError) as exc:
            return {**found, **{g: f"unreachable: {exc}" for g in missing}}
        version = admin_version(conn, ApiKey.FIND_COORDINATOR)
        if version is None:
            return {**found, **{g: UNSUPPORTED for g in missing}}
        try:
            answers = await self._find_coordinators(conn, version, missing)
        except (KafkaConnectionError, ProtocolError) as exc:
            return {**found, **{g: f"unreachable: {exc}" for g in missing}}
        for group_id, (code, node_id, host, port) in answers.items():
            if code == ErrorCode.none:
                self._coordinators[group_id] = node_id
                self.client.brokers.setdefault(node_id, BrokerAddress(node_id, host, port))
                found[group_id] = node_id
            else:
                found[group_id] = code.name
        return found

    async def _find_coordinators(
        self, conn: BrokerConnection, version: int, group_ids: Sequence[str]
    ) -> dict[str, tuple[ErrorCode, int, str, int]]:
        cls = request_type(ApiKey.FIND_COORDINATOR, version)
        if version >= FIND_COORDINATOR_BATCHED_VERSION:
            body = await conn.request(
                make_entity(cls, key_type=GROUP_KEY_TYPE, coordinator_keys=tuple(group_ids))
            )
            return {
                str(c.key): (
                    error_code_of(int(c.error_code)),
                    int(c.node_id),
                    str(c.host),
                    int(c.port),
                )
                for c in body.coordinators
            }
        answers = {}
        for group_id in group_ids:
            body = await conn.request(make_entity(cls, key=group_id, key_type=GROUP_KEY_TYPE))
            answers[group_id] = (
                error_code_of(int(body.error_code)),
                int(body.node_id),
                str(body.host),
                int(body.port),
            )
        return answers

    def _forget(self, group_id: str, error: ErrorCode | None = None) -> None:
        if error is None or error in COORDINATOR_MOVED:
            self._coordinators.pop(group_id, None)

    def forget(self, group_id: str) -> None:
        """Ask FindCoordinator again next time (a writer using this cache learnt that the
        coordinator moved or cannot be reached)."""
        self._forget(group_id)

    async def _by_coordinator(
        self, group_ids: Iterable[str]
    ) -> tuple[dict[int, list[str]], dict[str, str]]:
        by_node: dict[int, list[str]] = {}
        failed: dict[str, str] = {}
        for group_id, where in (await self.coordinators(group_ids)).items():
            if isinstance(where, int):
                by_node.setdefault(where, []).append(group_id)
            else:
                failed[group_id] = where
        return by_node, failed

    async def _per_coordinator(
        self,
        group_ids: Iterable[str],
        ask: Callable[[int, list[str]], Awaitable[Mapping[str, R]]],
        failure: Callable[[str, str], R],
    ) -> dict[str, R]:
        """`ask(node, groups)` of each coordinator at once; a group whose coordinator is
        unknown, unreachable or moved gets `failure(group, why)` (and is looked up again
        next time)."""
        wanted = list(dict.fromkeys(group_ids))
        by_node, failed = await self._by_coordinator(wanted)
        results = {g: failure(g, error) for g, error in failed.items()}
        answers = await asyncio.gather(
            *(ask(n, groups) for n, groups in by_node.items()), return_exceptions=True
        )
        for groups, answer in zip(by_node.values(), answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, (KafkaConnectionError, ProtocolError)):
                    raise answer
                for g in groups:
                    self._forget(g)
                    results[g] = failure(g, f"unreachable: {answer}")
                continue
            for g in groups:
                result = answer.get(g)
                if result is None:
                    result = failure(g, "missing from the answer")
                error = getattr(result, "error", None)
                if error is not None:
                    self._forget(g, _code_named(error))
                results[g] = result
        return {g: results[g] for g in wanted}

    # -- OffsetFetch ----------------------------------------------------------------------

    async def committed_offsets(
        self, group_ids: Iterable[str], *, require_stable: bool = False
    ) -> dict[str, GroupOffsets]:
        """Every committed offset of each group (all topics); see GroupOffsets."""

        async def ask(node_id: int, groups: list[str]) -> Mapping[str, GroupOffsets]:
            return await self._offsets_on(node_id, groups, require_stable)

        return await self._per_coordinator(
            group_ids, ask, lambda g, error: GroupOffsets(g, error=error)
        )

    async def _offsets_on(
        self, node_id: int, group_ids: list[str], require_stable: bool
    ) -> dict[str, GroupOffsets]:
        conn = await self.client.connection(node_id)
        version = admin_version(conn, ApiKey.OFFSET_FETCH)
        if version is None:
            return {g: GroupOffsets(g, error=UNSUPPORTED) for g in group_ids}
        cls = request_type(ApiKey.OFFSET_FETCH, version)
        if version >= OFFSET_FETCH_BATCHED_VERSION:
            group_cls = nested_type(cls, "OffsetFetchRequestGroup")
            body = await conn.request(
                make_entity(
                    cls,
                    groups=tuple(
                        make_entity(
                            group_cls, group_id=g, member_id=None, member_epoch=-1, topics=None
                        )
                        for g in group_ids
                    ),
                    require_stable=require_stable,
                )
            )
            return {
                str(g.group_id): _group_offsets(str(g.group_id), int(g.error_code), g.topics)
                for g in body.groups
            }
        results = {}
        for g in group_ids:
            body = await conn.request(
                make_entity(cls, group_id=g, topics=None, require_stable=require_stable)
            )
            results[g] = _group_offsets(g, int(getattr(body, "error_code", 0)), body.topics)
        return results

    # -- DescribeGroups -------------------------------------------------------------------

    async def describe(self, group_ids: Iterable[str]) -> dict[str, GroupDescription]:
        """State, protocol and members of each group; see GroupDescription."""
        return await self._per_coordinator(
            group_ids, self._describe_on, lambda g, error: GroupDescription(g, error=error)
        )

    async def _describe_on(self, node_id: int, group_ids: list[str]) -> dict[str, GroupDescription]:
        conn = await self.client.connection(node_id)
        version = admin_version(conn, ApiKey.DESCRIBE_GROUPS)
        if version is None:
            return {g: GroupDescription(g, error=UNSUPPORTED) for g in group_ids}
        body = await conn.request(
            make_entity(
                request_type(ApiKey.DESCRIBE_GROUPS, version),
                groups=tuple(group_ids),
                include_authorized_operations=False,
            )
        )
        results = {}
        for g in body.groups:
            code = error_code_of(int(g.error_code))
            if code != ErrorCode.none:
                results[str(g.group_id)] = GroupDescription(str(g.group_id), error=code.name)
                continue
            consumer = str(g.protocol_type) == PROTOCOL_TYPE
            results[str(g.group_id)] = GroupDescription(
                group_id=str(g.group_id),
                state=str(g.group_state),
                protocol_type=str(g.protocol_type),
                protocol=str(g.protocol_data),
                members=tuple(
                    GroupMember(
                        member_id=str(m.member_id),
                        group_instance_id=getattr(m, "group_instance_id", None),
                        client_id=str(m.client_id),
                        client_host=str(m.client_host),
                        assignment=bytes(m.member_assignment),
                        partitions=assigned_partitions(bytes(m.member_assignment))
                        if consumer
                        else None,
                    )
                    for m in g.members
                ),
            )
        return results

    # -- DescribeConfigs ------------------------------------------------------------------

    async def topic_configs(self, topics: Iterable[str]) -> dict[str, TopicConfigs]:
        """Every config entry of each topic (all keys, as the cluster reports them)."""
        wanted = list(dict.fromkeys(topics))
        if not wanted:
            return {}
        conn = await self._some_connection()
        version = admin_version(conn, ApiKey.DESCRIBE_CONFIGS)
        if version is None:
            return {t: TopicConfigs(t, error=UNSUPPORTED) for t in wanted}
        body = await conn.request(describe_topic_configs_request(version, wanted))
        results: dict[str, TopicConfigs] = {}
        for r in body.results:
            name = str(r.resource_name)
            code = error_code_of(int(r.error_code))
            if code != ErrorCode.none:
                results[name] = TopicConfigs(name, error=code.name)
                continue
            results[name] = TopicConfigs(
                name,
                tuple(
                    ConfigEntry(
                        name=str(c.name),
                        value=c.value,
                        read_only=bool(c.read_only),
                        source=int(getattr(c, "config_source", -1)),
                        sensitive=bool(c.is_sensitive),
                        config_type=int(getattr(c, "config_type", 0)),
                    )
                    for c in r.configs
                ),
            )
        return {t: results.get(t, TopicConfigs(t, error="missing from the answer")) for t in wanted}


def _code_named(name: str) -> ErrorCode | None:
    try:
        return ErrorCode[name]
    except KeyError:
        return None


def _group_offsets(group_id: str, group_error: int, topics: Sequence[Any]) -> GroupOffsets:
    code = error_code_of(group_error)
    if code != ErrorCode.none:
        return GroupOffsets(group_id, error=code.name)
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    errors: dict[TopicPartition, str] = {}
    for t in topics:
        for p in t.partitions:
            tp = TopicPartition(str(t.name), int(p.partition_index))
            pcode = int(p.error_code)
            if pcode != ErrorCode.none:
                errors[tp] = error_name(pcode)
                continue
            if int(p.committed_offset) == UNKNOWN_OFFSET:
                continue
            offsets[tp] = OffsetAndMetadata(
                offset=int(p.committed_offset),
                leader_epoch=int(getattr(p, "committed_leader_epoch", -1)),
                metadata=p.metadata,
            )
    return GroupOffsets(group_id, offsets, partition_errors=errors)
