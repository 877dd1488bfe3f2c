"""The read cache: a bound on the bytes held, least recently used dropped first."""

from __future__ import annotations

from replicad.archive.read_cache import WHOLE, ReadCache


def test_the_least_recently_used_entries_go_first_and_the_bound_holds() -> None:
    cache = ReadCache(max_bytes=10)
    cache.put(("a", 0), b"1234")
    cache.put(("a", 1), b"5678")
    assert cache.get(("a", 0)) == b"1234"  # a-0 is now the most recently used
    cache.put(("b", WHOLE), b"xyz")
    stats = cache.stats()
    assert (stats.held_bytes, stats.entries, stats.evicted_bytes) == (7, 2, 4)
    assert cache.get(("a", 1)) is None
    assert cache.get(("a", 0)) == b"1234" and cache.get(("b", WHOLE)) == b"xyz"
    assert (cache.stats().hits, cache.stats().misses) == (3, 1)


def test_an_entry_larger_than_the_bound_is_not_kept() -> None:
    cache = ReadCache(max_bytes=4)
    cache.put(("a", 0), b"12")
    cache.put(("big", 0), b"12345")
    assert cache.get(("big", 0)) is None and cache.get(("a", 0)) == b"12"
    none = ReadCache(max_bytes=0)
    none.put(("a", 0), b"1")
    assert none.stats().held_bytes == 0


def test_putting_a_key_again_replaces_it() -> None:
    cache = ReadCache(max_bytes=10)
    cache.put(("a", 0), b"1234")
    cache.put(("a", 0), b"12")
    assert cache.stats().held_bytes == 2 and cache.get(("a", 0)) == b"12"
