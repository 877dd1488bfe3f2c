"""The mirror's progress file: round trip, atomic replacement, unreadable files named."""

from __future__ import annotations

import pytest

from replicad.mirror import progress_store
from replicad.mirror.offset_map import SyncPoint
from replicad.mirror.partition_mirror import Progress
from replicad.types import TopicPartition


def test_round_trip(tmp_path) -> None:
    parts = {
        TopicPartition("a", 0): Progress(120, 118, (SyncPoint(0, 0), SyncPoint(50, 49))),
        TopicPartition("b", 3): Progress(0, None, ()),
    }
    assert progress_store.load(tmp_path) is None
    progress_store.save(tmp_path, "cluster-x", parts)
    stored = progress_store.load(tmp_path)
    assert stored is not None
    assert stored.destination_cluster == "cluster-x"
    assert dict(stored.partitions) == parts
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    "text", ["{", '{"version": 99, "partitions": []}', '{"version": 1, "partitions": [{}]}']
)
def test_unreadable_progress_is_an_error_naming_the_file(tmp_path, text) -> None:
    progress_store.progress_path(tmp_path).write_text(text)
    with pytest.raises(progress_store.MirrorProgressError, match=r"mirror-progress\.json"):
        progress_store.load(tmp_path)
