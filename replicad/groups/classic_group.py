"""One classic consumer group as Kafka's ClassicGroup keeps it: its state, its members, its
generation and the protocol its members voted for (sans-I/O, time passed in).

Rules:
- States and the only moves between them (Kafka's `validPreviousStates`), in `TRANSITIONS`:
  Empty -> PreparingRebalance (a member joins) or Dead (deleted, or expired with no offsets);
  PreparingRebalance -> CompletingRebalance (every member rejoined or the rebalance timed
  out, members left), Empty (none left) or Dead; CompletingRebalance -> Stable (the
  leader's SyncGroup) or PreparingRebalance (a member joins, leaves or times out) or Dead;
  Stable -> PreparingRebalance or Dead. Any other move is our bug: `LocalProtocolError`.
- The generation rises by one each time a rebalance completes, members or none.
- The protocol: only those every member supports are candidates; each member votes for the
  first candidate in its own order of preference; most votes wins. Kafka leaves ties to a
  hash map's order; here the leader's preference breaks them, so a group is deterministic.
- The group's protocol type is its first member's; a member of another type, or sharing no
  protocol with the rest, cannot join (INCONSISTENT_GROUP_PROTOCOL, in coordinator.py).
- The leader is the first member to join; if it leaves, any member that remains. A group
  with no members has no leader.
- A static member (KIP-345) is known by its `group.instance.id`; one instance id names at
  most one member id at a time.
- Pending members (KIP-394) hold a member id the coordinator gave them with
  MEMBER_ID_REQUIRED: they are not members until they join again with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum

from replicad.errors import LocalProtocolError
from replicad.groups.consumer_protocol import PROTOCOL_TYPE, subscribed_topics
from replicad.types import TopicPartition


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


S = GroupState
# Each state's allowed next states; a move not here raises LocalProtocolError.
TRANSITIONS: Mapping[GroupState, frozenset[GroupState]] = {
    S.EMPTY: frozenset({S.PREPARING_REBALANCE, S.DEAD}),
    S.PREPARING_REBALANCE: frozenset({S.COMPLETING_REBALANCE, S.EMPTY, S.DEAD}),
    S.COMPLETING_REBALANCE: frozenset({S.STABLE, S.PREPARING_REBALANCE, S.DEAD}),
    S.STABLE: frozenset({S.PREPARING_REBALANCE, S.DEAD}),
    S.DEAD: frozenset({S.DEAD}),
}

NO_GENERATION = -1
NO_DEADLINE = 2**63 - 1


@dataclass(slots=True)
class Member:
    """One member: what it asked for at its last JoinGroup and what the shell waits on."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    # (name, metadata) in the member's order of preference.
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""
    # The token of this member's JoinGroup / SyncGroup the coordinator still owes an answer.
    awaiting_join: object | None = None
    awaiting_sync: object | None = None
    # When the member is gone unless it is heard from (session timeout).
    heartbeat_deadline_ms: int = NO_DEADLINE
    # Joined during the rebalance now running (not yet part of a generation).
    is_new: bool = False

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    def protocol_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.protocols)

    def metadata(self, protocol: str) -> bytes:
        for name, data in self.protocols:
            if name == protocol:
                return data
        raise LocalProtocolError(f"member {self.member_id} does not support {protocol}")

    def vote(self, candidates: Iterable[str]) -> str:
        allowed = set(candidates)
        for name in self.protocol_names():
            if name in allowed:
                return name
        raise LocalProtocolError(f"member {self.member_id} supports no candidate protocol")


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """An offset as this coordinator keeps it: a types.OffsetAndMetadata that was committed,
    plus when (an Empty group's offsets expire counted from it), its metadata a string ("" for
    a null). Kept apart from OffsetAndMetadata, which is what a member asks or another cluster
    holds: only a stored offset has a commit time."""

    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int


@dataclass(slots=True)
class ClassicGroup:
    group_id: str
    state: GroupState = GroupState.EMPTY
    # When the state last changed: an Empty group's offsets expire counted from here.
    state_since_ms: int = 0
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    # group.instance.id -> member id (KIP-345).
    static_members: dict[str, str] = field(default_factory=dict)
    # member id -> when it must have joined again (KIP-394).
    pending_members: dict[str, int] = field(default_factory=dict)
    # Members the coordinator waits on for a SyncGroup after a rebalance completed.
    pending_sync: set[str] = field(default_factory=set)
    # When the running rebalance (or the wait for SyncGroups) ends whoever is missing.
    rebalance_deadline_ms: int = NO_DEADLINE
    # group.initial.rebalance.delay.ms (an Empty group's first rebalance waits for more
    # members): whether the running rebalance is in that delay, the delay, what is left of
    # the rebalance timeout to extend it by, and whether a member joined during it.
    in_initial_delay: bool = False
    initial_delay_ms: int = 0
    initial_delay_left_ms: int = 0
    new_member_added: bool = False
    offsets: dict[TopicPartition, CommittedOffset] = field(default_factory=dict)

    # -- state -------------------------------------------------------------------------------

    def transition(self, to: GroupState, now_ms: int) -> None:
        if to not in TRANSITIONS[self.state]:
            raise LocalProtocolError(
                f"group {self.group_id!r}: no transition from {self.state.value} to {to.value}"
            )
        self.state = to
        self.state_since_ms = now_ms

    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    # -- members -----------------------------------------------------------------------------

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        self.pending_sync.discard(member_id)
        if member is None:
            return None
        instance = member.group_instance_id
        if instance is not None and self.static_members.get(instance) == member_id:
            del self.static_members[instance]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def replace_static(self, instance_id: str, new_member_id: str) -> Member:
        """The static member `instance_id` comes back under a new member id; the old id is
        fenced. Returns the member (its waits are for the caller to answer)."""
        old_id = self.static_members[instance_id]
        member = self.members.pop(old_id)
        self.pending_sync.discard(old_id)
        member.member_id = new_member_id
        self.members[new_member_id] = member
        self.static_members[instance_id] = new_member_id
        if self.leader_id == old_id:
            self.leader_id = new_member_id
        return member

    def static_member_id(self, instance_id: str | None) -> str | None:
        return None if instance_id is None else self.static_members.get(instance_id)

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def awaiting_join(self) -> Iterator[Member]:
        return (m for m in self.members.values() if m.awaiting_join is not None)

    def all_joined(self) -> bool:
        """Every member rejoined and no pending member is still expected (Kafka's
        hasAllMembersJoined)."""
        return not self.pending_members and all(
            m.awaiting_join is not None for m in self.members.values()
        )

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    # -- protocol ----------------------------------------------------------------------------

    def candidate_protocols(self) -> list[str]:
        """Protocols every member supports, in the leader's order of preference."""
        if not self.members:
            return []
        first = self.members.get(self.leader_id or "") or next(iter(self.members.values()))
        common = set(first.protocol_names())
        for member in self.members.values():
            common &= set(member.protocol_names())
        return [name for name in first.protocol_names() if name in common]

    def supports(self, protocol_type: str, protocols: Iterable[str]) -> bool:
        """Whether a member of `protocol_type` offering `protocols` may join."""
        if not self.members:
            return bool(protocol_type) and bool(list(protocols))
        if protocol_type != self.protocol_type:
            return False
        candidates = set(self.candidate_protocols())
        return any(name in candidates for name in protocols)

    def select_protocol(self) -> str:
        candidates = self.candidate_protocols()
        if not candidates:
            raise LocalProtocolError(f"group {self.group_id!r}: no protocol every member supports")
        votes = {name: 0 for name in candidates}
        for member in self.members.values():
            votes[member.vote(candidates)] += 1
        best = max(votes.values())
        return next(name for name in candidates if votes[name] == best)

    def subscribed_topics(self) -> frozenset[str] | None:
        """The topics the members subscribe to, if the group speaks the consumer protocol
        and every member's subscription reads; None when unknown (then a coordinator must
        assume any topic may be in use)."""
        if self.protocol_type != PROTOCOL_TYPE or self.protocol_name is None:
            return None if self.members else frozenset()
        topics: set[str] = set()
        for member in self.members.values():
            found = subscribed_topics(member.metadata(self.protocol_name))
            if found is None:
                return None
            topics |= found
        return frozenset(topics)

    def next_deadline_ms(self) -> int:
        deadlines = [self.rebalance_deadline_ms, *self.pending_members.values()]
        deadlines += [m.heartbeat_deadline_ms for m in self.members.values()]
        return min(deadlines)
