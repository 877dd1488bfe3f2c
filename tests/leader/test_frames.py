"""Response frames on the server side: parts, their size, the throttle time patched in."""

from __future__ import annotations

import struct

import pytest

from replicad.errors import LocalProtocolError
from replicad.leader.frames import ResponseFrame, with_throttle_time
from replicad.log.segment import FileRegion

SIZE = struct.Struct(">i")


def test_the_size_prefix_counts_every_part(tmp_path) -> None:
    region = FileRegion(tmp_path / "segment.log", 10, 3_000_000)
    frame = ResponseFrame((b"HEAD", region, b"TAIL"))
    assert frame.size == 8 + 3_000_000
    prefix, *parts = frame.with_size_prefix()
    assert SIZE.unpack(prefix)[0] == frame.size
    assert parts == [b"HEAD", region, b"TAIL"]


def test_the_throttle_time_is_patched_where_the_response_begins(tmp_path) -> None:
    region = FileRegion(tmp_path / "s.log", 0, 1)
    frame = ResponseFrame((b"\x00\x00\x00\x07" + SIZE.pack(0) + b"rest", region))
    patched = with_throttle_time(frame, 4, 250)
    assert patched.parts[0] == b"\x00\x00\x00\x07" + SIZE.pack(250) + b"rest"
    assert patched.parts[1] is region
    with pytest.raises(LocalProtocolError, match="first part"):
        with_throttle_time(ResponseFrame((region,)), 0, 1)
