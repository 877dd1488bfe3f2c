"""The one lookup every state machine's table of moves goes through (the partition's phase,
the mirror's phases, its producer session and chores, the disk queue's keys, the archive's
retries, verify's check, the mirror's group sync): what an event moves a state to, and a
LocalProtocolError -- a bug of the caller, never a peer's -- for a move the table does not
hold. Each machine keeps its table and its rules in its own module."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeVar

from replicad.errors import LocalProtocolError

State = TypeVar("State")
Event = TypeVar("Event")
To = TypeVar("To")


def move(table: Mapping[tuple[State, Event], To], state: State, event: Event, machine: str) -> To:
    """`table`'s entry for `state` on `event`; LocalProtocolError naming `machine` when the
    table has none."""
    try:
        return table[(state, event)]
    except KeyError:
        raise LocalProtocolError(
            f"{machine}: no transition from {_name(state)} on {_name(event)}"
        ) from None


def _name(value: object) -> str:
    return str(value.value) if isinstance(value, enum.Enum) else str(value)
