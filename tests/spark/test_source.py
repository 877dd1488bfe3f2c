"""The `replicad` format in Spark local mode over a real replica: a producer's topics
(every codec, headers, nulls, committed and aborted transactions) through Kafka and
`replicad run`, compared with what a real Kafka consumer read; pruning checked through the
source's open trace."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql.types import StructType

from replicad.spark.catalog import Planner, list_partitions
from replicad.spark.files import Purpose, read_trace
from replicad.spark.options import parse_options
from replicad.spark.schema import RECORDS_DDL


def load(spark, data_dir: Path, **options: str):
    reader = spark.read.format("replicad")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(str(data_dir))


def rows_by_partition(df) -> dict[tuple[str, int], list[tuple]]:
    found: dict[tuple[str, int], list[tuple]] = {}
    for r in df.select("topic", "partition", "offset", "key", "value", "headers").collect():
        headers = [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in r.headers]
        key = None if r.key is None else bytes(r.key)
        value = None if r.value is None else bytes(r.value)
        found.setdefault((r.topic, r.partition), []).append((r.offset, key, value, headers))
    return {k: sorted(v) for k, v in found.items()}


def consumer_rows(records) -> list[tuple]:
    return [(r.offset, r.key, r.value, [tuple(h) for h in r.headers]) for r in records]


def assert_consumer_rows(got: dict[tuple[str, int], list[tuple]], expected) -> None:
    """`got` (rows_by_partition) holds, partition by partition, what a Kafka consumer
    read (`expected`: topic -> partition -> records), and every partition has rows."""
    want = {
        (topic, partition): consumer_rows(records)
        for topic, partitions in expected.items()
        for partition, records in partitions.items()
    }
    assert sorted(got) == sorted(want)
    for key in want:
        assert len(got[key]) == len(want[key]) > 0, key
        assert got[key] == want[key], key


def test_schema_is_the_documented_one(spark, replicated):
    df = load(spark, replicated.data_dir)
    assert df.schema == StructType.fromDDL(RECORDS_DDL)


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_dataframe_equals_what_a_kafka_consumer_read(spark, replicated, isolation):
    expected = replicated.committed if isolation == "read_committed" else replicated.uncommitted
    df = load(spark, replicated.data_dir, isolation=isolation)
    assert_consumer_rows(rows_by_partition(df), expected)


def test_the_replica_holds_every_codec_markers_and_many_segments(spark, replicated):
    batches = load(spark, replicated.data_dir, view="batches", topics=replicated.mixed)
    codecs = {r.codec for r in batches.select("codec").distinct().collect()}
    assert codecs == {"none", "gzip", "snappy", "lz4", "zstd"}
    summary = replicated.summaries[replicated.mixed]
    markers = load(spark, replicated.data_dir, topics=replicated.mixed, includeControl="true")
    assert markers.where("is_control").count() == summary.commit_markers + summary.abort_markers
    for files in list_partitions(parse_options({"path": str(replicated.data_dir)})):
        assert len(files.segments) >= 3, files


def test_one_spark_partition_per_split(spark, replicated):
    options = {"path": str(replicated.data_dir)}
    segments = sum(len(f.segments) for f in list_partitions(parse_options(options)))
    whole = load(spark, replicated.data_dir)
    assert whole.rdd.getNumPartitions() == len(Planner(parse_options(options)).plan()) == segments
    # Byte ranges of a segment read as they should is test_reader's and test_plan's part;
    # here: each of them is a Spark partition of its own.
    cut_options = {**options, "maxSplitBytes": str(16 * 1024)}
    cut = load(spark, replicated.data_dir, maxSplitBytes=cut_options["maxSplitBytes"])
    planned = Planner(parse_options(cut_options)).plan()
    assert cut.rdd.getNumPartitions() == len(planned) > 2 * segments


def test_topic_and_partition_options_select(spark, replicated):
    df = load(spark, replicated.data_dir, topics=replicated.plain, partitions="1")
    got = rows_by_partition(df)
    assert list(got) == [(replicated.plain, 1)]
    assert got[(replicated.plain, 1)] == consumer_rows(replicated.uncommitted[replicated.plain][1])


def _segment_bases(replicated, partition: int) -> list[int]:
    options = parse_options({"path": str(replicated.data_dir), "topics": replicated.mixed})
    files = next(f for f in list_partitions(options) if f.partition == partition)
    return [s.base_offset for s in files.segments]


def _logs_read(trace: Path) -> list[str]:
    return sorted(Path(t.path).name for t in read_trace(str(trace)) if t.purpose is Purpose.READ)


def test_a_narrow_offset_range_opens_only_its_segments(spark, replicated, tmp_path):
    bases = _segment_bases(replicated, 1)
    start, end = bases[1] + 5, bases[2] + 3  # from inside segment 1 into segment 2
    trace = tmp_path / "trace"
    df = load(
        spark,
        replicated.data_dir,
        topics=replicated.mixed,
        startingOffsets=f'{{"{replicated.mixed}": {{"1": {start}}}}}',
        endingOffsets=f'{{"{replicated.mixed}": {{"1": {end}}}}}',
        partitions="1",
        traceFileOpens=str(trace),
    )
    got = rows_by_partition(df)[(replicated.mixed, 1)]
    want = [
        r for r in consumer_rows(replicated.uncommitted[replicated.mixed][1]) if start <= r[0] < end
    ]
    assert got == want and want
    assert _logs_read(trace) == [f"{bases[1]:020d}.log", f"{bases[2]:020d}.log"]
    assert len(bases) > 3  # ... out of many
    assert not [t for t in read_trace(str(trace)) if t.purpose is Purpose.PLAN]


def kafka_offsets_for_times(bootstrap: str, topic: str, partition: int, stamps: list[int]):
    """What the broker itself answers (ListOffsets by timestamp), -1 for "after the end"."""
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    from tools.peers.admin import probe_consumer

    consumer = probe_consumer(bootstrap)
    try:
        return [
            consumer.offsets_for_times([KafkaTopicPartition(topic, partition, ts)], 10)[0].offset
            for ts in stamps
        ]
    finally:
        consumer.close()


def test_time_lookups_answer_what_the_broker_answers(replicated, tmp_path):
    """ListOffsets by timestamp on the same data, three ways: the broker's own answer, the
    source's planner, and the log store's (what `replicad serve` answers with)."""
    import shutil

    from replicad.log.config import LogConfig
    from replicad.log.partition import PartitionLog
    from replicad.records.batch import scan_batches
    from replicad.types import TopicPartition

    topic, partition = replicated.mixed, 2
    records = replicated.uncommitted[topic][partition]
    distinct = sorted({r.timestamp for r in records})
    sample = distinct[:: max(len(distinct) // 150, 1)]
    stamps = sorted({s + d for s in sample for d in (-1, 0, 1)} | {distinct[-1] + 1})
    broker = kafka_offsets_for_times(replicated.bootstrap, topic, partition, stamps)

    options = parse_options({"path": str(replicated.data_dir), "topics": topic})
    files = next(f for f in list_partitions(options) if f.partition == partition)
    planner = Planner(options)
    planned = [planner.offset_for_timestamp(files, ts) for ts in stamps]
    assert planned == [None if o < 0 else o for o in broker]

    # A copy: loading a partition may write its checkpoints, and the replica is shared.
    directory = tmp_path / Path(files.directory).name
    shutil.copytree(files.directory, directory)
    log = PartitionLog.load(
        directory,
        TopicPartition(topic, partition),
        LogConfig(),
        now_ms=0,
        recovery_point=0,
        log_start_offset=None,
        high_watermark=0,
        clean_shutdown=True,
    )
    try:
        served = [log.offset_for_timestamp(ts) for ts in stamps]
        bases = {
            h.base_offset
            for seg in sorted(directory.glob("*.log"))
            for h in scan_batches(seg.read_bytes()).batches
        }
    finally:
        log.close()
    assert [-1 if f is None else f.offset for f in served] == broker
    # The answers that land inside a batch are the ones a batch-level lookup got wrong.
    assert len([o for o in broker if o >= 0 and o not in bases]) > 10


def test_a_narrow_time_range_opens_only_its_segments(spark, replicated, tmp_path):
    records = replicated.uncommitted[replicated.mixed][0]
    bases = _segment_bases(replicated, 0)
    # Where a timestamp starts or ends a read is the broker's own answer: Kafka's
    # offsetsForTimes, the first offset whose timestamp is at or after it (transaction
    # markers count too, and theirs are the coordinator's, later than their data). Asked for
    # record timestamps across the partition, its answers step from offset to offset; the
    # range between two steps in the middle of the log is a narrow one.
    stamps = sorted({r.timestamp for r in records})[:: max(len(records) // 300, 1)]
    answers = kafka_offsets_for_times(replicated.bootstrap, replicated.mixed, 0, stamps)
    earliest_stamp: dict[int, int] = {}
    for stamp, offset in zip(stamps, answers, strict=True):
        earliest_stamp.setdefault(offset, stamp)
    steps = [
        (a, b)
        for a, b in itertools.pairwise(sorted(o for o in earliest_stamp if o >= 0))
        if a >= bases[1] and b < bases[-1]
    ]
    assert steps, answers
    first, stop = steps[len(steps) // 2]
    start_ts, end_ts = earliest_stamp[first], earliest_stamp[stop]
    trace = tmp_path / "trace"
    df = load(
        spark,
        replicated.data_dir,
        topics=replicated.mixed,
        partitions="0",
        startingTimestamp=str(start_ts),
        endingTimestamp=str(end_ts),
        traceFileOpens=str(trace),
    )
    got = [r[0] for r in rows_by_partition(df).get((replicated.mixed, 0), [])]
    assert got == [r.offset for r in records if first <= r.offset < stop]
    assert got

    def segment_of(offset: int) -> str:
        return f"{max(b for b in bases if b <= offset):020d}.log"

    # The time index finds the segments holding both ends (their .log is opened to find the
    # first record at or after each timestamp); then only the segments between are read.
    traced = read_trace(str(trace))
    planned = {Path(t.path).name for t in traced if t.purpose is Purpose.PLAN}
    assert planned == {segment_of(first), segment_of(stop)}
    assert set(_logs_read(trace)) == {segment_of(o) for o in range(first, stop)}
    assert len(bases) > len(planned | set(_logs_read(trace))) + 1  # the rest never opened


def test_bad_options_fail_at_analysis_naming_the_option(spark, replicated):
    with pytest.raises(AnalysisException, match="startingOffset"):
        load(spark, replicated.data_dir, startingOffset="5").schema  # noqa: B018
