"""Kafka's own DumpLogSegments (from the Kafka jars of the test harness) reads what we wrote.

The segments hold real producer bytes (kafka-python's record builders) with every codec,
leader epoch changes, legacy magic 0/1 message sets, rolls, a truncation and a restart.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.records.batch import Compression, scan_batches
from replicad.records.records import decode_batch
from replicad.types import TopicPartition
from tools.logdata.batches import batch_stream, legacy_message_set
from tools.peers.kafka import run_kafka_class
from tools.peers.process import PeerNotInstalledError

pytestmark = pytest.mark.kafka

# Kafka 4 moved the tool from kafka.tools (Scala) to org.apache.kafka.tools (Java).
DUMP_LOG_SEGMENTS = "org.apache.kafka.tools.DumpLogSegments"
CONFIG = LogConfig(segment_bytes=32 * 1024, index_interval_bytes=2048, segment_index_bytes=4096)


def _legacy_then_v2() -> list[bytes]:
    out = []
    offset = 0
    for magic, codec in [
        (0, Compression.NONE),
        (0, Compression.GZIP),
        (1, Compression.NONE),
        (1, Compression.GZIP),
        (1, Compression.SNAPPY),
        (1, Compression.LZ4),
    ]:
        values = [f"legacy {magic} {codec.name} {i} ".encode() * 8 for i in range(6)]
        out.append(legacy_message_set(offset, values, magic=magic, codec=codec))
        offset += len(values)
    out += batch_stream(5, 30, first_offset=offset)
    return out


def _write(data_dir: Path) -> dict[TopicPartition, int]:
    """Writes three partitions; returns the number of records each holds."""
    streams = {
        TopicPartition("codecs", 0): batch_stream(21, 150, epoch_every=40),
        TopicPartition("legacy", 0): _legacy_then_v2(),
        TopicPartition("truncated", 0): batch_stream(22, 90, epoch_every=30),
    }
    manager = LogManager.open(data_dir, CONFIG, now_ms=0)
    for tp, batches in streams.items():
        log = manager.get_or_create(tp)
        for raw in batches:
            log.append(raw, scan_batches(raw).batches, now_ms=0)
    truncated = manager.partitions()[TopicPartition("truncated", 0)]
    truncated.truncate_to(
        scan_batches(streams[TopicPartition("truncated", 0)][55]).batches[0].base_offset
    )
    manager.close()
    # A restart, more appends into the reopened active segments, then a clean close.
    manager = LogManager.open(data_dir, CONFIG, now_ms=0)
    more = batch_stream(23, 20, first_offset=truncated.log_end_offset)
    for raw in more:
        manager.partitions()[TopicPartition("truncated", 0)].append(
            raw, scan_batches(raw).batches, now_ms=0
        )
    manager.close()
    counts = {}
    for tp in streams:
        records = 0
        for path in sorted((data_dir / f"{tp.topic}-{tp.partition}").glob("*.log")):
            data = path.read_bytes()
            records += sum(len(decode_batch(data, h).records) for h in scan_batches(data).batches)
        counts[tp] = records
    return counts


def _dump(*args: str) -> tuple[str, str]:
    try:
        result = run_kafka_class(DUMP_LOG_SEGMENTS, *args)
    except PeerNotInstalledError as exc:
        pytest.skip(str(exc))
    return result.stdout, result.stderr


def test_kafka_reads_our_segments_and_indexes(tmp_path: Path) -> None:
    counts = _write(tmp_path)
    logs = sorted(str(p) for p in tmp_path.glob("*/*.log"))
    indexes = sorted(str(p) for p in tmp_path.glob("*/*.index"))
    timeindexes = sorted(str(p) for p in tmp_path.glob("*/*.timeindex"))
    assert len(logs) > 6 and len(indexes) == len(logs) == len(timeindexes)

    out, err = _dump("--deep-iteration", "--files", ",".join(logs))
    assert "isvalid: false" not in out
    assert "invalid bytes" not in out
    assert "Exception" not in err and "Error" not in err
    # Kafka 4's tool starts each file's check from offset -1, so it reports the first record
    # of every segment not based at 0 as "-1 is followed by <base>"; any other pair would be
    # a real hole or step back inside a segment.
    reports = re.findall(r"Non-consecutive offsets in (\S+)\n((?:  .*\n?)+)", err)
    assert sum(p.count("is followed by") for _, p in reports) == err.count("is followed by")
    for file_name, pairs in reports:
        base = int(Path(file_name).name[:20])
        assert pairs.strip().splitlines() == [f"-1 is followed by {base}"], (file_name, pairs)
    assert len(re.findall(r"^\| offset: ", out, re.M)) == sum(counts.values())
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        assert f"compresscodec: {codec}" in out
    assert "magic: 0" in out and "magic: 1" in out and "magic: 2" in out
    assert "partitionLeaderEpoch: 3" in out

    out, err = _dump("--verify-index-only", "--files", ",".join(indexes + timeindexes))
    assert err.strip() == "", err
    assert "Mismatches" not in out and "mismatch" not in out

    out, err = _dump("--index-sanity-check", "--files", ",".join(indexes + timeindexes))
    assert err.strip() == "", err
    checked = len(re.findall(r"passed sanity check", out)) + len(re.findall(r" is empty\.", out))
    assert checked >= len(indexes)
    assert out.count("passed sanity check") >= len(timeindexes)
