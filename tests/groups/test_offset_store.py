"""The committed-offset store: what was appended is there after a reopen, a torn tail is cut,
removals stay removed, compaction keeps exactly the live offsets, a failed append leaves
nothing torn behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from replicad.groups import offset_store
from replicad.groups.classic_group import CommittedOffset
from replicad.groups.offset_store import (
    DIRECTORY,
    FILE,
    Commit,
    GroupOwned,
    GroupRemoval,
    OffsetRemoval,
    OffsetStore,
    encode,
    replay,
)
from replicad.log.layout import parse_partition_dir
from replicad.types import TopicPartition

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def committed(offset: int, ts: int = 1) -> CommittedOffset:
    return CommittedOffset(offset, 4, "meta", ts)


def test_appended_offsets_are_there_after_a_reopen(tmp_path: Path) -> None:
    store = OffsetStore.open(tmp_path)
    store.append([Commit("g", T0, committed(5)), Commit("g", T1, committed(6))])
    store.append([Commit("g", T0, committed(9)), Commit("h", T0, committed(1))])
    store.close()
    again = OffsetStore.open(tmp_path)
    assert again.offsets() == {
        "g": {T0: committed(9), T1: committed(6)},
        "h": {T0: committed(1)},
    }
    assert again.records == 4


def test_removals_of_offsets_and_groups_are_replayed(tmp_path: Path) -> None:
    store = OffsetStore.open(tmp_path)
    store.append([Commit("g", T0, committed(5)), Commit("g", T1, committed(6))])
    store.append([OffsetRemoval("g", T0), Commit("h", T0, committed(1)), GroupRemoval("h")])
    store.close()
    assert OffsetStore.open(tmp_path).offsets() == {"g": {T1: committed(6)}}


def test_an_owned_mark_outlives_the_groups_offsets_its_removal_and_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(offset_store, "COMPACT_MIN_RECORDS", 10)
    store = OffsetStore.open(tmp_path)
    store.append([GroupOwned("g"), Commit("g", T0, committed(5)), Commit("h", T0, committed(1))])
    store.append([GroupRemoval("g"), GroupOwned("never-committed")])
    store.close()
    again = OffsetStore.open(tmp_path)
    assert again.owned_groups() == {"g", "never-committed"}
    assert again.offsets() == {"h": {T0: committed(1)}}
    for i in range(20):
        again.append([Commit("h", T0, committed(i))])
    assert again.compactions >= 1
    again.close()
    compacted = OffsetStore.open(tmp_path)
    assert compacted.owned_groups() == {"g", "never-committed"}
    assert compacted.offsets() == {"h": {T0: committed(19)}}


@pytest.mark.parametrize("cut", [1, 5, 9])
def test_a_torn_last_record_is_cut_and_the_rest_kept(tmp_path: Path, cut: int) -> None:
    store = OffsetStore.open(tmp_path)
    store.append([Commit("g", T0, committed(5))])
    store.close()
    path = tmp_path / DIRECTORY / FILE
    whole = path.stat().st_size
    with open(path, "ab") as f:
        f.write(encode(Commit("g", T0, committed(99)))[:cut])
    again = OffsetStore.open(tmp_path)
    assert again.offsets() == {"g": {T0: committed(5)}}
    assert path.stat().st_size == whole
    again.append([Commit("g", T1, committed(7))])
    again.close()
    assert OffsetStore.open(tmp_path).offsets() == {"g": {T0: committed(5), T1: committed(7)}}


def test_a_record_failing_its_crc_ends_the_replay() -> None:
    good = encode(Commit("g", T0, committed(1)))
    bad = bytearray(encode(Commit("g", T0, committed(2))))
    bad[-2] ^= 0xFF
    state: dict = {}
    replayed = replay(good + bytes(bad) + good, state, set())
    assert (replayed.records, replayed.valid_bytes) == (1, len(good))
    assert state == {"g": {T0: committed(1)}}


def test_compaction_keeps_the_live_offsets_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(offset_store, "COMPACT_MIN_RECORDS", 10)
    store = OffsetStore.open(tmp_path)
    for i in range(20):
        store.append([Commit("g", T0, committed(i)), Commit("g", T1, committed(100 + i))])
    assert store.compactions >= 1
    assert store.records < 20
    store.close()
    again = OffsetStore.open(tmp_path)
    assert again.offsets() == {"g": {T0: committed(19), T1: committed(119)}}
    assert not (tmp_path / DIRECTORY / f"{FILE}.tmp").exists()


def test_a_failed_append_leaves_no_torn_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = OffsetStore.open(tmp_path)
    store.append([Commit("g", T0, committed(1))])
    real_write = os.write

    def half_then_full(fd: int, data: bytes) -> int:
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(offset_store.os, "write", half_then_full)
    with pytest.raises(OSError):
        store.append([Commit("g", T0, committed(2))])
    monkeypatch.setattr(offset_store.os, "write", real_write)
    store.append([Commit("g", T1, committed(3))])
    store.close()
    assert OffsetStore.open(tmp_path).offsets() == {"g": {T0: committed(1), T1: committed(3)}}


def test_the_store_directory_is_never_taken_for_a_partition() -> None:
    assert parse_partition_dir(DIRECTORY) is None
