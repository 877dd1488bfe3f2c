from replicad.session.metadata import (
    FINAL_EPOCH,
    INITIAL,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    LEGACY,
    MAX_EPOCH,
    FetchMetadata,
    is_full_epoch,
    next_epoch,
)


def test_constants_are_kafkas() -> None:
    assert (INVALID_SESSION_ID, INITIAL_EPOCH, FINAL_EPOCH) == (0, 0, -1)
    assert MAX_EPOCH == 2_147_483_647


def test_next_epoch_counts_up() -> None:
    assert next_epoch(INITIAL_EPOCH) == 1
    assert next_epoch(1) == 2
    assert next_epoch(41) == 42


def test_next_epoch_wraps_to_one_not_zero() -> None:
    assert next_epoch(MAX_EPOCH) == 1
    assert next_epoch(MAX_EPOCH - 1) == MAX_EPOCH


def test_final_epoch_stays_final() -> None:
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH
    assert next_epoch(-7) == FINAL_EPOCH


def test_full_exactly_for_initial_and_final_epochs() -> None:
    assert is_full_epoch(INITIAL_EPOCH)
    assert is_full_epoch(FINAL_EPOCH)
    assert not is_full_epoch(1)
    assert not is_full_epoch(MAX_EPOCH)
    assert INITIAL.is_full and LEGACY.is_full
    assert not FetchMetadata(5, 3).is_full


def test_transitions() -> None:
    meta = FetchMetadata(77, 9)
    assert meta.next_incremental() == FetchMetadata(77, 10)
    assert meta.close_existing() == FetchMetadata(77, FINAL_EPOCH)
    assert meta.close_existing_attempt_new() == FetchMetadata(77, INITIAL_EPOCH)
    assert FetchMetadata.new_incremental(77) == FetchMetadata(77, 1)
    assert FetchMetadata(77, MAX_EPOCH).next_incremental() == FetchMetadata(77, 1)


def test_str_names_special_values() -> None:
    assert str(INITIAL) == "(session_id=INVALID, epoch=INITIAL)"
    assert str(FetchMetadata(3, FINAL_EPOCH)) == "(session_id=3, epoch=FINAL)"
    assert str(FetchMetadata(3, 8)) == "(session_id=3, epoch=8)"
