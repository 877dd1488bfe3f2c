import uuid
from types import SimpleNamespace as NS

from kio.schema.errors import ErrorCode

from replicad.protocol.metadata import ClusterMetadata, TopicSelection
from replicad.types import TopicPartition

TID = uuid.uuid4()


def _response():
    part = lambda i, leader, err=0: NS(  # noqa: E731
        partition_index=i, leader_id=leader, leader_epoch=3, error_code=err
    )
    return NS(
        cluster_id="c1",
        brokers=[NS(node_id=1, host="h1", port=9092), NS(node_id=2, host="h2", port=9093)],
        topics=[
            NS(
                name="orders",
                topic_id=TID,
                is_internal=False,
                error_code=0,
                partitions=[part(0, 1), part(1, 2)],
            ),
            NS(
                name="__consumer_offsets",
                topic_id=uuid.uuid4(),
                is_internal=True,
                error_code=0,
                partitions=[part(0, 1)],
            ),
            NS(
                name="gone",
                topic_id=uuid.UUID(int=0),
                is_internal=False,
                error_code=3,
                partitions=[],
            ),
        ],
    )


def test_from_response():
    cluster = ClusterMetadata.from_response(_response())
    assert cluster.brokers[2].port == 9093
    assert cluster.topic_id("orders") == TID
    assert cluster.topic_id("gone") is None  # the null uuid means "no id"
    leader = cluster.leader_of(TopicPartition("orders", 1))
    assert leader is not None and leader.leader_id == 2 and leader.leader_epoch == 3
    assert cluster.leader_of(TopicPartition("orders", 9)) is None


def test_list_selection_names_missing_topics():
    cluster = ClusterMetadata.from_response(_response())
    sel = TopicSelection(include=("orders", "gone", "nope"))
    assert sel.metadata_topics() == ["orders", "gone", "nope"]
    assert list(sel.partitions(cluster)) == [
        TopicPartition("orders", 0),
        TopicPartition("orders", 1),
    ]
    assert sel.missing(cluster) == ["gone", "nope"]


def test_regex_selection_skips_internal_topics():
    cluster = ClusterMetadata.from_response(_response())
    sel = TopicSelection(regex=".*o.*")
    assert sel.metadata_topics() is None
    assert {tp.topic for tp in sel.partitions(cluster)} == {"orders"}
    assert sel.missing(cluster) == []
    assert cluster.topics["gone"].error == ErrorCode.unknown_topic_or_partition
