from replicad.follower.validate import validate_fetched
from replicad.records.batch import Compression, scan_batches
from tools.logdata.batches import producer_batch


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
