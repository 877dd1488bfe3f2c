"""What the group sync and the cut-over must remember across restarts, in
`<data_dir>/mirror-groups.json`, beside the mirror's progress: the groups that failed over
at the destination (never synced again unless resumed) and the topics promoted (never
mirrored again).

Rules:
- Written whole and atomically (progress_store's way: write, fsync, rename, fsync the
  directory), on a worker thread, whenever either set changes.
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
from replicad.mirror.group_sync import FailedOver
from replicad.mirror.progress_store import decode_document, encode_document

GROUPS_FILE = "mirror-groups.json"
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class StoredGroups:
    destination_cluster: str | None
    failed_over: Mapping[str, FailedOver] = field(default_factory=dict)
    # Promoted source topic -> when (wall ms).
    promoted: Mapping[str, int] = field(default_factory=dict)


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
        },
        version=FORMAT_VERSION,
    )


def decode(text: str, *, source: str) -> StoredGroups:
    return decode_document(
        text, version=FORMAT_VERSION, source=source, what="mirror groups state", parse=_parse
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
    )


def load(data_dir: Path) -> StoredGroups | None:
    path = groups_path(data_dir)
    text = read_text(path)
    return None if text is None else decode(text, source=str(path))


def save(data_dir: Path, stored: StoredGroups) -> None:
    """Blocking (fsync): run it off the event loop."""
    write_atomically(groups_path(data_dir), encode(stored))
