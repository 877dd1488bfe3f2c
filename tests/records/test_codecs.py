"""Decompression against the compressors real clients use (kafka-python's codec module)."""

from __future__ import annotations

import cramjam
import pytest
from kafka import codec as kcodec

from replicad.errors import CorruptRecordError
from replicad.records.batch import Compression
from replicad.records.codecs import (
    LZ4_STEP,
    XERIAL_MAGIC,
    compress,
    decompress,
    decompress_at_most,
    new_lz4_context,
    scratch_buffer,
)

PAYLOAD = b"".join(f"record {i} of a compressible payload; ".encode() for i in range(5000))


@pytest.mark.parametrize(
    ("codec", "compress"),
    [
        (Compression.GZIP, kcodec.gzip_encode),
        (Compression.SNAPPY, kcodec.snappy_encode),  # xerial framing, as Kafka's Java client
        (Compression.SNAPPY, lambda d: kcodec.snappy_encode(d, xerial_compatible=False)),
        (Compression.SNAPPY, lambda d: bytes(cramjam.snappy.compress(d))),  # framing format
        (Compression.LZ4, kcodec.lz4_encode),
        (Compression.ZSTD, kcodec.zstd_encode),
    ],
    ids=["gzip", "snappy-xerial", "snappy-raw", "snappy-framed", "lz4", "zstd"],
)
def test_round_trip(codec: Compression, compress) -> None:  # type: ignore[no-untyped-def]
    compressed = compress(PAYLOAD)
    assert len(compressed) < len(PAYLOAD)
    assert decompress(codec, compressed) == PAYLOAD
    assert decompress(codec, memoryview(compressed)) == PAYLOAD


def test_xerial_with_several_blocks() -> None:
    compressed = kcodec.snappy_encode(PAYLOAD, xerial_blocksize=1024)
    assert decompress(Compression.SNAPPY, compressed) == PAYLOAD


@pytest.mark.parametrize(
    "codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD, Compression.SNAPPY]
)
def test_garbage_raises_corrupt_record_error(codec: Compression) -> None:
    with pytest.raises(CorruptRecordError, match=codec.name):
        decompress(codec, b"\x82SNAPPY\x00" + b"\x00" * 8 + b"\x00\x00\x00\x10garbage")


@pytest.mark.parametrize("codec", list(Compression))
def test_compress_round_trips_in_kafkas_framing(codec: Compression) -> None:
    data = b"".join(b"record %d " % i for i in range(20_000))  # several snappy blocks
    packed = compress(codec, data)
    assert decompress(codec, packed) == data
    if codec is Compression.SNAPPY:
        assert packed.startswith(XERIAL_MAGIC)
    if codec is Compression.LZ4:
        flags = packed[4]
        assert flags & 0x20  # independent blocks: all Kafka's reader takes


ENCODERS = [
    (Compression.NONE, bytes),
    (Compression.GZIP, kcodec.gzip_encode),
    (Compression.SNAPPY, lambda d: kcodec.snappy_encode(d, xerial_blocksize=1024)),
    (Compression.SNAPPY, lambda d: kcodec.snappy_encode(d, xerial_compatible=False)),
    (Compression.SNAPPY, lambda d: bytes(cramjam.snappy.compress(d))),
    (Compression.LZ4, kcodec.lz4_encode),
    (Compression.ZSTD, kcodec.zstd_encode),
]
ENCODER_IDS = ["none", "gzip", "snappy-xerial", "snappy-raw", "snappy-framed", "lz4", "zstd"]


@pytest.mark.parametrize(("codec", "encode"), ENCODERS, ids=ENCODER_IDS)
def test_decompress_at_most_stops_at_its_limit(codec: Compression, encode) -> None:  # type: ignore[no-untyped-def]
    """What fits is returned whole; what does not is None, after at most limit + 1 bytes
    were written (a bomb of 64 MiB of zeros is refused with a 64 KiB buffer)."""
    scratch = bytearray(len(PAYLOAD) + 1)
    packed = encode(PAYLOAD)
    assert decompress_at_most(codec, packed, len(PAYLOAD), scratch) == PAYLOAD
    assert decompress_at_most(codec, packed, len(PAYLOAD) - 1, scratch) is None
    if codec is not Compression.NONE:
        bomb = encode(bytes(64 << 20))
        assert decompress_at_most(codec, bomb, 64 << 10, bytearray((64 << 10) + 1)) is None
        assert decompress_at_most(codec, b"garbage" * 9, 1 << 10, scratch) is None
        # One LZ4 context reused: a refusal or garbage leaves it ready for the next frame.
        reader = new_lz4_context()
        for _ in range(2):
            assert decompress_at_most(codec, packed, len(PAYLOAD) - 1, scratch, reader) is None
            assert decompress_at_most(codec, b"garbage" * 9, 1 << 10, scratch, reader) is None
            assert decompress_at_most(codec, packed, len(PAYLOAD), scratch, reader) == PAYLOAD


@pytest.mark.parametrize(("codec", "encode"), ENCODERS, ids=ENCODER_IDS)
def test_decompress_at_most_makes_its_own_scratch_when_given_none(  # type: ignore[no-untyped-def]
    codec: Compression, encode
) -> None:
    packed = encode(PAYLOAD)
    assert decompress_at_most(codec, packed, len(PAYLOAD)) == PAYLOAD
    assert decompress_at_most(codec, packed, len(PAYLOAD) - 1, scratch_buffer(1 << 20)) is None
    assert decompress_at_most(codec, packed, 1 << 20, scratch_buffer(1 << 20)) == PAYLOAD


def test_an_lz4_frame_is_read_in_steps_and_a_cut_one_is_refused() -> None:
    """LZ4 output is asked for LZ4_STEP bytes at a time (python-lz4 allocates all of
    `max_length` per call): a frame of several steps comes back whole, one cut before its
    end mark is None, and the context is ready for the next frame after either."""
    big = PAYLOAD * 3
    assert len(big) > 4 * LZ4_STEP
    packed = kcodec.lz4_encode(big)
    reader = new_lz4_context()
    for _ in range(2):
        assert decompress_at_most(Compression.LZ4, packed, 1 << 20, None, reader) == big
        assert decompress_at_most(Compression.LZ4, packed[:-9], 1 << 20, None, reader) is None
        assert decompress_at_most(Compression.LZ4, packed, len(big) - 1, None, reader) is None
        assert decompress_at_most(Compression.LZ4, packed, len(big), None, reader) == big


def test_an_lz4_frame_in_a_view_of_a_larger_buffer_decompresses_and_the_context_serves_on() -> None:
    """The mirror passes a view of the local log's bytes: only the frame's bytes are read;
    a truncated frame, garbage and a frame over the limit in between leave the context
    ready for the next frame."""
    packed = kcodec.lz4_encode(PAYLOAD)
    buffer = b"before" + packed + b"after"
    view = memoryview(buffer)[6 : 6 + len(packed)]
    context = new_lz4_context()
    for bad in (packed[: len(packed) // 2], b"garbage" * 9, packed):
        limit = len(PAYLOAD) - 1 if bad is packed else 1 << 20
        assert decompress_at_most(Compression.LZ4, bad, limit, None, context) is None
        assert decompress_at_most(Compression.LZ4, view, len(PAYLOAD), None, context) == PAYLOAD
