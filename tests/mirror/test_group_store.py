"""The group sync's saved state: round trip, unreadable files named."""

from __future__ import annotations

import pytest

from replicad.mirror import group_store
from replicad.mirror.group_store import StoredGroups
from replicad.mirror.group_sync import FailedOver, Sent, Written
from replicad.mirror.progress_store import MirrorProgressError
from replicad.types import TopicPartition

DEST = TopicPartition("dr.orders", 2)


def test_round_trip(tmp_path) -> None:
    stored = StoredGroups(
        "cluster-x prefix=dr.",
        {"billing": FailedOver(1_700_000_000_000, "2 member(s) at the destination")},
        {"orders": 1_700_000_000_500},
        {"app": {DEST: Written(40, 44), TopicPartition("dr.a-b.c_d", 10): Written(0, 3)}},
        {"app": {DEST: Sent(60, 66, 40)}, "new": {DEST: Sent(5, 5, None)}},
    )
    assert group_store.load(tmp_path) is None
    group_store.save(tmp_path, stored)
    assert group_store.load(tmp_path) == stored
    assert not list(tmp_path.glob("*.tmp"))


def test_a_file_of_the_first_format_is_read_without_offsets(tmp_path) -> None:
    group_store.groups_path(tmp_path).write_text(
        '{"version":1,"destination_cluster":"c","failed_over":{},"promoted":{"orders":5}}'
    )
    assert group_store.load(tmp_path) == StoredGroups("c", {}, {"orders": 5}, {}, {})


@pytest.mark.parametrize(
    "text",
    [
        "{",
        '{"version": 3}',
        '{"version": 1, "failed_over": {"g": {}}, "promoted": {}}',
        '{"version": 2, "failed_over": {}, "promoted": {}, "written": {"g": {"t": {"x": [1, 2]}}}}',
        '{"version": 2, "failed_over": {}, "promoted": {}, "sent": {"g": {"t": {"0": [1]}}}}',
    ],
)
def test_an_unreadable_file_is_an_error_naming_it(tmp_path, text) -> None:
    group_store.groups_path(tmp_path).write_text(text)
    with pytest.raises(MirrorProgressError, match=r"mirror-groups\.json"):
        group_store.load(tmp_path)
