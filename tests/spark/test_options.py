"""Options of the Spark source: Spark Kafka conventions, strict names, clear errors."""

from __future__ import annotations

import pytest

from replicad.errors import ConfigError
from replicad.spark.options import (
    DEFAULT_MAX_SPLIT_BYTES,
    EARLIEST,
    LATEST,
    Isolation,
    View,
    parse_options,
)
from replicad.types import TopicPartition


def parse(**options: str):
    return parse_options({"path": "/data", **options})


def test_defaults_read_everything_uncommitted_without_markers():
    options = parse()
    assert options.data_dir == "/data"
    assert options.view is View.RECORDS
    assert options.topics is None and options.partitions is None
    assert options.starting_offsets.for_partition(TopicPartition("t", 0)) == EARLIEST
    assert options.ending_offsets.for_partition(TopicPartition("t", 0)) == LATEST
    assert options.isolation is Isolation.READ_UNCOMMITTED
    assert not options.include_control
    assert options.verify_crc
    assert options.max_split_bytes == DEFAULT_MAX_SPLIT_BYTES
    assert options.trace_file_opens is None


def test_names_are_case_insensitive_as_in_spark():
    options = parse_options({"PATH": "/d", "startingoffsets": "5", "ISOLATION": "READ_COMMITTED"})
    assert options.starting_offsets.default == 5
    assert options.isolation is Isolation.READ_COMMITTED


def test_unknown_option_is_an_error_naming_it():
    with pytest.raises(ConfigError) as error:
        parse(startingOffset="5")  # missing s
    assert error.value.path == "startingOffset"
    assert "startingOffsets" in str(error.value)


def test_missing_path_is_an_error():
    with pytest.raises(ConfigError, match="no data directory"):
        parse_options({})


def test_topics_and_partitions_select():
    options = parse(topics="a, b", partitions="0,2,5-7")
    assert options.topics == {"a", "b"}
    assert options.partitions == {0, 2, 5, 6, 7}
    assert options.selects(TopicPartition("a", 6))
    assert not options.selects(TopicPartition("a", 3))
    assert not options.selects(TopicPartition("c", 0))


def test_topic_pattern_must_match_the_whole_name():
    options = parse(topicPattern=r"orders\..*")
    assert options.selects(TopicPartition("orders.eu", 0))
    assert not options.selects(TopicPartition("x-orders.eu", 0))
    with pytest.raises(ConfigError, match="regular expression"):
        parse(topicPattern="(")


@pytest.mark.parametrize("bad", ["", "x", "3-1", "-1", "1-x"])
def test_bad_partitions(bad):
    with pytest.raises(ConfigError) as error:
        parse(partitions=bad)
    assert error.value.path == "partitions"


def test_offsets_in_spark_kafka_json():
    options = parse(
        startingOffsets='{"a": {"0": 10, "1": -2}}',
        endingOffsets='{"a": {"0": 20}, "b": {"3": -1}}',
    )
    assert options.starting_offsets.for_partition(TopicPartition("a", 0)) == 10
    assert options.starting_offsets.for_partition(TopicPartition("a", 1)) == EARLIEST
    assert options.starting_offsets.for_partition(TopicPartition("a", 2)) == EARLIEST  # unnamed
    assert options.ending_offsets.for_partition(TopicPartition("a", 0)) == 20
    assert options.ending_offsets.for_partition(TopicPartition("b", 3)) == LATEST


def test_one_offset_for_every_partition():
    options = parse(startingOffsets="100", endingOffsets="200")
    assert options.starting_offsets.for_partition(TopicPartition("z", 9)) == 100
    assert options.ending_offsets.for_partition(TopicPartition("z", 9)) == 200


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("startingOffsets", "latest", "no start"),
        ("startingOffsets", '{"a": {"0": -1}}', "no start"),
        ("endingOffsets", "earliest", "no end"),
        ("startingOffsets", "{not json", "not JSON"),
        ("startingOffsets", '{"a": 5}', "expected"),
        ("startingOffsets", '{"a": {"x": 5}}', "no partition"),
        ("startingOffsets", '{"a": {"0": "5"}}', "no offset"),
        ("startingOffsets", "-3", "not an offset"),
        ("endingOffsets", "soon", "not earliest, latest"),
    ],
)
def test_bad_offsets(name, value, message):
    with pytest.raises(ConfigError, match=message) as error:
        parse(**{name: value})
    assert error.value.path == name


def test_timestamps_in_milliseconds_or_iso_8601_utc_by_default():
    assert parse(startingTimestamp="1700000000123").starting_timestamp == 1_700_000_000_123
    assert parse(endingTimestamp="2023-11-14T22:13:20").ending_timestamp == 1_700_000_000_000
    assert parse(endingTimestamp="2023-11-14T23:13:20+01:00").ending_timestamp == 1_700_000_000_000
    with pytest.raises(ConfigError, match="ISO 8601"):
        parse(startingTimestamp="yesterday")


def test_offset_and_timestamp_on_the_same_side_conflict():
    with pytest.raises(ConfigError, match="not both"):
        parse(startingOffsets="5", startingTimestamp="1")
    with pytest.raises(ConfigError, match="not both"):
        parse(endingOffsets="5", endingTimestamp="1")
    both_sides = parse(startingOffsets="5", endingTimestamp="1")
    assert both_sides.starting_offsets.default == 5 and both_sides.ending_timestamp == 1


@pytest.mark.parametrize(
    ("name", "value"),
    [("view", "rows"), ("isolation", "serializable"), ("includeControl", "maybe")],
)
def test_bad_choices(name, value):
    with pytest.raises(ConfigError) as error:
        parse(**{name: value})
    assert error.value.path == name


def test_flags_and_sizes():
    options = parse(
        view="batches",
        includeControl="true",
        verifyCrc="false",
        maxSplitBytes="4096",
        traceFileOpens="/tmp/t",
    )
    assert options.view is View.BATCHES
    assert options.include_control and not options.verify_crc
    assert options.max_split_bytes == 4096
    assert options.trace_file_opens == "/tmp/t"
    with pytest.raises(ConfigError, match="below"):
        parse(maxSplitBytes="0")
    with pytest.raises(ConfigError, match="integer"):
        parse(maxSplitBytes="1MB")


def test_stream_options_are_spark_kafka_names_and_refused_by_a_batch_read():
    from replicad.spark.options import parse_stream_options

    options = parse_stream_options(
        {
            "path": "/data",
            "maxOffsetsPerTrigger": "100",
            "minOffsetsPerTrigger": "10",
            "maxTriggerDelay": "30s",
            "maxBytesPerTrigger": "1048576",
            "failOnDataLoss": "false",
            "startingOffsets": "latest",
            "includeHeaders": "false",
        }
    )
    assert options.max_offsets_per_trigger == 100
    assert options.min_offsets_per_trigger == 10
    assert options.max_trigger_delay_ms == 30_000
    assert options.max_bytes_per_trigger == 1_048_576
    assert not options.fail_on_data_loss
    assert options.read.starting_offsets.default == LATEST
    assert not options.read.include_headers
    with pytest.raises(ConfigError) as error:
        parse(maxOffsetsPerTrigger="5")
    assert error.value.path == "maxOffsetsPerTrigger"


def test_a_stream_has_no_end_and_sane_limits():
    from replicad.spark.options import parse_stream_options

    def stream(**options: str):
        return parse_stream_options({"path": "/data", **options})

    for name in ("endingOffsets", "endingTimestamp"):
        with pytest.raises(ConfigError) as error:
            stream(**{name: "5"})
        assert error.value.path == name
    with pytest.raises(ConfigError, match="above maxOffsetsPerTrigger"):
        stream(minOffsetsPerTrigger="10", maxOffsetsPerTrigger="5")
    with pytest.raises(ConfigError, match="duration"):
        stream(maxTriggerDelay="soon")
    with pytest.raises(ConfigError, match="records view"):
        stream(view="batches")
    assert stream().max_trigger_delay_ms == 15 * 60 * 1000
