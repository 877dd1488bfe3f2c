"""One group of the consumer group protocol (KIP-848, ConsumerGroupHeartbeat) as Kafka's
GroupMetadataManager, ConsumerGroup and CurrentAssignmentBuilder keep it: the coordinator
assigns, members reconcile towards their target by heartbeats (sans-I/O, time passed in).

Rules:
- Epochs: the group epoch rises when a member joins, leaves or is removed, changes its
  subscription, or when the partition counts of the subscribed topics change. When it is
  ahead of the target assignment's epoch, the next heartbeat of any member computes a new
  target with the group's assignor (the one the members ask for, by vote of the first
  asking member in id order; else `uniform`), and the target takes the group epoch.
- A member's epoch is the target epoch it reconciled to. Each heartbeat reconciles the
  member that sent it (`RECONCILE`, a table):
  - its new assigned partitions are those it has that the target keeps; the others are
    pending revocation. While it still reports owning any of those (or reports nothing),
    it stays in UNREVOKED_PARTITIONS at its epoch, told only the partitions it keeps
    (revoke before assign), and must revoke within its rebalance timeout or be removed;
  - once nothing is left to revoke, it takes the target epoch and every partition of its
    target no other member holds (assigned or pending revocation); if another still holds
    some, it is UNRELEASED_PARTITIONS and gets them on a later heartbeat once they are free;
    else STABLE.
  So no partition is ever held by two members (assigned or pending revocation).
- Heartbeat epochs (the member's view): 0 joins (a member id already known joins again,
  as a new member: it has given up its partitions); -1 leaves; -2 is a static member's
  temporary leave (KIP-848's static membership, `group.instance.id`): it keeps its epoch
  and partitions until its session times out, and a member joining with its instance id
  meanwhile takes its place, epoch and partitions with no new group epoch (no rebalance);
  joining with an instance id a live member holds is UNRELEASED_INSTANCE_ID. (-2 from a
  member without an instance id leaves, as -1.) A positive epoch must name
  a known member (UNKNOWN_MEMBER_ID) and equal its epoch, or its previous epoch with owned
  partitions within its assignment (the answer that raised it was lost); else
  FENCED_MEMBER_EPOCH (the member gives up its partitions and joins again).
- A join must give its rebalance timeout and its subscription (topic names or a regex),
  and own nothing (INVALID_REQUEST); an unknown server assignor is UNSUPPORTED_ASSIGNOR; a
  regex Python cannot compile is INVALID_REGULAR_EXPRESSION.
- Every heartbeat keeps the member alive for the session timeout; a member not heard from
  by then is removed.
- The answer carries the member's assignment when the request was full (a join, or one
  with rebalance timeout, subscription and owned partitions) or the assignment changed.
- Group state (Kafka's ConsumerGroupState): Empty (no members), Assigning (group epoch
  ahead of the target), Reconciling (a member not yet at the target epoch, or not
  STABLE), Stable.
- OffsetCommit and OffsetFetch from a member (member id given, epoch >= 0): the member
  must be known (UNKNOWN_MEMBER_ID) and its epoch the member's (STALE_MEMBER_EPOCH);
  OffsetCommit before v9 from a member of this protocol is UNSUPPORTED_VERSION. Without
  a member (epoch < 0): only into a group with no members (else UNKNOWN_MEMBER_ID).
  A commit with an epoch behind the member's (KIP-1251, Kafka 4.3: the member had not yet
  heard of its new epoch) is taken for each partition still assigned to it since that
  epoch or before, and STALE_MEMBER_EPOCH for the others; an epoch ahead is stale.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from kio.schema.errors import ErrorCode

from replicad.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNOR, AssignorMember
from replicad.groups.classic_group import NO_DEADLINE, CommittedOffset
from replicad.types import TopicPartition

E = ErrorCode
JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2
UNCHANGED_TIMEOUT = -1
# OffsetCommit v9 is the first a member of this protocol may use (KIP-848).
COMMIT_MEMBER_EPOCH_VERSION = 9


class MemberState(Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


class GroupState(Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


M = MemberState


@dataclass(frozen=True, slots=True)
class Reconciled:
    """The member's next state, and whether it takes the target epoch (else keeps its own)."""

    state: MemberState
    takes_target_epoch: bool


# (revocations it still owns, partitions it can take now, partitions others still hold)
# -> its next state. Revoking comes first: nothing is given while something is owed.
RECONCILE: Mapping[tuple[bool, bool, bool], Reconciled] = {
    (True, False, False): Reconciled(M.UNREVOKED_PARTITIONS, False),
    (True, False, True): Reconciled(M.UNREVOKED_PARTITIONS, False),
    (True, True, False): Reconciled(M.UNREVOKED_PARTITIONS, False),
    (True, True, True): Reconciled(M.UNREVOKED_PARTITIONS, False),
    (False, True, False): Reconciled(M.STABLE, True),
    (False, True, True): Reconciled(M.UNRELEASED_PARTITIONS, True),
    (False, False, True): Reconciled(M.UNRELEASED_PARTITIONS, True),
    (False, False, False): Reconciled(M.STABLE, True),
}


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeat:
    """A ConsumerGroupHeartbeat, partitions by name (the wire resolves topic ids). None:
    unchanged since the member's last heartbeat."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = UNCHANGED_TIMEOUT
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: frozenset[TopicPartition] | None = None
    client_id: str = ""
    client_host: str = ""

    @property
    def is_full(self) -> bool:
        return self.member_epoch == JOIN_EPOCH or (
            self.rebalance_timeout_ms != UNCHANGED_TIMEOUT
            and self.subscribed_topic_names is not None
            and self.owned is not None
        )


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str = ""
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    # None: not sent (unchanged); else every partition the member may use now.
    assignment: frozenset[TopicPartition] | None = None

    @classmethod
    def taken(
        cls,
        member: ConsumerMember,
        heartbeat_interval_ms: int,
        assignment: frozenset[TopicPartition] | None,
    ) -> HeartbeatResult:
        """`member`'s heartbeat answered without an error: its id, its epoch, and
        `assignment` (None: unchanged, not sent)."""
        return cls(E.none, None, member.member_id, member.epoch, heartbeat_interval_ms, assignment)


@dataclass(slots=True)
class ConsumerMember:
    member_id: str
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    instance_id: str | None = None
    rack_id: str | None = None
    subscribed_names: frozenset[str] = frozenset()
    subscribed_regex: str | None = None
    server_assignor: str | None = None
    epoch: int = 0
    previous_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: frozenset[TopicPartition] = frozenset()
    # The epoch at which each assigned partition was given to it (KIP-1251's commit check).
    assigned_since: dict[TopicPartition, int] = field(default_factory=dict)
    pending_revocation: frozenset[TopicPartition] = frozenset()
    session_deadline_ms: int = NO_DEADLINE
    # Set while UNREVOKED_PARTITIONS: the member is removed if it has not revoked by then.
    revocation_deadline_ms: int = NO_DEADLINE
    # A static member's heartbeat of epoch -2: gone until its instance id joins again.
    temporarily_left: bool = False

    def subscribed(self, topics: Iterable[str]) -> frozenset[str]:
        """The topics it subscribes to, its regex matched against `topics`."""
        if not self.subscribed_regex:
            return self.subscribed_names
        pattern = re.compile(self.subscribed_regex)
        return self.subscribed_names | {t for t in topics if pattern.fullmatch(t)}


@dataclass(slots=True)
class ConsumerGroup:
    group_id: str
    state_since_ms: int = 0
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    # member id -> the partitions the last target assignment gives it.
    target: dict[str, frozenset[TopicPartition]] = field(default_factory=dict)
    # The subscribed topics' partition counts the group epoch was last computed with.
    topic_partitions: dict[str, int] = field(default_factory=dict)
    offsets: dict[TopicPartition, CommittedOffset] = field(default_factory=dict)
    _last_state: GroupState = GroupState.EMPTY

    # -- state -------------------------------------------------------------------------------

    @property
    def state(self) -> GroupState:
        if not self.members:
            return GroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return GroupState.ASSIGNING
        if any(
            m.epoch != self.assignment_epoch or m.state is not M.STABLE
            for m in self.members.values()
        ):
            return GroupState.RECONCILING
        return GroupState.STABLE

    def note_state(self, now_ms: int) -> None:
        """Keep when the state last changed (an Empty group's offsets expire from then)."""
        state = self.state
        if state is not self._last_state:
            self._last_state = state
            self.state_since_ms = now_ms

    def assignor_name(self) -> str:
        for member_id in sorted(self.members):
            name = self.members[member_id].server_assignor
            if name:
                return name
        return DEFAULT_ASSIGNOR

    def subscribed_topics(self, topics: Iterable[str] = ()) -> frozenset[str]:
        known = tuple(topics)
        out: set[str] = set()
        for member in self.members.values():
            out |= member.subscribed(known)
        return frozenset(out)

    def held_by_others(self, member_id: str) -> frozenset[TopicPartition]:
        """Partitions another member holds (assigned, or pending its revocation)."""
        held: set[TopicPartition] = set()
        for other in self.members.values():
            if other.member_id != member_id:
                held |= other.assigned | other.pending_revocation
        return frozenset(held)

    def next_deadline_ms(self) -> int:
        return min(
            (min(m.session_deadline_ms, m.revocation_deadline_ms) for m in self.members.values()),
            default=NO_DEADLINE,
        )

    # -- heartbeat ---------------------------------------------------------------------------

    def heartbeat(
        self,
        req: ConsumerHeartbeat,
        topics: Mapping[str, int],
        *,
        session_timeout_ms: int,
        heartbeat_interval_ms: int,
        now_ms: int,
    ) -> HeartbeatResult:
        """A heartbeat of epoch >= 0 (leaving is `leave`); `topics`: every topic this node
        holds and its partition count."""
        member = self.members.get(req.member_id)
        if req.member_epoch == JOIN_EPOCH and req.instance_id is not None:
            holder = self.static_member(req.instance_id)
            if holder is not None and holder.member_id != req.member_id:
                if not holder.temporarily_left:
                    return HeartbeatResult(
                        E.unreleased_instance_id,
                        f"instance {req.instance_id} is held by member {holder.member_id}",
                    )
                member = self._replace_static(holder, req.member_id)
                self._update(member, req)
                member.session_deadline_ms = now_ms + session_timeout_ms
                self.note_state(now_ms)
                return HeartbeatResult.taken(member, heartbeat_interval_ms, member.assigned)
        if req.member_epoch == JOIN_EPOCH:
            if member is not None:
                # Joining again under the same id: it has given up what it had.
                self.remove(member.member_id)
            member = ConsumerMember(
                req.member_id, req.client_id, req.client_host, req.rebalance_timeout_ms
            )
            self.members[member.member_id] = member
            previous = None
        else:
            if member is None:
                return HeartbeatResult(
                    E.unknown_member_id, f"member {req.member_id} is not in the group"
                )
            error = _epoch_error(member, req)
            if member.temporarily_left:
                error = f"member {member.member_id} left (epoch -2): join again"
            if error is not None:
                return HeartbeatResult(E.fenced_member_epoch, error)
            previous = member.assigned
        bump = self._update(member, req) or previous is None
        subscribed = {t: topics[t] for t in self.subscribed_topics(topics) if t in topics}
        if subscribed != self.topic_partitions:
            self.topic_partitions = subscribed
            bump = True
        if bump:
            self.group_epoch += 1
        if self.group_epoch > self.assignment_epoch:
            self._assign()
        self._reconcile(member, req.owned, now_ms)
        member.session_deadline_ms = now_ms + session_timeout_ms
        self.note_state(now_ms)
        send = req.is_full or previous != member.assigned
        return HeartbeatResult.taken(
            member, heartbeat_interval_ms, member.assigned if send else None
        )

    def _update(self, member: ConsumerMember, req: ConsumerHeartbeat) -> bool:
        """Take what the heartbeat changed; whether the subscription (or assignor) did."""
        member.client_id, member.client_host = req.client_id, req.client_host
        if req.instance_id is not None:
            member.instance_id = req.instance_id
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        if req.rebalance_timeout_ms != UNCHANGED_TIMEOUT:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        changed = False
        if req.subscribed_topic_names is not None:
            names = frozenset(req.subscribed_topic_names)
            changed |= names != member.subscribed_names
            member.subscribed_names = names
        if req.subscribed_topic_regex is not None:
            regex = req.subscribed_topic_regex or None
            changed |= regex != member.subscribed_regex
            member.subscribed_regex = regex
        if req.server_assignor is not None:
            changed |= req.server_assignor != member.server_assignor
            member.server_assignor = req.server_assignor
        return changed

    def _assign(self) -> None:
        known = tuple(self.topic_partitions)
        members = tuple(
            AssignorMember(
                m.member_id,
                m.subscribed(known),
                self.target.get(m.member_id, frozenset()),
            )
            for m in self.members.values()
        )
        self.target = ASSIGNORS[self.assignor_name()](members, self.topic_partitions)
        self.assignment_epoch = self.group_epoch

    def _reconcile(
        self, member: ConsumerMember, owned: frozenset[TopicPartition] | None, now_ms: int
    ) -> None:
        if member.state is M.STABLE and member.epoch == self.assignment_epoch:
            return
        if member.state is M.UNREVOKED_PARTITIONS and _still_owns(owned, member.pending_revocation):
            return
        target = self.target.get(member.member_id, frozenset())
        keep = member.assigned & target
        revoke = member.assigned - keep
        wanted = target - keep
        held = self.held_by_others(member.member_id)
        free = wanted - held
        owes = bool(revoke) and _still_owns(owned, revoke)
        step = RECONCILE[(owes, bool(free), bool(wanted & held))]
        if step.state is M.UNREVOKED_PARTITIONS:
            if member.state is not M.UNREVOKED_PARTITIONS:
                member.revocation_deadline_ms = now_ms + member.rebalance_timeout_ms
            member.assigned, member.pending_revocation = keep, revoke
        else:
            member.assigned, member.pending_revocation = keep | free, frozenset()
            member.revocation_deadline_ms = NO_DEADLINE
        if step.takes_target_epoch and member.epoch != self.assignment_epoch:
            member.previous_epoch, member.epoch = member.epoch, self.assignment_epoch
        member.state = step.state
        since = member.assigned_since
        for tp in list(since):
            if tp not in member.assigned:
                del since[tp]
        for tp in member.assigned:
            since.setdefault(tp, member.epoch)

    # -- leaving and timeouts ----------------------------------------------------------------

    def leave(self, member_id: str, member_epoch: int, *, now_ms: int) -> HeartbeatResult:
        member = self.members.get(member_id)
        if member is None:
            return HeartbeatResult(E.unknown_member_id, f"member {member_id} is not in the group")
        if member_epoch == STATIC_LEAVE_EPOCH and member.instance_id is not None:
            # Back soon under the same instance id: its partitions wait for it (rules).
            member.temporarily_left = True
        else:
            self.remove(member_id)
        self.note_state(now_ms)
        return HeartbeatResult(E.none, None, member_id, member_epoch)

    def static_member(self, instance_id: str) -> ConsumerMember | None:
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    def _replace_static(self, old: ConsumerMember, new_id: str) -> ConsumerMember:
        """`new_id` takes the place of the temporarily departed `old`: its epoch (from
        before it left), partitions and target."""
        old_id = old.member_id
        del self.members[old_id]
        old.member_id, old.temporarily_left = new_id, False
        self.members[new_id] = old
        target = self.target.pop(old_id, None)
        if target is not None:
            self.target[new_id] = target
        return old

    def remove(self, member_id: str) -> ConsumerMember | None:
        """The member is gone (left, timed out, joined again): its partitions are free."""
        member = self.members.pop(member_id, None)
        if member is not None:
            self.target.pop(member_id, None)
            self.group_epoch += 1
        return member

    def expire_members(self, now_ms: int) -> tuple[str, ...]:
        """Remove members whose session ended or who did not revoke in time."""
        gone = tuple(
            m.member_id
            for m in self.members.values()
            if min(m.session_deadline_ms, m.revocation_deadline_ms) <= now_ms
        )
        for member_id in gone:
            self.remove(member_id)
        if gone:
            self.note_state(now_ms)
        return gone

    # -- offsets -----------------------------------------------------------------------------

    def commit_refusals(
        self,
        member_id: str | None,
        member_epoch: int,
        partitions: Iterable[TopicPartition],
        *,
        version: int | None,
    ) -> dict[TopicPartition, ErrorCode]:
        """The partitions of an OffsetCommit refused, with their error (see the rules)."""
        wanted = tuple(partitions)
        refused = self.offset_request_error(member_id, member_epoch, commit_version=version)
        if refused is None:
            return {}
        member = self.members.get(member_id or "")
        lagging = (
            refused[0] == E.stale_member_epoch
            and member is not None
            and 0 <= member_epoch < member.epoch
        )
        if not lagging or member is None:
            return dict.fromkeys(wanted, refused[0])
        return {
            tp: E.stale_member_epoch
            for tp in wanted
            if member.assigned_since.get(tp, member_epoch + 1) > member_epoch
        }

    def offset_request_error(
        self, member_id: str | None, member_epoch: int, *, commit_version: int | None = None
    ) -> tuple[ErrorCode, str] | None:
        """Whether a member (or an admin, epoch < 0) may commit or fetch offsets here."""
        if member_epoch < 0 and not member_id:
            if self.members:
                return E.unknown_member_id, "the group has members: commit as one of them"
            return None
        member = self.members.get(member_id or "")
        if member is None or member.temporarily_left:
            return E.unknown_member_id, f"member {member_id} is not in the group"
        if commit_version is not None and commit_version < COMMIT_MEMBER_EPOCH_VERSION:
            return E.unsupported_version, "OffsetCommit v9+ is needed by this group's members"
        if member_epoch != member.epoch:
            return E.stale_member_epoch, (
                f"member epoch {member_epoch} is not the member's ({member.epoch})"
            )
        return None


def _epoch_error(member: ConsumerMember, req: ConsumerHeartbeat) -> str | None:
    if req.member_epoch > member.epoch:
        return f"member epoch {req.member_epoch} is ahead of the coordinator's {member.epoch}"
    if req.member_epoch < member.epoch:
        lost_answer = (
            req.member_epoch == member.previous_epoch
            and req.owned is not None
            and req.owned <= member.assigned
        )
        if not lost_answer:
            return f"member epoch {req.member_epoch} is behind the coordinator's {member.epoch}"
    return None


def _still_owns(
    owned: frozenset[TopicPartition] | None, revoking: frozenset[TopicPartition]
) -> bool:
    """Whether the member may still own any of `revoking` (it reports nothing: it may)."""
    return owned is None or bool(owned & revoking)
