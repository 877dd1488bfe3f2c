"""The exact source -> destination offset map of one mirrored partition.

Rules:
- The map is a list of sync points (source offset, destination offset), in increasing
  order of both. A sync point says: from this source offset on, destination offset =
  source offset + (dest - source), up to the next sync point. A point is added only when
  that difference changes (a control batch or an aborted transaction skipped, a destination
  that was not empty), so a partition whose offsets are kept has at most one point.
- `record(source_base, dest_base)` is called for every batch produced, in order; a batch
  produced where the running difference already says adds nothing.
- `translate(source_offset)`: the destination offset of the first mirrored record at or
  after `source_offset` -- exact for mirrored records; for an offset that was skipped
  (a marker, an aborted record) it is where the next mirrored record lands. Below the
  first sync point there is no answer (None): that data was never mirrored.
- `offsets_kept`: true while every mirrored record has its source offset.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, order=True)
class SyncPoint:
    source: int
    dest: int

    @property
    def shift(self) -> int:
        return self.dest - self.source


@dataclass(slots=True)
class OffsetMap:
    points: list[SyncPoint] = field(default_factory=list)
    _sources: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, points: Iterable[SyncPoint]) -> OffsetMap:
        m = cls()
        for p in points:
            m.record(p.source, p.dest)
        return m

    def record(self, source_base: int, dest_base: int) -> bool:
        """Note a batch produced at `source_base` that landed at `dest_base`; True when
        that made a new sync point."""
        if self.points:
            last = self.points[-1]
            if source_base < last.source or dest_base < last.dest:
                raise ValueError(
                    f"sync point ({source_base}, {dest_base}) goes back before "
                    f"({last.source}, {last.dest})"
                )
            if dest_base - source_base == last.shift:
                return False
        self.points.append(SyncPoint(source_base, dest_base))
        self._sources.append(source_base)
        return True

    def translate(self, source_offset: int) -> int | None:
        i = bisect.bisect_right(self._sources, source_offset) - 1
        if i < 0:
            return None
        dest = source_offset + self.points[i].shift
        if i + 1 < len(self.points):
            # In a gap (skipped offsets) before the next point: where the next record lands.
            dest = min(dest, self.points[i + 1].dest)
        return dest

    @property
    def offsets_kept(self) -> bool:
        return all(p.shift == 0 for p in self.points)
