"""Sans-I/O log rate limiting: say each kind of event once per interval, with a repeat count.

Rules:
- The first event of a key is emitted.
- Later events of that key are suppressed until `interval_ms` has passed since the
  last emitted one; the next emitted event reports how many were suppressed since.
- Time is passed in (`now_ms`, from a monotonic clock); a clock that goes backwards
  counts as "not yet" rather than emitting early.
- Keys are whatever the caller chooses (a recovery reason, "oor:topic-3", "group:<id>");
  the memory held is one small record per key still in its interval or holding back a
  count. A key whose interval has passed with nothing held back is forgotten (pruned when
  the keys held double): it would emit its next event anyway, as an unknown key does, so
  forgetting it changes nothing said -- and keys named after groups or partitions that come
  and go no longer accumulate for the life of the process.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Emit:
    """Whether to log this event now, and how many repeats were held back before it."""

    emit: bool
    suppressed: int


@dataclass(slots=True)
class _KeyState:
    last_emit_ms: int
    suppressed: int = 0


# Keys held before the first prune; after one, twice what it kept.
_FIRST_PRUNE_AT = 1024


class RateLimitedLog:
    def __init__(self, interval_ms: int) -> None:
        if interval_ms < 0:
            raise ValueError(f"interval_ms must be >= 0, got {interval_ms}")
        self._interval_ms = interval_ms
        self._keys: dict[Hashable, _KeyState] = {}
        self._prune_at = _FIRST_PRUNE_AT

    def __len__(self) -> int:
        """Keys held now."""
        return len(self._keys)

    @property
    def interval_ms(self) -> int:
        return self._interval_ms

    def should_emit(self, key: Hashable, now_ms: int) -> Emit:
        state = self._keys.get(key)
        if state is None:
            if len(self._keys) >= self._prune_at:
                self._prune(now_ms)
            self._keys[key] = _KeyState(last_emit_ms=now_ms)
            return Emit(emit=True, suppressed=0)
        if now_ms - state.last_emit_ms >= self._interval_ms:
            held_back = state.suppressed
            state.last_emit_ms = now_ms
            state.suppressed = 0
            return Emit(emit=True, suppressed=held_back)
        state.suppressed += 1
        return Emit(emit=False, suppressed=state.suppressed)

    def _prune(self, now_ms: int) -> None:
        """Forget the keys that would emit their next event anyway (see the rules)."""
        self._keys = {
            key: state
            for key, state in self._keys.items()
            if state.suppressed or now_ms - state.last_emit_ms < self._interval_ms
        }
        self._prune_at = max(_FIRST_PRUNE_AT, 2 * len(self._keys))

    def pending(self, key: Hashable) -> int:
        """Events of `key` suppressed since it was last emitted (0 for an unknown key)."""
        state = self._keys.get(key)
        return 0 if state is None else state.suppressed
