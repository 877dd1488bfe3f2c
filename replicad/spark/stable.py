"""The last stable offset of a partition of the replica, for read_committed streams.

Rules (Kafka's: the LSO is the first offset of the earliest transaction still open):
- Only batch headers are read (no record is decoded), from the stream's position to the high
  watermark: a transactional data batch of producer P opens P's transaction unless one is
  open; P's COMMIT or ABORT marker (a transactional control batch) closes it. Markers and
  batches at or past the high watermark do not count: the source could still truncate them.
- The result is the base offset of the earliest transaction open at the high watermark, or
  the high watermark; never below the stream's position (a transaction begun before it has
  none of its batches left to read).
"""

from __future__ import annotations

from replicad.spark.files import FileOpener, Purpose
from replicad.spark.plan import Split
from replicad.spark.walk import Walk


def last_stable_offset(
    splits: list[Split], start: int, high_watermark: int, opener: FileOpener
) -> int:
    """`splits`: the partition's splits of [start, high_watermark), in offset order."""
    open_since: dict[int, int] = {}
    for split in splits:
        with opener.open(split.path, Purpose.LOOKAHEAD) as fd:
            for chunk in Walk(fd, split.start_position, split.end_position, verify_crc=False):
                for header in chunk.batches:
                    if header.base_offset >= high_watermark:
                        break
                    if not header.is_transactional:
                        continue
                    if header.is_control:
                        open_since.pop(header.producer_id, None)
                    else:
                        open_since.setdefault(header.producer_id, header.base_offset)
    return max(start, min(open_since.values(), default=high_watermark))
