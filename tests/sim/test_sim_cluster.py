"""The simulated cluster answers as a Kafka leader answers a consumer: up to the high
watermark, KIP-74 limits, DivergingEpoch after an unclean election, fencing, and the
KIP-227 session model (the one replicad serve uses)."""

from __future__ import annotations

import random

from kio.schema.errors import ErrorCode

from replicad.follower.fetch_response import NO_DIVERGING_EPOCH
from replicad.protocol.fetch_request import FetchRequest, RequestedPartition
from replicad.types import TopicPartition
from tools.sim.cluster import SimCluster

TP = TopicPartition("t", 0)


def _cluster(replication: int = 1) -> SimCluster:
    cluster = SimCluster(random.Random(1))
    cluster.create_topic("t", 1, replication)
    return cluster


def _spec(cluster, offset, *, epoch=0, last_epoch=-1, max_bytes=1 << 20, session=(0, -1)):
    return FetchRequest(
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=session[0],
        session_epoch=session[1],
        partitions=(
            RequestedPartition.of(
                TP,
                offset,
                max_bytes,
                topic_id=cluster.topics["t"],
                log_start_offset=0,
                current_leader_epoch=epoch,
                last_fetched_epoch=last_epoch,
            ),
        ),
    )


def _fetch(cluster, spec, version=13):
    node = cluster.partitions[TP].leader
    response = cluster.fetch(node, version, spec, 0)
    return response, response.responses[0].partitions[0] if response.responses else None


def test_a_consumer_reads_up_to_the_high_watermark_only():
    cluster = _cluster(replication=2)
    cluster.produce(TP, 3)
    p = cluster.partitions[TP]
    assert p.high_watermark == 0  # the other replica has not copied it
    _, answer = _fetch(cluster, _spec(cluster, 0))
    assert answer.error_code == 0 and len(answer.records) == 0
    for node in p.replicas:
        cluster.replicate(TP, node)
    _, answer = _fetch(cluster, _spec(cluster, 0))
    assert p.high_watermark == 3 and bytes(answer.records) == p.log.batches[0].data


def test_the_byte_limit_cuts_the_last_batch_but_one_batch_always_comes():
    cluster = _cluster()
    for _ in range(3):
        cluster.produce(TP, 2)
    size = len(cluster.partitions[TP].log.batches[0].data)
    _, answer = _fetch(cluster, _spec(cluster, 0, max_bytes=size + 10))
    assert len(answer.records) == size + 10  # one whole batch and 10 bytes of the next
    _, answer = _fetch(cluster, _spec(cluster, 0, max_bytes=1))
    assert len(answer.records) == size  # KIP-74


def test_an_unclean_election_makes_the_leader_say_where_we_diverged():
    cluster = _cluster(replication=2)
    cluster.produce(TP, 2)
    for node in cluster.partitions[TP].replicas:
        cluster.replicate(TP, node)
    cluster.produce(TP, 2)  # only on the leader
    old = cluster.partitions[TP].leader
    other = next(n for n in cluster.partitions[TP].replicas if n != old)
    cluster.lag(TP, other)
    for node in cluster.partitions[TP].replicas:
        cluster.replicate(TP, node, upto=2)
    assert cluster.elect(TP, unclean=True)
    cluster.produce(TP, 5)
    _, answer = _fetch(cluster, _spec(cluster, 4, epoch=1, last_epoch=0))
    assert answer.diverging_epoch.epoch == 0 and answer.diverging_epoch.end_offset == 2
    _, answer = _fetch(cluster, _spec(cluster, 4, epoch=0, last_epoch=0))
    assert answer.error_code == ErrorCode.fenced_leader_epoch
    response = cluster.fetch(old, 13, _spec(cluster, 0, epoch=1), 0)
    assert response.responses[0].partitions[0].error_code == ErrorCode.not_leader_or_follower


def test_out_of_range_below_the_log_start_and_past_the_end():
    cluster = _cluster()
    for _ in range(3):
        cluster.produce(TP, 2)
    cluster.retain(TP, 2)
    for offset in (0, 99):
        _, answer = _fetch(cluster, _spec(cluster, offset))
        assert answer.error_code == ErrorCode.offset_out_of_range
    _, answer = _fetch(cluster, _spec(cluster, 4))
    assert answer.error_code == 0 and answer.diverging_epoch == NO_DIVERGING_EPOCH


def test_sessions_follow_kip_227_and_an_eviction_loses_them():
    cluster = _cluster()
    response, _ = _fetch(cluster, _spec(cluster, 0, session=(0, 0)))
    session = response.session_id
    assert session > 0
    response, _ = _fetch(cluster, _spec(cluster, 0, session=(session, 1)))
    assert response.error_code == 0
    response, _ = _fetch(cluster, _spec(cluster, 0, session=(session, 1)))
    assert response.error_code == 71  # INVALID_FETCH_SESSION_EPOCH: epoch 1 again
    cluster.evict_sessions(cluster.partitions[TP].leader)
    response, _ = _fetch(cluster, _spec(cluster, 0, session=(session, 2)))
    assert response.error_code == 70  # FETCH_SESSION_ID_NOT_FOUND


def test_delete_records_starts_every_replica_inside_a_batch_and_it_is_still_served():
    cluster = _cluster(replication=2)
    cluster.produce(TP, 4)  # offsets 0..3, one batch
    for node in cluster.partitions[TP].replicas:
        cluster.replicate(TP, node)
    assert not cluster.delete_records(TP, 5)  # past the high watermark: refused
    assert cluster.delete_records(TP, 2)
    p = cluster.partitions[TP]
    assert all(r.log_start == 2 and len(r.batches) == 1 for r in p.replicas.values())
    _, answer = _fetch(cluster, _spec(cluster, 2))
    assert answer.log_start_offset == 2 and bytes(answer.records) == p.log.batches[0].data
    _, answer = _fetch(cluster, _spec(cluster, 1))
    assert answer.error_code == ErrorCode.offset_out_of_range
