"""The mirror's progress on disk: per partition, the source position, the destination's
expected log end and the offset map's sync points, in `<data_dir>/mirror-progress.json`.

Rules:
- Written whole and atomically (write, fsync, rename, fsync the directory), so a crash
  leaves the previous or the new file, never a mix. The shell calls `save` on a worker
  thread: the event loop never waits on the disk.
- The file names the destination cluster's id; progress made against another cluster is
  not used (a different destination starts from scratch, and the log says so).
- Progress may lag the destination (a crash between a produce and a save): the partition
  mirror's `reconcile` closes that gap from the destination's log end, exactly.
- A file that does not parse is a `MirrorProgressError` naming the file: progress is never
  guessed (starting over would duplicate everything already mirrored).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from replicad.errors import ReplicadError
from replicad.log.checkpoint import read_text, write_atomically
from replicad.mirror.offset_map import SyncPoint
from replicad.mirror.partition_mirror import Progress
from replicad.types import TopicPartition

PROGRESS_FILE = "mirror-progress.json"
FORMAT_VERSION = 1

T = TypeVar("T")


class MirrorProgressError(ReplicadError):
    """The progress file exists but cannot be read."""


@dataclass(frozen=True, slots=True)
class StoredProgress:
    destination_cluster: str | None
    partitions: Mapping[TopicPartition, Progress]


def progress_path(data_dir: Path) -> Path:
    return Path(data_dir) / PROGRESS_FILE


def encode_document(body: Mapping[str, Any], *, version: int) -> str:
    """A state file's text (this one's and group_store's): compact JSON, its format version
    first, one line."""
    return json.dumps({"version": version, **body}, separators=(",", ":")) + "\n"


def decode_document(
    text: str,
    *,
    version: int,
    source: str,
    what: str,
    parse: Callable[[Any], T],
    older: Sequence[int] = (),
) -> T:
    """`parse` of the document; anything missing, mistyped or of another format version
    (than `version`, or one of the `older` ones `parse` still reads) is a
    `MirrorProgressError` naming `source`: state is never guessed."""
    try:
        body = json.loads(text)
        if body.get("version") != version and body.get("version") not in older:
            raise ValueError(f"unknown format version {body.get('version')!r}")
        return parse(body)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise MirrorProgressError(f"{source}: {what} unreadable: {exc}") from None


def encode(destination_cluster: str | None, partitions: Mapping[TopicPartition, Progress]) -> str:
    return encode_document(
        {
            "destination_cluster": destination_cluster,
            "partitions": [
                {
                    "topic": tp.topic,
                    "partition": tp.partition,
                    "position": p.position,
                    "dest_next": p.dest_next,
                    "sync_points": [[s.source, s.dest] for s in p.points],
                }
                for tp, p in sorted(partitions.items())
            ],
        },
        version=FORMAT_VERSION,
    )


def decode(text: str, *, source: str) -> StoredProgress:
    return decode_document(
        text, version=FORMAT_VERSION, source=source, what="mirror progress", parse=_parse
    )


def _parse(body: Any) -> StoredProgress:
    partitions: dict[TopicPartition, Progress] = {}
    for item in body["partitions"]:
        tp = TopicPartition(str(item["topic"]), int(item["partition"]))
        dest_next = item["dest_next"]
        partitions[tp] = Progress(
            position=int(item["position"]),
            dest_next=None if dest_next is None else int(dest_next),
            points=tuple(SyncPoint(int(s), int(d)) for s, d in item["sync_points"]),
        )
    cluster = body.get("destination_cluster")
    return StoredProgress(None if cluster is None else str(cluster), partitions)


def load(data_dir: Path) -> StoredProgress | None:
    """The stored progress, or None when there is none yet."""
    path = progress_path(data_dir)
    text = read_text(path)
    return None if text is None else decode(text, source=str(path))


def save(
    data_dir: Path,
    destination_cluster: str | None,
    partitions: Mapping[TopicPartition, Progress],
) -> None:
    """Blocking (fsync): run it off the event loop."""
    write_atomically(progress_path(data_dir), encode(destination_cluster, partitions))
