from replicad.follower.partition_phase import PartitionPhase
from replicad.follower.partition_state import PartitionState
from replicad.types import TopicPartition


def _state(**kw):
    return PartitionState(
        tp=TopicPartition("t", 0),
        topic_id=None,
        leader_id=1,
        leader_epoch=0,
        phase=PartitionPhase.FETCHING,
        **kw,
    )


def test_delay_blocks_fetching_until_it_expires():
    s = _state()
    s.delay(1000, 500, "not_leader_or_follower")
    assert not s.fetchable(1499) and s.fetchable(1500)
    assert s.last_error == "not_leader_or_follower" and s.error_count == 1


def test_only_fetching_phase_is_fetchable():
    for phase in PartitionPhase:
        s = _state()
        s.phase = phase
        assert s.fetchable(0) == (phase is PartitionPhase.FETCHING)


def test_lag():
    s = _state(fetch_offset=40, high_watermark=100)
    assert s.lag == 60
    s.fetch_offset = 100
    assert s.lag == 0
    assert _state().lag == 0  # unknown high watermark
