"""Names of things in a data directory, exactly as Apache Kafka names them.

    <data_dir>/.lock                               the one-process lock (flock)
    <data_dir>/replication-offset-checkpoint       high watermarks
    <data_dir>/recovery-point-offset-checkpoint    offsets below which everything was fsynced
    <data_dir>/log-start-offset-checkpoint         first offset kept per partition
    <data_dir>/<topic>-<partition>/<base offset, 20 digits>.log|.index|.timeindex
    <data_dir>/<topic>-<partition>/leader-epoch-checkpoint
    <data_dir>/<topic>-<partition>/partition.metadata   (version + topic id, KIP-516)

Files a crash can leave behind and recovery removes: `*.tmp` (a checkpoint being written),
`*.swap`, `*.cleaned`, `*.deleted` (Kafka's compaction and deletion steps; replicad never
creates these but removes them like Kafka's loader does when it finds them), and index files
whose `.log` is gone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from replicad.types import TopicPartition

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
PRODUCER_SNAPSHOT_SUFFIX = ".snapshot"
TEMP_SUFFIX = ".tmp"
SWAP_SUFFIX = ".swap"
CLEANED_SUFFIX = ".cleaned"
DELETED_SUFFIX = ".deleted"
STRAY_SUFFIXES = (TEMP_SUFFIX, SWAP_SUFFIX, CLEANED_SUFFIX, DELETED_SUFFIX)
SEGMENT_INDEX_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)

LOCK_FILE = ".lock"
# Written by LogManager.close() after everything is flushed and checkpointed; its presence
# at open means the active segments need no scan (Kafka's `.kafka_cleanshutdown`, renamed
# so that no Kafka broker mistakes our directory for its own).
CLEAN_SHUTDOWN_FILE = ".replicad_cleanshutdown"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
PARTITION_METADATA = "partition.metadata"

OFFSET_DIGITS = 20
_SEGMENT_FILE = re.compile(r"^(\d{20})(\.[a-z]+)$")
# Directories of partitions being deleted or moved (`-delete`, `-future`) do not match.
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:0{OFFSET_DIGITS}d}{suffix}"


def partition_dir_name(tp: TopicPartition) -> str:
    return f"{tp.topic}-{tp.partition}"


def parse_partition_dir(name: str) -> TopicPartition | None:
    """The partition a directory name stands for, or None for anything else."""
    match = _PARTITION_DIR.match(name)
    if match is None:
        return None
    return TopicPartition(match.group(1), int(match.group(2)))


@dataclass(frozen=True, slots=True)
class PartitionListing:
    """What a partition directory holds, sorted out (no I/O: built from file names)."""

    segments: list[int]  # base offsets of the .log files, ascending
    missing_index: list[int]  # .log files without their .index
    missing_time_index: list[int]
    strays: list[str] = field(default_factory=list)  # file names to remove


def classify_partition_files(names: list[str]) -> PartitionListing:
    logs: set[int] = set()
    indexes: dict[str, set[int]] = {INDEX_SUFFIX: set(), TIME_INDEX_SUFFIX: set()}
    other_index_files: list[tuple[int, str]] = []
    strays: list[str] = []
    for name in names:
        if name.endswith(STRAY_SUFFIXES):
            strays.append(name)
            continue
        match = _SEGMENT_FILE.match(name)
        if match is None:
            continue
        base, suffix = int(match.group(1)), match.group(2)
        if suffix == LOG_SUFFIX:
            logs.add(base)
        elif suffix in indexes:
            indexes[suffix].add(base)
            other_index_files.append((base, name))
        elif suffix == TXN_INDEX_SUFFIX:
            other_index_files.append((base, name))
    strays.extend(name for base, name in other_index_files if base not in logs)
    segments = sorted(logs)
    return PartitionListing(
        segments=segments,
        missing_index=[b for b in segments if b not in indexes[INDEX_SUFFIX]],
        missing_time_index=[b for b in segments if b not in indexes[TIME_INDEX_SUFFIX]],
        strays=sorted(strays),
    )
