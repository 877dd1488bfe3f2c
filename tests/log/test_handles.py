"""The bounded cache of open segment files: its LRU decisions, and the descriptors behind them."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.errors import LogError
from replicad.log.handles import FileHandle, FileHandles, OpenFileLru


def _open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


# -- OpenFileLru (sans-I/O) ----------------------------------------------------------------------


def _admitted(lru: OpenFileLru[str], key: str, *, dirty: bool = False) -> tuple[str, ...]:
    return lru.admit(key, dirty=dirty).victims


def test_the_least_recently_used_key_is_closed_first() -> None:
    lru: OpenFileLru[str] = OpenFileLru(3)
    assert [_admitted(lru, k) for k in "abc"] == [(), (), ()]
    lru.touch("a")
    assert _admitted(lru, "d") == ("b",)
    assert _admitted(lru, "e") == ("c",)
    assert lru.order() == ("a", "d", "e")


def test_clean_keys_are_closed_before_older_dirty_ones() -> None:
    lru: OpenFileLru[str] = OpenFileLru(3)
    _admitted(lru, "a", dirty=True)
    _admitted(lru, "b")
    _admitted(lru, "c")
    lru.mark_dirty("b")
    assert _admitted(lru, "d") == ("c",)
    # Only dirty ones (and the new clean "d") left: "d" goes, then the oldest dirty.
    assert _admitted(lru, "e") == ("d",)
    lru.mark_dirty("e")
    assert _admitted(lru, "f") == ("a",)


def test_a_synced_key_becomes_the_most_recent_clean_one() -> None:
    lru: OpenFileLru[str] = OpenFileLru(3)
    _admitted(lru, "a", dirty=True)
    _admitted(lru, "b")
    _admitted(lru, "c")
    lru.mark_clean("a")
    assert lru.order() == ("b", "c", "a")
    assert not lru.is_dirty("a")


def test_pinned_keys_are_never_closed_and_the_cap_comes_back() -> None:
    lru: OpenFileLru[str] = OpenFileLru(2)
    for key in "ab":
        lru.admit(key, dirty=False)
        lru.pin(key)
    # Both pinned: "c" opens over the cap rather than closing a file in use.
    assert lru.admit("c", dirty=False).victims == ()
    lru.pin("c")
    assert len(lru) == 3
    assert lru.evict_one() is None
    assert lru.trim().victims == ()
    # Releases close the excess, least recently used first, once it is unpinned.
    assert lru.release("b").victims == ("b",)
    assert lru.release("c").victims == ()
    assert len(lru) == 2
    assert lru.admit("d", dirty=False).victims == ("c",)


def test_an_unpinned_key_over_the_cap_is_trimmed() -> None:
    lru: OpenFileLru[str] = OpenFileLru(1)
    lru.admit("a", dirty=False)
    lru.pin("a")
    assert lru.admit("b", dirty=True).victims == ()
    # b was used once (not pinned) while a was in use: it goes as soon as that use ends.
    assert lru.trim().victims == ("b",)
    assert lru.order() == ("a",)


def test_pressure_never_closes_the_file_being_opened() -> None:
    lru: OpenFileLru[str] = OpenFileLru(4)
    for key in "ab":
        lru.admit(key, dirty=False)
    assert lru.evict_one(keep="a") == "b"
    assert lru.evict_one(keep="a") is None


def test_pins_count_nested_uses() -> None:
    lru: OpenFileLru[str] = OpenFileLru(1)
    lru.admit("a", dirty=False)
    lru.pin("a")
    lru.pin("a")
    assert lru.release("a").victims == ()
    assert lru.pins("a") == 1
    assert lru.admit("b", dirty=False).victims == ()
    lru.pin("b")
    assert lru.release("a").victims == ("a",)
    assert lru.pins("a") == 0
    assert lru.release("b").victims == ()
    assert lru.admit("c", dirty=False).victims == ("b",)


def test_misuse_is_refused() -> None:
    lru: OpenFileLru[str] = OpenFileLru(2)
    with pytest.raises(ValueError, match="at least one"):
        OpenFileLru(0)
    lru.admit("a", dirty=False)
    with pytest.raises(ValueError, match="already open"):
        lru.admit("a", dirty=False)
    with pytest.raises(ValueError, match="not open"):
        lru.mark_dirty("zz")
    with pytest.raises(ValueError, match="not open"):
        lru.pin("zz")
    lru.pin("a")
    lru.remove("a")
    assert "a" not in lru
    assert lru.pinned == 0


_KEYS = st.sampled_from("abcdefg")
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["use", "pin", "release", "trim", "dirty", "clean", "remove", "pressure"]),
        _KEYS,
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(1, 4), ops=_OPS)
def test_lru_agrees_with_a_model_of_its_rules(capacity: int, ops: list[tuple[str, str]]) -> None:
    """Against a plain model (last-use ticks): the same victims, never a pinned one, the cap
    exceeded only by pinned keys (and the one key a single use opened among them)."""
    lru: OpenFileLru[str] = OpenFileLru(capacity)
    tick = 0
    last_use: dict[str, int] = {}
    dirty: dict[str, bool] = {}
    pins: dict[str, int] = {}

    def model_victim() -> str | None:
        for want_dirty in (False, True):
            candidates = [k for k in last_use if dirty[k] == want_dirty and not pins.get(k)]
            if candidates:
                return min(candidates, key=last_use.__getitem__)
        return None

    def model_evict_down_to(size: int) -> tuple[str, ...]:
        victims = []
        while len(last_use) > size and (victim := model_victim()) is not None:
            victims.append(victim)
            del last_use[victim], dirty[victim]
        return tuple(victims)

    for op, key in ops:
        tick += 1
        if op == "use":
            if key in last_use:
                lru.touch(key)
            else:
                expected = model_evict_down_to(capacity - 1)
                assert lru.admit(key, dirty=tick % 3 == 0).victims == expected
                dirty[key] = tick % 3 == 0
            last_use[key] = tick
        elif op == "trim":
            assert lru.trim().victims == model_evict_down_to(capacity)
        elif key not in last_use:
            continue
        elif op == "pin":
            lru.pin(key)
            pins[key] = pins.get(key, 0) + 1
        elif op == "release" and pins.get(key):
            pins[key] -= 1
            if not pins[key]:
                del pins[key]
            expected = () if key in pins else model_evict_down_to(capacity)
            assert lru.release(key).victims == expected
        elif op == "dirty":
            lru.mark_dirty(key)
            dirty[key] = True
            last_use[key] = tick
        elif op == "clean" and dirty[key]:
            lru.mark_clean(key)
            dirty[key] = False
            last_use[key] = tick
        elif op == "remove":
            lru.remove(key)
            del last_use[key], dirty[key]
            pins.pop(key, None)
        elif op == "pressure":
            expected_victim = model_victim()
            assert lru.evict_one() == expected_victim
            if expected_victim is not None:
                del last_use[expected_victim], dirty[expected_victim]
        assert len(lru) == len(last_use) <= max(capacity, len(pins) + 1)
        assert set(lru.order()) == set(last_use)
        assert all(lru.pins(k) == n for k, n in pins.items())


# -- FileHandles (descriptors) -------------------------------------------------------------------


def _files(tmp_path: Path, handles: FileHandles, count: int) -> list[FileHandle]:
    return [handles.create(tmp_path, f"f{i}") for i in range(count)]


def test_files_are_reopened_on_demand_within_the_cap(tmp_path: Path) -> None:
    before = _open_fds()
    handles = FileHandles(2)
    files = _files(tmp_path, handles, 5)
    for round_ in range(3):
        for i, f in enumerate(files):
            f.write_all(f"{round_}{i}".encode(), round_ * 2)
            assert len(_open_fds()) - len(before) <= 2
    for i, f in enumerate(files):
        assert f.pread(6, 0) == f"0{i}1{i}2{i}".encode()
        assert f.size() == 6
    stats = handles.stats()
    assert stats.open == 2
    assert stats.peak_open == 2
    assert stats.evictions == stats.opens - 2
    assert stats.pressure_evictions == 0
    for f in files:
        f.close()
    assert _open_fds() == before
    assert handles.stats().open == 0


def test_a_file_in_use_is_reused_not_reopened(tmp_path: Path) -> None:
    handles = FileHandles(2)
    hot, *cold = _files(tmp_path, handles, 6)
    hot.write_all(b"x", 0)
    opens = handles.stats().opens
    fd = hot.fd
    for i, f in enumerate(cold * 20):
        hot.write_all(b"x", i)
        f.write_all(b"y", i)
    # Each cold write reopens; the hot file, used in between, never was closed.
    assert hot.fd == fd
    assert handles.stats().opens - opens == len(cold) * 20


def test_an_evicted_dirty_file_is_synced_through_a_new_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handles = FileHandles(1)
    a, b = _files(tmp_path, handles, 2)
    a.sync()
    a.write_all(b"unsynced", 0)
    dirty_evictions = handles.stats().dirty_evictions
    b.pread(1, 0)  # evicts a, dirty
    assert a.fd == -1 and a.dirty
    assert handles.stats().dirty_evictions == dirty_evictions + 1
    synced_inodes = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced_inodes.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    before = handles.stats()
    a.sync()
    assert synced_inodes == [os.stat(a.path).st_ino]
    assert not a.dirty
    # The sync did not go through the LRU: b is still the one open file.
    after = handles.stats()
    assert (after.open, after.opens, b.fd >= 0) == (before.open, before.opens, True)
    a.sync()  # clean now: nothing to do
    assert len(synced_inodes) == 1


def test_a_write_during_a_sync_keeps_the_file_dirty(tmp_path: Path) -> None:
    handles = FileHandles(4)
    (f,) = _files(tmp_path, handles, 1)
    f.write_all(b"first", 0)
    ticket = handles.sync_ticket(f)
    assert ticket is not None
    f.write_all(b"second", 5)  # lands after the ticket's generation
    os.fsync(ticket.fd)
    os.close(ticket.fd)
    handles.synced(f, ticket.generation)
    assert f.dirty
    f.sync()
    assert not f.dirty
    assert handles.sync_ticket(f) is None


def test_reopening_never_creates_a_vanished_file(tmp_path: Path) -> None:
    handles = FileHandles(1)
    a, b = _files(tmp_path, handles, 2)
    a.write_all(b"data", 0)
    b.pread(1, 0)
    a.path.unlink()
    with pytest.raises(FileNotFoundError):
        a.pread(4, 0)
    assert not a.path.exists()
    # A handle made with create=True creates its file on first use, and only then.
    lazy = handles.handle(tmp_path, "lazy", create=True)
    assert not lazy.path.exists()
    assert lazy.size() == 0
    lazy.mark_unsynced()
    lazy.sync()
    assert not lazy.dirty


def test_a_never_opened_missing_file_has_nothing_to_sync(tmp_path: Path) -> None:
    handles = FileHandles(1)
    missing = handles.handle(tmp_path, "not-yet", create=True)
    missing.mark_unsynced()
    missing.sync()
    assert not missing.dirty
    assert not missing.path.exists()


def test_closing_a_pinned_file_waits_for_its_release(tmp_path: Path) -> None:
    before = _open_fds()
    handles = FileHandles(2)
    (f,) = _files(tmp_path, handles, 1)
    with f.pinned() as fd:
        f.close()
        assert os.pread(fd, 1, 0) == b""  # still open while in use
    assert _open_fds() == before
    with pytest.raises(LogError, match="used after its segment was closed"):
        f.pread(1, 0)


def test_a_pinned_file_stays_open_past_the_cap(tmp_path: Path) -> None:
    handles = FileHandles(1)
    a, b = _files(tmp_path, handles, 2)
    with a.pinned() as fd:
        b.write_all(b"b", 0)
        # b was opened over the cap (a is in use) and closed again as soon as it was released.
        assert (a.fd, b.fd, handles.stats().open, handles.stats().peak_open) == (fd, -1, 1, 2)
        os.pwrite(fd, b"a", 0)
    assert (a.fd, handles.stats().open) == (fd, 1)
    assert b.pread(1, 0) == b"b"
    assert (a.fd, handles.stats().open) == (-1, 1)


def test_too_many_open_files_closes_more_and_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handles = FileHandles(8)
    files = _files(tmp_path, handles, 4)
    extra = handles.handle(tmp_path, "f0")
    real_open = os.open
    refusals = iter([True, True])

    def limited_open(path: object, flags: int, mode: int = 0o777) -> int:
        if next(refusals, False):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", limited_open)
    assert extra.pread(1, 0) == b""
    stats = handles.stats()
    assert stats.pressure_evictions == 2
    assert stats.open == 3
    assert [f.fd >= 0 for f in files] == [False, False, True, True]


def test_too_many_open_files_with_nothing_to_close_is_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handles = FileHandles(8)
    (f,) = _files(tmp_path, handles, 1)
    f.close()
    g = handles.handle(tmp_path, "f0")

    def refusing_open(path: object, flags: int, mode: int = 0o777) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "open", refusing_open)
    with pytest.raises(OSError) as raised:
        g.pread(1, 0)
    assert raised.value.errno == errno.EMFILE
    assert handles.stats().open == 0
