from replicad.follower.validate import validate_fetched
from replicad.records.batch import Compression, scan_batches
from tools.logdata.batches import legacy_message_set, producer_batch


def _batches(*specs):
    return b"".join(
        producer_batch(base, [b"v%d" % i for i in range(n)], codec=Compression.LZ4)
        for base, n in specs
    )


def test_whole_batches_are_kept_byte_for_byte():
    data = _batches((0, 3), (3, 2))
    got = validate_fetched(data, fetch_offset=0, log_is_empty=True)
    assert bytes(got.data) == data
    assert [b.base_offset for b in got.batches] == [0, 3]
    assert got.next_fetch_offset == 5
    assert got.corrupt is None and not got.partial_dropped and got.restart_at is None


def test_trailing_partial_batch_is_dropped_not_an_error():
    data = _batches((0, 3), (3, 2))
    cut = data[:-7]
    got = validate_fetched(cut, fetch_offset=0, log_is_empty=True)
    assert [b.base_offset for b in got.batches] == [0]
    assert got.partial_dropped and got.corrupt is None
    assert got.next_fetch_offset == 3


def test_crc_mismatch_keeps_only_the_valid_prefix():
    first = _batches((0, 3))
    second = bytearray(_batches((3, 2)))
    second[-1] ^= 0xFF  # a byte inside the CRC-covered records
    got = validate_fetched(first + bytes(second), fetch_offset=0, log_is_empty=True)
    assert bytes(got.data) == first
    assert got.corrupt is not None and "crc" in got.corrupt.lower()
    assert got.next_fetch_offset == 3


def test_batch_below_fetch_offset_is_skipped_and_positions_rebased():
    data = _batches((0, 3), (3, 2))
    got = validate_fetched(data, fetch_offset=3, log_is_empty=False)
    assert [b.base_offset for b in got.batches] == [3]
    assert got.batches[0].position == 0
    assert bytes(got.data) == _batches((3, 2))
    # the rebased header describes the bytes it points at
    assert scan_batches(got.data).batches[0].base_offset == 3


def test_gap_is_allowed():
    data = _batches((0, 3), (10, 2))
    got = validate_fetched(data, fetch_offset=0, log_is_empty=True)
    assert got.next_fetch_offset == 12 and got.corrupt is None


def test_overlap_is_corruption():
    data = _batches((0, 3), (2, 2))
    got = validate_fetched(data, fetch_offset=0, log_is_empty=True)
    assert [b.base_offset for b in got.batches] == [0]
    assert got.corrupt is not None and "overlaps" in got.corrupt


def test_straddling_first_batch_restarts_an_empty_log():
    data = _batches((5, 5))
    got = validate_fetched(data, fetch_offset=7, log_is_empty=True)
    assert got.restart_at == 5 and got.next_fetch_offset == 10


def test_straddling_first_batch_on_a_non_empty_log_is_another_lineage():
    got = validate_fetched(_batches((5, 5), (10, 2)), fetch_offset=7, log_is_empty=False)
    assert got.is_empty and got.foreign == (5, 9) and got.corrupt is None
    assert got.next_fetch_offset == 7


def test_an_overlap_after_a_kept_batch_is_still_corruption():
    got = validate_fetched(_batches((7, 2), (8, 2)), fetch_offset=7, log_is_empty=False)
    assert [b.base_offset for b in got.batches] == [7]
    assert got.foreign is None and "overlaps" in got.corrupt


def test_empty_and_null_records():
    for records in (None, b""):
        got = validate_fetched(records, fetch_offset=4, log_is_empty=False)
        assert got.is_empty and got.next_fetch_offset == 4 and got.corrupt is None


# -- rule 8: epochs ----------------------------------------------------------------------


def _epoch_batches(*specs):
    """(base offset, record count, partition leader epoch) each."""
    return b"".join(
        producer_batch(base, [b"v%d" % i for i in range(n)], leader_epoch=epoch)
        for base, n, epoch in specs
    )


def test_nothing_from_a_batch_above_the_known_leader_epoch_on_is_kept():
    data = _epoch_batches((10, 2, 3), (12, 2, 3), (14, 2, 4), (16, 2, 3))
    got = validate_fetched(data, fetch_offset=10, log_is_empty=False, max_epoch=3)
    assert [b.base_offset for b in got.batches] == [10, 12]
    assert got.epoch_stop == (14, 4) and got.next_fetch_offset == 14
    everything = validate_fetched(data, fetch_offset=10, log_is_empty=False, max_epoch=4)
    assert len(everything.batches) == 4 and everything.epoch_stop is None
    # No known epoch (old metadata): nothing to compare with.
    unknown = validate_fetched(data, fetch_offset=10, log_is_empty=False, max_epoch=-1)
    assert len(unknown.batches) == 4 and unknown.epoch_stop is None


def test_a_new_epoch_at_our_log_end_is_kept_only_when_not_asked_to_match():
    data = _epoch_batches((12, 2, 3), (14, 2, 3))
    got = validate_fetched(data, fetch_offset=12, log_is_empty=False, max_epoch=5, end_epoch=1)
    assert got.is_empty and got.epoch_stop == (12, 3) and got.next_fetch_offset == 12
    same = validate_fetched(data, fetch_offset=12, log_is_empty=False, max_epoch=5, end_epoch=3)
    assert len(same.batches) == 2 and same.epoch_stop is None
    # Only the batch at our end must match: a later epoch change is the leader's own log.
    mixed = _epoch_batches((12, 2, 3), (14, 2, 4))
    later = validate_fetched(mixed, fetch_offset=12, log_is_empty=False, max_epoch=5, end_epoch=3)
    assert len(later.batches) == 2 and later.epoch_stop is None


def test_a_batch_of_another_epoch_holding_our_log_end_is_checked_before_it_is_another_lineage():
    data = _epoch_batches((5, 5, 3))
    got = validate_fetched(data, fetch_offset=7, log_is_empty=False, end_epoch=1)
    assert got.is_empty and got.epoch_stop == (5, 3) and got.foreign is None
    same_epoch = validate_fetched(data, fetch_offset=7, log_is_empty=False, end_epoch=3)
    assert same_epoch.foreign == (5, 9) and same_epoch.epoch_stop is None


def test_batches_without_a_leader_epoch_pass_rule_8():
    legacy = legacy_message_set(7, [b"a", b"b"], magic=1)
    got = validate_fetched(legacy, fetch_offset=7, log_is_empty=False, max_epoch=0, end_epoch=2)
    assert len(got.batches) == 2 and got.epoch_stop is None
