"""Control-socket wire format: requests, replies split into datagrams and put back together."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.control.protocol import (
    MAX_DATAGRAM_BYTES,
    JsonRows,
    ReplyAssembler,
    ReplyComplete,
    ReplyIgnored,
    ReplyPending,
    decode_request,
    encode_body,
    encode_reply,
    encode_request,
    error_reply,
    ok_reply,
    request_id_of,
)
from replicad.errors import ControlError


def big_reply(partitions: int) -> dict:
    return ok_reply(
        {
            "partitions": [
                {"topic": "orders", "partition": i, "log_end_offset": i * 1000, "lag": i % 7}
                for i in range(partitions)
            ]
        }
    )


def assemble(request_id: int, datagrams: list[bytes]) -> dict:
    assembler = ReplyAssembler(request_id)
    steps = [assembler.feed(datagram) for datagram in datagrams]
    assert all(isinstance(step, ReplyPending) for step in steps[:-1])
    last = steps[-1]
    assert isinstance(last, ReplyComplete)
    return last.reply


def test_request_round_trip() -> None:
    datagram = encode_request("reload", 42, {"dry_run": True})
    request = decode_request(datagram)
    assert (request.cmd, request.id, request.args) == ("reload", 42, {"dry_run": True})
    assert decode_request(encode_request("status", 7)).args == {}


@pytest.mark.parametrize(
    ("datagram", "complaint"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"id": 1}', "no `cmd`"),
        (b'{"cmd": "status", "id": "1"}', "`id` is not an integer"),
        (b'{"cmd": "status", "id": true}', "`id` is not an integer"),
        (b'{"cmd": "status", "id": 1, "args": []}', "`args` is not an object"),
    ],
)
def test_bad_requests_say_what_is_wrong(datagram: bytes, complaint: str) -> None:
    with pytest.raises(ControlError, match=complaint):
        decode_request(datagram)


def test_id_of_an_unparseable_request_is_recovered_when_possible() -> None:
    assert request_id_of(b'{"id": 9, "cmd": 3}') == 9
    assert request_id_of(b"garbage") == 0


def test_a_small_reply_is_one_datagram() -> None:
    datagrams = encode_reply(5, ok_reply({"pid": 1}))
    assert len(datagrams) == 1
    assert assemble(5, datagrams) == {"ok": True, "result": {"pid": 1}}


def test_a_10000_partition_reply_spans_many_datagrams_each_under_the_limit() -> None:
    reply = big_reply(10_000)
    datagrams = encode_reply(77, reply)
    body_size = len(json.dumps(reply, separators=(",", ":")))
    assert len(datagrams) == -(-body_size // (MAX_DATAGRAM_BYTES - 128))
    assert len(datagrams) > 5
    assert all(len(datagram) <= MAX_DATAGRAM_BYTES for datagram in datagrams)
    assert assemble(77, datagrams) == reply


def test_reassembly_tolerates_reordering_and_duplicates() -> None:
    reply = big_reply(3_000)
    datagrams = encode_reply(3, reply)
    shuffled = datagrams + datagrams[:2]
    random.Random(1).shuffle(shuffled)
    assembler = ReplyAssembler(3)
    results = [assembler.feed(datagram) for datagram in shuffled]
    complete = [r for r in results if isinstance(r, ReplyComplete)]
    assert complete and complete[0].reply == reply


def test_chunks_of_another_request_are_ignored() -> None:
    assembler = ReplyAssembler(1)
    assert assembler.feed(encode_reply(2, ok_reply({}))[0]) == ReplyIgnored(id=2)
    step = assembler.feed(encode_reply(1, error_reply("nope"))[0])
    assert step == ReplyComplete(reply={"ok": False, "error": "nope"})


def test_inconsistent_headers_are_errors() -> None:
    first, second = encode_reply(1, big_reply(2_000))[:2]
    assembler = ReplyAssembler(1)
    assembler.feed(first)
    forged = second.replace(b'"total": ', b'"total": 1', 1)
    with pytest.raises(ControlError, match="total"):
        assembler.feed(forged)
    with pytest.raises(ControlError, match="seq"):
        ReplyAssembler(1).feed(b'{"id": 1, "seq": 3, "total": 2}\n{}')
    with pytest.raises(ControlError, match="header"):
        ReplyAssembler(1).feed(b"no header line")
    with pytest.raises(ControlError, match="header"):
        ReplyAssembler(1).feed(b'{"id": 1}\n{}')


@settings(max_examples=50, deadline=None)
@given(
    result=st.dictionaries(
        st.text(max_size=8),
        st.one_of(st.integers(), st.text(max_size=20_000), st.none(), st.booleans()),
        max_size=12,
    ),
    seed=st.integers(0, 2**32),
)
def test_any_reply_survives_any_order(result: dict, seed: int) -> None:
    reply = ok_reply(result)
    datagrams = encode_reply(11, reply)
    random.Random(seed).shuffle(datagrams)
    assert assemble(11, datagrams) == reply


def _row(i: int) -> dict:
    return {"topic": f"topic-{i % 40}", "partition": i, "log_end_offset": i * 1000, "lag": i % 7}


@pytest.mark.parametrize("rows", [0, 1, 3, 5_000])
def test_rows_made_while_encoding_give_the_json_of_a_list(rows: int) -> None:
    result = {"before": "x\u0000y", "partitions": [_row(i) for i in range(rows)], "after": 1}
    as_list = ok_reply(result)

    def streamed() -> dict:  # rows are made once: a reply is encoded once
        return ok_reply(
            {
                **result,
                "partitions": JsonRows(_row(i) for i in range(rows)),
                "mirror": {"rows": JsonRows(iter([{"a": 1}]))},
            }
        )

    body = encode_body(streamed())
    assert json.loads(body) == {**as_list, "result": {**result, "mirror": {"rows": [{"a": 1}]}}}
    assert assemble(4, encode_reply(4, streamed())) == json.loads(body)
    assert json.loads(encode_body(as_list)) == as_list


def test_rows_made_while_encoding_are_never_all_held_at_once() -> None:
    """Issue 32: a 10,000-partition status held every row (a dict of ~20 fields each) and
    then its JSON: the reply was the daemon's peak. Made one at a time, only the JSON is
    held (tracemalloc's peak while encoding; the list's own rows are the comparison)."""
    import tracemalloc

    rows = 5_000
    tracemalloc.start()
    try:
        held = [_row(i) for i in range(rows)]
        rows_bytes = tracemalloc.get_traced_memory()[0]
        body_bytes = len(encode_body({"partitions": held}))
        del held
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        body = encode_body({"partitions": JsonRows(_row(i) for i in range(rows))})
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    assert len(body) == body_bytes
    # The body (a bytearray grows by ~1/8) and one row at a time; not the rows.
    assert peak < 2 * body_bytes < rows_bytes + body_bytes
