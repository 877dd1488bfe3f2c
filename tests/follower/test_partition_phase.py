"""The partition phase's table: the moves the follower makes, and a move it must never make."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from replicad.errors import LocalProtocolError
from replicad.follower.partition_phase import (
    ASKS_OFFSETS,
    TRANSITIONS,
    PartitionPhase,
    PhaseEvent,
    initial_phase,
    next_phase,
)
from replicad.follower.partition_state import PartitionState
from replicad.types import TopicPartition

FOLLOWER = Path(__file__).resolve().parents[2] / "replicad" / "follower"


def _state(phase: PartitionPhase) -> PartitionState:
    return PartitionState(TopicPartition("t", 0), None, 1, 0, phase)


def test_a_partition_starts_where_its_data_says():
    assert initial_phase(has_local_data=True) is PartitionPhase.FETCHING
    assert initial_phase(has_local_data=False) is PartitionPhase.NEEDS_OFFSET


def test_the_life_of_a_partition():
    state = _state(PartitionPhase.NEEDS_OFFSET)
    for event, phase in [
        (PhaseEvent.START_FOUND, PartitionPhase.FETCHING),
        (PhaseEvent.OUT_OF_RANGE, PartitionPhase.TRUNCATING),
        (PhaseEvent.RECONCILED, PartitionPhase.FETCHING),
        (PhaseEvent.DISK_FULL, PartitionPhase.PAUSED_DISK_FULL),
        (PhaseEvent.DISK_FULL, PartitionPhase.PAUSED_DISK_FULL),
        (PhaseEvent.DISK_RETRY, PartitionPhase.FETCHING),
        (PhaseEvent.DISK_FULL, PartitionPhase.PAUSED_DISK_FULL),
        (PhaseEvent.DISK_BACK, PartitionPhase.FETCHING),
        (PhaseEvent.OUT_OF_RANGE, PartitionPhase.TRUNCATING),
        (PhaseEvent.GAP_HALT, PartitionPhase.HALTED),
    ]:
        assert state.move(event) is phase
    assert state.phase is PartitionPhase.HALTED


@pytest.mark.parametrize("phase", list(PartitionPhase))
@pytest.mark.parametrize("event", [PhaseEvent.LOG_UNUSABLE, PhaseEvent.TOPIC_RECREATED])
def test_an_unusable_log_or_a_recreated_topic_halts_from_any_phase(phase, event):
    state = _state(phase)
    state.move(event, "why")
    assert state.phase is PartitionPhase.HALTED and state.last_error == "why"


def test_a_planted_illegal_transition_raises():
    """A halted partition revived by a stale ListOffsets answer (the bug the table exists
    to catch) is replicad's own error, and the phase is left as it was."""
    state = _state(PartitionPhase.HALTED)
    with pytest.raises(LocalProtocolError, match="no transition from halted on reconciled"):
        state.move(PhaseEvent.RECONCILED)
    assert state.phase is PartitionPhase.HALTED


def test_halted_is_final():
    leaving = [
        event
        for event in PhaseEvent
        if TRANSITIONS.get((PartitionPhase.HALTED, event), PartitionPhase.HALTED)
        is not PartitionPhase.HALTED
    ]
    assert leaving == []
    for event in PhaseEvent:
        if (PartitionPhase.HALTED, event) not in TRANSITIONS:
            with pytest.raises(LocalProtocolError):
                next_phase(PartitionPhase.HALTED, event)


def test_only_the_phases_that_ask_list_offsets_act_on_its_answer():
    assert {PartitionPhase.NEEDS_OFFSET, PartitionPhase.TRUNCATING} == ASKS_OFFSETS
    for phase in PartitionPhase:
        moved = {
            TRANSITIONS.get((phase, e)) for e in (PhaseEvent.START_FOUND, PhaseEvent.RECONCILED)
        }
        assert (moved != {None}) == (phase in ASKS_OFFSETS)


def test_the_phase_is_assigned_in_its_module_only():
    """`state.phase = ...` is written by PartitionState.move alone: every other module of
    the follower asks for a move with an event."""
    writers = []
    for path in sorted(FOLLOWER.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == "phase":
                    writers.append(path.name)
    assert writers == ["partition_state.py"]
