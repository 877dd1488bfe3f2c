"""The exact offset map: sync points only where the shift changes, gaps translated to the
next mirrored record."""

from __future__ import annotations

import pytest

from replicad.mirror.offset_map import OffsetMap, SyncPoint


def test_kept_offsets_need_one_point() -> None:
    m = OffsetMap()
    assert m.record(0, 0) is True
    assert m.record(10, 10) is False
    assert m.record(25, 25) is False
    assert m.points == [SyncPoint(0, 0)]
    assert m.offsets_kept
    assert m.translate(17) == 17
    assert m.translate(-1) is None


def test_skipped_offsets_shift_what_follows() -> None:
    m = OffsetMap()
    m.record(0, 0)  # records 0..4 at 0..4
    # 5..9 aborted, 10 its marker: the next batch at source 11 lands at dest 5.
    assert m.record(11, 5) is True
    assert not m.offsets_kept
    assert m.translate(3) == 3
    # A committed offset inside the skipped range resumes at the next mirrored record.
    for skipped in range(5, 12):
        assert m.translate(skipped) == 5
    assert m.translate(14) == 8


def test_non_empty_destination() -> None:
    m = OffsetMap.of([SyncPoint(0, 100)])
    assert m.translate(7) == 107
    assert not m.offsets_kept


def test_points_never_go_back() -> None:
    m = OffsetMap.of([SyncPoint(10, 10)])
    with pytest.raises(ValueError):
        m.record(5, 20)
