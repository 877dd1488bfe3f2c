from replicad.follower.truncation import decide_truncation
from replicad.log.epoch import EpochEndOffset

# Our log: epoch 1 covers [0, 50), epoch 3 covers [50, 100).
OURS = {1: EpochEndOffset(1, 50), 2: EpochEndOffset(1, 50), 3: EpochEndOffset(3, 100)}


def local_end_for(epoch: int) -> EpochEndOffset:
    if epoch < 1:
        return EpochEndOffset(-1, -1)
    return OURS.get(epoch, EpochEndOffset(-1, -1))


def decide(epoch: int, end: int, *, leo: int = 100, hw: int = 40):
    return decide_truncation(
        EpochEndOffset(epoch, end),
        local_end_for=local_end_for,
        log_end_offset=leo,
        high_watermark=hw,
    )


def test_leader_knows_nothing_of_the_epoch_truncates_to_high_watermark():
    d = decide(3, -1)
    assert (d.offset, d.complete, d.rule) == (40, True, 1)


def test_undefined_leader_epoch_truncates_to_its_end():
    d = decide(-1, 70)
    assert (d.offset, d.complete, d.rule) == (70, True, 2)


def test_no_local_epoch_at_or_below_the_leaders():
    d = decide(0, 30)
    assert (d.offset, d.complete, d.rule) == (30, True, 3)


def test_different_local_epoch_is_an_intermediate_step():
    d = decide(2, 75)  # the leader had epoch 2 up to 75; we never had epoch 2
    assert (d.offset, d.complete, d.rule) == (50, False, 4)


def test_same_epoch_takes_the_smallest_end():
    assert decide(1, 45).offset == 45  # the leader's epoch 1 ended earlier
    assert decide(1, 80).offset == 50  # ours ended earlier
    d = decide(3, 120)
    assert (d.offset, d.complete, d.rule) == (100, True, 5)  # never beyond our end


def test_never_moves_the_log_end_forward():
    for epoch, end in [(3, 500), (-1, 500), (0, 500)]:
        assert decide(epoch, end, leo=100).offset <= 100
