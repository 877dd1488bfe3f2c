"""The server-side assignors of the consumer group protocol (KIP-848): who should own which
partition, given the members' subscriptions and the topics' partition counts (pure).

Rules (Kafka's `group.consumer.assignors`, `uniform` first, so the default):
- Only partitions of topics that exist are assigned, each to exactly one member subscribed
  to its topic; a topic no member subscribes to is not assigned at all.
- `uniform` (Kafka's UniformAssignor): as even as the subscriptions allow and sticky. A
  member keeps the partitions it had in the last target assignment while it still
  subscribes to their topic and holds no more than its fair share; the partitions left go,
  in topic then partition order, to the eligible member holding the fewest (ties: member
  id); then partitions move from the fullest member to an eligible member with at least two
  fewer, until no such move is left. Kafka reaches the same balance by other steps (its
  exact choice of who keeps what may differ; the balance and stickiness are the rules).
- `range` (Kafka's server-side RangeAssignor): per topic, its subscribers in member-id
  order get contiguous ranges; the first (partitions % members) get one more.
- Deterministic: the same members, subscriptions, topics and previous assignment give the
  same answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from replicad.types import TopicPartition


@dataclass(frozen=True, slots=True)
class AssignorMember:
    member_id: str
    topics: frozenset[str]
    # The member's partitions in the last target assignment (stickiness).
    previous: frozenset[TopicPartition] = frozenset()


Assignment = dict[str, frozenset[TopicPartition]]
Assignor = Callable[[tuple[AssignorMember, ...], Mapping[str, int]], Assignment]


def uniform(members: tuple[AssignorMember, ...], partitions: Mapping[str, int]) -> Assignment:
    """Balanced and sticky; see the module docstring."""
    ordered = sorted(members, key=lambda m: m.member_id)
    eligible: dict[TopicPartition, list[str]] = {}
    for topic in sorted(partitions):
        subscribers = [m.member_id for m in ordered if topic in m.topics]
        if subscribers:
            for index in range(partitions[topic]):
                eligible[TopicPartition(topic, index)] = subscribers
    owned: dict[str, set[TopicPartition]] = {m.member_id: set() for m in ordered}
    if not owned:
        return {}
    fair = -(-len(eligible) // len(owned))  # the most any member needs, rounded up
    taken: set[TopicPartition] = set()
    for member in ordered:
        for tp in sorted(member.previous):
            keeps = tp in eligible and tp not in taken and member.member_id in eligible[tp]
            if keeps and len(owned[member.member_id]) < fair:
                owned[member.member_id].add(tp)
                taken.add(tp)
    for tp, subscribers in eligible.items():
        if tp not in taken:
            chosen = min(subscribers, key=lambda m: (len(owned[m]), m))
            owned[chosen].add(tp)
    _balance(owned, eligible)
    return {member_id: frozenset(tps) for member_id, tps in owned.items()}


def _balance(
    owned: dict[str, set[TopicPartition]], eligible: Mapping[TopicPartition, list[str]]
) -> None:
    """Move partitions from fuller to emptier eligible members until no move narrows the
    gap (each move lowers the sum of squares, so this ends)."""
    moved = True
    while moved:
        moved = False
        for giver in sorted(owned, key=lambda m: (-len(owned[m]), m)):
            for tp in sorted(owned[giver]):
                taker = min(eligible[tp], key=lambda m: (len(owned[m]), m))
                if len(owned[taker]) + 1 < len(owned[giver]):
                    owned[giver].discard(tp)
                    owned[taker].add(tp)
                    moved = True
                    break
            if moved:
                break


def range_assignor(
    members: tuple[AssignorMember, ...], partitions: Mapping[str, int]
) -> Assignment:
    """Contiguous ranges per topic; see the module docstring."""
    owned: dict[str, set[TopicPartition]] = {m.member_id: set() for m in members}
    for topic in sorted(partitions):
        subscribers = sorted(m.member_id for m in members if topic in m.topics)
        if not subscribers:
            continue
        count = partitions[topic]
        share, extra = divmod(count, len(subscribers))
        start = 0
        for index, member_id in enumerate(subscribers):
            size = share + (1 if index < extra else 0)
            owned[member_id].update(TopicPartition(topic, p) for p in range(start, start + size))
            start += size
    return {member_id: frozenset(tps) for member_id, tps in owned.items()}


# By the names clients ask for (`group.remote.assignor`); the first is the default.
ASSIGNORS: Mapping[str, Assignor] = {"uniform": uniform, "range": range_assignor}
DEFAULT_ASSIGNOR = "uniform"
