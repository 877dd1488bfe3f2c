"""The control socket's datagrams (requests to the daemon, reply chunks to the client):
only ControlError comes out of decoding."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from replicad.control.protocol import (
    HEADER_END,
    ReplyAssembler,
    ReplyComplete,
    decode_request,
    ok_reply,
    request_id_of,
)
from replicad.errors import ControlError
from tools.chaos.fuzz_targets import control_datagrams, seeds
from tools.chaos.strategies import bounded, mutated

BOUNDED = bounded(400)
JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def test_every_seed_decodes() -> None:
    """Each seed is well formed (so mutating it explores near valid input): a request
    decodes to its command, a reply chunk is taken by the assembler of its request and
    completes its reply; and the fuzz target takes each."""
    commands, replies = [], []
    for seed in seeds("control-datagrams"):
        control_datagrams(seed)
        try:
            commands.append(decode_request(seed).cmd)
        except ControlError:
            header = seed.partition(HEADER_END)[0]
            step = ReplyAssembler(request_id=request_id_of(header)).feed(seed)
            assert isinstance(step, ReplyComplete), (seed, step)
            replies.append(step.reply)
    assert commands == ["status", "reload"]
    assert replies == [ok_reply({"partitions": list(range(50))}), {}]


@BOUNDED
@given(mutated("control-datagrams"))
def test_mutated_datagrams(data: bytes) -> None:
    control_datagrams(data)


@BOUNDED
@given(JSONISH, JSONISH)
def test_json_shapes(header: object, body: object) -> None:
    control_datagrams(json.dumps(header).encode())
    control_datagrams(json.dumps(header).encode() + b"\n" + json.dumps(body).encode())
    control_datagrams(json.dumps({"cmd": body, "id": header, "args": body}).encode())


@BOUNDED
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    control_datagrams(data)
