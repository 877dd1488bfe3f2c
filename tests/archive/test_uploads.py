"""What the uploader does next: closed, non-empty, committed segments in order; the hold;
the back-off."""

from __future__ import annotations

import pytest

from replicad.archive.uploads import (
    Backoff,
    LocalSegment,
    State,
    remote_expired,
    retention_floor,
    to_upload,
)
from replicad.errors import LocalProtocolError


def seg(base: int, next_offset: int, size: int = 100) -> LocalSegment:
    return LocalSegment(base, next_offset, size, -1)


SEGMENTS = [seg(0, 10), seg(10, 20), seg(20, 30), seg(30, 30, size=0)]  # the last is active


def bases(segments: list[LocalSegment]) -> list[int]:
    return [s.base_offset for s in segments]


def test_only_closed_segments_below_the_high_watermark_are_uploaded() -> None:
    assert bases(to_upload(None, SEGMENTS, high_watermark=30)) == [0, 10, 20]
    assert bases(to_upload(None, SEGMENTS, high_watermark=25)) == [0, 10]
    # The active segment is never uploaded, however far the high watermark is.
    assert bases(to_upload(None, SEGMENTS[:1], high_watermark=100)) == []


def test_what_the_archive_has_is_not_uploaded_again() -> None:
    assert bases(to_upload(10, SEGMENTS, high_watermark=30)) == [10, 20]
    assert bases(to_upload(30, SEGMENTS, high_watermark=30)) == []


def test_an_empty_closed_segment_is_skipped() -> None:
    segments = [seg(0, 0, size=0), seg(0, 10), seg(10, 10, size=0)]
    assert bases(to_upload(None, segments, high_watermark=10)) == [0]


def test_retention_holds_everything_until_something_is_archived() -> None:
    assert retention_floor(None) == 0
    assert retention_floor(20) == 20


def test_backoff_doubles_to_its_max_and_a_success_resets_it() -> None:
    backoff = Backoff(backoff_ms=100, backoff_max_ms=350)
    assert backoff.ready(0)
    assert backoff.failed(1_000) == 1_100
    assert backoff.state is State.BACKING_OFF
    assert not backoff.ready(1_099)
    assert backoff.ready(1_100)
    assert backoff.failed(2_000) == 2_200
    assert backoff.ready(2_200)
    assert backoff.failed(3_000) == 3_350  # capped
    assert backoff.ready(3_350)
    backoff.succeeded()
    assert backoff.failures == 0
    assert backoff.failed(4_000) == 4_100


def test_a_move_not_in_the_table_is_refused() -> None:
    backoff = Backoff(backoff_ms=100, backoff_max_ms=1000)
    backoff.failed(0)
    with pytest.raises(LocalProtocolError, match="no transition from backing_off on"):
        backoff.succeeded()  # a success while backing off: no upload was tried


def test_remote_retention_deletes_the_oldest_by_time_or_size_never_the_newest() -> None:
    archived = [LocalSegment(b, b + 10, 100, 1_000 + b) for b in (0, 10, 20, 30)]
    assert remote_expired(archived, -1, -1, now_ms=10**9) == 0
    # By time: segments whose largest timestamp is older than retention_ms, from the oldest.
    assert remote_expired(archived, 1_000, -1, now_ms=2_015) == 2
    assert remote_expired(archived, 0, -1, now_ms=10**9) == 3  # the newest stays
    # By size: while the rest still holds retention_bytes.
    assert remote_expired(archived, -1, 250, now_ms=0) == 1
    assert remote_expired(archived, -1, 0, now_ms=0) == 3
