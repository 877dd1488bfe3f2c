"""Options of the `replicad` Spark data source, parsed and checked once, on the driver.

Rules:
- Names and conventions follow Spark's own Kafka source where it has the option:
  `startingOffsets` / `endingOffsets` are "earliest", "latest", one offset for every
  partition, or JSON per topic and partition (`{"orders": {"0": 42, "1": -2}}`) with -2 for
  earliest and -1 for latest; an ending offset is exclusive. `startingTimestamp` /
  `endingTimestamp` (epoch milliseconds, or ISO 8601 with UTC assumed when no zone is
  given) become, per partition, the first offset whose record timestamp is >= the value
  (Kafka's offsetsForTimes); none means the log end.
- An offset bound and a timestamp bound on the same side are an error, not a precedence
  rule nobody remembers.
- Every option name is checked: a misspelt filter would otherwise read everything.
  Names are case-insensitive, as Spark's are.
- Problems raise ConfigError naming the option.
- Streaming (`spark.readStream`, stream.py) takes the same names plus the limits of Spark's
  Kafka source (`maxOffsetsPerTrigger`, `minOffsetsPerTrigger` with `maxTriggerDelay`,
  `failOnDataLoss`) and `maxBytesPerTrigger`; those are refused by a batch read, and
  `endingOffsets` / `endingTimestamp` by a stream (it has no end), as Spark's Kafka source
  does. A stream may start at "latest".
- `includeHeaders` (Spark's Kafka source has it, default false there): the `headers` column
  is in the table unless it is false -- our batch table has always had it.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from replicad.errors import ConfigError
from replicad.types import TopicPartition

# Spark's Kafka source conventions for offsets in JSON.
EARLIEST = -2
LATEST = -1
# Spark's own default for file sources (spark.sql.files.maxPartitionBytes).
DEFAULT_MAX_SPLIT_BYTES = 128 * 1024 * 1024
MIN_SPLIT_BYTES = 1
OPTION_LOCATION = "spark option"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_E = TypeVar("_E", bound=enum.Enum)


class View(enum.Enum):
    RECORDS = "records"  # one row per record (the table people query)
    BATCHES = "batches"  # one row per batch, and one per problem found (what verify reads)


class Isolation(enum.Enum):
    READ_UNCOMMITTED = "read_uncommitted"
    READ_COMMITTED = "read_committed"


@dataclass(frozen=True, slots=True)
class OffsetBound:
    """One side of the offset range: a default for every partition, overridden per partition."""

    default: int
    per_partition: tuple[tuple[TopicPartition, int], ...] = ()

    def for_partition(self, tp: TopicPartition) -> int:
        for named, offset in self.per_partition:
            if named == tp:
                return offset
        return self.default


@dataclass(frozen=True, slots=True)
class ReadOptions:
    data_dir: str
    view: View = View.RECORDS
    topics: frozenset[str] | None = None
    topic_pattern: str | None = None
    partitions: frozenset[int] | None = None
    starting_offsets: OffsetBound = field(default_factory=lambda: OffsetBound(EARLIEST))
    ending_offsets: OffsetBound = field(default_factory=lambda: OffsetBound(LATEST))
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None
    isolation: Isolation = Isolation.READ_UNCOMMITTED
    include_control: bool = False
    verify_crc: bool = True
    max_split_bytes: int = DEFAULT_MAX_SPLIT_BYTES
    include_headers: bool = True
    # Diagnostics: append "<purpose>\t<path>" for every file the source opens.
    trace_file_opens: str | None = None
    # A bucket path's S3 endpoint and region (None: the AWS configuration's, e.g.
    # AWS_ENDPOINT_URL and AWS_DEFAULT_REGION); credentials only ever come from there.
    s3_endpoint: str | None = None
    s3_region: str | None = None

    def selects(self, tp: TopicPartition) -> bool:
        if self.topics is not None and tp.topic not in self.topics:
            return False
        if self.topic_pattern is not None and re.fullmatch(self.topic_pattern, tp.topic) is None:
            return False
        return self.partitions is None or tp.partition in self.partitions


# Option names as users write them -> the parser of each.
OPTION_NAMES = (
    "path",
    "view",
    "topics",
    "topicPattern",
    "partitions",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "isolation",
    "includeControl",
    "verifyCrc",
    "maxSplitBytes",
    "traceFileOpens",
    "includeHeaders",
    "s3Endpoint",
    "s3Region",
)
# Only for spark.readStream.
STREAM_OPTION_NAMES = (
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "maxBytesPerTrigger",
    "failOnDataLoss",
)
BATCH_ONLY_OPTION_NAMES = ("endingOffsets", "endingTimestamp")
_CANONICAL = {name.lower(): name for name in (*OPTION_NAMES, *STREAM_OPTION_NAMES)}
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000  # Spark's Kafka source: 15m
_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """A stream's options: what each micro-batch reads (`read`, its offsets set per batch)
    and how much it may take (admission.py)."""

    read: ReadOptions
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    max_bytes_per_trigger: int | None = None
    fail_on_data_loss: bool = True


def _error(name: str, message: str) -> ConfigError:
    return ConfigError(name, message, location=OPTION_LOCATION)


def _given(
    raw: Mapping[str, str], known: tuple[str, ...], refused: tuple[str, ...], kind: str
) -> dict[str, str]:
    given: dict[str, str] = {}
    for key, value in raw.items():
        name = _CANONICAL.get(key.lower())
        if name is None:
            raise _error(key, f"unknown option (known: {', '.join(known)})")
        if name in refused:
            raise _error(name, f"not an option of a {kind}")
        given[name] = str(value)
    return given


def parse_options(raw: Mapping[str, str]) -> ReadOptions:
    """ReadOptions from Spark's option map (`path` is what `load(PATH)` sets)."""
    given = _given(raw, OPTION_NAMES, STREAM_OPTION_NAMES, "batch read (only of readStream)")
    return _read_options(given, stream=False)


def table_options(raw: Mapping[str, str]) -> tuple[View, bool]:
    """The view and includeHeaders, which decide the table's schema (the rest is the
    reader's to check)."""
    every = (*OPTION_NAMES, *STREAM_OPTION_NAMES)
    given = _given(raw, every, (), "read")  # a misspelt name fails at analysis already
    return _enum(given, "view", View, View.RECORDS), _bool(given, "includeHeaders", True)


def parse_stream_options(raw: Mapping[str, str]) -> StreamOptions:
    """StreamOptions from the option map of `spark.readStream`."""
    every = (*OPTION_NAMES, *STREAM_OPTION_NAMES)
    names = tuple(n for n in every if n not in BATCH_ONLY_OPTION_NAMES)
    given = _given(raw, names, BATCH_ONLY_OPTION_NAMES, "stream (a stream has no end)")
    minimum = _optional_int(given, "minOffsetsPerTrigger")
    maximum = _optional_int(given, "maxOffsetsPerTrigger")
    if minimum is not None and maximum is not None and minimum > maximum:
        raise _error("minOffsetsPerTrigger", f"{minimum} is above maxOffsetsPerTrigger {maximum}")
    read = _read_options(given, stream=True)
    if read.view is not View.RECORDS:
        raise _error("view", "a stream reads the records view only")
    return StreamOptions(
        read=read,
        max_offsets_per_trigger=maximum,
        min_offsets_per_trigger=minimum,
        max_trigger_delay_ms=_duration_ms(given, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
        max_bytes_per_trigger=_optional_int(given, "maxBytesPerTrigger"),
        fail_on_data_loss=_bool(given, "failOnDataLoss", True),
    )


def _optional_int(given: dict[str, str], name: str) -> int | None:
    return _int(given, name, 0, 1) if name in given else None


def _duration_ms(given: dict[str, str], name: str, default: int) -> int:
    """Spark's duration strings: "15m", "30s", "500ms", "1h"; a bare number is milliseconds."""
    if name not in given:
        return default
    text = given[name].strip().lower()
    match = re.fullmatch(r"(\d+)\s*([a-z]*)", text)
    unit = match.group(2) if match else None
    if match is None or (unit and unit not in _DURATION_UNITS_MS):
        raise _error(name, f"{given[name]!r} is not a duration such as 500ms, 30s, 15m or 1h")
    return int(match.group(1)) * _DURATION_UNITS_MS.get(unit or "ms", 1)


def _read_options(given: dict[str, str], *, stream: bool) -> ReadOptions:
    data_dir = given.get("path", "")
    if not data_dir:
        raise _error("path", 'no data directory: use .load("/path/to/replicad/data")')
    starting_timestamp = _timestamp(given, "startingTimestamp")
    ending_timestamp = _timestamp(given, "endingTimestamp")
    if starting_timestamp is not None and "startingOffsets" in given:
        raise _error("startingTimestamp", "give startingOffsets or startingTimestamp, not both")
    if ending_timestamp is not None and "endingOffsets" in given:
        raise _error("endingTimestamp", "give endingOffsets or endingTimestamp, not both")
    starting_offsets = _offsets(given, "startingOffsets", EARLIEST)
    ending_offsets = _offsets(given, "endingOffsets", LATEST)
    # A batch read has a fixed range: as in Spark's Kafka source, it cannot start at the
    # end nor end at the start.
    if not stream and LATEST in _values(starting_offsets):
        raise _error("startingOffsets", "latest (-1) is no start for a batch read")
    if EARLIEST in _values(ending_offsets):
        raise _error("endingOffsets", "earliest (-2) is no end for a batch read")
    pattern = given.get("topicPattern")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise _error("topicPattern", f"not a regular expression: {exc}") from exc
    return ReadOptions(
        data_dir=data_dir,
        view=_enum(given, "view", View, View.RECORDS),
        topics=_topics(given),
        topic_pattern=pattern,
        partitions=_partitions(given),
        starting_offsets=starting_offsets,
        ending_offsets=ending_offsets,
        starting_timestamp=starting_timestamp,
        ending_timestamp=ending_timestamp,
        isolation=_enum(given, "isolation", Isolation, Isolation.READ_UNCOMMITTED),
        include_control=_bool(given, "includeControl", False),
        verify_crc=_bool(given, "verifyCrc", True),
        max_split_bytes=_int(given, "maxSplitBytes", DEFAULT_MAX_SPLIT_BYTES, MIN_SPLIT_BYTES),
        include_headers=_bool(given, "includeHeaders", True),
        trace_file_opens=given.get("traceFileOpens") or None,
        s3_endpoint=given.get("s3Endpoint") or None,
        s3_region=given.get("s3Region") or None,
    )


def _values(bound: OffsetBound) -> set[int]:
    return {bound.default, *(offset for _, offset in bound.per_partition)}


def _enum(given: dict[str, str], name: str, kind: type[_E], default: _E) -> _E:
    if name not in given:
        return default
    text = given[name].strip().lower()
    for member in kind:
        if member.value == text:
            return member
    choices = ", ".join(str(m.value) for m in kind)
    raise _error(name, f"{given[name]!r} is not one of {choices}")


def _bool(given: dict[str, str], name: str, default: bool) -> bool:
    if name not in given:
        return default
    text = given[name].strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise _error(name, f"{given[name]!r} is not true or false")


def _int(given: dict[str, str], name: str, default: int, minimum: int) -> int:
    if name not in given:
        return default
    try:
        value = int(given[name])
    except ValueError as exc:
        raise _error(name, f"{given[name]!r} is not an integer") from exc
    if value < minimum:
        raise _error(name, f"{value} is below {minimum}")
    return value


def _topics(given: dict[str, str]) -> frozenset[str] | None:
    if "topics" not in given:
        return None
    names = frozenset(t.strip() for t in given["topics"].split(",") if t.strip())
    if not names:
        raise _error("topics", "no topic named")
    return names


def _partitions(given: dict[str, str]) -> frozenset[int] | None:
    """ "0,2,5-7" -> {0, 2, 5, 6, 7}."""
    if "partitions" not in given:
        return None
    chosen: set[int] = set()
    for part in given["partitions"].split(","):
        part = part.strip()
        if not part:
            continue
        low, sep, high = part.partition("-")
        try:
            first = int(low)
            last = int(high) if sep else first
        except ValueError as exc:
            raise _error("partitions", f"{part!r} is not a partition or a range a-b") from exc
        if first < 0 or last < first:
            raise _error("partitions", f"{part!r} is not a partition or a range a-b")
        chosen.update(range(first, last + 1))
    if not chosen:
        raise _error("partitions", "no partition named")
    return frozenset(chosen)


def _offsets(given: dict[str, str], name: str, default: int) -> OffsetBound:
    if name not in given:
        return OffsetBound(default)
    text = given[name].strip()
    if text.lower() == "earliest":
        return OffsetBound(EARLIEST)
    if text.lower() == "latest":
        return OffsetBound(LATEST)
    if not text.startswith("{"):
        return OffsetBound(_offset_value(name, text))
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _error(name, f"not JSON: {exc}") from exc
    pairs: list[tuple[TopicPartition, int]] = []
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise _error(name, f'topic {topic!r}: expected {{"partition": offset}}')
        for partition, offset in partitions.items():
            try:
                number = int(partition)
            except ValueError as exc:
                raise _error(name, f"topic {topic!r}: {partition!r} is no partition") from exc
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise _error(name, f"{topic}-{partition}: {offset!r} is no offset")
            pairs.append((TopicPartition(topic, number), _offset_value(name, str(offset))))
    return OffsetBound(default, tuple(pairs))


def _offset_value(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise _error(name, f"{text!r} is not earliest, latest, an offset or JSON") from exc
    if value < EARLIEST:
        raise _error(name, f"{value} is not an offset (-2 earliest, -1 latest, or >= 0)")
    return value


def _timestamp(given: dict[str, str], name: str) -> int | None:
    if name not in given:
        return None
    text = given[name].strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise _error(name, f"{text!r} is neither epoch milliseconds nor ISO 8601") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(milliseconds=1)
