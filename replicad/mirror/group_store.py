"""What the group sync and the cut-over must remember across restarts, in
`<data_dir>/mirror-groups.json`, beside the mirror's progress: the groups that failed over
at the destination (never synced again unless resumed), the topics promoted (never
mirrored again), and the offsets the sync wrote (and sent, answer unknown) per group and
destination partition, by which a group that failed over while replicad was stopped is
recognised at the next start. A group gone at the source and at the destination is
forgotten (group_sync.py), so the file holds the groups that exist on one side at least.

Rules:
- Written whole and atomically (progress_store's way: write, fsync, rename, fsync the
  directory), on a worker thread, whenever any of it changes.
- Format 1 (no offsets) is still read: it remembers no offsets, as before.
- Like the progress, it names the destination (cluster id and topic prefix): what failed
  over at another destination says nothing about this one, and is not used (logged).
- A file that does not parse is a `MirrorProgressError` naming the file: forgetting a
  failover would write into a group an application now owns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replicad.log.checkpoint import read_text, write_atomically
from replicad.mirror.group_sync import FailedOver, Sent, SentOffsets, Written, WrittenOffsets
from replicad.mirror.progress_store import decode_document, encode_document
from replicad.types import TopicPartition

GROUPS_FILE = "mirror-groups.json"
FORMAT_VERSION = 2
# Read as well: written before the offsets were kept.
OLDER_VERSIONS = (1,)


@dataclass(frozen=True, slots=True)
class StoredGroups:
    destination_cluster: str | None
    failed_over: Mapping[str, FailedOver] = field(default_factory=dict)
    # Promoted source topic -> when (wall ms).
    promoted: Mapping[str, int] = field(default_factory=dict)
    written: WrittenOffsets = field(default_factory=dict)
    sent: SentOffsets = field(default_factory=dict)


def groups_path(data_dir: Path) -> Path:
    return Path(data_dir) / GROUPS_FILE


def encode(stored: StoredGroups) -> str:
    return encode_document(
        {
            "destination_cluster": stored.destination_cluster,
            "failed_over": {
                g: {"since_ms": f.since_ms, "reason": f.reason}
                for g, f in sorted(stored.failed_over.items())
            },
            "promoted": dict(sorted(stored.promoted.items())),
            "written": _encode_offsets(
                {
                    g: {tp: [w.offset, w.source_offset] for tp, w in o.items()}
                    for g, o in stored.written.items()
                }
            ),
            "sent": _encode_offsets(
                {
                    g: {tp: [s.offset, s.source_offset, s.before] for tp, s in o.items()}
                    for g, o in stored.sent.items()
                }
            ),
        },
        version=FORMAT_VERSION,
    )


def decode(text: str, *, source: str) -> StoredGroups:
    return decode_document(
        text,
        version=FORMAT_VERSION,
        older=OLDER_VERSIONS,
        source=source,
        what="mirror groups state",
        parse=_parse,
    )


def _parse(body: Any) -> StoredGroups:
    cluster = body.get("destination_cluster")
    return StoredGroups(
        None if cluster is None else str(cluster),
        {
            str(g): FailedOver(int(f["since_ms"]), str(f["reason"]))
            for g, f in body["failed_over"].items()
        },
        {str(t): int(at) for t, at in body["promoted"].items()},
        {
            g: {tp: Written(int(w[0]), int(w[1])) for tp, w in o.items()}
            for g, o in _decode_offsets(body.get("written", {})).items()
        },
        {
            g: {
                tp: Sent(int(s[0]), int(s[1]), None if s[2] is None else int(s[2]))
                for tp, s in o.items()
            }
            for g, o in _decode_offsets(body.get("sent", {})).items()
        },
    )


Cells = Mapping[str, Mapping[TopicPartition, list[int | None]]]


def _encode_offsets(offsets: Cells) -> dict[str, dict[str, dict[str, list[int | None]]]]:
    # group -> topic -> partition -> [destination offset, source offset(, before)]
    out: dict[str, dict[str, dict[str, list[int | None]]]] = {}
    for group, per_tp in sorted(offsets.items()):
        topics: dict[str, dict[str, list[int | None]]] = {}
        for tp, cells in sorted(per_tp.items()):
            topics.setdefault(tp.topic, {})[str(tp.partition)] = cells
        if topics:
            out[group] = topics
    return out


def _decode_offsets(body: Mapping[str, Mapping[str, Mapping[str, list]]]) -> Cells:
    return {
        str(group): {
            TopicPartition(str(topic), int(p)): list(cells)
            for topic, parts in topics.items()
            for p, cells in parts.items()
        }
        for group, topics in body.items()
    }


def load(data_dir: Path) -> StoredGroups | None:
    path = groups_path(data_dir)
    text = read_text(path)
    return None if text is None else decode(text, source=str(path))


def save(data_dir: Path, stored: StoredGroups) -> None:
    """Blocking (fsync): run it off the event loop."""
    write_atomically(groups_path(data_dir), encode(stored))
