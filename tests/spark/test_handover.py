"""Offsets out of a Spark checkpoint (handover.py), and a Spark job failed over from Spark's
Kafka source on a real broker to the replica a real `replicad run` keeps: the union of both
sinks holds every record exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest

from replicad.spark.handover import CheckpointError, offsets_from_checkpoint
from tools.replica import replicad_cli


def write_checkpoint(root: Path, offsets: dict[int, str], commits: list[int]) -> Path:
    """A checkpoint laid out as Spark writes one (offsets/N, commits/N, their .crc files)."""
    for batch, source in offsets.items():
        (root / "offsets").mkdir(parents=True, exist_ok=True)
        metadata = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}'
        (root / "offsets" / str(batch)).write_text(f"v1\n{metadata}\n{source}")
        (root / "offsets" / f".{batch}.crc").write_bytes(b"crc")
    for batch in commits:
        (root / "commits").mkdir(parents=True, exist_ok=True)
        (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    return root


def test_the_last_committed_batch_is_handed_over(tmp_path):
    checkpoint = write_checkpoint(
        tmp_path / "c",
        {0: '{"t":{"0":10,"1":5}}', 1: '{"t":{"0":20,"1":9}}', 2: '{"t":{"0":30,"1":9}}'},
        commits=[0, 1],
    )
    assert offsets_from_checkpoint(checkpoint) == {"t": {"0": 20, "1": 9}}
    # The file sink already holds batch 2 (the query stopped before committing it).
    sink = tmp_path / "out"
    (sink / "_spark_metadata").mkdir(parents=True)
    (sink / "_spark_metadata" / "2").write_text("v1\n")
    assert offsets_from_checkpoint(checkpoint, sink=sink) == {"t": {"0": 30, "1": 9}}


def test_what_cannot_be_handed_over_is_said(tmp_path):
    with pytest.raises(CheckpointError, match="not a Spark streaming checkpoint"):
        offsets_from_checkpoint(tmp_path)
    planned = write_checkpoint(tmp_path / "p", {0: '{"t":{"0":1}}'}, commits=[])
    with pytest.raises(CheckpointError, match="no micro-batch was committed"):
        offsets_from_checkpoint(planned)
    other = write_checkpoint(tmp_path / "o", {0: '{"logOffset":3}'}, commits=[0])
    with pytest.raises(CheckpointError, match="not a Kafka source"):
        offsets_from_checkpoint(other)
    with pytest.raises(CheckpointError, match="no source number 1"):
        offsets_from_checkpoint(other, source=1)
    result = replicad_cli("pipeline", "offsets-from-checkpoint", str(planned))
    assert result.returncode == 1
    assert result.stderr.strip().endswith("(exit 1)") and len(result.stderr.splitlines()) == 1
