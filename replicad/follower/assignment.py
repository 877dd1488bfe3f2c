"""Metadata answered: which partitions the follower tracks, and where (sans-I/O).

`assign` compares the partitions the selection chose in the latest metadata with the
follower's states and says what changes; the replicator (and tools/sim) performs it:
tables gain, move or lose partitions, a log stores its first topic id.

Rules:
- A partition new to the follower starts from its local log if it has one (FETCHING at
  its log end, and asks the leader about divergence first: the data may come from an
  earlier leader), else it needs a start offset (NEEDS_OFFSET).
- A topic id differing from the one the local log stores means the topic was deleted
  and re-created upstream: the partition halts and its data is kept (an operator
  decides). A log that stores none takes the first one seen.
- A new leader or leader epoch: ask about divergence before fetching again (the shell's
  table moves it to the new leader's fetcher), and its idle time counts from the change
  (`progress_ms`), as a newly elected Kafka leader counts its followers' lag from its
  election: a new leader answers UNKNOWN_LEADER_EPOCH until it has applied the move itself
  (session 14's 10,000-partition soak: 24 s at load 31 after a SIGKILL), and a partition
  idle before it, for example paused on a full disk, was reported stalled for that wait.
- A partition the selection no longer chooses is forgotten; its data is kept.
- A partition changed in place (its topic id, leader epoch, a divergence check asked, a
  halt) and not moved is `updated`: its leader's table is told (`touch`, the partition
  table's R13), since that table examines again only what it was told of.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from replicad.follower.partition_phase import PartitionPhase, PhaseEvent, initial_phase
from replicad.follower.partition_state import PartitionState
from replicad.types import TopicPartition

RECREATED = "topic recreated upstream (topic id differs from the replica's)"


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    """What metadata says of a chosen partition."""

    leader_id: int
    leader_epoch: int
    topic_id: uuid.UUID | None


@dataclass(frozen=True, slots=True)
class LocalFacts:
    """What the follower has of a partition on disk."""

    topic_id: uuid.UUID | None
    log_end_offset: int


@dataclass(frozen=True, slots=True)
class Assignment:
    # New states, to place with their leader (halted ones too: status shows them).
    added: tuple[PartitionState, ...] = ()
    # Leader changed, or not placed yet: take from wherever it is, place with its leader.
    moved: tuple[PartitionState, ...] = ()
    # No longer chosen: forget (the data stays).
    removed: tuple[PartitionState, ...] = ()
    # A log storing no topic id yet: store this one.
    topic_ids: tuple[tuple[PartitionState, uuid.UUID], ...] = ()
    # Halted now because the topic was re-created upstream.
    halted: tuple[PartitionState, ...] = ()
    # Changed in place: its table must examine it again (the partition table's R13).
    updated: tuple[PartitionState, ...] = ()


def assign(
    states: Mapping[TopicPartition, PartitionState],
    chosen: Mapping[TopicPartition, LeaderInfo],
    local: Mapping[TopicPartition, LocalFacts],
    *,
    now_ms: int,
    is_placed: Callable[[PartitionState], bool],
) -> Assignment:
    """What the latest metadata changes. Updates existing states in place (epochs, ids,
    phases); the caller adds `added` to its states and drops `removed`."""
    added: list[PartitionState] = []
    moved: list[PartitionState] = []
    topic_ids: list[tuple[PartitionState, uuid.UUID]] = []
    halted: list[PartitionState] = []
    updated: list[PartitionState] = []
    for tp, info in chosen.items():
        state = states.get(tp)
        if state is None:
            existing = local.get(tp)
            state = PartitionState(
                tp=tp,
                topic_id=info.topic_id,
                leader_id=info.leader_id,
                leader_epoch=info.leader_epoch,
                phase=initial_phase(has_local_data=existing is not None),
                fetch_offset=existing.log_end_offset if existing else 0,
                # Data from an earlier run may have diverged from the leader's.
                epoch_check_pending=existing is not None,
                progress_ms=now_ms,
            )
            known = existing.topic_id if existing is not None else None
            if known is not None and info.topic_id is not None and known != info.topic_id:
                state.move(PhaseEvent.TOPIC_RECREATED, RECREATED)
                state.topic_id = known
                halted.append(state)
            added.append(state)
            continue
        before = (state.topic_id, state.leader_epoch, state.epoch_check_pending, state.phase)
        if info.topic_id is not None and info.topic_id != state.topic_id:
            # First id seen (an old metadata version before), or the topic was re-created.
            if state.log is not None:
                stored = state.log.topic_id
            else:  # not opened yet: what the disk holds, if anything
                facts = local.get(tp)
                stored = facts.topic_id if facts is not None else None
            if stored is None or stored == info.topic_id:
                if state.log is not None and stored is None:
                    topic_ids.append((state, info.topic_id))
                state.topic_id = info.topic_id
            elif state.phase is not PartitionPhase.HALTED:
                state.move(PhaseEvent.TOPIC_RECREATED, RECREATED)
                halted.append(state)
        if info.leader_epoch != state.leader_epoch or info.leader_id != state.leader_id:
            state.epoch_check_pending = True
            state.progress_ms = max(state.progress_ms, now_ms)
        state.leader_epoch = info.leader_epoch
        if state.leader_id != info.leader_id or not is_placed(state):
            state.leader_id = info.leader_id
            moved.append(state)
        elif before != (state.topic_id, state.leader_epoch, state.epoch_check_pending, state.phase):
            updated.append(state)  # among them those in `topic_ids`: the id is new
    removed = tuple(s for tp, s in states.items() if tp not in chosen)
    return Assignment(
        tuple(added), tuple(moved), removed, tuple(topic_ids), tuple(halted), tuple(updated)
    )


def place_all(
    plan: Assignment,
    states: dict[TopicPartition, PartitionState],
    *,
    place: Callable[[PartitionState], None],
    unplace: Callable[[PartitionState], None],
    touch: Callable[[PartitionState], None],
) -> None:
    """The shell's part, the same for every shell: `states` gains `added` and loses
    `removed`; `place` puts a state with its leader, `unplace` takes it from wherever it is,
    `touch` tells the table that holds it that it changed in place (`updated`; called after
    the shell stored the new topic ids, which may have halted a partition)."""
    for state in plan.added:
        states[state.tp] = state
        place(state)
    for state in plan.moved:
        unplace(state)
        place(state)
    for state in plan.removed:
        del states[state.tp]
        unplace(state)
    for state in plan.updated:
        touch(state)
