"""Response frames on the server side: records spliced into a kio-encoded response."""

from __future__ import annotations

import struct

import pytest

from replicad.errors import LocalProtocolError
from replicad.leader.frames import (
    RECORDS_TOKEN_BYTES,
    ResponseFrame,
    records_token,
    splice_records,
)
from replicad.log.segment import FileRegion

SIZE = struct.Struct(">i")


@pytest.mark.parametrize("flexible", [False, True])
@pytest.mark.parametrize("size", [0, 5, 126, 127, 128, 20_000, 3_000_000])
def test_records_are_spliced_in_with_their_real_length(tmp_path, flexible, size) -> None:
    token = records_token()
    prefix = bytes([RECORDS_TOKEN_BYTES + 1]) if flexible else SIZE.pack(RECORDS_TOKEN_BYTES)
    encoded = b"HEAD" + prefix + token + b"TAIL"
    region = FileRegion(tmp_path / "segment.log", 10, size)
    parts = splice_records(encoded, [(token, region)], flexible=flexible)
    assert parts[1] is region
    head, tail = parts[0], parts[2]
    assert isinstance(head, bytes) and head.startswith(b"HEAD") and tail == b"TAIL"
    length = head[4:]
    if flexible:
        value, shift = 0, 0
        for byte in length:
            value |= (byte & 0x7F) << shift
            shift += 7
        assert value == size + 1
    else:
        assert SIZE.unpack(length)[0] == size
    assert ResponseFrame(parts).size == len(head) + size + 4


def test_a_token_that_is_not_where_kio_put_it_is_a_local_error(tmp_path) -> None:
    token = records_token()
    region = FileRegion(tmp_path / "s.log", 0, 1)
    with pytest.raises(LocalProtocolError, match="missing"):
        splice_records(b"no token here", [(token, region)], flexible=False)
    with pytest.raises(LocalProtocolError, match="length prefix"):
        splice_records(b"\x00\x00\x00\x05" + token, [(token, region)], flexible=False)
