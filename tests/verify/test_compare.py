"""The comparison core of `verify --against-source` (replicad/verify/compare.py), step by step."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from replicad.errors import LocalProtocolError
from replicad.records.batch import V2_CRC_START, scan_batches
from replicad.types import TopicPartition
from replicad.verify.compare import (
    Batch,
    Event,
    Kind,
    OffsetRange,
    PartitionCheck,
    Phase,
    ReplicaSlice,
    SourceAnswer,
    next_phase,
)
from tools.logdata.batches import producer_batch

TP = TopicPartition("t", 0)
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23
_CRC_AT = 17


def batch(data: bytes) -> Batch:
    (header,) = scan_batches(memoryview(data)).batches
    return Batch.from_header(header, data)


def log(count: int = 6, per_batch: int = 3, first: int = 0, tag: bytes = b"v") -> list[Batch]:
    return [
        batch(producer_batch(first + i * per_batch, [tag + b"%d" % j for j in range(per_batch)]))
        for i in range(count)
    ]


def end_of(batches: list[Batch]) -> int:
    return batches[-1].last_offset + 1


def cleaned(original: Batch, keep: int) -> Batch:
    """The source's log cleaner's version of `original`: `keep` records, same offsets."""
    data = bytearray(producer_batch(original.base_offset, [b"kept%d" % i for i in range(keep)]))
    _LAST_OFFSET_DELTA.pack_into(
        data, _LAST_OFFSET_DELTA_AT, original.last_offset - original.base_offset
    )
    struct.pack_into(">I", data, _CRC_AT, crc32c(bytes(data[V2_CRC_START:])))
    return batch(bytes(data))


def flipped(original: Batch) -> Batch:
    data = bytearray(original.data)
    data[-2] ^= 0x10
    return Batch(
        original.base_offset,
        original.last_offset,
        original.record_count,
        original.attributes,
        bytes(data),
    )


def answer(batches: list[Batch], high_watermark: int, log_start: int = 0) -> SourceAnswer:
    return SourceAnswer(high_watermark, log_start, batches)


def overlapping(replica: list[Batch], theirs: list[Batch], low: int) -> ReplicaSlice:
    """What the shell hands over: the replica's batches over the answer's offsets."""
    high = theirs[-1].last_offset if theirs else -1
    return ReplicaSlice([b for b in replica if b.last_offset >= low and b.base_offset <= high])


def walk(check: PartitionCheck, replica: list[Batch], source: list[Batch], hw: int, step: int):
    """Answer `check` from `source`, `step` batches an answer, until it is done."""
    for _ in range(100):
        offset = check.next_fetch()
        if offset is None:
            return check.result
        theirs = [b for b in source if b.last_offset >= offset][:step]
        check.on_answer(answer(theirs, hw), overlapping(replica, theirs, offset))
    raise AssertionError("the walk did not end")


def walk_all(replica: list[Batch], source: list[Batch], end: int):
    """A check of [0, end) walked through `source`'s answers (high watermark `end`), ten
    batches an answer."""
    return walk(PartitionCheck(TP, OffsetRange(0, end)), replica, source, end, step=10)


def test_an_identical_replica_is_verified_to_its_end_across_answers():
    replica = log()
    check = PartitionCheck(TP, OffsetRange(0, end_of(replica)))
    result = walk(check, replica, list(replica), end_of(replica), step=2)
    assert result.clean and result.mismatches == []
    assert result.verified_to == end_of(replica)
    assert result.batches_compared == len(replica)
    assert result.bytes_compared == sum(len(b.data) for b in replica)
    assert check.phase is Phase.DONE and check.next_fetch() is None


def test_a_flipped_byte_is_a_mismatch_at_its_batch_and_the_walk_goes_on():
    source = log()
    replica = list(source)
    replica[3] = flipped(source[3])
    result = walk_all(replica, source, end_of(source))
    (m,) = result.mismatches
    assert (m.offset, m.last_offset, m.kind) == (9, 11, Kind.DIFFERENT_BYTES)
    assert "fails its CRC" in m.detail
    assert result.verified_to == end_of(source)
    assert not result.clean


def test_two_valid_batches_that_differ_are_a_mismatch_without_blaming_the_disk():
    source = log()
    replica = log(tag=b"w")
    result = walk_all(replica, source, end_of(source))
    assert [m.kind for m in result.mismatches] == [Kind.DIFFERENT_BYTES] * len(source)
    assert all("CRC" not in m.detail for m in result.mismatches)


def test_a_batch_only_the_source_has_is_missing_in_the_replica():
    source = log()
    replica = source[:2] + source[3:]
    result = walk_all(replica, source, end_of(source))
    assert [(m.offset, m.kind) for m in result.mismatches] == [(6, Kind.MISSING_IN_REPLICA)]
    assert result.batches_compared == len(replica)


def test_a_batch_only_the_replica_has_is_missing_at_the_source():
    replica = log()
    source = replica[:2] + replica[3:]
    result = walk_all(replica, source, end_of(replica))
    assert [(m.offset, m.kind) for m in result.mismatches] == [(6, Kind.MISSING_AT_SOURCE)]


def test_on_a_compacted_topic_what_the_cleaner_rewrote_or_dropped_is_not_a_mismatch():
    replica = log()
    source = [replica[0], cleaned(replica[1], keep=1), *replica[3:]]
    check = PartitionCheck(TP, OffsetRange(0, end_of(replica)), compacted=True)
    result = walk(check, replica, source, end_of(replica), step=10)
    assert result.mismatches == [] and result.clean
    # Batch 1 rewritten (3..5), batch 2 dropped (6..8): one range, said.
    assert result.rewritten_at_source == [OffsetRange(3, 9)]
    assert result.batches_compared == len(replica) - 2


def test_a_rewritten_batch_on_a_topic_that_is_not_compacted_is_a_mismatch():
    replica = log()
    source = [replica[0], cleaned(replica[1], keep=1), *replica[2:]]
    result = walk_all(replica, source, end_of(replica))
    assert [(m.offset, m.kind) for m in result.mismatches] == [(3, Kind.DIFFERENT_BYTES)]


def test_retention_below_the_cursor_is_gone_at_the_source_and_the_walk_resumes_there():
    replica = log()
    check = PartitionCheck(TP, OffsetRange(0, end_of(replica)))
    # The log start inside batch 2 (6..8): Kafka still serves that batch whole.
    check.on_out_of_range(log_start=7, high_watermark=end_of(replica))
    assert check.result.gone_at_source == [OffsetRange(0, 7)]
    assert check.next_fetch() == 7
    result = walk(check, replica, replica[2:], end_of(replica), step=10)
    assert result.clean and result.mismatches == []
    assert result.batches_compared == len(replica) - 2
    assert result.verified_to == end_of(replica)


def test_offsets_past_the_sources_high_watermark_are_not_at_the_source_yet():
    replica = log()
    check = PartitionCheck(TP, OffsetRange(0, end_of(replica)))
    hw = replica[4].base_offset
    result = walk(check, replica, replica[:4], hw, step=10)
    assert result.clean
    assert result.not_at_source == OffsetRange(hw, end_of(replica))
    assert result.verified_to == hw


def test_out_of_range_above_the_source_end_is_not_at_the_source():
    replica = log()
    check = PartitionCheck(TP, OffsetRange(0, end_of(replica)), start=9)
    check.on_out_of_range(log_start=0, high_watermark=6)
    assert check.result.not_at_source == OffsetRange(9, end_of(replica))
    assert check.phase is Phase.DONE and check.result.clean


def test_an_answer_that_moves_nothing_ends_the_walk_unverified():
    replica = log()
    check = PartitionCheck(TP, OffsetRange(0, end_of(replica)))
    check.on_answer(answer([], high_watermark=end_of(replica)), ReplicaSlice(()))
    assert check.phase is Phase.DONE
    assert check.result.unverified is not None and "moved nothing" in check.result.unverified
    assert not check.result.clean


def test_a_replica_unreadable_past_an_offset_is_a_mismatch_there():
    replica = log()
    check = PartitionCheck(TP, OffsetRange(0, end_of(replica)))
    readable = replica[:2]
    check.on_answer(
        answer(replica, end_of(replica)),
        ReplicaSlice(readable, unreadable_at=6, unreadable_detail="x.log: bad length"),
    )
    assert [(m.offset, m.kind) for m in check.result.mismatches] == [(6, Kind.REPLICA_UNREADABLE)]
    assert check.result.batches_compared == 2
    assert check.phase is Phase.DONE and check.result.unverified is not None


def test_a_sample_compares_only_its_batches_in_offset_order():
    replica = log()
    targets = [replica[4].base_offset, replica[1].base_offset]
    check = PartitionCheck(TP, OffsetRange(0, end_of(replica)), targets=targets)
    assert check.result.sample == (3, 12)
    asked = []
    while (offset := check.next_fetch()) is not None:
        asked.append(offset)
        theirs = [b for b in replica if b.last_offset >= offset]
        ours = ReplicaSlice([b for b in replica if b.base_offset == offset])
        check.on_answer(answer(theirs, end_of(replica)), ours)
    assert asked == [3, 12]
    assert check.result.clean and check.result.batches_compared == 2


def test_a_resumed_walk_starts_at_the_saved_offset():
    replica = log()
    check = PartitionCheck(TP, OffsetRange(0, end_of(replica)), start=9)
    assert check.next_fetch() == 9
    result = walk(check, replica, replica, end_of(replica), step=10)
    assert result.batches_compared == len(replica) - 3 and result.clean


def test_an_empty_replica_is_done_at_once():
    check = PartitionCheck(TP, OffsetRange(0, 0))
    assert check.next_fetch() is None and check.result.clean


def test_a_move_not_in_the_table_is_our_bug():
    with pytest.raises(LocalProtocolError):
        next_phase(Phase.DONE, Event.ANSWERED)
    check = PartitionCheck(TP, OffsetRange(0, 0))
    with pytest.raises(LocalProtocolError):
        check.on_answer(answer([], 0), ReplicaSlice(()))
