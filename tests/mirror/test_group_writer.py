"""The admin OffsetCommit the group sync sends (group_writer.py), in every version it may
choose; against Kafka it is exercised by test_group_sync_shell.py."""

from __future__ import annotations

import pytest

from replicad.mirror.group_sync import Commit
from replicad.mirror.group_writer import _request
from replicad.protocol.apis import CLIENT_VERSIONS, ApiKey
from replicad.protocol.codec import encode_entities
from replicad.types import TopicPartition

COMMITS = {
    TopicPartition("dr.orders", 1): Commit(40, "meta", TopicPartition("orders", 1), 42, False),
    TopicPartition("dr.orders", 0): Commit(7, None, TopicPartition("orders", 0), 7, True),
}


@pytest.mark.parametrize(
    "version",
    range(CLIENT_VERSIONS[ApiKey.OFFSET_COMMIT].min, CLIENT_VERSIONS[ApiKey.OFFSET_COMMIT].max + 1),
)
def test_an_admin_commit_with_the_metadata_kept_and_no_leader_epoch(version: int) -> None:
    request = _request(version, "billing", COMMITS)
    assert request.group_id == "billing"
    assert request.generation_id_or_member_epoch == -1 and request.member_id == ""
    (topic,) = request.topics
    assert topic.name == "dr.orders"
    parts = topic.partitions
    written = [(p.partition_index, p.committed_offset, p.committed_metadata) for p in parts]
    assert written == [(0, 7, None), (1, 40, "meta")]
    if hasattr(topic.partitions[0], "committed_leader_epoch"):
        assert {p.committed_leader_epoch for p in topic.partitions} == {-1}
    assert encode_entities(request)
