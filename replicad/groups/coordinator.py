"""The classic group coordinator `replicad serve` runs for every group (sans-I/O: requests
in, answers out, time passed in as `now_ms`; Kafka's GroupCoordinator / GroupMetadataManager
for classic groups). Group states and their transitions are classic_group.py's.

Answers: JoinGroup and SyncGroup may be answered later than asked (a rebalance waits for
the others), so the caller passes a `token` of its own with each and gets `Reply(token,
result)`s back -- from that call or from any later one, `poll` included. Every other
request is answered at once; any call may also carry replies owed to others.

Rules:
- JoinGroup: an empty group id is INVALID_GROUP_ID; a session timeout outside
  [min_session_timeout_ms, max_session_timeout_ms] is INVALID_SESSION_TIMEOUT; a member of
  another protocol type, or sharing no protocol with the members, is
  INCONSISTENT_GROUP_PROTOCOL; a Dead group is COORDINATOR_NOT_AVAILABLE.
  - A new dynamic member (no member id) from JoinGroup v4+ gets a member id with
    MEMBER_ID_REQUIRED and is pending (KIP-394): it must join again with that id within its
    session timeout; before v4 it joins at once. A member id the group does not know is
    UNKNOWN_MEMBER_ID.
  - A new static member (`group.instance.id`, KIP-345) joins at once. If its instance id
    is known, it takes the place of the old member id, whose owed answers are
    FENCED_INSTANCE_ID; in a Stable group whose protocol would stay the same this is no
    rebalance (the leader is told so with skip_assignment; a leader whose JoinGroup is
    older than v9 cannot be, and is answered as a follower -- the old member id named as
    leader, no members -- so it asks SyncGroup for its assignment, as Kafka answers it),
    otherwise it is one.
  - A known member joining again: during PreparingRebalance it is awaited; during
    CompletingRebalance with the same protocols, or in Stable as a follower with the same
    protocols, it gets the current generation back; otherwise a rebalance starts.
- A rebalance (PreparingRebalance) completes once every member has joined again and no
  pending member is expected, or when the rebalance timeout (the largest of the members')
  passes: dynamic members that did not join again are removed (static ones are kept
  until their session times out). If the group was Empty, it waits
  group.initial.rebalance.delay.ms instead, whoever has joined; a group of generation 0
  waits that long again (within the rebalance timeout) as long as members keep coming.
  Completion: generation + 1, the protocol by vote, every waiting member answered (the
  leader with every member's metadata), then CompletingRebalance, or Empty if no member
  is left. A rebalance with nobody to wait for completes as it starts.
- SyncGroup: the member must be known (UNKNOWN_MEMBER_ID), its instance id its own
  (FENCED_INSTANCE_ID), its generation current (ILLEGAL_GENERATION), and from v5 its
  protocol type and name the group's (INCONSISTENT_GROUP_PROTOCOL). In PreparingRebalance:
  REBALANCE_IN_PROGRESS. In CompletingRebalance it waits for the leader's, whose
  assignments (none: empty) answer everyone and make the group Stable. In Stable: the
  member's assignment at once. Members that have not sent SyncGroup within the rebalance
  timeout of the join's completion are removed, and the group rebalances.
- Heartbeat: the same member checks, then Empty is UNKNOWN_MEMBER_ID, PreparingRebalance
  REBALANCE_IN_PROGRESS, CompletingRebalance and Stable NONE; all but the first keep the
  member alive for its session timeout. A member waiting for its JoinGroup or SyncGroup
  answer is alive; any other member not heard from within its session timeout is removed:
  a Stable or CompletingRebalance group then rebalances, a PreparingRebalance one may
  complete.
- LeaveGroup: per member (v3+ batched; a static member may leave by instance id alone):
  UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID as above, else removed as by a timeout. A member
  leaving while its JoinGroup waits gets UNKNOWN_MEMBER_ID there.
- OffsetCommit: with generation < 0 (an admin, or a consumer without a group) only into an
  Empty or unknown group (which it creates, with no protocol type); an unknown group with a
  generation is ILLEGAL_GENERATION. Otherwise the member checks above, and
  REBALANCE_IN_PROGRESS during CompletingRebalance (PreparingRebalance accepts, so members
  commit before they rejoin). Metadata longer than offset_metadata_max_bytes is
  OFFSET_METADATA_TOO_LARGE for that partition.
- OffsetFetch: an unknown group has no offsets (not an error).
- DeleteGroups: unknown is GROUP_ID_NOT_FOUND; with members NON_EMPTY_GROUP; else the group
  and its offsets are gone (Dead). OffsetDelete: unknown GROUP_ID_NOT_FOUND; a group with
  members: NON_EMPTY_GROUP unless it speaks the consumer protocol, then per partition
  GROUP_SUBSCRIBED_TO_TOPIC for subscribed topics.
- Offsets synced from the source (`sync_offsets`, `replicad run` with serve and groups):
  taken only while the group is not the replica's own and has no members here. A group
  becomes the replica's own (`owned`) when a member joins it here or a client commits to it
  here, and stays so for good: its own commits win, even once it is Empty, Dead, deleted or
  restarted (the shell makes the mark durable: `take_newly_owned`, restored by `restore`).
  An offset the group already has is not taken again. The offsets come planned by
  offset_sync.py (replicated partitions only, held at the replica's end).
- Read-only groups (`read_only`, groups.read_only: the groups whose offsets come from the
  source only): OffsetCommit is GROUP_AUTHORIZATION_FAILED for every partition, from members
  and admins alike; a member joining does not make the group the replica's own, so the
  source's offsets are synced again once its members have left.
- Consumer groups (KIP-848, ConsumerGroupHeartbeat; their rules are consumer_group.py's)
  share the group ids, the offsets and the rules above for offsets with classic groups: a
  group id is one or the other. A heartbeat joining a classic group with no members (and
  no pending member) makes it a consumer group with its offsets, a JoinGroup into a
  consumer group with no members makes it classic again; with members, the other protocol
  is GROUP_ID_NOT_FOUND (a heartbeat) or INCONSISTENT_GROUP_PROTOCOL (a JoinGroup). A
  heartbeat of epoch > 0 for a group this node does not know is UNKNOWN_MEMBER_ID (the
  member joins again: a restart of serve forgets members, not offsets). The request's
  fields are checked first (INVALID_REQUEST, UNSUPPORTED_ASSIGNOR,
  INVALID_REGULAR_EXPRESSION). DescribeGroups does not describe them (Dead before v6,
  GROUP_ID_NOT_FOUND after, as Kafka); ConsumerGroupDescribe describes only them.
- Offsets expire (KIP-211, `expire_offsets`): all of an Empty group's once it has been Empty
  for offsets_retention_ms; in a group without protocol type, each by its commit time; in
  a Stable consumer group, those of topics no member subscribes to, by commit time. An Empty
  group left with no offsets and no pending member is Dead.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from replicad.config.model import GroupsConfig, defaults_of
from replicad.groups.assignors import ASSIGNORS
from replicad.groups.classic_group import (
    NO_DEADLINE,
    NO_GENERATION,
    ClassicGroup,
    CommittedOffset,
    GroupState,
    Member,
)
from replicad.groups.consumer_group import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    UNCHANGED_TIMEOUT,
    ConsumerGroup,
    ConsumerHeartbeat,
    ConsumerMember,
    HeartbeatResult,
)
from replicad.groups.consumer_protocol import PROTOCOL_TYPE
from replicad.types import OffsetAndMetadata, TopicPartition

S = GroupState
E = ErrorCode
NO_ERROR = E.none


_GROUPS = defaults_of(GroupsConfig)


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Kafka's broker settings of the same names, with Kafka's defaults: those the config's
    `groups:` section sets are its defaults (written there only)."""

    min_session_timeout_ms: int = _GROUPS["min_session_timeout_ms"]
    max_session_timeout_ms: int = _GROUPS["max_session_timeout_ms"]
    initial_rebalance_delay_ms: int = _GROUPS["initial_rebalance_delay_ms"]
    max_group_size: int = 2**31 - 1
    offset_metadata_max_bytes: int = 4096
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    # KIP-848's group.consumer.session.timeout.ms and group.consumer.heartbeat.interval.ms.
    consumer_session_timeout_ms: int = _GROUPS["consumer_session_timeout_ms"]
    consumer_heartbeat_interval_ms: int = _GROUPS["consumer_heartbeat_interval_ms"]

    @classmethod
    def from_config(cls, groups: GroupsConfig) -> CoordinatorConfig:
        """The coordinator's settings from the `groups:` section (Kafka's defaults otherwise)."""
        return cls(
            min_session_timeout_ms=groups.min_session_timeout_ms,
            max_session_timeout_ms=groups.max_session_timeout_ms,
            initial_rebalance_delay_ms=groups.initial_rebalance_delay_ms,
            consumer_session_timeout_ms=groups.consumer_session_timeout_ms,
            consumer_heartbeat_interval_ms=groups.consumer_heartbeat_interval_ms,
        )


# -- requests ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    # JoinGroup v4+ (KIP-394): a new dynamic member must ask again with its member id.
    require_known_member_id: bool = True
    # JoinGroup v9+ (KIP-814): the client can be told to skip the assignment.
    supports_skip_assignment: bool = True


@dataclass(frozen=True, slots=True)
class SyncRequest:
    group_id: str
    generation_id: int
    member_id: str
    assignments: Mapping[str, bytes] = field(default_factory=dict)
    group_instance_id: str | None = None
    # SyncGroup v5+; None: not checked.
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class MemberRef:
    """Who a Heartbeat, a LeaveGroup entry or an OffsetCommit speaks for."""

    member_id: str
    group_instance_id: str | None = None


# -- answers ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinedMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    members: tuple[JoinedMember, ...] = ()
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer owed to the request the caller passed `token` with."""

    token: object
    result: JoinResult | SyncResult


@dataclass(frozen=True, slots=True)
class LeftMember:
    member_id: str
    group_instance_id: str | None
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class LeaveResult:
    error: ErrorCode
    members: tuple[LeftMember, ...] = ()


@dataclass(frozen=True, slots=True)
class CommitResult:
    errors: Mapping[TopicPartition, ErrorCode]
    # What was committed (to be made durable before the answer goes out).
    committed: Mapping[TopicPartition, CommittedOffset] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FetchedOffsets:
    error: ErrorCode
    # None: no committed offset for that partition.
    offsets: Mapping[TopicPartition, CommittedOffset | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = "classic"


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    group_id: str
    state: str
    protocol_type: str
    protocol_name: str
    members: tuple[DescribedMember, ...]


@dataclass(frozen=True, slots=True)
class DescribedConsumerMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    assignment: frozenset[TopicPartition]
    target_assignment: frozenset[TopicPartition]


@dataclass(frozen=True, slots=True)
class DescribedConsumerGroup:
    """ConsumerGroupDescribe's view; error GROUP_ID_NOT_FOUND: no such consumer group."""

    group_id: str
    error: ErrorCode
    message: str | None = None
    state: str = ""
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor_name: str = ""
    members: tuple[DescribedConsumerMember, ...] = ()


@dataclass(frozen=True, slots=True)
class OffsetDeleteResult:
    error: ErrorCode
    errors: Mapping[TopicPartition, ErrorCode] = field(default_factory=dict)
    deleted: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True, slots=True)
class SyncOutcome:
    # What was taken (to be made durable); empty when nothing changed or sync stopped.
    applied: Mapping[TopicPartition, CommittedOffset] = field(default_factory=dict)
    # The group is the replica's own: sync is over for it.
    stopped: bool = False


@dataclass(frozen=True, slots=True)
class Step:
    """What a call decided: its own answer (None for a JoinGroup or SyncGroup still
    waiting; its Reply comes later) and the replies now owed to others."""

    result: Any
    replies: tuple[Reply, ...] = ()


def _stepped(token: object, result: JoinResult | SyncResult | None, out: list[Reply]) -> Step:
    """A JoinGroup's or SyncGroup's Step: the replies now owed (`out`), its own among them
    when it has its answer now (`result`; None while it waits for its group)."""
    if result is not None:
        out.append(Reply(token, result))
    return Step(None, tuple(out))


def random_member_id(prefix: str) -> str:
    """Kafka's form: the client id (or instance id), a dash, a random uuid."""
    return f"{prefix}-{uuid.uuid4()}"


class GroupCoordinator:
    """Every group this node coordinates; see the module docstring."""

    def __init__(
        self,
        config: CoordinatorConfig | None = None,
        *,
        new_member_id: Callable[[str], str] = random_member_id,
        read_only: Callable[[str], bool] | None = None,
    ) -> None:
        self.config = config or CoordinatorConfig()
        self._new_member_id = new_member_id
        self.read_only = read_only or _never
        self.groups: dict[str, ClassicGroup] = {}
        # KIP-848 groups; a group id is in one of the two at most.
        self.consumer_groups: dict[str, ConsumerGroup] = {}
        # Groups that are the replica's own (see the rules): kept apart from `groups`, which
        # forgets a group once it is Dead.
        self.owned: set[str] = set()
        self._newly_owned: list[str] = []
        self.rebalances_total = 0
        self.commits_total = 0

    # -- JoinGroup ---------------------------------------------------------------------------

    def join(self, request: JoinRequest, token: object, *, now_ms: int) -> Step:
        out: list[Reply] = []
        return _stepped(token, self._join(request, token, now_ms, out), out)

    def _join(
        self, req: JoinRequest, token: object, now_ms: int, out: list[Reply]
    ) -> JoinResult | None:
        cfg = self.config
        if not req.group_id:
            return JoinResult(E.invalid_group_id, req.member_id)
        if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
            return JoinResult(E.invalid_session_timeout, req.member_id)
        consumer = self.consumer_groups.get(req.group_id)
        if consumer is not None:
            if consumer.members:
                return JoinResult(E.inconsistent_group_protocol, req.member_id)
            self._to_classic(consumer, now_ms)
        group = self.groups.get(req.group_id)
        if req.member_id:
            if group is None:
                return JoinResult(E.unknown_member_id, req.member_id)
            return self._join_known(group, req, token, now_ms, out)
        if group is None:
            group = self.groups[req.group_id] = ClassicGroup(req.group_id, state_since_ms=now_ms)
        if group.is_in(S.DEAD):
            return JoinResult(E.coordinator_not_available, req.member_id)
        if not group.supports(req.protocol_type, (name for name, _ in req.protocols)):
            self._drop_if_unused(group)
            return JoinResult(E.inconsistent_group_protocol, req.member_id)
        instance = req.group_instance_id
        known_static = group.static_member_id(instance)
        if known_static is None and len(group.members) >= cfg.max_group_size:
            return JoinResult(E.group_max_size_reached, req.member_id)
        if instance is not None:
            new_id = self._new_member_id(instance)
            if known_static is not None:
                return self._replace_static(group, instance, new_id, req, token, now_ms, out)
            self._add_and_rebalance(group, new_id, req, token, now_ms, out)
            return None
        new_id = self._new_member_id(req.client_id)
        if req.require_known_member_id:
            group.pending_members[new_id] = now_ms + req.session_timeout_ms
            return JoinResult(E.member_id_required, new_id)
        self._add_and_rebalance(group, new_id, req, token, now_ms, out)
        return None

    def _join_known(
        self, group: ClassicGroup, req: JoinRequest, token: object, now_ms: int, out: list[Reply]
    ) -> JoinResult | None:
        if group.is_in(S.DEAD):
            return JoinResult(E.coordinator_not_available, req.member_id)
        if not group.supports(req.protocol_type, (name for name, _ in req.protocols)):
            return JoinResult(E.inconsistent_group_protocol, req.member_id)
        if req.member_id in group.pending_members:
            del group.pending_members[req.member_id]
            self._add_and_rebalance(group, req.member_id, req, token, now_ms, out)
            return None
        error = _member_error(group, MemberRef(req.member_id, req.group_instance_id))
        if error is not None:
            return JoinResult(error, req.member_id)
        member = group.members[req.member_id]
        same = member.protocols == req.protocols
        # A follower with nothing new (or anyone, while the sync is awaited) is given the
        # generation that stands.
        unchanged = same and (
            group.is_in(S.COMPLETING_REBALANCE)
            or (group.is_in(S.STABLE) and not group.is_leader(member.member_id))
        )
        if group.is_in(S.PREPARING_REBALANCE):
            self._update_and_rebalance(group, member, req, token, now_ms, out)
        elif unchanged:
            return self._current_generation(group, member.member_id)
        elif group.is_in(S.COMPLETING_REBALANCE, S.STABLE):
            self._update_and_rebalance(group, member, req, token, now_ms, out)
        else:
            return JoinResult(E.unknown_member_id, req.member_id)
        return None

    def _add_and_rebalance(
        self,
        group: ClassicGroup,
        member_id: str,
        req: JoinRequest,
        token: object,
        now_ms: int,
        out: list[Reply],
    ) -> None:
        member = Member(
            member_id=member_id,
            group_instance_id=req.group_instance_id,
            client_id=req.client_id,
            client_host=req.client_host,
            session_timeout_ms=req.session_timeout_ms,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            protocol_type=req.protocol_type,
            protocols=req.protocols,
            awaiting_join=token,
            is_new=True,
        )
        group.add(member)
        if not self.read_only(group.group_id):
            self._own(group.group_id)
        if group.in_initial_delay and group.generation_id == 0:
            # Kafka extends the delay only for a new group's first members.
            group.new_member_added = True
        self._maybe_prepare_rebalance(group, now_ms, out)
        self._try_complete_join(group, now_ms, out)

    def _update_and_rebalance(
        self,
        group: ClassicGroup,
        member: Member,
        req: JoinRequest,
        token: object,
        now_ms: int,
        out: list[Reply],
    ) -> None:
        if member.awaiting_join is not None and member.awaiting_join is not token:
            # Asked again before the first was answered (a client's retry): the first
            # answer is no longer the one it waits for.
            out.append(Reply(member.awaiting_join, JoinResult(E.rebalance_in_progress)))
        _update_member(member, req)
        member.awaiting_join = token
        self._maybe_prepare_rebalance(group, now_ms, out)
        self._try_complete_join(group, now_ms, out)

    def _replace_static(
        self,
        group: ClassicGroup,
        instance: str,
        new_id: str,
        req: JoinRequest,
        token: object,
        now_ms: int,
        out: list[Reply],
    ) -> JoinResult | None:
        old = group.members[group.static_members[instance]]
        old_id = old.member_id
        for owed in (old.awaiting_join, old.awaiting_sync):
            if owed is not None:
                fenced: JoinResult | SyncResult = (
                    JoinResult(E.fenced_instance_id, old_id)
                    if owed is old.awaiting_join
                    else SyncResult(E.fenced_instance_id)
                )
                out.append(Reply(owed, fenced))
        member = group.replace_static(instance, new_id)
        member.awaiting_join = member.awaiting_sync = None
        _update_member(member, req)
        if group.is_in(S.STABLE) and group.select_protocol() == group.protocol_name:
            # Same protocol: the new id takes the old one's place and assignment.
            member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
            leader = group.is_leader(new_id)
            if leader and not req.supports_skip_assignment:
                # Told it leads, a client before KIP-814 would assign and then rejoin: a
                # rebalance after all. As a follower it just syncs.
                leader_id, leader = old_id, False
            else:
                leader_id = group.leader_id or ""
            return JoinResult(
                NO_ERROR,
                new_id,
                group.generation_id,
                group.protocol_type,
                group.protocol_name,
                leader_id,
                _member_list(group) if leader else (),
                skip_assignment=leader,
            )
        member.awaiting_join = token
        self._maybe_prepare_rebalance(group, now_ms, out)
        self._try_complete_join(group, now_ms, out)
        return None

    def _current_generation(self, group: ClassicGroup, member_id: str) -> JoinResult:
        leader = group.is_leader(member_id)
        return JoinResult(
            NO_ERROR,
            member_id,
            group.generation_id,
            group.protocol_type,
            group.protocol_name,
            group.leader_id or "",
            _member_list(group) if leader else (),
        )

    # -- rebalancing -------------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: ClassicGroup, now_ms: int, out: list[Reply]) -> None:
        if group.is_in(S.EMPTY, S.STABLE, S.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, now_ms, out)

    def _prepare_rebalance(self, group: ClassicGroup, now_ms: int, out: list[Reply]) -> None:
        if group.is_in(S.COMPLETING_REBALANCE):
            # The assignment being synced is void: those waiting for it hear so.
            for member in group.members.values():
                member.assignment = b""
                if member.awaiting_sync is not None:
                    out.append(Reply(member.awaiting_sync, SyncResult(E.rebalance_in_progress)))
                    member.awaiting_sync = None
        group.pending_sync.clear()
        timeout = group.rebalance_timeout_ms()
        delay = min(self.config.initial_rebalance_delay_ms, timeout)
        if group.is_in(S.EMPTY) and delay > 0:
            group.in_initial_delay = True
            group.initial_delay_ms = delay
            group.initial_delay_left_ms = timeout - delay
            group.new_member_added = False
            group.rebalance_deadline_ms = now_ms + delay
        else:
            group.in_initial_delay = False
            group.rebalance_deadline_ms = now_ms + timeout
        group.transition(S.PREPARING_REBALANCE, now_ms)
        self.rebalances_total += 1
        # As Kafka's delayed join is tried at once: with nobody left to wait for, it is done.
        self._try_complete_join(group, now_ms, out)

    def _try_complete_join(self, group: ClassicGroup, now_ms: int, out: list[Reply]) -> None:
        waiting = group.is_in(S.PREPARING_REBALANCE) and not group.in_initial_delay
        if waiting and group.all_joined():
            self._complete_join(group, now_ms, out)

    def _complete_join(self, group: ClassicGroup, now_ms: int, out: list[Reply]) -> None:
        for member in list(group.members.values()):
            if member.awaiting_join is None and not member.is_static:
                group.remove(member.member_id)
        group.in_initial_delay = False
        group.generation_id += 1
        if not group.members:
            group.protocol_name = None
            group.leader_id = None
            group.rebalance_deadline_ms = NO_DEADLINE
            group.transition(S.EMPTY, now_ms)
            return
        group.protocol_name = group.select_protocol()
        group.transition(S.COMPLETING_REBALANCE, now_ms)
        everyone = _member_list(group)
        for member in group.members.values():
            member.is_new = False
            member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
            if member.awaiting_join is None:
                continue
            leader = group.is_leader(member.member_id)
            result = JoinResult(
                NO_ERROR,
                member.member_id,
                group.generation_id,
                group.protocol_type,
                group.protocol_name,
                group.leader_id or "",
                everyone if leader else (),
            )
            out.append(Reply(member.awaiting_join, result))
            member.awaiting_join = None
            group.pending_sync.add(member.member_id)
        # The sync timeout: whoever has not sent SyncGroup by then is removed.
        group.rebalance_deadline_ms = now_ms + group.rebalance_timeout_ms()

    def _remove_member(
        self, group: ClassicGroup, member: Member, now_ms: int, out: list[Reply]
    ) -> None:
        """A member leaves (LeaveGroup, or its session or sync timed out)."""
        if member.awaiting_join is not None:
            out.append(Reply(member.awaiting_join, JoinResult(E.unknown_member_id)))
        if member.awaiting_sync is not None:
            out.append(Reply(member.awaiting_sync, SyncResult(E.unknown_member_id)))
        member.awaiting_join = member.awaiting_sync = None
        group.remove(member.member_id)
        if group.is_in(S.STABLE, S.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, now_ms, out)
        else:
            self._try_complete_join(group, now_ms, out)

    # -- SyncGroup ---------------------------------------------------------------------------

    def sync(self, request: SyncRequest, token: object, *, now_ms: int) -> Step:
        out: list[Reply] = []
        return _stepped(token, self._sync(request, token, now_ms, out), out)

    def _sync(
        self, req: SyncRequest, token: object, now_ms: int, out: list[Reply]
    ) -> SyncResult | None:
        group = self.groups.get(req.group_id)
        if group is None:
            return SyncResult(E.unknown_member_id)
        if group.is_in(S.DEAD):
            return SyncResult(E.coordinator_not_available)
        error = _member_error(group, MemberRef(req.member_id, req.group_instance_id))
        if error is not None:
            return SyncResult(error)
        if req.generation_id != group.generation_id:
            return SyncResult(E.illegal_generation)
        if (req.protocol_type is not None and req.protocol_type != group.protocol_type) or (
            req.protocol_name is not None and req.protocol_name != group.protocol_name
        ):
            return SyncResult(E.inconsistent_group_protocol)
        if group.is_in(S.EMPTY):
            return SyncResult(E.unknown_member_id)
        if group.is_in(S.PREPARING_REBALANCE):
            return SyncResult(E.rebalance_in_progress)
        member = group.members[req.member_id]
        group.pending_sync.discard(member.member_id)
        if not group.pending_sync:
            group.rebalance_deadline_ms = NO_DEADLINE
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        if group.is_in(S.STABLE):
            return self._synced(group, member)
        member.awaiting_sync = token
        if group.is_leader(member.member_id):
            for each in group.members.values():
                each.assignment = req.assignments.get(each.member_id, b"")
            group.transition(S.STABLE, now_ms)
            for each in group.members.values():
                if each.awaiting_sync is not None:
                    out.append(Reply(each.awaiting_sync, self._synced(group, each)))
                    each.awaiting_sync = None
                    each.heartbeat_deadline_ms = now_ms + each.session_timeout_ms
        return None

    @staticmethod
    def _synced(group: ClassicGroup, member: Member) -> SyncResult:
        return SyncResult(NO_ERROR, member.assignment, group.protocol_type, group.protocol_name)

    # -- Heartbeat, LeaveGroup ---------------------------------------------------------------

    def heartbeat(self, group_id: str, generation_id: int, who: MemberRef, *, now_ms: int) -> Step:
        group = self.groups.get(group_id)
        if group is None:
            return Step(E.unknown_member_id)
        if group.is_in(S.DEAD):
            return Step(E.coordinator_not_available)
        error = _member_error(group, who)
        if error is not None:
            return Step(error)
        if generation_id != group.generation_id:
            return Step(E.illegal_generation)
        if group.is_in(S.EMPTY):
            return Step(E.unknown_member_id)
        member = group.members[who.member_id]
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        if group.is_in(S.PREPARING_REBALANCE):
            return Step(E.rebalance_in_progress)
        return Step(NO_ERROR)

    def leave(self, group_id: str, leaving: Sequence[MemberRef], *, now_ms: int) -> Step:
        group = self.groups.get(group_id)
        if group is None:
            return Step(
                LeaveResult(
                    NO_ERROR,
                    tuple(
                        LeftMember(m.member_id, m.group_instance_id, E.unknown_member_id)
                        for m in leaving
                    ),
                )
            )
        if group.is_in(S.DEAD):
            return Step(LeaveResult(E.coordinator_not_available))
        out: list[Reply] = []
        answers = []
        for who in leaving:
            member_id = who.member_id
            if not member_id and who.group_instance_id is not None:
                member_id = group.static_member_id(who.group_instance_id) or ""
            error: ErrorCode | None
            if member_id in group.pending_members and who.group_instance_id is None:
                del group.pending_members[member_id]
                self._try_complete_join(group, now_ms, out)
                self._drop_if_unused(group, now_ms)
                error = None
            else:
                error = _member_error(group, MemberRef(member_id, who.group_instance_id))
                if error is None:
                    self._remove_member(group, group.members[member_id], now_ms, out)
            answers.append(LeftMember(who.member_id, who.group_instance_id, error or NO_ERROR))
        return Step(LeaveResult(NO_ERROR, tuple(answers)), tuple(out))

    # -- consumer groups (KIP-848) -----------------------------------------------------------

    def consumer_heartbeat(
        self, req: ConsumerHeartbeat, topics: Mapping[str, int], *, now_ms: int
    ) -> HeartbeatResult:
        """A ConsumerGroupHeartbeat; `topics`: every topic this node holds, with its
        partition count (what the assignor may give out)."""
        invalid = _heartbeat_error(req)
        if invalid is not None:
            return invalid
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            consumer = self.consumer_groups.get(req.group_id)
            if consumer is None:
                return HeartbeatResult(E.unknown_member_id, "no such member")
            return consumer.leave(req.member_id, req.member_epoch, now_ms=now_ms)
        consumer = self.consumer_groups.get(req.group_id)
        if consumer is None:
            classic = self.groups.get(req.group_id)
            if classic is not None and (classic.members or classic.pending_members):
                return HeartbeatResult(
                    E.group_id_not_found, f"group {req.group_id} is not a consumer group"
                )
            if req.member_epoch != JOIN_EPOCH:
                return HeartbeatResult(E.unknown_member_id, "no such member: join again")
            consumer = self.consumer_groups[req.group_id] = ConsumerGroup(
                req.group_id, state_since_ms=now_ms
            )
            if classic is not None:
                consumer.offsets.update(classic.offsets)
                del self.groups[req.group_id]
        if req.member_epoch == JOIN_EPOCH:
            self.rebalances_total += 1
            if not self.read_only(req.group_id):
                self._own(req.group_id)
        return consumer.heartbeat(
            req,
            topics,
            session_timeout_ms=self.config.consumer_session_timeout_ms,
            heartbeat_interval_ms=self.config.consumer_heartbeat_interval_ms,
            now_ms=now_ms,
        )

    def describe_consumer_group(self, group_id: str) -> DescribedConsumerGroup:
        group = self.consumer_groups.get(group_id)
        if group is None:
            return DescribedConsumerGroup(
                group_id, E.group_id_not_found, f"group {group_id} is not a consumer group"
            )
        return DescribedConsumerGroup(
            group_id,
            NO_ERROR,
            None,
            group.state.value,
            group.group_epoch,
            group.assignment_epoch,
            group.assignor_name(),
            tuple(_described_member(group, m) for m in group.members.values()),
        )

    def _to_classic(self, consumer: ConsumerGroup, now_ms: int) -> None:
        """A consumer group with no members becomes a classic group, offsets and all."""
        del self.consumer_groups[consumer.group_id]
        group = self.groups[consumer.group_id] = ClassicGroup(
            consumer.group_id, state_since_ms=now_ms
        )
        group.offsets.update(consumer.offsets)

    # -- time --------------------------------------------------------------------------------

    def next_deadline_ms(self) -> int:
        """When `poll` next has something to do (NO_DEADLINE: nothing is timed)."""
        return min(
            (g.next_deadline_ms() for g in (*self.groups.values(), *self.consumer_groups.values())),
            default=NO_DEADLINE,
        )

    def poll(self, *, now_ms: int) -> Step:
        """Whatever timed out by `now_ms`: pending members, sessions, rebalances, syncs."""
        out: list[Reply] = []
        for group in list(self.groups.values()):
            self._poll_group(group, now_ms, out)
        for consumer in self.consumer_groups.values():
            consumer.expire_members(now_ms)
        return Step(None, tuple(out))

    def _poll_group(self, group: ClassicGroup, now_ms: int, out: list[Reply]) -> None:
        for member_id, deadline in list(group.pending_members.items()):
            if deadline <= now_ms:
                del group.pending_members[member_id]
                self._try_complete_join(group, now_ms, out)
                self._drop_if_unused(group, now_ms)
                if group.is_in(S.DEAD):
                    return
        for member in list(group.members.values()):
            alive = member.awaiting_join is not None or member.awaiting_sync is not None
            if not alive and member.heartbeat_deadline_ms <= now_ms:
                self._remove_member(group, member, now_ms, out)
        if group.rebalance_deadline_ms > now_ms:
            return
        if group.is_in(S.PREPARING_REBALANCE):
            if (
                group.in_initial_delay
                and group.new_member_added
                and group.initial_delay_left_ms > 0
            ):
                # Members still arriving: wait once more, within the rebalance timeout.
                delay = min(group.initial_delay_ms, group.initial_delay_left_ms)
                group.initial_delay_left_ms -= delay
                group.new_member_added = False
                group.rebalance_deadline_ms = now_ms + delay
            else:
                self._complete_join(group, now_ms, out)
        elif group.is_in(S.COMPLETING_REBALANCE, S.STABLE):
            group.rebalance_deadline_ms = NO_DEADLINE
            late = [group.members[m] for m in group.pending_sync if m in group.members]
            group.pending_sync.clear()
            for member in late:
                if member.awaiting_sync is not None:
                    out.append(Reply(member.awaiting_sync, SyncResult(E.unknown_member_id)))
                    member.awaiting_sync = None
                group.remove(member.member_id)
            if late:
                self._prepare_rebalance(group, now_ms, out)
        else:
            group.rebalance_deadline_ms = NO_DEADLINE

    # -- offsets -----------------------------------------------------------------------------

    def commit(
        self,
        group_id: str,
        generation_id: int,
        who: MemberRef,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        *,
        now_ms: int,
        version: int | None = None,
    ) -> Step:
        """`version`: the OffsetCommit's (None: not checked), for a consumer group's rule."""
        if self.read_only(group_id):
            return Step(CommitResult({tp: E.group_authorization_failed for tp in offsets}))
        consumer = self.consumer_groups.get(group_id)
        if consumer is not None:
            refused = consumer.commit_refusals(
                who.member_id, generation_id, offsets, version=version
            )
            if refused:
                taken = {tp: o for tp, o in offsets.items() if tp not in refused}
                if not taken:
                    return Step(CommitResult(refused))
                self._own(group_id)
                result = self._store_offsets(consumer.offsets, taken, now_ms)
                return Step(CommitResult({**result.errors, **refused}, result.committed))
            member = consumer.members.get(who.member_id)
            if member is not None:
                member.session_deadline_ms = max(
                    member.session_deadline_ms, now_ms + self.config.consumer_session_timeout_ms
                )
            self._own(group_id)
            return Step(self._store_offsets(consumer.offsets, offsets, now_ms))
        group = self.groups.get(group_id)
        error: ErrorCode | None = None
        if group is None:
            if generation_id < 0:
                group = self.groups[group_id] = ClassicGroup(group_id, state_since_ms=now_ms)
            else:
                error = E.illegal_generation
        if group is not None and error is None:
            error = self._commit_error(group, generation_id, who)
        if error is not None or group is None:
            return Step(CommitResult({tp: error or E.unknown_member_id for tp in offsets}))
        member = group.members.get(who.member_id)
        if member is not None:
            member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        self._own(group_id)
        return Step(self._store_offsets(group.offsets, offsets, now_ms))

    def _store_offsets(
        self,
        stored: dict[TopicPartition, CommittedOffset],
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        now_ms: int,
    ) -> CommitResult:
        errors: dict[TopicPartition, ErrorCode] = {}
        committed: dict[TopicPartition, CommittedOffset] = {}
        for tp, value in offsets.items():
            metadata = value.metadata or ""
            if len(metadata.encode()) > self.config.offset_metadata_max_bytes:
                errors[tp] = E.offset_metadata_too_large
                continue
            entry = CommittedOffset(value.offset, value.leader_epoch, metadata, now_ms)
            stored[tp] = committed[tp] = entry
            errors[tp] = NO_ERROR
        self.commits_total += len(committed)
        return CommitResult(errors, committed)

    @staticmethod
    def _commit_error(group: ClassicGroup, generation_id: int, who: MemberRef) -> ErrorCode | None:
        if group.is_in(S.DEAD):
            return E.coordinator_not_available
        if generation_id < 0 and group.is_in(S.EMPTY):
            return None
        if who.group_instance_id is not None:
            error = _member_error(group, who)
            if error is not None:
                return error
        if group.is_in(S.COMPLETING_REBALANCE):
            return E.rebalance_in_progress
        if who.member_id not in group.members:
            return E.unknown_member_id
        if generation_id != group.generation_id:
            return E.illegal_generation
        return None

    def sync_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, OffsetAndMetadata], *, now_ms: int
    ) -> SyncOutcome:
        """Take a source group's offsets, unless the group is the replica's own (rules)."""
        consumer = self.consumer_groups.get(group_id)
        if consumer is not None:
            if group_id in self.owned or consumer.members:
                return SyncOutcome(stopped=True)
            self._to_classic(consumer, now_ms)
        group = self.groups.get(group_id)
        if group_id in self.owned or (group is not None and (group.members or group.is_in(S.DEAD))):
            return SyncOutcome(stopped=True)
        applied: dict[TopicPartition, CommittedOffset] = {}
        for tp, value in offsets.items():
            current = group.offsets.get(tp) if group is not None else None
            metadata = value.metadata or ""
            same = current is not None and (current.offset, current.leader_epoch) == (
                value.offset,
                value.leader_epoch,
            )
            if not same:
                applied[tp] = CommittedOffset(value.offset, value.leader_epoch, metadata, now_ms)
        if applied:
            if group is None:
                group = self.groups[group_id] = ClassicGroup(group_id, state_since_ms=now_ms)
            group.offsets.update(applied)
        return SyncOutcome(applied)

    def _own(self, group_id: str) -> None:
        if group_id not in self.owned:
            self.owned.add(group_id)
            self._newly_owned.append(group_id)

    def take_newly_owned(self) -> tuple[str, ...]:
        """The groups that became the replica's own since the last call (to be made durable:
        a restart that forgot one would sync the source's offsets over its own)."""
        taken, self._newly_owned = tuple(self._newly_owned), []
        return taken

    def fetch_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition] | None,
        *,
        member_id: str | None = None,
        member_epoch: int = -1,
    ) -> FetchedOffsets:
        """The committed offsets of `partitions` (None: every partition with one); a
        member of a consumer group (OffsetFetch v9+) is checked as for a commit."""
        consumer = self.consumer_groups.get(group_id)
        stored: Mapping[TopicPartition, CommittedOffset]
        if consumer is not None:
            if member_id or member_epoch >= 0:
                refused = consumer.offset_request_error(member_id, member_epoch)
                if refused is not None:
                    return FetchedOffsets(refused[0])
            stored = consumer.offsets
        else:
            group = self.groups.get(group_id)
            stored = group.offsets if group is not None else {}
        if partitions is None:
            return FetchedOffsets(NO_ERROR, dict(stored))
        return FetchedOffsets(NO_ERROR, {tp: stored.get(tp) for tp in partitions})

    def delete_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition], *, now_ms: int
    ) -> OffsetDeleteResult:
        consumer = self.consumer_groups.get(group_id)
        if consumer is not None:
            return self._delete_consumer_offsets(consumer, partitions)
        group = self.groups.get(group_id)
        if group is None or group.is_in(S.DEAD):
            return OffsetDeleteResult(E.group_id_not_found)
        subscribed: frozenset[str] | None = frozenset()
        if not group.is_in(S.EMPTY):
            if group.protocol_type != "consumer":
                return OffsetDeleteResult(E.non_empty_group)
            subscribed = group.subscribed_topics()
        errors: dict[TopicPartition, ErrorCode] = {}
        deleted = []
        for tp in partitions:
            if subscribed is None or tp.topic in subscribed:
                errors[tp] = E.group_subscribed_to_topic
                continue
            errors[tp] = NO_ERROR
            if group.offsets.pop(tp, None) is not None:
                deleted.append(tp)
        self._drop_if_unused(group, now_ms)
        return OffsetDeleteResult(NO_ERROR, errors, tuple(deleted))

    def _delete_consumer_offsets(
        self, group: ConsumerGroup, partitions: Sequence[TopicPartition]
    ) -> OffsetDeleteResult:
        subscribed = group.subscribed_topics(group.topic_partitions)
        errors: dict[TopicPartition, ErrorCode] = {}
        deleted = []
        for tp in partitions:
            if tp.topic in subscribed:
                errors[tp] = E.group_subscribed_to_topic
                continue
            errors[tp] = NO_ERROR
            if group.offsets.pop(tp, None) is not None:
                deleted.append(tp)
        return OffsetDeleteResult(NO_ERROR, errors, tuple(deleted))

    def expire_offsets(self, *, now_ms: int) -> dict[str, tuple[TopicPartition, ...]]:
        """Offsets past retention, removed (see the rules); per group, what went."""
        retention = self.config.offsets_retention_ms
        removed: dict[str, tuple[TopicPartition, ...]] = {}
        for consumer in list(self.consumer_groups.values()):
            if not consumer.members:
                old = now_ms - consumer.state_since_ms >= retention
                gone = list(consumer.offsets) if old else []
            else:
                used = consumer.subscribed_topics(consumer.topic_partitions)
                gone = [
                    tp
                    for tp, entry in consumer.offsets.items()
                    if tp.topic not in used and now_ms - entry.commit_timestamp_ms >= retention
                ]
            for tp in gone:
                del consumer.offsets[tp]
            if gone:
                removed[consumer.group_id] = tuple(gone)
            if not consumer.members and not consumer.offsets:
                del self.consumer_groups[consumer.group_id]
        for group in list(self.groups.values()):
            if group.is_in(S.EMPTY) and group.protocol_type:
                expired = list(group.offsets) if now_ms - group.state_since_ms >= retention else []
            elif group.protocol_type is None or group.is_in(S.STABLE, S.EMPTY):
                unused: frozenset[str] | None = frozenset()
                if group.protocol_type is not None:
                    unused = group.subscribed_topics()
                expired = [
                    tp
                    for tp, entry in group.offsets.items()
                    if unused is not None
                    and tp.topic not in unused
                    and now_ms - entry.commit_timestamp_ms >= retention
                ]
            else:
                expired = []
            for tp in expired:
                del group.offsets[tp]
            if expired:
                removed[group.group_id] = tuple(expired)
            self._drop_if_unused(group, now_ms)
        return removed

    def _drop_if_unused(self, group: ClassicGroup, now_ms: int = 0) -> None:
        """An Empty group with nothing in it is Dead, and forgotten."""
        if (
            group.is_in(S.EMPTY)
            and not group.members
            and not group.offsets
            and not group.pending_members
        ):
            group.transition(S.DEAD, now_ms)
            self.groups.pop(group.group_id, None)

    def restore(
        self,
        offsets: Mapping[str, Mapping[TopicPartition, CommittedOffset]],
        *,
        now_ms: int,
        owned: Iterable[str] = (),
    ) -> None:
        """Groups as a restart finds them: Empty, with their committed offsets and no
        protocol type (members join again; until one does, each offset expires by its own
        commit time); `owned`, the groups that were the replica's own."""
        self.owned.update(owned)
        for group_id, committed in offsets.items():
            if committed and group_id not in self.groups:
                group = ClassicGroup(group_id, state_since_ms=now_ms)
                group.offsets.update(committed)
                self.groups[group_id] = group

    # -- administration ----------------------------------------------------------------------

    def list_groups(
        self, states: Iterable[str] = (), types: Iterable[str] = ()
    ) -> tuple[ListedGroup, ...]:
        """Every live group; `states` / `types` (case-insensitive) narrow it when given."""
        wanted_states = {s.lower() for s in states}
        wanted_types = {t.lower() for t in types}
        listed: list[ListedGroup] = []
        if not wanted_types or "classic" in wanted_types:
            listed.extend(
                ListedGroup(g.group_id, g.protocol_type or "", g.state.value)
                for g in self.groups.values()
                if not g.is_in(S.DEAD)
                and (not wanted_states or g.state.value.lower() in wanted_states)
            )
        if not wanted_types or "consumer" in wanted_types:
            listed.extend(
                ListedGroup(c.group_id, PROTOCOL_TYPE, c.state.value, "consumer")
                for c in self.consumer_groups.values()
                if not wanted_states or c.state.value.lower() in wanted_states
            )
        return tuple(listed)

    def describe(self, group_id: str) -> DescribedGroup | None:
        """A group as DescribeGroups shows it; None if there is no such group."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        stable = group.is_in(S.STABLE) and group.protocol_name is not None
        members = tuple(
            DescribedMember(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata(group.protocol_name) if stable and group.protocol_name else b"",
                m.assignment if stable else b"",
            )
            for m in group.members.values()
        )
        return DescribedGroup(
            group.group_id,
            group.state.value,
            group.protocol_type or "",
            group.protocol_name or "" if stable else "",
            members,
        )

    def delete_groups(self, group_ids: Iterable[str], *, now_ms: int) -> dict[str, ErrorCode]:
        """Delete Empty groups and their offsets; per group, the error (NONE: deleted)."""
        errors: dict[str, ErrorCode] = {}
        for group_id in group_ids:
            consumer = self.consumer_groups.get(group_id)
            if consumer is not None:
                if consumer.members:
                    errors[group_id] = E.non_empty_group
                else:
                    del self.consumer_groups[group_id]
                    errors[group_id] = NO_ERROR
                continue
            group = self.groups.get(group_id)
            if group is None or group.is_in(S.DEAD):
                errors[group_id] = E.group_id_not_found
            elif not group.is_in(S.EMPTY):
                errors[group_id] = E.non_empty_group
            else:
                group.offsets.clear()
                group.pending_members.clear()
                group.transition(S.DEAD, now_ms)
                del self.groups[group_id]
                errors[group_id] = NO_ERROR
        return errors

    def states(self) -> dict[str, int]:
        """How many groups are in each state (for status and metrics)."""
        counts = {state.value: 0 for state in GroupState if state is not S.DEAD}
        for group in self.groups.values():
            if not group.is_in(S.DEAD):
                counts[group.state.value] += 1
        for consumer in self.consumer_groups.values():
            state = consumer.state.value
            counts[state] = counts.get(state, 0) + 1
        return counts


def _never(_group_id: str) -> bool:
    return False


def _heartbeat_error(req: ConsumerHeartbeat) -> HeartbeatResult | None:
    """Kafka's checks of a ConsumerGroupHeartbeat's fields, before any group is looked at."""
    problem: str | None = None
    if not req.group_id:
        problem = "GroupId can't be empty."
    elif not req.member_id:
        problem = "MemberId can't be empty."
    elif req.instance_id == "" or req.rack_id == "":
        problem = "InstanceId and RackId can't be empty."
    elif req.member_epoch == JOIN_EPOCH:
        if req.rebalance_timeout_ms == UNCHANGED_TIMEOUT:
            problem = "RebalanceTimeoutMs must be provided in first request."
        elif req.owned is None or req.owned:
            problem = "TopicPartitions must be empty when (re-)joining."
        elif req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
            problem = "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
    if problem is not None:
        return HeartbeatResult(E.invalid_request, problem)
    if req.server_assignor is not None and req.server_assignor not in ASSIGNORS:
        return HeartbeatResult(
            E.unsupported_assignor,
            f"assignor {req.server_assignor!r} is not one of {', '.join(ASSIGNORS)}",
        )
    if req.subscribed_topic_regex:
        try:
            re.compile(req.subscribed_topic_regex)
        except re.error as exc:
            return HeartbeatResult(
                E.invalid_regular_expression,
                f"SubscribedTopicRegex {req.subscribed_topic_regex!r} is not valid: {exc}",
            )
    return None


def _described_member(group: ConsumerGroup, m: ConsumerMember) -> DescribedConsumerMember:
    return DescribedConsumerMember(
        m.member_id,
        m.instance_id,
        m.rack_id,
        m.epoch,
        m.client_id,
        m.client_host,
        tuple(sorted(m.subscribed_names)),
        m.subscribed_regex,
        m.assigned,
        group.target.get(m.member_id, frozenset()),
    )


def _member_error(group: ClassicGroup, who: MemberRef) -> ErrorCode | None:
    """Kafka's validateMember: a static member's instance id must be known and name this
    member id (else FENCED_INSTANCE_ID); a dynamic member must be known."""
    if who.group_instance_id is not None:
        known = group.static_member_id(who.group_instance_id)
        if known is None:
            return E.unknown_member_id
        if known != who.member_id:
            return E.fenced_instance_id
        return None
    if who.member_id not in group.members:
        return E.unknown_member_id
    return None


def _update_member(member: Member, req: JoinRequest) -> None:
    member.protocols = req.protocols
    member.session_timeout_ms = req.session_timeout_ms
    member.rebalance_timeout_ms = req.rebalance_timeout_ms
    member.client_id = req.client_id
    member.client_host = req.client_host


def _member_list(group: ClassicGroup) -> tuple[JoinedMember, ...]:
    protocol = group.protocol_name
    if protocol is None:
        return ()
    return tuple(
        JoinedMember(m.member_id, m.group_instance_id, m.metadata(protocol))
        for m in group.members.values()
    )
