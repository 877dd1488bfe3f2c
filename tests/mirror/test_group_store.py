"""The group sync's saved state: round trip, unreadable files named."""

from __future__ import annotations

import pytest

from replicad.mirror import group_store
from replicad.mirror.group_store import StoredGroups
from replicad.mirror.group_sync import FailedOver
from replicad.mirror.progress_store import MirrorProgressError


def test_round_trip(tmp_path) -> None:
    stored = StoredGroups(
        "cluster-x prefix=dr.",
        {"billing": FailedOver(1_700_000_000_000, "2 member(s) at the destination")},
        {"orders": 1_700_000_000_500},
    )
    assert group_store.load(tmp_path) is None
    group_store.save(tmp_path, stored)
    assert group_store.load(tmp_path) == stored
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    "text",
    ["{", '{"version": 2}', '{"version": 1, "failed_over": {"g": {}}, "promoted": {}}'],
)
def test_an_unreadable_file_is_an_error_naming_it(tmp_path, text) -> None:
    group_store.groups_path(tmp_path).write_text(text)
    with pytest.raises(MirrorProgressError, match=r"mirror-groups\.json"):
        group_store.load(tmp_path)
