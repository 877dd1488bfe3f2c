"""Which of a source group's committed offsets `serve`'s coordinator may take (sans-I/O):
`replicad run`, with a `serve:` section, syncs the source's groups into the replica so that
an application can fail over with the same group id and resume where it committed.

Rules:
- Offsets are taken as they are: the replica keeps the source's offsets, so a committed
  offset means the same record on both (no translation, unlike MirrorMaker 2).
- Only partitions the replica holds; the others are left out (counted as not replicated).
- An offset beyond what a consumer can read on the replica (its high watermark: the
  replica is behind the source) is held there, and counted: a consumer resuming from it
  waits for the data instead of being sent back by auto.offset.reset. The next sync moves
  it on once the replica has caught up.
- Whether the group may take them at all (never once it is the replica's own) is the
  coordinator's rule (`GroupCoordinator.sync_offsets`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from replicad.types import OffsetAndMetadata, TopicPartition


@dataclass(frozen=True, slots=True)
class GroupSyncPlan:
    offsets: Mapping[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)
    # Offsets held at the replica's end (the source's was beyond it).
    held: tuple[TopicPartition, ...] = ()
    # Partitions the replica does not hold.
    not_replicated: tuple[TopicPartition, ...] = ()


def plan_group_sync(
    source: Mapping[TopicPartition, OffsetAndMetadata], readable_end: Mapping[TopicPartition, int]
) -> GroupSyncPlan:
    """The offsets to hand the coordinator for one group; `readable_end` is each replicated
    partition's high watermark on the replica."""
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    held: list[TopicPartition] = []
    missing: list[TopicPartition] = []
    for tp, committed in source.items():
        end = readable_end.get(tp)
        if end is None:
            missing.append(tp)
            continue
        if committed.offset > end:
            held.append(tp)
            # The epoch named the record at the source's offset, not the one at ours.
            offsets[tp] = OffsetAndMetadata(end, -1, committed.metadata)
        else:
            offsets[tp] = committed
    return GroupSyncPlan(offsets, tuple(held), tuple(missing))
