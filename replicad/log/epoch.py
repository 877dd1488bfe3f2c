"""The leader-epoch cache of a partition: which epoch began at which offset.

Rules (Kafka's LeaderEpochFileCache):
- Entries are (epoch, start offset), both strictly increasing. Appending a batch whose
  partition leader epoch is >= 0 and greater than the latest cached epoch assigns
  (epoch, batch base offset). Assigning an entry first drops every entry whose epoch or
  start offset is >= the new one's (a leader change after a truncation).
- `end_offset_for(epoch, log_end_offset)`:
    UNDEFINED_EPOCH asked                      -> (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
    the latest epoch asked                     -> (epoch, log end offset)
    no epoch above the asked one               -> (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
    none at or below it, one above             -> (asked epoch, start of the one above)
    otherwise                                  -> (largest epoch <= asked, start of the next)
- Truncating the log to offset T drops entries starting at >= T; moving the log start to S
  drops entries that end before S and moves the start of the one covering S up to S.
The cache is pure; PartitionLog persists it to `leader-epoch-checkpoint` on every change.
"""

from __future__ import annotations

from dataclasses import dataclass

from replicad.log.checkpoint import EpochEntry

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    epoch: int
    end_offset: int


class LeaderEpochCache:
    # One per partition, thousands at once. The entries are a tuple, replaced whole on each
    # change: one entry is 48 bytes less than in a list (whose items live in a block of
    # their own), and no entry at all is the shared empty tuple (a list: 56 bytes each).
    __slots__ = ("_entries", "version")

    def __init__(self, entries: list[EpochEntry] | None = None) -> None:
        self._entries: tuple[EpochEntry, ...] = tuple(entries or ())
        # Bumped on every change, so the owner knows when to persist.
        self.version = 0

    def _set(self, entries: list[EpochEntry]) -> None:
        new = tuple(entries)
        if new != self._entries:
            self._entries = new
            self.version += 1

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    def latest_epoch(self) -> int | None:
        return self._entries[-1].epoch if self._entries else None

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that `epoch` began at `start_offset`."""
        if epoch < 0:
            return
        if self._entries:
            latest = self._entries[-1]
            if latest.epoch == epoch and start_offset >= latest.start_offset:
                return
        kept = [e for e in self._entries if e.epoch < epoch and e.start_offset < start_offset]
        self._set([*kept, EpochEntry(epoch, start_offset)])

    def maybe_assign_from_batch(self, epoch: int, base_offset: int) -> None:
        """The append rule: only an epoch above the latest one starts a new entry."""
        latest = self.latest_epoch()
        if epoch >= 0 and (latest is None or epoch > latest):
            self.assign(epoch, base_offset)

    def end_offset_for(self, epoch: int, log_end_offset: int) -> EpochEndOffset:
        if epoch == UNDEFINED_EPOCH:
            return EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
        if self._entries and self._entries[-1].epoch == epoch:
            return EpochEndOffset(epoch, log_end_offset)
        higher = next((e for e in self._entries if e.epoch > epoch), None)
        if higher is None:
            return EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
        floor = None
        for e in self._entries:
            if e.epoch <= epoch:
                floor = e
        if floor is None:
            return EpochEndOffset(epoch, higher.start_offset)
        return EpochEndOffset(floor.epoch, higher.start_offset)

    def truncate_from_end(self, end_offset: int) -> None:
        self._set([e for e in self._entries if e.start_offset < end_offset])

    def truncate_from_start(self, start_offset: int) -> None:
        below = [e for e in self._entries if e.start_offset <= start_offset]
        if not below:
            return
        kept = [EpochEntry(below[-1].epoch, start_offset)]
        self._set(kept + [e for e in self._entries if e.start_offset > start_offset])
