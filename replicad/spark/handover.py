"""Offsets out of a Spark Structured Streaming checkpoint, to hand a query over to the replica.

A query that read the source cluster with Spark's Kafka source checkpointed, per
micro-batch, its end offsets as `{"topic": {"0": 42}}` -- the JSON the `replicad` source
takes as `startingOffsets`, and our offsets are the source's. Rules:
- `offsets/<N>` holds batch N's end offsets (line 1 "v1", line 2 the batch's metadata,
  then one line per source, in the order the query's sources were planned; "-" for a
  source without an offset yet). `commits/<N>` exists once batch N is done.
- The hand-over point is the last committed batch. With Spark's file sink (`sink`), its
  `_spark_metadata` log may already hold the next batch (written just before the commit,
  when the query stopped between the two): then that batch's offsets are the point, so no
  record is written twice.
- Only a local checkpoint (a directory) is read; copy a remote one first.
"""

from __future__ import annotations

import json
from pathlib import Path

from replicad.errors import ReplicadError


class CheckpointError(ReplicadError):
    """The checkpoint has no offsets to hand over."""


def _batch_ids(directory: Path) -> list[int]:
    """Batch ids of a metadata log directory (`7`, `9.compact`), ascending."""
    if not directory.is_dir():
        return []
    ids = []
    for path in directory.iterdir():
        stem = path.name.removesuffix(".compact")
        if stem.isdigit():
            ids.append(int(stem))
    return sorted(ids)


def handover_batch(checkpoint: Path, sink: Path | None = None) -> int:
    committed = _batch_ids(checkpoint / "commits")
    batch = committed[-1] if committed else None
    if sink is not None:
        written = _batch_ids(sink / "_spark_metadata")
        if written and (batch is None or written[-1] > batch):
            batch = written[-1]
    if batch is None:
        raise CheckpointError(
            f"{checkpoint}: no micro-batch was committed; start the replica's query from "
            f"the same startingOffsets as the first one"
        )
    return batch


def offsets_from_checkpoint(checkpoint: Path, *, sink: Path | None = None, source: int = 0) -> dict:
    """The end offsets of the hand-over batch of source number `source`."""
    if not (checkpoint / "offsets").is_dir():
        raise CheckpointError(f"{checkpoint}: not a Spark streaming checkpoint (no offsets/)")
    batch = handover_batch(checkpoint, sink)
    path = checkpoint / "offsets" / str(batch)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: batch {batch} has no offsets") from None
    sources = lines[2:]
    if source >= len(sources):
        raise CheckpointError(f"{path}: {len(sources)} source(s), no source number {source}")
    text = sources[source].strip()
    if text == "-":
        raise CheckpointError(f"{path}: source number {source} has no offsets yet")
    try:
        offsets = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: source number {source}: not JSON ({exc})") from exc
    if not isinstance(offsets, dict) or not all(isinstance(v, dict) for v in offsets.values()):
        raise CheckpointError(
            f'{path}: source number {source} is not a Kafka source ({{"topic": {{"0": 42}}}})'
        )
    return offsets
