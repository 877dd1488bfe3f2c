"""The leader-epoch cache, against Kafka's LeaderEpochFileCache semantics."""

from __future__ import annotations

from replicad.log.checkpoint import EpochEntry
from replicad.log.epoch import (
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    EpochEndOffset,
    LeaderEpochCache,
)


def _cache() -> LeaderEpochCache:
    cache = LeaderEpochCache()
    for epoch, offset in ((1, 0), (3, 100), (6, 250)):
        cache.maybe_assign_from_batch(epoch, offset)
    return cache


def test_only_higher_epochs_start_entries() -> None:
    cache = _cache()
    version = cache.version
    cache.maybe_assign_from_batch(3, 300)  # older epoch from a stale batch: ignored
    cache.maybe_assign_from_batch(6, 260)  # same epoch continues
    cache.maybe_assign_from_batch(-1, 270)  # no epoch (old format)
    assert cache.version == version
    assert cache.entries == [EpochEntry(1, 0), EpochEntry(3, 100), EpochEntry(6, 250)]
    assert cache.latest_epoch() == 6


def test_end_offset_for_epoch() -> None:
    cache = _cache()
    leo = 400
    assert cache.end_offset_for(6, leo) == EpochEndOffset(6, 400)  # latest: the log end
    assert cache.end_offset_for(3, leo) == EpochEndOffset(3, 250)
    assert cache.end_offset_for(4, leo) == EpochEndOffset(3, 250)  # unknown: floor epoch
    assert cache.end_offset_for(2, leo) == EpochEndOffset(1, 100)
    assert cache.end_offset_for(0, leo) == EpochEndOffset(0, 0)  # below all: first start
    assert cache.end_offset_for(7, leo) == EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
    assert cache.end_offset_for(UNDEFINED_EPOCH, leo) == EpochEndOffset(-1, -1)
    assert LeaderEpochCache().end_offset_for(0, 10) == EpochEndOffset(-1, -1)


def test_assign_drops_entries_it_contradicts() -> None:
    cache = _cache()
    cache.assign(4, 200)  # a new leader after a truncation to 200
    assert cache.entries == [EpochEntry(1, 0), EpochEntry(3, 100), EpochEntry(4, 200)]


def test_truncate_from_end_and_start() -> None:
    cache = _cache()
    cache.truncate_from_end(250)
    assert cache.entries == [EpochEntry(1, 0), EpochEntry(3, 100)]
    cache.truncate_from_start(150)
    assert cache.entries == [EpochEntry(3, 150)]
    cache.truncate_from_start(10)  # below: no change
    assert cache.entries == [EpochEntry(3, 150)]
