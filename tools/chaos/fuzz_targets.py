"""Fuzz targets: every decoder replicad runs on bytes it did not make, bytes in, and the one
rule each keeps -- nothing escapes except the errors that decoder documents.

| target            | feeds                                               | may raise           |
|-------------------|-----------------------------------------------------|---------------------|
| fetch-response    | Fetch v4-v17 frame -> scan_fetch_response -> session| RemoteProtocolError |
|                   | handler -> validate_fetched (the follower's path)   | (scan only)         |
| responses         | Metadata, ListOffsets, OffsetForLeaderEpoch,        | RemoteProtocolError |
|                   | ApiVersions -> decode (+ ClusterMetadata, selection, | (decode only)       |
|                   | version negotiation)                                | UnsupportedBroker.. |
| record-batches    | scan_batches, header_at, decode_batch, control      | CorruptRecordError  |
|                   | markers, validate_fetched                           | (decode_batch only) |
| legacy-messages   | the same, seeded with magic 0/1 message sets        | CorruptRecordError  |
| checkpoints       | offsets / leader-epoch / partition.metadata parsers | LogError            |
| config            | YAML text -> load_config; parsed YAML -> mapping    | ConfigError         |
| control-datagrams | control socket requests and reply chunks            | ControlError        |

The first byte of a fetch-response or responses input picks the API version (and the
API), the rest is the frame body; so one byte string is one input for atheris and
hypothesis alike. `seeds(name)` gives well-formed inputs to mutate.

Beyond "no unexpected exception", what the follower would write is checked: the data
`validate_fetched` keeps is whole batches that pass their CRC, with offsets moving
forward -- a corrupt byte is never kept.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from replicad.config import load_config
from replicad.config.loader import config_from_mapping
from replicad.control.protocol import (
    ReplyAssembler,
    decode_request,
    encode_reply,
    encode_request,
    ok_reply,
    request_id_of,
)
from replicad.errors import (
    ConfigError,
    ControlError,
    CorruptRecordError,
    LogError,
    RemoteProtocolError,
)
from replicad.follower.fetch_response import FetchResponseView, scan_fetch_response
from replicad.follower.validate import validate_fetched
from replicad.log.checkpoint import (
    EpochEntry,
    format_epochs,
    format_offsets,
    format_partition_metadata,
    parse_epochs,
    parse_offsets,
    parse_partition_metadata,
)
from replicad.protocol.apis import ApiKey, UnsupportedBrokerError, VersionRange, negotiate
from replicad.protocol.codec import decode_response, encode_entities, response_type
from replicad.protocol.error_codes import error_code_of
from replicad.protocol.metadata import ClusterMetadata, TopicSelection
from replicad.protocol.requests import make_entity, nested_type
from replicad.records.batch import (
    Compression,
    ScanStop,
    header_at,
    scan_batches,
)
from replicad.records.records import ControlType, control_marker, decode_batch
from replicad.session.client import FetchSessionHandler
from replicad.session.metadata import PartitionFetch
from replicad.types import TopicPartition
from tools.chaos.isolate import Outcome, run_batch
from tools.chaos.wire_data import (
    BrokerEntry,
    PartitionAnswer,
    fetch_response_body,
    metadata_response_body,
)
from tools.logdata.batches import batch_stream, control_batch, legacy_message_set

FETCH_VERSIONS = tuple(range(4, 18))
RESPONSE_APIS: tuple[tuple[ApiKey, tuple[int, ...]], ...] = (
    (ApiKey.METADATA, tuple(range(4, 13))),
    (ApiKey.LIST_OFFSETS, tuple(range(1, 10))),
    (ApiKey.OFFSET_FOR_LEADER_EPOCH, tuple(range(2, 5))),
    (ApiKey.API_VERSIONS, tuple(range(0, 4))),
)
# The partitions the fuzzed follower asks for; the seeds answer for these.
TOPICS = {"orders": 3, "audit": 4}
TOPIC_IDS = {name: uuid.uuid5(uuid.NAMESPACE_URL, name) for name in TOPICS}
WANTED_OFFSET = 0


class FuzzFinding(AssertionError):
    """A decoder broke its rule: kept corrupt data, or returned something inconsistent."""


# -- fetch responses: the follower's whole path ---------------------------------------------


def fetch_response(data: bytes) -> None:
    if not data:
        return
    version = FETCH_VERSIONS[data[0] % len(FETCH_VERSIONS)]
    try:
        view = scan_fetch_response(memoryview(data[1:]), version)
    except RemoteProtocolError:
        return
    follow_fetch_response(version, view)


def _wanted(use_ids: bool) -> dict[TopicPartition, PartitionFetch]:
    return {
        TopicPartition(topic, p): PartitionFetch(
            fetch_offset=WANTED_OFFSET,
            log_start_offset=0,
            max_bytes=1 << 20,
            topic_id=TOPIC_IDS[topic] if use_ids else None,
        )
        for topic, count in TOPICS.items()
        for p in range(count)
    }


def follow_fetch_response(version: int, body: FetchResponseView) -> None:
    """What the follower does with a scanned Fetch response (replicad.follower.fetcher's
    _handle_response and _process_partition, minus the log): judge it with the session
    handler, then validate each partition's records. Nothing here may raise."""
    use_ids = version >= 13
    handler = FetchSessionHandler(1)
    plan = handler.build_request(_wanted(use_ids))
    entries: list[tuple[TopicPartition, Any]] = []
    seen_ids: list[Any] = []
    for topic in body.responses:
        if use_ids:
            seen_ids.append(topic.topic_id)
            name = plan.topic_names.get(topic.topic_id)
        else:
            name = topic.topic
        if name is None:
            continue
        for pd in topic.partitions:
            entries.append((TopicPartition(name, int(pd.partition_index)), pd))
    verdict = handler.handle_response(
        plan,
        error_code=body.error_code,
        session_id=body.session_id,
        partitions=[tp for tp, _ in entries],
        now_ms=0,
        throttle_time_ms=body.throttle_time_ms,
        topic_ids=seen_ids,
    )
    handler.build_request(_wanted(use_ids))  # the next plan follows from any verdict
    if not verdict.accepted:
        return
    for _, pd in entries:
        error_code_of(pd.error_code)  # as the fetcher reads it: unknown codes included
        int(pd.diverging_epoch.epoch), int(pd.diverging_epoch.end_offset)
        int(pd.high_watermark), int(pd.log_start_offset)
        check_kept(pd.records, fetch_offset=WANTED_OFFSET, log_is_empty=True)


def check_kept(records: bytes | None, *, fetch_offset: int, log_is_empty: bool) -> None:
    """validate_fetched, and what it keeps is whole CRC-valid batches moving forward."""
    fetched = validate_fetched(records, fetch_offset=fetch_offset, log_is_empty=log_is_empty)
    kept = bytes(fetched.data)
    rescan = scan_batches(kept)
    if rescan.stop is not ScanStop.END or rescan.valid_bytes != len(kept):
        raise FuzzFinding(f"validate_fetched kept bytes that do not scan clean: {rescan}")
    if len(rescan.batches) != len(fetched.batches):
        raise FuzzFinding("validate_fetched's batch list does not match its data")
    expected = fetched.restart_at if fetched.restart_at is not None else fetch_offset
    for batch in rescan.batches:
        if batch.base_offset < expected:
            raise FuzzFinding(f"kept batch at {batch.base_offset} below {expected}")
        expected = batch.next_offset
    if fetched.batches and fetched.next_fetch_offset != expected:
        raise FuzzFinding(f"next fetch offset {fetched.next_fetch_offset} != {expected}")


# -- other responses ----------------------------------------------------------------------------


def responses(data: bytes) -> None:
    if len(data) < 2:
        return
    api, versions = RESPONSE_APIS[data[0] % len(RESPONSE_APIS)]
    version = versions[data[1] % len(versions)]
    try:
        decoded = decode_response(data[2:], response_type(api, version))
    except RemoteProtocolError:
        return
    body = decoded.body
    if api is ApiKey.METADATA:
        cluster = ClusterMetadata.from_response(body)
        for selection in (
            TopicSelection(include=tuple(TOPICS)),
            TopicSelection(regex="orders|au.*"),
        ):
            selection.partitions(cluster)
            selection.missing(cluster)
    elif api is ApiKey.API_VERSIONS:
        ranges = {
            int(k.api_key): VersionRange(int(k.min_version), int(k.max_version))
            for k in body.api_keys
        }
        with contextlib.suppress(UnsupportedBrokerError):
            negotiate(ranges)
    elif api is ApiKey.LIST_OFFSETS:
        for topic in body.topics:
            for p in topic.partitions:
                ErrorCode(p.error_code), int(p.offset)
    else:
        for topic in body.topics:
            for p in topic.partitions:
                ErrorCode(p.error_code), int(p.leader_epoch), int(p.end_offset)


# -- record batches and legacy message sets -----------------------------------------------------


def record_batches(data: bytes) -> None:
    scan = scan_batches(data)
    if scan.valid_bytes > len(data):
        raise FuzzFinding(f"valid_bytes {scan.valid_bytes} beyond {len(data)}")
    position = 0
    for header in scan.batches:
        if header.position != position:
            raise FuzzFinding(f"batch at {header.position}, expected {position}")
        position = header.end_position
        try:
            decoded = decode_batch(data, header)
        except CorruptRecordError:
            continue
        if header.is_control:
            for record in decoded.records:
                with contextlib.suppress(CorruptRecordError):
                    control_marker(record)
    if position != scan.valid_bytes:
        raise FuzzFinding(f"batches end at {position}, valid_bytes {scan.valid_bytes}")
    header_at(data[:64], 0)
    first = scan.batches[0].base_offset if scan.batches else 0
    check_kept(data, fetch_offset=first, log_is_empty=False)
    check_kept(data, fetch_offset=first + 1, log_is_empty=True)


# -- checkpoints --------------------------------------------------------------------------------


# Each checkpoint format: its parser, its formatter, its name in a finding.
CHECKPOINT_FORMATS: tuple[tuple[Callable[..., Any], Callable[[Any], str], str], ...] = (
    (parse_offsets, format_offsets, "offset checkpoint"),
    (parse_epochs, format_epochs, "epoch checkpoint"),
    (parse_partition_metadata, format_partition_metadata, "partition.metadata"),
)


def checkpoints(data: bytes) -> None:
    """Any text is parsed by every checkpoint format: a LogError, or a value that
    round-trips through the formatter."""
    text = data.decode("utf-8", errors="surrogateescape")
    for parse, format_, name in CHECKPOINT_FORMATS:
        try:
            parsed = parse(text, source="fuzz")
        except LogError:
            continue
        if parse(format_(parsed), source="again") != parsed:
            raise FuzzFinding(f"{name} does not round-trip")


# -- config -------------------------------------------------------------------------------------


@cache
def _scratch_dir() -> Path:
    """A directory for the config files, removed when this process exits."""
    path = Path(tempfile.mkdtemp(prefix="replicad-fuzz-config-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def config_text(data: bytes) -> None:
    """A config file with these bytes: only ConfigError may come out."""
    path = _scratch_dir() / f"c-{os.getpid()}.yaml"
    path.write_bytes(data)
    with contextlib.suppress(ConfigError):
        load_config(path)


def config_mapping(raw: object) -> None:
    """An already-parsed structure (what a YAML file could hold)."""
    with contextlib.suppress(ConfigError):
        config_from_mapping(raw)  # type: ignore[arg-type]


def config(data: bytes) -> None:
    config_text(data)
    import yaml

    try:
        parsed = yaml.safe_load(data)
    except yaml.YAMLError:
        return
    config_mapping(parsed)


# -- control socket -----------------------------------------------------------------------------


def control_datagrams(data: bytes) -> None:
    with contextlib.suppress(ControlError):
        decode_request(data)
    request_id_of(data)
    assembler = ReplyAssembler(request_id=7)
    for piece in (data, *data.split(b"\0")):
        with contextlib.suppress(ControlError):
            assembler.feed(piece)


# -- registry and seeds -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FuzzTarget:
    name: str
    run: Callable[[bytes], None]
    seeds: Callable[[], list[bytes]]


def _fetch_seeds() -> list[bytes]:
    seeds = []
    codecs = list(Compression)
    for i, version in enumerate(FETCH_VERSIONS):
        answers = []
        for topic, count in TOPICS.items():
            for p in range(count):
                data = b"".join(
                    batch_stream(i * 10 + p, 2 + p % 3, codecs=[codecs[(i + p) % len(codecs)]])
                )
                if p == 1:
                    data += data[:30]  # a partial tail, as KIP-74 allows
                answers.append(
                    PartitionAnswer(
                        topic, p, data or None, high_watermark=100, topic_id=TOPIC_IDS[topic]
                    )
                )
        seeds.append(bytes([i]) + fetch_response_body(version, answers, session_id=i))
        seeds.append(bytes([i]) + fetch_response_body(version, answers[:2], error_code=70))
    return seeds


def _response_seeds() -> list[bytes]:
    seeds = []
    for api_index, (api, versions) in enumerate(RESPONSE_APIS):
        for version_index, version in enumerate(versions):
            if api is ApiKey.METADATA:
                body = metadata_response_body(
                    version,
                    [BrokerEntry(1, "127.0.0.1", 9092), BrokerEntry(2, "::1", 9093)],
                    list(TOPICS.items()),
                )
            else:
                body = _minimal_response(api, version)
            seeds.append(bytes([api_index, version_index]) + body)
    return seeds


def _minimal_response(api: ApiKey, version: int) -> bytes:
    cls = response_type(api, version)
    if api is ApiKey.API_VERSIONS:
        key_cls = nested_type(cls, "ApiVersion")
        body = make_entity(
            cls,
            error_code=ErrorCode.none,
            api_keys=tuple(
                make_entity(key_cls, api_key=int(k), min_version=0, max_version=17)
                for k in (ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.METADATA)
            ),
            throttle_time=datetime.timedelta(0),
        )
    elif api is ApiKey.LIST_OFFSETS:
        body = _one_partition_response(
            cls,
            ("ListOffsetsTopicResponse", "name"),
            "ListOffsetsPartitionResponse",
            partition_index=0,
            error_code=ErrorCode.none,
            timestamp=-1,
            offset=42,
            leader_epoch=0,
            old_style_offsets=(42,),
        )
    else:
        body = _one_partition_response(
            cls,
            ("OffsetForLeaderTopicResult", "topic"),
            "EpochEndOffset",
            error_code=ErrorCode.none,
            partition=0,
            leader_epoch=3,
            end_offset=99,
        )
    return encode_entities(cls.__header_schema__(correlation_id=1), body)


def _one_partition_response(
    cls: type, topic: tuple[str, str], partition_type: str, **partition: Any
) -> Any:
    """A response of one topic, "orders" (`topic`: its entity's name and the field that
    names it), holding one partition entity with the fields given."""
    topic_type, name_field = topic
    return make_entity(
        cls,
        throttle_time=datetime.timedelta(0),
        topics=(
            make_entity(
                nested_type(cls, topic_type),
                **{name_field: "orders"},
                partitions=(make_entity(nested_type(cls, partition_type), **partition),),
            ),
        ),
    )


def _batch_seeds() -> list[bytes]:
    seeds = [
        b"".join(batch_stream(seed, 4, codecs=[codec])) for seed, codec in enumerate(Compression)
    ]
    seeds.append(b"".join(batch_stream(9, 3, gap_every=1)))
    stream = batch_stream(11, 3)
    end = scan_batches(stream[-1]).batches[0].next_offset
    commit = control_batch(end, producer_id=7, coordinator_epoch=5)
    seeds.append(b"".join([*stream, commit]))
    abort = control_batch(0, producer_id=7, control_type=ControlType.ABORT, coordinator_epoch=5)
    seeds.append(abort)
    return seeds


def _legacy_seeds() -> list[bytes]:
    seeds = []
    for magic in (0, 1):
        for codec in (Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4):
            if magic == 0 and codec is Compression.LZ4:
                continue  # Kafka never wrote magic 0 LZ4 that anyone can read back
            seeds.append(
                legacy_message_set(10, [b"alpha", None, b"gamma" * 20], magic=magic, codec=codec)
                + legacy_message_set(13, [b"delta"], magic=magic)
            )
    return seeds


def _checkpoint_seeds() -> list[bytes]:
    offsets = {TopicPartition("orders", 0): 1500, TopicPartition("audit-log", 12): 0}
    return [
        format_offsets(offsets).encode(),
        format_epochs([EpochEntry(0, 0), EpochEntry(3, 1200)]).encode(),
        format_partition_metadata(TOPIC_IDS["orders"]).encode(),
        b"0\n0\n",
    ]


def _config_seeds() -> list[bytes]:
    example = Path(__file__).resolve().parents[2] / "config" / "replicad.yaml"
    seeds = [
        b"source:\n  bootstrap_servers: ['127.0.0.1:9092']\ntopics:\n  include: [orders]\n",
        b"fetch:\n  response_max_bytes: 1048576\n  sessions: false\nlog:\n  segment_bytes: 1024\n",
        b"serve:\n  listen: '0.0.0.0:9092'\n",
    ]
    if example.exists():
        seeds.append(example.read_bytes())
    return seeds


def _control_seeds() -> list[bytes]:
    return [
        encode_request("status", 7),
        encode_request("reload", 7, {"why": "test"}),
        *encode_reply(7, ok_reply({"partitions": list(range(50))})),
        json.dumps({"id": 7, "seq": 0, "total": 1}).encode() + b"\n{}",
    ]


TARGETS: dict[str, FuzzTarget] = {
    t.name: t
    for t in (
        FuzzTarget("fetch-response", fetch_response, _fetch_seeds),
        FuzzTarget("responses", responses, _response_seeds),
        FuzzTarget("record-batches", record_batches, _batch_seeds),
        FuzzTarget("legacy-messages", record_batches, _legacy_seeds),
        FuzzTarget("checkpoints", checkpoints, _checkpoint_seeds),
        FuzzTarget("config", config, _config_seeds),
        FuzzTarget("control-datagrams", control_datagrams, _control_seeds),
    )
}


@cache
def seeds(name: str) -> tuple[bytes, ...]:
    return tuple(TARGETS[name].seeds())


# -- running inputs, with the known findings set apart -------------------------------------

# Findings reported and pinned by an xfail test: a fuzz run counts them apart, so that it
# still fails on anything new. None is open. (kio's native abort on a huge length prefix is
# guarded by replicad.protocol.frame_guard, and Fetch responses are read by the follower's
# own scanner; null compact arrays are refused as RemoteProtocolError.)
KNOWN_FINDINGS: dict[str, tuple[Callable[[Outcome], bool], str]] = {}


@dataclass(frozen=True, slots=True)
class FuzzReport:
    target: str
    inputs: int
    unexpected: tuple[Outcome, ...]
    known: tuple[Outcome, ...]

    def describe(self, inputs: Sequence[bytes]) -> str:
        lines = [
            f"{self.target}: {self.inputs} inputs, {len(self.unexpected)} unexpected, "
            f"{len(self.known)} known findings"
        ]
        for outcome in self.unexpected[:5]:
            data = inputs[outcome.index]
            lines.append(f"--- input {outcome.index} ({len(data)} bytes): {data[:200].hex()}")
            lines.append(
                f"{outcome.kind} (signal {outcome.signal_number}): {outcome.detail[-3000:]}"
            )
        return "\n".join(lines)


def fuzz_inputs(name: str, inputs: Sequence[bytes]) -> FuzzReport:
    """Run `inputs` through target `name`, each in a forked child (crashes are findings)."""
    failures = run_batch(TARGETS[name].run, inputs)
    known_check = KNOWN_FINDINGS.get(name)
    known = tuple(f for f in failures if known_check is not None and known_check[0](f))
    unexpected = tuple(f for f in failures if f not in known)
    return FuzzReport(name, len(inputs), unexpected, known)
