"""Checkpoint files (offsets, leader epochs, partition.metadata): the parsers raise only
LogError, and whatever parses round-trips through the formatter."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tools.chaos.fuzz_targets import checkpoints, seeds
from tools.chaos.strategies import bounded, mutated

BOUNDED = bounded(400)

LINES = st.lists(
    st.one_of(
        st.sampled_from(["0", "1", "2", "-1", "", " ", "orders 0 5", "3 100", "version: 0"]),
        st.from_regex(r"[a-z._-]{0,8} -?[0-9]{1,3} -?[0-9]{1,20}", fullmatch=True),
        st.from_regex(r"-?[0-9]{1,3} -?[0-9]{1,20}", fullmatch=True),
        st.from_regex(r"topic_id: [A-Za-z0-9_=-]{0,30}", fullmatch=True),
        st.text(max_size=20),
    ),
    max_size=6,
)


def test_every_seed_parses() -> None:
    for seed in seeds("checkpoints"):
        checkpoints(seed)


@BOUNDED
@given(mutated("checkpoints"))
def test_mutated_checkpoints(data: bytes) -> None:
    checkpoints(data)


@BOUNDED
@given(LINES, st.sampled_from(["\n", "\r\n", "\n\n"]))
def test_line_soup(lines: list[str], newline: str) -> None:
    checkpoints(newline.join(lines).encode("utf-8", errors="surrogateescape"))


@BOUNDED
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    checkpoints(data)
