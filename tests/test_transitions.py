"""The one lookup of every state machine's table of moves: an entry is the move, a missing
one is a LocalProtocolError naming the machine, the state and the event."""

from __future__ import annotations

import enum

import pytest

from replicad.errors import LocalProtocolError
from replicad.transitions import move


class Light(enum.Enum):
    RED = "red"
    GREEN = "green"


# States and events are enum members in replicad's machines; plain values work as well.
TABLE = {(Light.RED, "go"): Light.GREEN, (Light.GREEN, "stop"): Light.RED}


def test_a_move_in_the_table_is_taken() -> None:
    assert move(TABLE, Light.RED, "go", "light") is Light.GREEN
    assert move(TABLE, Light.GREEN, "stop", "light") is Light.RED


def test_a_move_not_in_the_table_names_machine_state_and_event() -> None:
    with pytest.raises(LocalProtocolError, match=r"^light: no transition from green on go$"):
        move(TABLE, Light.GREEN, "go", "light")
    with pytest.raises(LocalProtocolError, match=r"^plain: no transition from 1 on x$"):
        move({}, 1, "x", "plain")
