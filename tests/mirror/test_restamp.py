"""Re-stamping: producer fields and CRC rewritten, the compressed records untouched."""

from __future__ import annotations

import pytest

from replicad.mirror.restamp import ProducerStamp, mirrorable, next_sequence, restamp
from replicad.records.batch import RECORD_BATCH_OVERHEAD, Compression, scan_batches
from replicad.records.records import MAX_SEQUENCE, decode_batch
from tools.logdata.batches import producer_batch

STAMP = ProducerStamp(producer_id=4242, producer_epoch=3)


@pytest.mark.parametrize("codec", list(Compression))
def test_restamped_batch_keeps_its_records_and_codec_and_passes_its_crc(codec) -> None:
    source = producer_batch(
        1234,
        [b"value-%d" % i * 20 for i in range(50)],
        codec=codec,
        keys=[None if i % 7 == 0 else b"k%d" % i for i in range(50)],
        headers=[("h", b"x"), ("n", None)],
        leader_epoch=9,
        producer_id=77,
        producer_epoch=1,
        base_sequence=500,
    )
    out = restamp(source, STAMP, 12)
    scan = scan_batches(out, verify_crc=True)
    assert scan.error is None and len(scan.batches) == 1
    h = scan.batches[0]
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (4242, 3, 12)
    assert (h.base_offset, h.partition_leader_epoch) == (0, -1)
    assert h.compression == codec
    # The records section is byte for byte the stored one: nothing was re-compressed.
    assert out[RECORD_BATCH_OVERHEAD:] == source[RECORD_BATCH_OVERHEAD:]
    src_header = scan_batches(source).batches[0]
    want = decode_batch(source, src_header).records
    got = decode_batch(out, h).records
    assert [(r.key, r.value, r.headers, r.timestamp) for r in got] == [
        (r.key, r.value, r.headers, r.timestamp) for r in want
    ]


def test_transactional_flag_is_cleared() -> None:
    source = bytearray(producer_batch(0, [b"a"], producer_id=5, producer_epoch=0, base_sequence=0))
    source[22] |= 0x10  # attributes' low byte: transactional
    out = restamp(bytes(source), STAMP, 0)
    header = scan_batches(out, verify_crc=True).batches[0]
    assert not header.is_transactional


def test_what_cannot_be_produced_is_named() -> None:
    header = scan_batches(producer_batch(10, [b"a", b"b", b"c"])).batches[0]
    assert mirrorable(header) is None
    legacy = header._replace(magic=1)
    assert "magic 1" in mirrorable(legacy).reason
    control = header._replace(attributes=0x20)
    assert "control" in mirrorable(control).reason


def thinned_batch(codec: int) -> bytes:
    """Three records at offset deltas 0, 2 and 5 of six, as compaction leaves a batch."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for delta in (0, 2, 5):
        builder.append(delta, 1_700_000_000_000 + delta, b"k%d" % delta, b"v%d" % delta * 50, [])
    data = bytearray(builder.build())
    header = scan_batches(data).batches[0]
    assert header.last_offset_delta == 5 and header.compression == codec
    return bytes(data)


@pytest.mark.parametrize("codec", list(Compression))
def test_a_batch_thinned_by_compaction_claims_as_many_offsets_as_records(codec) -> None:
    source = thinned_batch(codec)
    out = restamp(source, STAMP, 0)
    header = scan_batches(out, verify_crc=True).batches[0]
    assert (header.record_count, header.last_offset_delta) == (3, 2)
    records = decode_batch(out, header).records
    assert [(r.key, r.value) for r in records] == [(b"k%d" % d, b"v%d" % d * 50) for d in (0, 2, 5)]
    # Renumbered: the records' offsets follow each other; the codec stays.
    assert [r.offset for r in records] == [0, 1, 2]
    assert header.compression == codec


def test_sequences_wrap_at_int32_max() -> None:
    assert next_sequence(5, 10) == 15
    assert next_sequence(MAX_SEQUENCE - 1, 3) == 1


def test_a_record_rewrites_the_same_alone_as_among_others() -> None:
    """rewrite_records' one-record path (a batch of one record, the linger.ms 0 case) writes
    what its loop over many records writes for the same record: offset delta renumbered,
    timestamp delta moved, length rewritten, the rest copied; a record that does not fill
    its section is refused the same way."""
    import random

    from replicad.mirror.restamp import rewrite_records
    from replicad.records.varint import varint as zigzag

    rng = random.Random(32)
    for _ in range(2000):
        body = (
            bytes([rng.randrange(256)])
            + zigzag(rng.choice([0, 1, -1, 63, -64, 64, rng.randrange(-(10**6), 10**6)]))
            + zigzag(rng.choice([0, 1, 70]))
            + rng.randbytes(rng.choice([0, 5, 60, 1030, 9000]))
        )
        record = zigzag(len(body)) + body
        other = zigzag(3) + b"\x00\x00\x02"  # a second record: offset delta 1
        index, shift = rng.choice([0, 1, 64, 10**6]), rng.choice([0, 5, -5, 10**7])
        alone, among = bytearray(), bytearray()
        next_index = rewrite_records(
            memoryview(record), 1, alone, first_index=index, shift_ms=shift
        )
        assert next_index == index + 1
        rewrite_records(memoryview(record + other), 2, among, first_index=index, shift_ms=shift)
        assert among.startswith(alone) and len(among) > len(alone)
        for bad in (record + b"\x00", record[:-1]):
            with pytest.raises(ValueError):
                rewrite_records(memoryview(bad), 1, bytearray(), first_index=index)
