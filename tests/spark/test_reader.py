"""Reading splits on an executor, without Spark: synthetic partitions written by replicad's
log store, and real data (a real producer -> Kafka -> replicad) against a real consumer."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from replicad.errors import CorruptRecordError
from replicad.records.batch import RECORD_BATCH_OVERHEAD, Compression, scan_batches
from replicad.records.records import ControlType, decode_batch
from replicad.spark.catalog import Planner
from replicad.spark.files import FileOpener, Purpose, read_trace
from replicad.spark.options import parse_options
from replicad.spark.reader import PROBLEM_CORRUPT, PROBLEM_TORN_TAIL, read_batches, read_records
from replicad.spark.schema import BATCHES_ARROW, RECORDS_ARROW
from replicad.types import TopicPartition

TP = TopicPartition("t", 0)
P, Q, R = 101, 202, 303


def read(data_dir: Path, **options: str) -> list[dict]:
    parsed = parse_options({"path": str(data_dir), **options})
    rows = []
    for split in Planner(parsed).plan():
        reader = read_batches if parsed.view.value == "batches" else read_records
        for batch in reader(split, parsed, FileOpener(parsed.trace_file_opens)):
            assert batch.schema == (BATCHES_ARROW if reader is read_batches else RECORDS_ARROW)
            rows += batch.to_pylist()
    return rows


def written(directory: Path) -> list[tuple]:
    """(offset, timestamp ms, key, value, headers) of every data record, by our own decoder."""
    found = []
    for path in sorted(directory.glob("*.log")):
        data = path.read_bytes()
        for header in scan_batches(data).batches:
            if not header.is_control:
                for r in decode_batch(data, header).records:
                    found.append((r.offset, r.timestamp, r.key, r.value, list(r.headers)))
    return found


def as_written(row: dict) -> tuple:
    millis = int(row["timestamp"].timestamp() * 1000) if row["timestamp"] else -1
    headers = [(h["key"], h["value"]) for h in row["headers"]]
    return (row["offset"], millis, row["key"], row["value"], headers)


@pytest.fixture
def codecs_dir(tmp_path, make_batches, write_partition):
    batches = [
        make_batches.data(i * 7, 7, codec=Compression(i % 5), value_size=300) for i in range(60)
    ]
    write_partition(tmp_path / "data", TP, batches, segment_bytes=8 * 1024)
    return tmp_path / "data"


def test_every_codec_reads_back_as_written(codecs_dir):
    rows = read(codecs_dir, maxSplitBytes="2048")
    expected = written(codecs_dir / "t-0")
    assert len(rows) == 420
    assert [(r["topic"], r["partition"]) for r in rows] == [("t", 0)] * 420
    for row, want in zip(sorted(rows, key=lambda r: r["offset"]), expected, strict=True):
        rebuilt = (*as_written(row)[:4], [])
        assert rebuilt == (*want[:4], [])
    assert {r["timestamp_type"] for r in rows} == {0}
    assert {r["leader_epoch"] for r in rows} == {0}
    assert {r["producer_id"] for r in rows} == {None}
    assert not any(r["is_transactional"] or r["is_control"] for r in rows)


def test_offset_bounds_cut_inside_batches(codecs_dir):
    rows = read(codecs_dir, startingOffsets="12", endingOffsets="100")
    assert sorted(r["offset"] for r in rows) == list(range(12, 100))
    json_bounds = '{"t": {"0": 30}}'
    rows = read(
        codecs_dir, startingOffsets=json_bounds, endingOffsets=json_bounds.replace("30", "31")
    )
    assert [r["offset"] for r in rows] == [30]


@pytest.fixture
def txn_dir(tmp_path, make_batches, write_partition):
    """Offsets 0-4 plain; P commits 5-7 and 11; Q aborts 8-10; the markers of P (second
    transaction) and R's records 16-17 come late; R never ends; 12 KiB segments."""
    b = make_batches
    batches = [
        b.data(0, 5),
        b.transactional(5, 3, P),
        b.transactional(8, 3, Q),
        b.marker(11, Q, ControlType.ABORT),
        b.marker(12, P, ControlType.COMMIT),
        b.transactional(13, 2, P),  # second transaction of P, decided much later
        *[b.data(15 + 20 * i, 20, value_size=400) for i in range(6)],  # 15..134
        b.transactional(135, 2, R),  # never decided
        b.marker(137, P, ControlType.ABORT),
        b.data(138, 2),
    ]
    write_partition(tmp_path / "data", TP, batches, segment_bytes=12 * 1024)
    return tmp_path / "data"


def test_read_uncommitted_shows_every_data_record(txn_dir):
    rows = read(txn_dir)
    markers = {11, 12, 137}
    assert sorted(r["offset"] for r in rows) == [o for o in range(140) if o not in markers]
    transactional = {r["offset"] for r in rows if r["is_transactional"]}
    assert transactional == {5, 6, 7, 8, 9, 10, 13, 14, 135, 136}
    assert {r["producer_id"] for r in rows if r["offset"] in (8, 9, 10)} == {Q}


def test_read_committed_drops_aborted_and_undecided_transactions(txn_dir, tmp_path):
    trace = tmp_path / "trace"
    rows = read(txn_dir, isolation="read_committed", traceFileOpens=str(trace))
    dropped = {8, 9, 10, 13, 14, 135, 136} | {11, 12, 137}
    assert sorted(r["offset"] for r in rows) == [o for o in range(140) if o not in dropped]
    # P's second transaction is decided in a later segment: the split holding offset 13
    # looked ahead for it.
    segments = sorted((txn_dir / "t-0").glob("*.log"))
    assert len(segments) >= 3
    lookahead = [t for t in read_trace(str(trace)) if t.purpose is Purpose.LOOKAHEAD]
    assert lookahead, "the marker of P's second transaction lies in a later segment"


def test_read_committed_on_a_narrow_range_decides_with_markers_after_it(txn_dir):
    rows = read(txn_dir, isolation="read_committed", startingOffsets="5", endingOffsets="9")
    assert [r["offset"] for r in rows] == [5, 6, 7]  # 8 is Q's, aborted at 11


def test_markers_only_with_include_control(txn_dir):
    rows = read(txn_dir, includeControl="true")
    control = [r for r in rows if r["is_control"]]
    assert [r["offset"] for r in control] == [11, 12, 137]
    assert all(r["is_transactional"] for r in control)
    assert control[0]["key"] == b"\x00\x00\x00\x00"  # version 0, ABORT
    assert control[1]["key"] == b"\x00\x00\x00\x01"  # COMMIT
    committed = read(txn_dir, includeControl="true", isolation="read_committed")
    assert [r["offset"] for r in committed if r["is_control"]] == [11, 12, 137]


def test_a_corrupt_batch_fails_the_read_with_file_and_position(codecs_dir):
    segment = sorted((codecs_dir / "t-0").glob("*.log"))[1]
    data = bytearray(segment.read_bytes())
    second = scan_batches(bytes(data)).batches[1]
    data[second.position + 70] ^= 0x55
    segment.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match=rf"{segment.name}.*position {second.position}"):
        read(codecs_dir)
    batches = read(codecs_dir, view="batches")
    problems = [b for b in batches if b["problem_kind"] is not None]
    assert [(p["problem_kind"], p["segment"], p["position"]) for p in problems] == [
        (PROBLEM_CORRUPT, int(segment.stem), second.position)
    ]
    assert "CRC32C" in problems[0]["problem"]


def test_records_that_do_not_decode_fail_the_read_with_file_and_position(codecs_dir):
    segment = sorted((codecs_dir / "t-0").glob("*.log"))[1]
    data = bytearray(segment.read_bytes())
    plain = [h for h in scan_batches(bytes(data)).batches if h.compression == Compression.NONE]
    victim = plain[0]
    data[victim.position + RECORD_BATCH_OVERHEAD] = 0x7E  # the first record's length: 63
    segment.write_bytes(bytes(data))
    # Without the CRC check only the records' own framing can tell.
    with pytest.raises(
        CorruptRecordError, match=rf"{segment.name}.*position {victim.position}.*does not decode"
    ):
        read(codecs_dir, verifyCrc="false")


def test_a_torn_tail_is_a_live_writers_only_in_the_last_segment(codecs_dir, make_batches):
    segments = sorted((codecs_dir / "t-0").glob("*.log"))
    before = len(read(codecs_dir))
    with segments[-1].open("ab") as f:
        f.write(make_batches.data(420, 5)[:40])  # a batch being appended
    assert len(read(codecs_dir)) == before
    torn_rows = [b for b in read(codecs_dir, view="batches") if b["problem_kind"]]
    assert [b["problem_kind"] for b in torn_rows] == [PROBLEM_TORN_TAIL]
    with segments[0].open("ab") as f:
        f.write(make_batches.data(999, 5)[:40])
    with pytest.raises(CorruptRecordError, match="torn batch"):
        read(codecs_dir)


def test_batches_view_has_every_header(codecs_dir):
    rows = read(codecs_dir, view="batches")
    assert [r["base_offset"] for r in rows] == [i * 7 for i in range(60)]
    assert [r["codec"] for r in rows[:5]] == ["none", "gzip", "snappy", "lz4", "zstd"]
    assert all(r["record_count"] == 7 and r["magic"] == 2 for r in rows)
    assert all(r["problem"] is None for r in rows)
    for path in sorted((codecs_dir / "t-0").glob("*.log")):
        in_file = [r for r in rows if r["segment"] == int(path.stem)]
        assert sum(r["size"] for r in in_file) == path.stat().st_size
        assert in_file[0]["position"] == 0


# -- real data: a producer's topics through Kafka and replicad, against a real consumer ----


def consumed(records) -> list[tuple]:
    return [(r.offset, r.key, r.value, [tuple(h) for h in r.headers], r.timestamp) for r in records]


def ours(rows) -> list[tuple]:
    out = []
    for r in sorted(rows, key=lambda r: r["offset"]):
        headers = [(h["key"], h["value"]) for h in r["headers"]]
        millis = int(r["timestamp"].timestamp() * 1000)
        out.append((r["offset"], r["key"], r["value"], headers, millis))
    return out


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_replica_reads_as_a_kafka_consumer_reads_the_topic(replicated, isolation):
    expected = replicated.committed if isolation == "read_committed" else replicated.uncommitted
    rows = read(replicated.data_dir, isolation=isolation, maxSplitBytes=str(16 * 1024))
    for topic, partitions in replicated.partitions.items():
        for partition in range(partitions):
            got = [r for r in rows if r["topic"] == topic and r["partition"] == partition]
            want = consumed(expected[topic][partition])
            assert len(got) == len(want) > 0, (topic, partition)
            assert ours(got) == want, (topic, partition)
    summary = replicated.summaries[replicated.mixed]
    aborted = sum(p.aborted_records for p in summary.partitions)
    mixed_rows = [r for r in rows if r["topic"] == replicated.mixed]
    if isolation == "read_committed":
        assert len(mixed_rows) == summary.records - aborted
    else:
        assert len(mixed_rows) == summary.records
    assert aborted > 0


def test_legacy_message_sets_read_as_records(tmp_path, make_batches, write_partition):
    from tools.logdata.batches import legacy_message_set

    batches = [
        legacy_message_set(0, [b"a", b"b"], magic=0),
        legacy_message_set(2, [b"c", b"d", b"e"], magic=1, codec=Compression.GZIP),
        make_batches.data(5, 2),
    ]
    write_partition(tmp_path / "data", TP, batches)
    rows = read(tmp_path / "data")
    assert [r["offset"] for r in rows] == list(range(7))
    assert [r["value"] for r in rows[:5]] == [b"a", b"b", b"c", b"d", b"e"]
    assert [r["timestamp_type"] for r in rows] == [-1, -1, 0, 0, 0, 0, 0]
    assert rows[0]["timestamp"] is None  # magic 0 has no timestamp
    # a bound inside a compressed wrapper: the wrapper's first offset is known only inside
    inside = read(tmp_path / "data", startingOffsets="3", endingOffsets="4")
    assert [(r["offset"], r["value"]) for r in inside] == [(3, b"d")]


def test_an_executors_read_of_magic_2_batches_imports_no_kio(tmp_path):
    """What a Python worker imports to read a split: the magic 2 path needs no kio (nor
    hypothesis, which kio imports where it is installed): 0.17-0.9 CPU-s of every worker's
    start (reader.py). A fresh interpreter, as a worker is."""
    from tools.bench.spark_read_cpu import write_replica

    records = write_replica(tmp_path, partitions=2, mb=0.5, codec="lz4")
    code = textwrap.dedent(
        f"""
        import sys
        from replicad.spark.options import parse_options
        from replicad.spark.source import ReplicadReader

        reader = ReplicadReader(parse_options({{"path": {str(tmp_path)!r}}}))
        rows = sum(b.num_rows for p in reader.partitions() for b in reader.read(p))
        print(rows, sorted(name for name in ("kio", "hypothesis") if name in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split(maxsplit=1) == [str(records), "[]\n"]
