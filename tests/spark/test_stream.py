"""`spark.readStream.format("replicad")` in Spark local mode over a replica that a real
`replicad run` is writing from a real Kafka broker: Trigger.AvailableNow into Spark's
parquet sink, checkpointed offsets, new partitions and topics joining, read_committed
before an open transaction, data lost to retention, the options that shape rows
(includeHeaders, includeControl) and micro-batches (minOffsetsPerTrigger with
maxTriggerDelay, maxBytesPerTrigger; the query's progress says what each batch read and
where the replica ends); and running queries over a replica the
follower truncates under them (an unclean leader election on the session's real three-node
cluster)."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pytest
from confluent_kafka import ElectionType

from replicad.spark.catalog import list_partitions
from replicad.spark.files import read_trace
from replicad.spark.follow import START_ATTEMPTS, worker_start_failed
from replicad.spark.handover import offsets_from_checkpoint
from replicad.spark.options import parse_stream_options
from replicad.spark.stable import last_stable_offset
from replicad.spark.stream import ReplicadStreamReader, StreamSplit, high_watermarks
from replicad.types import TopicPartition
from tools.chaos.leadership import elect
from tools.peers.produce import CheckedProducer, produce_numbered
from tools.replica import replicad_run
from tools.wait import wait_until

# Checkpoints (and so high watermarks on disk) and retention often; new topics seen soon.
REPLICA_CONFIG = {
    "checkpoint_interval_ms": 200,
    "source": {"metadata_max_age_ms": 1000},
    "log": {"segment_bytes": 16 * 1024, "index_interval_bytes": 512},
}
QUERY_TIMEOUT_S = 600


def wait_replicated(proc, data_dir: Path, want: dict[TopicPartition, int]) -> None:
    """Until the replica holds `want` and its high watermark checkpoint says so."""
    proc.wait_caught_up(want)

    def checkpointed() -> bool:
        try:
            hws = high_watermarks(str(data_dir))
        except Exception:
            return False
        return {tp: hws.get(tp) for tp in want} == want

    proc.wait_for(checkpointed, timeout_s=60, what="high watermarks checkpointed")


def into_parquet(spark, data_dir: Path, root: Path, options: dict[str, str]):
    """A stream of data_dir read with `options`, written as parquet into root/out with its
    checkpoint in root/checkpoint; the caller sets the trigger."""
    return (
        spark.readStream.format("replicad")
        .options(**options)
        .load(str(data_dir))
        .writeStream.format("parquet")
        .option("checkpointLocation", str(root / "checkpoint"))
        .option("path", str(root / "out"))
    )


def available_now(spark, data_dir: Path, root: Path, **options: str) -> list[dict]:
    """One Trigger.AvailableNow run into root/out with root/checkpoint; the progress of its
    micro-batches that read rows."""
    writer = into_parquet(spark, data_dir, root, options).trigger(availableNow=True)
    for attempt in range(1, START_ATTEMPTS + 1):
        query = writer.start()
        try:
            assert query.awaitTermination(QUERY_TIMEOUT_S), "the AvailableNow run did not end"
            break
        except Exception as exc:  # as `replicad pipeline` does (follow.py says why)
            if attempt == START_ATTEMPTS or not worker_start_failed(exc):
                raise
        finally:
            query.stop()
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def sink_offsets(spark, out: Path) -> tuple[int, set[tuple[str, int, int]]]:
    """Rows in the sink at `out` and its distinct (topic, partition, offset)."""
    rows = spark.read.parquet(str(out)).select("topic", "partition", "offset").collect()
    return len(rows), {(r.topic, r.partition, r.offset) for r in rows}


def every_offset(ends: dict[TopicPartition, int]) -> set[tuple[str, int, int]]:
    return {(tp.topic, tp.partition, o) for tp, end in ends.items() for o in range(end)}


def test_available_now_over_a_running_replica_adds_only_new_records(
    spark, kafka_broker, unique_topic, tmp_path
):
    from confluent_kafka.admin import NewPartitions

    first = unique_topic()
    prefix = re.escape(first.rsplit("-", 1)[0])
    kafka_broker.create_topic(first, 2)
    produce_numbered(kafka_broker.bootstrap, first, 2, 150)
    data_dir = tmp_path / "data"
    regex = ["--topics-regex", f"{prefix}-.*"]
    with replicad_run(
        kafka_broker.bootstrap, None, data_dir, config=REPLICA_CONFIG, extra=regex
    ) as proc:
        want = {TopicPartition(first, p): 150 for p in range(2)}
        wait_replicated(proc, data_dir, want)
        progress = available_now(spark, data_dir, tmp_path, topicPattern=f"{prefix}-.*")
        assert sum(p["numInputRows"] for p in progress) == 300
        rows, offsets = sink_offsets(spark, tmp_path / "out")
        assert rows == len(offsets) == 300
        assert offsets == every_offset(want)
        # Offsets read as Spark's Kafka source writes them.
        assert progress[-1]["sources"][0]["endOffset"] == f'{{"{first}": {{"0": 150, "1": 150}}}}'

        # More records, a partition added to the topic, a new topic matching the pattern.
        admin = kafka_broker.admin()  # held: a collected client cancels its futures
        admin.create_partitions([NewPartitions(first, 3)])[first].result(30)
        second = unique_topic()
        kafka_broker.create_topic(second, 1)
        produce_numbered(kafka_broker.bootstrap, first, 3, 40, b"w")
        produce_numbered(kafka_broker.bootstrap, second, 1, 40)
        want = {
            **{TopicPartition(first, p): 190 for p in range(2)},
            TopicPartition(first, 2): 40,
            TopicPartition(second, 0): 40,
        }
        wait_replicated(proc, data_dir, want)
        limit = 50
        progress = available_now(
            spark,
            data_dir,
            tmp_path,
            topicPattern=f"{prefix}-.*",
            maxOffsetsPerTrigger=str(limit),
        )
    added = sum(p["numInputRows"] for p in progress)
    assert added == 160
    assert len(progress) >= math.ceil(added / limit)
    # A share below one offset rounds up: at most one more per partition.
    assert all(p["numInputRows"] <= limit + len(want) for p in progress)
    rows, offsets = sink_offsets(spark, tmp_path / "out")
    assert rows == len(offsets) == 460
    assert offsets == every_offset(want)


def test_a_stream_refuses_a_directory_without_high_watermarks(spark, tmp_path):
    (tmp_path / "data").mkdir()
    with pytest.raises(Exception, match="replication-offset-checkpoint"):
        available_now(spark, tmp_path / "data", tmp_path)


# Small producer batches, so that the replica's small segments roll often.
PRODUCER_BATCH_BYTES = 4096


def produce_sized(bootstrap: str, topic: str, count: int, value_bytes: int, first: int = 0) -> None:
    config = {"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.size": PRODUCER_BATCH_BYTES}
    producer = CheckedProducer(config)
    for i in range(first, first + count):
        producer.produce(topic, value=(b"%d-" % i).ljust(value_bytes, b"x"), partition=0)
    producer.flush(30)  # PeerError unless every record was delivered


def test_retention_past_the_stream_fails_it_or_is_skipped(
    spark, kafka_broker, unique_topic, tmp_path, caplog
):
    import shutil

    from replicad.spark.catalog import log_start_offsets

    topic = unique_topic()
    tp = TopicPartition(topic, 0)
    kafka_broker.create_topic(topic, 1)
    produce_sized(kafka_broker.bootstrap, topic, 20, 500)
    data_dir = tmp_path / "data"
    config = {**REPLICA_CONFIG, "log": {**REPLICA_CONFIG["log"], "retention_bytes": 40 * 1024}}
    strict, lenient = tmp_path / "strict", tmp_path / "lenient"
    with replicad_run(kafka_broker.bootstrap, [topic], data_dir, config=config) as proc:
        wait_replicated(proc, data_dir, {tp: 20})
        assert len(available_now(spark, data_dir, strict)) >= 1
        shutil.copytree(strict, lenient)
        # Retention deletes segments the stream has not read yet.
        produce_sized(kafka_broker.bootstrap, topic, 300, 500, first=20)
        wait_replicated(proc, data_dir, {tp: 320})
        proc.wait_for(
            lambda: log_start_offsets(str(data_dir)).get(tp, 0) > 20,
            what="retention to delete unread segments",
        )
    log_start = log_start_offsets(str(data_dir))[tp]
    line = f"data lost in {topic}-0: offsets 20..{log_start - 1}"
    with pytest.raises(Exception, match=re.escape(line)):
        available_now(spark, data_dir, strict)
    progress = available_now(spark, data_dir, lenient, failOnDataLoss="false")
    assert sum(p["numInputRows"] for p in progress) == 320 - log_start
    # Read back from the copied sink: the records this run added, each once (the first
    # run's are in strict/).
    rows, offsets = sink_offsets(spark, lenient / "out")
    assert rows == len(offsets) == 320 - log_start
    assert offsets == {(topic, 0, o) for o in range(log_start, 320)}
    # Counted and logged by the stream reader (on the driver: asked here directly).
    reader = ReplicadStreamReader(
        parse_stream_options({"path": str(data_dir), "failOnDataLoss": "false"})
    )
    with caplog.at_level(logging.WARNING, logger="replicad.spark.stream"):
        splits = reader.partitions({topic: {"0": 20}}, {topic: {"0": 320}})
    assert reader.lost_offsets == log_start - 20
    assert any(line in message for message in caplog.messages)
    assert min(split.start_offset for s in splits for split in s.splits) == log_start


def test_a_micro_batch_is_planned_from_the_look_that_chose_its_end(
    tmp_path, write_partition, make_batches
):
    """partitions() after latestOffset neither lists the directory again nor reads again the
    indexes latestOffset read; a batch it did not choose (a replay) looks afresh."""
    data_dir, tp = tmp_path / "data", TopicPartition("one-look", 0)
    batches = [make_batches.data(o, 10) for o in range(0, 200, 10)]
    directory = write_partition(data_dir, tp, batches, segment_bytes=4096, index_interval_bytes=256)
    (data_dir / "replication-offset-checkpoint").write_text(f"0\n1\n{tp.topic} 0 200\n")
    trace = tmp_path / "trace"
    options = {"path": str(data_dir), "maxBytesPerTrigger": "3000", "traceFileOpens": str(trace)}
    reader = ReplicadStreamReader(parse_stream_options(options))
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert 0 < end[tp.topic]["0"] < 200  # cut by the byte limit: indexes read to choose it
    read_before = len(read_trace(str(trace)))
    assert read_before > 0
    # replicad appends meanwhile: the batch is planned as the look that chose it saw the log.
    last = sorted(directory.glob("*.log"))[-1]
    size = last.stat().st_size
    more = make_batches.data(200, 10)
    with last.open("ab") as f:
        f.write(more)
    (data_dir / "replication-offset-checkpoint").write_text(f"0\n1\n{tp.topic} 0 210\n")
    planned = [split for group in reader.partitions(start, end) for split in group.splits]
    assert planned and {s.end_offset for s in planned} == {end[tp.topic]["0"]}
    assert {s.log_end.size for s in planned} == {size}
    assert len(read_trace(str(trace))) == read_before  # no index read twice
    replayed = [split for group in reader.partitions(start, end) for split in group.splits]
    assert [(s.segment, s.start_position) for s in replayed] == [
        (s.segment, s.start_position) for s in planned
    ]
    assert {s.log_end.size for s in replayed} == {size + len(more)}
    assert len(read_trace(str(trace))) > read_before


def test_a_micro_batch_ends_at_the_high_watermark_not_the_log_end(
    tmp_path, write_partition, make_batches
):
    """Records the follower appended past the checkpointed high watermark (not yet
    committed at the source: a leader change could truncate them) are not streamed until
    the checkpoint passes them."""
    data_dir, tp = tmp_path / "data", TopicPartition("past-hw", 0)
    batches = [make_batches.data(o, 10) for o in range(0, 200, 10)]
    write_partition(data_dir, tp, batches, segment_bytes=4096, index_interval_bytes=256)
    checkpoint = data_dir / "replication-offset-checkpoint"
    checkpoint.write_text(f"0\n1\n{tp.topic} 0 150\n")  # the log holds 0..199
    reader = ReplicadStreamReader(parse_stream_options({"path": str(data_dir)}))
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {tp.topic: {"0": 150}}
    splits = [split for group in reader.partitions(start, end) for split in group.splits]
    assert {s.end_offset for s in splits} == {150}
    assert sorted(r for s in splits for r in read_offsets(s, reader)) == list(range(150))
    checkpoint.write_text(f"0\n1\n{tp.topic} 0 200\n")
    assert reader.latestOffset(end, reader.getDefaultReadLimit()) == {tp.topic: {"0": 200}}


def read_offsets(split, reader: ReplicadStreamReader) -> list[int]:
    """The offsets the executors would read from `split`."""
    return [o for batch in reader.read(StreamSplit((split,))) for o in batch["offset"].to_pylist()]


def test_a_stream_starts_at_a_timestamp_and_reports_the_replicas_end(
    spark, tmp_path, write_partition, make_batches
):
    """startingTimestamp picks each partition's first record at or past it (past every
    record: the readable end); reportLatestOffset says where the replica ends, beyond a
    micro-batch cut by maxOffsetsPerTrigger, so query progress shows how far behind it is.
    Then the same startingTimestamp through a real Spark query (AvailableNow)."""
    from tests.spark.conftest import TIMESTAMP_MS

    data_dir, tp = tmp_path / "data", TopicPartition("stamps", 0)
    # Batch at offset o: records stamped TIMESTAMP_MS + o * 1000 + i.
    batches = [
        make_batches.data(o, 10, timestamp_ms=TIMESTAMP_MS + o * 1000) for o in range(0, 200, 10)
    ]
    directory = write_partition(data_dir, tp, batches, segment_bytes=4096, index_interval_bytes=256)
    (data_dir / "replication-offset-checkpoint").write_text(f"0\n1\n{tp.topic} 0 200\n")

    def reader(**options: str) -> ReplicadStreamReader:
        return ReplicadStreamReader(parse_stream_options({"path": str(data_dir), **options}))

    after_55 = reader(startingTimestamp=str(TIMESTAMP_MS + 55_000))
    assert after_55.initialOffset() == {tp.topic: {"0": 60}}
    at_55 = reader(startingTimestamp=str(TIMESTAMP_MS + 55_005))
    assert at_55.initialOffset() == {tp.topic: {"0": 60}}
    exact = reader(startingTimestamp=str(TIMESTAMP_MS + 50_005))
    assert exact.initialOffset() == {tp.topic: {"0": 55}}
    late = reader(startingTimestamp=str(TIMESTAMP_MS + 10_000_000))
    assert late.initialOffset() == {tp.topic: {"0": 200}}

    limited = reader(startingTimestamp=str(TIMESTAMP_MS + 55_000), maxOffsetsPerTrigger="50")
    start = limited.initialOffset()
    assert limited.latestOffset(start, limited.getDefaultReadLimit()) == {tp.topic: {"0": 110}}
    assert limited.reportLatestOffset() == {tp.topic: {"0": 200}}
    # replicad appends and checkpoints: the next look reports the new end.
    last = sorted(directory.glob("*.log"))[-1]
    with last.open("ab") as f:
        f.write(make_batches.data(200, 10, timestamp_ms=TIMESTAMP_MS + 200_000))
    (data_dir / "replication-offset-checkpoint").write_text(f"0\n1\n{tp.topic} 0 210\n")
    end = limited.latestOffset({tp.topic: {"0": 110}}, limited.getDefaultReadLimit())
    assert end == {tp.topic: {"0": 160}}
    assert limited.reportLatestOffset() == {tp.topic: {"0": 210}}

    progress = available_now(
        spark, data_dir, tmp_path / "stream", startingTimestamp=str(TIMESTAMP_MS + 55_000)
    )
    assert sum(p["numInputRows"] for p in progress) == 150
    rows, offsets = sink_offsets(spark, tmp_path / "stream" / "out")
    assert rows == len(offsets) == 150
    assert offsets == {(tp.topic, 0, o) for o in range(60, 210)}


def test_read_committed_stops_before_an_open_transaction(
    spark, kafka_broker, unique_topic, tmp_path
):

    topic = unique_topic()
    tp = TopicPartition(topic, 0)
    kafka_broker.create_topic(topic, 1)
    produce_numbered(kafka_broker.bootstrap, topic, 1, 10)
    transactional = CheckedProducer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "transactional.id": f"{topic}-txn",
            # Open across a replica's start and a Spark query: 190 s at load 40, past
            # librdkafka's 60 s default, after which the broker aborted it and fenced us.
            "transaction.timeout.ms": 600_000,
        }
    )
    transactional.init_transactions(30)
    transactional.begin_transaction()
    for i in range(5):
        transactional.produce(topic, value=b"t%d" % i, partition=0)
    transactional.flush(30)
    produce_numbered(kafka_broker.bootstrap, topic, 1, 10, b"after")  # offsets 15..24
    data_dir = tmp_path / "data"
    with replicad_run(kafka_broker.bootstrap, [topic], data_dir, config=REPLICA_CONFIG) as proc:
        wait_replicated(proc, data_dir, {tp: 25})
        available_now(spark, data_dir, tmp_path, isolation="read_committed")
        rows, offsets = sink_offsets(spark, tmp_path / "out")
        assert rows == len(offsets) == 10  # the open transaction begins at offset 10
        assert offsets == every_offset({tp: 10})
        transactional.commit_transaction(30)  # its marker is offset 25
        wait_replicated(proc, data_dir, {tp: 26})
        available_now(spark, data_dir, tmp_path, isolation="read_committed")
    rows, offsets = sink_offsets(spark, tmp_path / "out")
    assert rows == len(offsets) == 25
    assert offsets == every_offset({tp: 25})


def parquet_rows(spark, out: Path) -> tuple[list[str], list]:
    """The columns of the sink at `out` and its rows by offset."""
    frame = spark.read.parquet(str(out))
    return frame.columns, sorted(frame.collect(), key=lambda r: r.offset)


def test_include_headers_false_streams_rows_without_the_headers_column(
    spark, kafka_broker, unique_topic, tmp_path
):
    topic = unique_topic()
    tp = TopicPartition(topic, 0)
    kafka_broker.create_topic(topic, 1)
    producer = CheckedProducer({"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 5})
    for i in range(20):
        producer.produce(topic, value=b"v%d" % i, partition=0, headers=[("h", b"%d" % i)])
    producer.flush(30)
    data_dir = tmp_path / "data"
    with replicad_run(kafka_broker.bootstrap, [topic], data_dir, config=REPLICA_CONFIG) as proc:
        wait_replicated(proc, data_dir, {tp: 20})
        available_now(spark, data_dir, tmp_path / "with")
        available_now(spark, data_dir, tmp_path / "without", includeHeaders="false")
    with_columns, with_rows = parquet_rows(spark, tmp_path / "with" / "out")
    without_columns, without_rows = parquet_rows(spark, tmp_path / "without" / "out")
    assert "headers" in with_columns
    assert without_columns == [c for c in with_columns if c != "headers"]
    assert [[(h.key, bytes(h.value)) for h in r.headers] for r in with_rows] == [
        [("h", b"%d" % i)] for i in range(20)
    ]
    # The same records otherwise.
    assert [(r.offset, bytes(r.value)) for r in without_rows] == [
        (i, b"v%d" % i) for i in range(20)
    ]


def test_include_control_streams_the_transaction_markers_as_rows(
    spark, kafka_broker, unique_topic, tmp_path
):
    """Offsets 0..4 plain, 5..9 a committed transaction and its marker at 10, 11..13 an
    aborted one and its marker at 14."""
    topic = unique_topic()
    tp = TopicPartition(topic, 0)
    kafka_broker.create_topic(topic, 1)
    produce_numbered(kafka_broker.bootstrap, topic, 1, 5)
    transactional = CheckedProducer(
        {"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": f"{topic}-txn"}
    )
    transactional.init_transactions(30)
    for count, end in ((5, transactional.commit_transaction), (3, transactional.abort_transaction)):
        transactional.begin_transaction()
        for i in range(count):
            transactional.produce(topic, value=b"t%d" % i, partition=0)
        transactional.flush(30)
        end(30)
    data_dir = tmp_path / "data"
    with replicad_run(kafka_broker.bootstrap, [topic], data_dir, config=REPLICA_CONFIG) as proc:
        wait_replicated(proc, data_dir, {tp: 15})  # the abort marker replicated
        available_now(spark, data_dir, tmp_path / "default")
        available_now(spark, data_dir, tmp_path / "control", includeControl="true")
        available_now(
            spark,
            data_dir,
            tmp_path / "committed",
            includeControl="true",
            isolation="read_committed",
        )

    def rows(name: str) -> list[tuple[int, bool]]:
        return [(r.offset, r.is_control) for r in parquet_rows(spark, tmp_path / name / "out")[1]]

    data = [*range(10), 11, 12, 13]  # read_uncommitted: the aborted records too
    assert rows("default") == [(o, False) for o in data]
    assert rows("control") == sorted([(o, False) for o in data] + [(10, True), (14, True)])
    # read_committed: the aborted records dropped, both markers kept.
    assert rows("committed") == [(o, False) for o in range(10)] + [(10, True), (14, True)]


def started(writer):
    """A query started from `writer`, once a trigger found nothing new to read
    (processAllAvailable); started again if the driver's Python source process could not
    connect back in time (follow.py)."""
    for attempt in range(1, START_ATTEMPTS + 1):
        query = writer.start()
        try:
            query.processAllAvailable()
            return query
        except Exception as exc:
            query.stop()
            if attempt == START_ATTEMPTS or not worker_start_failed(exc):
                raise
    raise AssertionError("unreachable")


def read_rows(query) -> list[int]:
    """Rows of each micro-batch of `query` that read any."""
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]


def read_up_to(root: Path, topic: str) -> int:
    """Where the query writing into root/out has committed partition 0 of `topic` to."""
    return (committed(root / "checkpoint") or {}).get(topic, {}).get("0", 0)


def test_min_offsets_per_trigger_waits_for_records_or_max_trigger_delay(
    spark, kafka_broker, unique_topic, tmp_path
):
    topic = unique_topic()
    tp = TopicPartition(topic, 0)
    kafka_broker.create_topic(topic, 1)
    produce_numbered(kafka_broker.bootstrap, topic, 1, 30)
    data_dir = tmp_path / "data"
    waiting = tmp_path / "waiting"
    with replicad_run(kafka_broker.bootstrap, [topic], data_dir, config=REPLICA_CONFIG) as proc:
        wait_replicated(proc, data_dir, {tp: 30})
        # 30 offsets below a minimum of 100, and a delay no test waits out: no batch.
        options = {"minOffsetsPerTrigger": "100", "maxTriggerDelay": "1h"}
        writer = into_parquet(spark, data_dir, waiting, options)
        query = started(writer.trigger(processingTime="200 milliseconds"))
        try:
            # Nothing read (Spark may commit an empty first batch, ending where it began).
            assert read_rows(query) == []
            assert committed(waiting / "checkpoint") in (None, {topic: {"0": 0}})
            produce_numbered(kafka_broker.bootstrap, topic, 1, 80, b"more-")
            wait_until(
                lambda: read_up_to(waiting, topic) >= 100 or not query.isActive,
                timeout_s=QUERY_TIMEOUT_S,
                what="a micro-batch of at least 100 offsets",
            )
            query.processAllAvailable()  # its progress recorded
            # One batch from offset 0, of at least 100 (the last few may wait behind it
            # when the replica's high watermark passed 100 before 110).
            (rows,) = read_rows(query)
            assert 100 <= rows <= 110
            assert committed(waiting / "checkpoint") == {topic: {"0": rows}}
        finally:
            query.stop()
        # A minimum the replica never reaches: the delay lets a smaller batch through.
        delayed = running_query(
            spark,
            data_dir,
            tmp_path / "delayed",
            {topic: {"0": 110}},
            minOffsetsPerTrigger="1000",
            maxTriggerDelay="1s",
        )
        try:
            delayed.processAllAvailable()  # the batch's progress recorded
            assert read_rows(delayed) == [110]
        finally:
            delayed.stop()


def test_max_bytes_per_trigger_cuts_micro_batches_and_progress_shows_the_replicas_end(
    spark, kafka_broker, unique_topic, tmp_path
):
    topic = unique_topic()
    tp = TopicPartition(topic, 0)
    kafka_broker.create_topic(topic, 1)
    value_bytes, count, budget = 1000, 120, 16 * 1024
    produce_sized(kafka_broker.bootstrap, topic, count, value_bytes)
    data_dir = tmp_path / "data"
    with replicad_run(kafka_broker.bootstrap, [topic], data_dir, config=REPLICA_CONFIG) as proc:
        wait_replicated(proc, data_dir, {tp: count})
        log_bytes = sum(f.stat().st_size for f in (data_dir / f"{topic}-0").glob("*.log"))
        progress = available_now(spark, data_dir, tmp_path, maxBytesPerTrigger=str(budget))
    assert sum(p["numInputRows"] for p in progress) == count
    rows, offsets = sink_offsets(spark, tmp_path / "out")
    assert rows == len(offsets) == count
    # A micro-batch ends at the last offset index entry within its budget (an entry names
    # a batch's last offset at the batch's position: that batch is read up to it), or at a
    # segment's first entry past the budget (a segment's first batch has none): at most two
    # producer batches (PRODUCER_BATCH_BYTES each) past the budget.
    most = budget + 2 * PRODUCER_BATCH_BYTES
    assert all(p["numInputRows"] * value_bytes <= most for p in progress)
    assert len(progress) >= math.ceil(log_bytes / most)
    # reportLatestOffset: each micro-batch's progress says where the replica ends, past
    # where the batch did, as Spark's Kafka source says it for avgOffsetsBehindLatest.
    sources = [p["sources"][0] for p in progress]
    assert [json.loads(s["latestOffset"]) for s in sources] == [{topic: {"0": count}}] * len(
        sources
    )
    ends = [json.loads(s["endOffset"])[topic]["0"] for s in sources]
    assert ends == sorted(ends) and ends[-1] == count and ends[0] < count


def committed(checkpoint: Path) -> dict | None:
    """The offsets of a checkpoint's last committed micro-batch, None before the first."""
    try:
        return offsets_from_checkpoint(checkpoint)
    except Exception:
        return None


def running_query(spark, data_dir: Path, root: Path, want: dict, **options: str):
    """A query with a 200 ms processing-time trigger into root/out, once it has committed
    `want` (Spark's Kafka source JSON); started again if the driver's Python source process
    could not connect back in time (follow.py)."""
    writer = into_parquet(spark, data_dir, root, options).trigger(processingTime="200 milliseconds")
    for attempt in range(1, START_ATTEMPTS + 1):
        query = writer.start()
        wait_until(
            lambda q=query: committed(root / "checkpoint") == want or not q.isActive,
            timeout_s=QUERY_TIMEOUT_S,
            what=f"the query to commit {want}",
        )
        if query.isActive:
            return query
        if attempt == START_ATTEMPTS or not worker_start_failed(query.exception()):
            raise AssertionError(f"the query ended: {query.exception()}")
    raise AssertionError("unreachable")


@pytest.mark.timeout(1200)  # three node restarts of the shared cluster: minutes under load
def test_an_unclean_election_on_a_real_cluster_truncates_under_running_streams(
    spark, kafka_cluster, unique_topic, tmp_path
):
    """The session's three-node Apache Kafka cluster elects a stale follower uncleanly: the
    new leader holds 0..49 of the 0..99 both running queries read from the replica, and
    `replicad run` truncates to 50 on the broker's DivergingEpoch. The strict query stops
    with one line; the lenient one moves to 50 and reads the new history."""
    topic = unique_topic()
    tp = TopicPartition(topic, 0)
    leader, stale = kafka_cluster.node_ids[:2]
    kafka_cluster.create_replicated_topic(
        topic,
        {"min.insync.replicas": "1", "unclean.leader.election.enable": "true"},
        assignment=[[leader, stale]],
    )
    strict, lenient = tmp_path / "strict", tmp_path / "lenient"
    data_dir = tmp_path / "data"
    stopped: list[int] = []
    try:
        produce_numbered(kafka_cluster.bootstrap, topic, 1, 50, b"a-")  # acks=all: both hold it
        kafka_cluster.node(stale).stop()
        stopped.append(stale)
        produce_numbered(kafka_cluster.bootstrap, topic, 1, 50, b"b-")  # 50..99: the leader's
        bootstrap = kafka_cluster.bootstrap
        with replicad_run(bootstrap, [topic], data_dir, config=REPLICA_CONFIG) as proc:
            wait_replicated(proc, data_dir, {tp: 100})
            read_all = {topic: {"0": 100}}
            queries = [
                running_query(spark, data_dir, strict, read_all),
                running_query(spark, data_dir, lenient, read_all, failOnDataLoss="false"),
            ]
            try:
                kafka_cluster.node(leader).kill()
                stopped.append(leader)
                kafka_cluster.node(stale).start()
                stopped.remove(stale)
                elect(kafka_cluster, ElectionType.UNCLEAN, [tp])
                proc.wait_for(
                    lambda: high_watermarks(str(data_dir)).get(tp) == 50,
                    timeout_s=QUERY_TIMEOUT_S,
                    what="the replica truncated to 50",
                )
                line = (
                    f"data lost in {topic}-0: offsets 50..99 "
                    "(the replica's log was truncated below the stream's position)"
                )
                with pytest.raises(Exception, match=re.escape(line)):
                    queries[0].awaitTermination(QUERY_TIMEOUT_S)
                # failOnDataLoss=false goes on from the new end, then reads the new history.
                wait_until(
                    lambda: committed(lenient / "checkpoint") == {topic: {"0": 50}},
                    timeout_s=QUERY_TIMEOUT_S,
                    what="the lenient stream to move to the new end",
                )
                produce_numbered(kafka_cluster.bootstrap, topic, 1, 30, b"new-")  # 50..79
                wait_until(
                    lambda: committed(lenient / "checkpoint") == {topic: {"0": 80}},
                    timeout_s=QUERY_TIMEOUT_S,
                    what="the lenient stream to read the new history",
                )
            finally:
                for query in queries:
                    query.stop()
    finally:
        for node in stopped:  # the cluster is the session's: whole again for the next test
            kafka_cluster.node(node).start()
    rows = spark.read.parquet(str(lenient / "out")).select("offset", "value").collect()
    values = sorted((r.offset, bytes(r.value)) for r in rows)
    # What it read of the old history stays in its sink; of the new, what lies past 50.
    assert values == sorted(
        [(o, b"a-%d" % o) for o in range(50)]
        + [(o, b"b-%d" % (o - 50)) for o in range(50, 100)]
        + [(o, b"new-%d" % (o - 50)) for o in range(50, 80)]
    )
    strict_rows, strict_offsets = sink_offsets(spark, strict / "out")
    assert strict_rows == len(strict_offsets) == 100


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_the_query_s_start_looks_at_the_replica_once(
    tmp_path, write_partition, make_batches, monkeypatch, isolation
):
    """prepareForTriggerAvailableNow, initialOffset, reportLatestOffset and the first
    latestOffset, which Spark calls one after the other before the first micro-batch, share
    one listing of the directory (and with read_committed one walk of the headers for the
    last stable offset); the micro-batch plans from it; the next latestOffset looks again."""
    from replicad.spark import stream

    data_dir, tp = tmp_path / "data", TopicPartition("start-look", 0)
    batches = [make_batches.data(o, 10) for o in range(0, 200, 10)]
    write_partition(data_dir, tp, batches, segment_bytes=4096, index_interval_bytes=256)
    (data_dir / "replication-offset-checkpoint").write_text(f"0\n1\n{tp.topic} 0 200\n")
    listings, walks = [], []
    monkeypatch.setattr(
        stream, "list_partitions", lambda options: listings.append(1) or list_partitions(options)
    )
    monkeypatch.setattr(
        stream,
        "last_stable_offset",
        lambda *args: walks.append(1) or last_stable_offset(*args),
    )
    reader = ReplicadStreamReader(
        parse_stream_options({"path": str(data_dir), "isolation": isolation})
    )
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    assert reader.reportLatestOffset() == {tp.topic: {"0": 200}}
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert (start, end) == ({tp.topic: {"0": 0}}, {tp.topic: {"0": 200}})
    splits = [split for group in reader.partitions(start, end) for split in group.splits]
    assert sorted(r for s in splits for r in read_offsets(s, reader)) == list(range(200))
    assert len(listings) == 1
    assert len(walks) == (1 if isolation == "read_committed" else 0)
    assert reader.latestOffset(end, reader.getDefaultReadLimit()) == end
    assert len(listings) == 2


def test_a_start_look_from_elsewhere_is_not_used_for_the_first_batch_with_read_committed(
    tmp_path, write_partition, make_batches
):
    """With read_committed, a look at the start that searched for the last stable offset
    from the log start (here: reportLatestOffset's, before any batch) finds a transaction
    open below a stream restarted from a checkpoint past its batches; searched from the
    stream's position, the records after it are stable. The first latestOffset looks from
    there, as it did before the start's look was shared."""
    data_dir, tp = tmp_path / "data", TopicPartition("start-look-txn", 0)
    batches = [
        make_batches.data(0, 10),
        make_batches.transactional(10, 5, producer_id=7),  # open: no marker
        make_batches.data(15, 1),
        make_batches.data(16, 10),
    ]
    # Every batch indexed (an entry names its batch's last offset): a search from 16
    # starts at the batch of 15, past the transaction's.
    write_partition(data_dir, tp, batches, segment_bytes=1 << 20, index_interval_bytes=1)
    (data_dir / "replication-offset-checkpoint").write_text(f"0\n1\n{tp.topic} 0 26\n")
    reader = ReplicadStreamReader(
        parse_stream_options({"path": str(data_dir), "isolation": "read_committed"})
    )
    assert reader.reportLatestOffset() == {tp.topic: {"0": 10}}  # from the log start
    end = reader.latestOffset({tp.topic: {"0": 16}}, reader.getDefaultReadLimit())
    assert end == {tp.topic: {"0": 26}}
