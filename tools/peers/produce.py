"""Realistic data in a topic, written and read back by a real client (confluent-kafka).

`produce_mixed` writes a deterministic mix per seed: every codec, with and
without headers, null keys and null values, small to 32 KiB values, plain,
idempotent and transactional producers, with transactions both committed and
aborted (so the log holds commit and abort markers). `consume_all` reads a
topic back with a real consumer. `read_broker_batches` (from
`tools.peers.segments`) gives the broker's own batch bytes for byte-identity.

The data is produced in rounds. A round is one producer (one codec, one kind)
sending a few hundred to a few thousand records to the topic's partitions and
flushing, and, when transactional, committing or aborting. Rounds run one after
another, so in every partition the offsets of the records are fixed by the
seed: record contents, order and offsets repeat exactly for the same seed
(only timestamps and how the client cuts batches differ). The offsets in the
summary come from the broker's acknowledgements, not from arithmetic.
Nothing else may write to the topic while `produce_mixed` runs.
"""

from __future__ import annotations

import hashlib
import random
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
)
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient

from tools.peers.admin import admin_client, latest_offsets, librdkafka_log
from tools.peers.process import PeerError
from tools.peers.segments import BrokerBatch, broker_batches, read_broker_batches

__all__ = [
    "CODECS",
    "BrokerBatch",
    "ConsumedRecord",
    "PartitionSummary",
    "ProduceSummary",
    "broker_batches",
    "consume_all",
    "produce_mixed",
    "read_broker_batches",
    "records_digest",
]

CODECS: tuple[str, ...] = ("none", "gzip", "snappy", "lz4", "zstd")
READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"

# A round's size: big enough that every partition gets a compressible batch
# (librdkafka sends a batch uncompressed when compressing would not shrink it).
MIN_ROUND_RECORDS = 200
MAX_ROUND_RECORDS = 3000
GUARANTEED_PER_PARTITION = 25
NULL_KEY_SHARE = 0.10
NULL_VALUE_SHARE = 0.05
HEADERS_SHARE = 0.30
KEY_SPACE = 1000
GZIP_LEVEL = 1
FLUSH_TIMEOUT_S = 60.0
TXN_TIMEOUT_S = 30.0
# Between two ListOffsets rounds while a transaction's markers are not all written yet.
MARKER_POLL_S = 0.02

_WORDS = (
    *("order", "payment", "refund", "invoice", "customer", "account", "session", "click"),
    *("view", "cart", "checkout", "shipment", "warehouse", "region", "europe", "america"),
    *("asia", "pending", "settled", "failed", "retry", "alpha", "beta", "gamma", "delta"),
    *("kafka", "replica", "leader", "follower", "segment", "offset", "epoch", "batch"),
)


class RoundKind(Enum):
    """How a round's records reach the log."""

    PLAIN = "plain"  # non-idempotent producer: producer id -1 in the batch
    IDEMPOTENT = "idempotent"  # producer id and sequence numbers, no transaction
    COMMIT = "commit"  # transactional, then a commit marker in each touched partition
    ABORT = "abort"  # transactional, then an abort marker in each touched partition

    @property
    def transactional(self) -> bool:
        return self in (RoundKind.COMMIT, RoundKind.ABORT)


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    """One record as a consumer sees it; also what `produce_mixed` digests."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


def records_digest(records: Iterable[ConsumedRecord]) -> str:
    """SHA-256 over offsets, keys, values and headers (not timestamps), in the given order.

    `produce_mixed` keeps this digest instead of the records themselves, so
    200,000 records cost no memory to compare with what a consumer reads.
    """
    digest = hashlib.sha256()
    for record in records:
        _digest_record(digest, record.offset, record.key, record.value, record.headers)
    return digest.hexdigest()


def _digest_record(
    digest: hashlib._Hash,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
) -> None:
    # Lengths (-1 for null) keep field boundaries unambiguous.
    def put(blob: bytes | None) -> None:
        if blob is None:
            digest.update(b"\xff\xff\xff\xff")
        else:
            digest.update(len(blob).to_bytes(4, "big"))
            digest.update(blob)

    digest.update(offset.to_bytes(8, "big", signed=True))
    put(key)
    put(value)
    digest.update(len(headers).to_bytes(4, "big"))
    for name, header_value in headers:
        put(name.encode())
        put(header_value)


@dataclass(frozen=True, slots=True)
class PartitionSummary:
    """What `produce_mixed` put into one partition, as the broker acknowledged it."""

    partition: int
    records: int  # every data record written, aborted ones included
    committed_records: int  # records of committed transactions
    aborted_records: int  # records of aborted transactions
    commit_markers: int
    abort_markers: int
    log_end_offset: int  # next offset: records + markers (+ what was there before)
    records_by_codec: Mapping[str, int]  # by the codec asked of the producer
    # Digests (records_digest) of what a consumer must read back, in offset order.
    committed_digest: str  # read_committed: everything but aborted records
    uncommitted_digest: str  # read_uncommitted: every data record

    @property
    def visible_records(self) -> int:
        """Records a read_committed consumer sees."""
        return self.records - self.aborted_records

    @property
    def last_offset(self) -> int:
        """Offset of the last entry (record or marker); -1 for an empty partition."""
        return self.log_end_offset - 1


@dataclass(frozen=True, slots=True)
class ProduceSummary:
    """What `produce_mixed` produced, per partition."""

    topic: str
    seed: int
    partitions: tuple[PartitionSummary, ...]  # index = partition number
    rounds: int
    elapsed_s: float

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions)

    @property
    def commit_markers(self) -> int:
        return sum(p.commit_markers for p in self.partitions)

    @property
    def abort_markers(self) -> int:
        return sum(p.abort_markers for p in self.partitions)

    @property
    def log_end_offsets(self) -> dict[int, int]:
        return {p.partition: p.log_end_offset for p in self.partitions}


@dataclass(frozen=True, slots=True)
class _Record:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True, slots=True)
class _Round:
    codec: str
    kind: RoundKind
    records: tuple[_Record, ...]


@dataclass
class _PartitionTally:
    records: int = 0
    committed: int = 0
    aborted: int = 0
    commit_markers: int = 0
    abort_markers: int = 0
    log_end_offset: int = 0
    by_codec: dict[str, int] = field(default_factory=dict)
    committed_digest: hashlib._Hash = field(default_factory=hashlib.sha256)
    uncommitted_digest: hashlib._Hash = field(default_factory=hashlib.sha256)


# -- data generation ------------------------------------------------------------------


def _value(rng: random.Random, n: int) -> bytes | None:
    roll = rng.random()
    if roll < NULL_VALUE_SHARE:
        return None
    if roll < 0.80:  # small JSON events: the bulk of real topics
        words = rng.choices(_WORDS, k=rng.randint(1, 6))
        tags = ",".join(f'"{word}"' for word in words)
        amount = rng.randint(0, 10**6)
        return f'{{"id":{n},"event":"{words[0]}","amount":{amount},"tags":[{tags}]}}'.encode()
    if roll < 0.99:  # text documents
        return " ".join(rng.choices(_WORDS, k=rng.randint(30, 300))).encode()
    # Large values: compressible text around an incompressible core.
    text = " ".join(rng.choices(_WORDS, k=rng.randint(300, 4000))).encode()
    return text + rng.randbytes(rng.randint(64, 2048)) + text[:512]


def _key(rng: random.Random) -> bytes | None:
    if rng.random() < NULL_KEY_SHARE:
        return None
    return f"user-{rng.randrange(KEY_SPACE)}".encode()


def _headers(rng: random.Random, enabled: bool) -> tuple[tuple[str, bytes | None], ...]:
    if not enabled or rng.random() >= HEADERS_SHARE:
        return ()
    chosen: list[tuple[str, bytes | None]] = [("trace-id", rng.randbytes(8).hex().encode())]
    if rng.random() < 0.5:
        chosen.append(("source", rng.choice(_WORDS).encode()))
    if rng.random() < 0.3:
        chosen.append(("nullable", None if rng.random() < 0.5 else b""))
    return tuple(chosen)


def _plan(
    rng: random.Random,
    *,
    partitions: int,
    records: int,
    codecs: Sequence[str],
    transactional: bool,
    headers: bool,
) -> list[_Round]:
    """The rounds for one topic: first each codec and each kind once, over all partitions."""
    kinds = [RoundKind.PLAIN, RoundKind.IDEMPOTENT]
    if transactional:
        kinds += [RoundKind.COMMIT, RoundKind.ABORT]
    guaranteed = [(codec, RoundKind.IDEMPOTENT) for codec in codecs]
    guaranteed += [(codecs[i % len(codecs)], kind) for i, kind in enumerate(kinds)]
    rng.shuffle(guaranteed)
    per_guaranteed = max(
        1, min(GUARANTEED_PER_PARTITION, records // (len(guaranteed) * partitions))
    )

    rounds: list[_Round] = []
    counter = 0
    remaining = records

    def make(codec: str, kind: RoundKind, size: int, spread: bool) -> None:
        nonlocal counter, remaining
        made = []
        for i in range(size):
            # A spread round first gives every partition its share, in order.
            partition = i % partitions if spread else rng.randrange(partitions)
            made.append(_Record(partition, _key(rng), _value(rng, counter), _headers(rng, headers)))
            counter += 1
        remaining -= size
        rounds.append(_Round(codec, kind, tuple(made)))

    for codec, kind in guaranteed:
        size = min(remaining, per_guaranteed * partitions)
        if size > 0:
            make(codec, kind, size, spread=True)
    while remaining > 0:
        size = min(remaining, rng.randint(MIN_ROUND_RECORDS, MAX_ROUND_RECORDS))
        # Mostly committed and idempotent traffic, some plain, a few aborts.
        weights = [2, 4, 3, 1] if transactional else [1, 2]
        make(rng.choice(codecs), rng.choices(kinds, weights=weights)[0], size, spread=False)
    return rounds


# -- producing ------------------------------------------------------------------------


class _Producers:
    """One librdkafka producer per (codec, kind) the plan uses, all made up front.

    An idempotent or transactional producer spends about half a second getting
    its producer id; making them all before the first round lets those waits
    overlap instead of adding up.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        seed: int,
        plan: Sequence[_Round],
        max_batch_bytes: int | None,
    ) -> None:
        # Unique per call: a rerun on the same broker must not fence a live producer.
        txn_prefix = f"produce-mixed-{topic}-{seed}-{uuid.uuid4().hex[:8]}"
        self._made: dict[tuple[str, RoundKind], Producer] = {}
        for round_ in plan:
            key = self._key(round_.codec, round_.kind)
            if key not in self._made:
                config = _producer_config(bootstrap, *key, txn_prefix)
                if max_batch_bytes is not None:
                    config["batch.size"] = max_batch_bytes
                self._made[key] = Producer(config)
        for (_, kind), producer in self._made.items():
            if kind.transactional:
                producer.init_transactions(TXN_TIMEOUT_S)

    @staticmethod
    def _key(codec: str, kind: RoundKind) -> tuple[str, RoundKind]:
        # Commits and aborts share one transactional producer per codec.
        return codec, RoundKind.COMMIT if kind.transactional else kind

    def get(self, codec: str, kind: RoundKind) -> Producer:
        return self._made[self._key(codec, kind)]


def _producer_config(
    bootstrap: str, codec: str, kind: RoundKind, txn_prefix: str
) -> dict[str, object]:
    config: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "compression.type": codec,
        "linger.ms": 5,
        "acks": "all",
        "enable.idempotence": kind is not RoundKind.PLAIN,
        "logger": librdkafka_log,
    }
    if codec == "gzip":
        # zlib's default level 6 makes gzip rounds 5x slower than all the others.
        config["compression.level"] = GZIP_LEVEL
    if kind.transactional:
        config["transactional.id"] = f"{txn_prefix}-{codec}"
    return config


class CheckedProducer(Producer):  # type: ignore[misc]
    """A librdkafka producer whose `flush` raises PeerError unless every record produced
    through it was delivered: librdkafka removes a record it gave up on (its message
    timeout, an unknown partition, a refused batch) from the queue and reports it only to
    the record's delivery callback, so `flush() == 0` alone passes over a lost record.
    A callback given to `produce` is called too."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(dict(config))
        self.delivery_errors: list[KafkaError] = []

    def produce(self, *args: Any, **kwargs: Any) -> None:
        theirs = kwargs.pop("on_delivery", None) or kwargs.pop("callback", None)
        errors = self.delivery_errors

        def report(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                errors.append(error)
            if theirs is not None:
                theirs(error, message)

        super().produce(*args, on_delivery=report, **kwargs)

    def flush(self, *args: Any, **kwargs: Any) -> int:
        """0 once every record is delivered (as librdkafka's); PeerError when one is still
        unsent at the timeout or was not delivered."""
        left = int(super().flush(*args, **kwargs))
        if left or self.delivery_errors:
            raise PeerError(
                f"records not delivered: {left} unsent, {len(self.delivery_errors)} failed "
                f"({', '.join(str(e) for e in self.delivery_errors[:3])})"
            )
        return left


def produce_numbered(
    bootstrap: str,
    topic: str,
    partitions: int,
    per_partition: int,
    tag: bytes = b"v",
    *,
    key: bytes | None = None,
    config: Mapping[str, Any] | None = None,
) -> None:
    """`per_partition` small records (values `tag`0, `tag`1, ...) into each of the first
    `partitions` partitions, one plain producer, flushed: for tests that count offsets,
    not for data that must look real (that is `produce_mixed`). PeerError unless every
    record was delivered; `config`: more librdkafka settings."""
    producer = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 5, **(config or {})})
    for partition in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, value=tag + b"%d" % i, key=key, partition=partition)
    try:
        producer.flush(30)
    except PeerError as error:
        raise PeerError(f"{topic}: {error}") from None


def produce_mixed(
    bootstrap: str,
    topic: str,
    *,
    partitions: int,
    records: int,
    seed: int,
    codecs: Sequence[str] = CODECS,
    transactional: bool = True,
    headers: bool = True,
    max_batch_bytes: int | None = None,
) -> ProduceSummary:
    """Produce `records` records into an existing topic of `partitions` partitions.

    The first rounds give every partition records of each codec and, with
    `transactional`, at least one committed and one aborted transaction.
    `max_batch_bytes` caps the client's batches (librdkafka `batch.size`);
    topics with segments under 1 MiB need it below their segment size (values
    reach about 32 KiB, so 64 KiB batches need segments of 128 KiB or more).
    Raises PeerError if any record is not acknowledged. Calls for different
    topics may run in parallel threads (3 topics x 8 partitions x 66,667
    records: about 22 s one after another, 14 s in three threads, on 2 cores).
    """
    if partitions < 1 or records < 0:
        raise ValueError("need at least one partition and a non-negative record count")
    unknown = set(codecs) - set(CODECS)
    if unknown or not codecs:
        raise ValueError(f"codecs must be a non-empty subset of {CODECS}, not {sorted(unknown)}")
    started = time.monotonic()
    rng = random.Random(seed)
    plan = _plan(
        rng,
        partitions=partitions,
        records=records,
        codecs=tuple(codecs),
        transactional=transactional,
        headers=headers,
    )
    admin = admin_client(bootstrap)
    tallies = [_PartitionTally() for _ in range(partitions)]
    for tally, end in zip(tallies, _log_end_offsets(admin, topic, partitions), strict=True):
        tally.log_end_offset = end
    producers = _Producers(bootstrap, topic, seed, plan, max_batch_bytes)
    for round_ in plan:
        touched = _produce_round(producers.get(round_.codec, round_.kind), topic, round_, tallies)
        if round_.kind.transactional:
            _wait_for_markers(admin, topic, tallies, touched, bootstrap=bootstrap)
    summaries = tuple(
        PartitionSummary(
            partition=p,
            records=t.records,
            committed_records=t.committed,
            aborted_records=t.aborted,
            commit_markers=t.commit_markers,
            abort_markers=t.abort_markers,
            log_end_offset=t.log_end_offset,
            records_by_codec=dict(t.by_codec),
            committed_digest=t.committed_digest.hexdigest(),
            uncommitted_digest=t.uncommitted_digest.hexdigest(),
        )
        for p, t in enumerate(tallies)
    )
    return ProduceSummary(topic, seed, summaries, len(plan), time.monotonic() - started)


def produce_when_room(producer: Producer, topic: str, **record: Any) -> None:
    """`producer.produce(topic, **record)`, polling while librdkafka's local queue is full
    (a poll serves delivery reports, which lets the queue drain)."""
    while True:
        try:
            producer.produce(topic, **record)
            return
        except BufferError:
            producer.poll(0.05)


def _produce_round(
    producer: Producer, topic: str, round_: _Round, tallies: list[_PartitionTally]
) -> set[int]:
    """The round produced and tallied; the partitions it wrote to."""
    acked: list[int | None] = [None] * len(round_.records)
    errors: list[KafkaError] = []

    def on_delivery(index: int) -> object:
        def report(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                errors.append(error)
            else:
                acked[index] = message.offset()

        return report

    if round_.kind.transactional:
        producer.begin_transaction()
    for index, record in enumerate(round_.records):
        produce_when_room(
            producer,
            topic,
            key=record.key,
            value=record.value,
            partition=record.partition,
            headers=list(record.headers) or None,
            on_delivery=on_delivery(index),
        )
    # Flush before an abort too: librdkafka purges unsent records on abort, and
    # aborted records that never reached the log would test nothing.
    left = producer.flush(FLUSH_TIMEOUT_S)
    if left or errors:
        raise PeerError(f"producing to {topic}: {left} unsent, errors {errors[:3]}")
    if round_.kind is RoundKind.COMMIT:
        producer.commit_transaction(TXN_TIMEOUT_S)
    elif round_.kind is RoundKind.ABORT:
        producer.abort_transaction(TXN_TIMEOUT_S)

    # Tally in offset order per partition (delivery order is per-partition order already).
    ordered = sorted(
        range(len(round_.records)), key=lambda i: (round_.records[i].partition, acked[i])
    )
    touched: set[int] = set()
    for index in ordered:
        record, offset = round_.records[index], acked[index]
        assert offset is not None
        tally = tallies[record.partition]
        touched.add(record.partition)
        tally.records += 1
        tally.by_codec[round_.codec] = tally.by_codec.get(round_.codec, 0) + 1
        tally.log_end_offset = offset + 1
        _digest_record(tally.uncommitted_digest, offset, record.key, record.value, record.headers)
        if round_.kind is RoundKind.ABORT:
            tally.aborted += 1
        else:
            _digest_record(tally.committed_digest, offset, record.key, record.value, record.headers)
            if round_.kind is RoundKind.COMMIT:
                tally.committed += 1
    if round_.kind.transactional:
        # The marker goes right after the transaction's last record in each
        # partition it touched: nothing else writes to the topic meanwhile.
        for partition in touched:
            tally = tallies[partition]
            tally.log_end_offset += 1
            if round_.kind is RoundKind.COMMIT:
                tally.commit_markers += 1
            else:
                tally.abort_markers += 1
    return touched


# -- reading back ---------------------------------------------------------------------


def _consumer(bootstrap: str, isolation: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            # librdkafka wants a group id even for assign(); nothing is committed.
            "group.id": f"consume-all-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "logger": librdkafka_log,
        }
    )


def _wait_for_markers(
    admin: AdminClient,
    topic: str,
    tallies: Sequence[_PartitionTally],
    touched: Iterable[int],
    timeout_s: float = 60,
    *,
    bootstrap: str,
) -> None:
    """Until the log end of every partition the transaction `touched` is where its tally
    puts it. A transaction's commit or abort markers are written by the coordinator after
    EndTxn has returned; records of the next round produced before they land would take
    other offsets, and the same seed would not give the same log. Only the touched
    partitions get a marker; one ListOffsets round asks all those still short (5,000
    partitions one at a time, every round, took most of a 10,000-partition soak's load).
    Those ListOffsets leaves short are asked Fetch's high watermark too, where the broker
    answers a fetch past the end with it: Tansu 0.6.0 on its S3 storage answers ListOffsets
    "latest" with its first batch's offset + 1 however much it holds (Kafka refuses such a
    fetch, and ListOffsets alone counts there)."""
    deadline = time.monotonic() + timeout_s
    short = sorted(touched)
    while short:
        ends = latest_offsets(admin, topic, short)
        short = [p for p in short if ends[p] < tallies[p].log_end_offset]
        if short:
            ends = _fetched_ends(bootstrap, topic, short, ends)
            short = [p for p in short if ends[p] < tallies[p].log_end_offset]
        if short and time.monotonic() > deadline:
            raise PeerError(f"{topic}-{short[0]}: transaction markers not written in time")
        if short:
            time.sleep(MARKER_POLL_S)


def _fetched_ends(
    bootstrap: str, topic: str, partitions: Sequence[int], ends: Mapping[int, int]
) -> dict[int, int]:
    """`ends`, raised to Fetch's high watermark where the broker answers a fetch past a
    partition's end with it (Tansu); as they were where it refuses (Kafka)."""
    from replicad.types import TopicPartition
    from tools.peers.wire import high_watermarks

    try:
        marks = high_watermarks(bootstrap, [TopicPartition(topic, p) for p in partitions])
    except (PeerError, OSError):
        return dict(ends)
    return {p: max(ends.get(p, -1), marks.get(TopicPartition(topic, p), -1)) for p in ends}


def _log_end_offsets(admin: AdminClient, topic: str, partitions: int) -> list[int]:
    """What the broker says each partition's log end is (ListOffsets latest, one round for
    every partition)."""
    ends = latest_offsets(admin, topic, range(partitions))
    return [ends[p] for p in range(partitions)]


def _partition_count(bootstrap: str, topic: str) -> int:
    metadata = admin_client(bootstrap).list_topics(topic=topic, timeout=10).topics.get(topic)
    if metadata is None or metadata.error is not None:
        raise PeerError(f"topic {topic!r} not found on {bootstrap}")
    return len(metadata.partitions)


def consume_all(
    bootstrap: str,
    topic: str,
    *,
    partitions: int | None = None,
    isolation: str = READ_COMMITTED,
    timeout_s: float = 60,
) -> dict[int, list[ConsumedRecord]]:
    """Read every partition of `topic` from its start to its end with a real consumer.

    The end is where librdkafka reports end-of-partition (the high watermark, or
    the last stable offset under read_committed). Control records are never
    returned; aborted records only under read_uncommitted. Raises PeerError when
    some partition has not reached its end within `timeout_s`.
    """
    if isolation not in (READ_COMMITTED, READ_UNCOMMITTED):
        raise ValueError(f"isolation must be {READ_COMMITTED} or {READ_UNCOMMITTED}")
    count = partitions if partitions is not None else _partition_count(bootstrap, topic)
    result: dict[int, list[ConsumedRecord]] = {p: [] for p in range(count)}
    at_end: set[int] = set()
    consumer = _consumer(bootstrap, isolation)
    try:
        consumer.assign([KafkaTopicPartition(topic, p, OFFSET_BEGINNING) for p in range(count)])
        deadline = time.monotonic() + timeout_s
        while len(at_end) < count:
            if time.monotonic() > deadline:
                missing = sorted(set(range(count)) - at_end)
                raise PeerError(
                    f"consume_all {topic}: partitions {missing} not read to their end "
                    f"within {timeout_s:.0f} s"
                )
            for message in consumer.consume(num_messages=10_000, timeout=0.5):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_end.add(message.partition())
                        continue
                    raise PeerError(f"consume_all {topic}: {error}")
                partition = message.partition()
                at_end.discard(partition)  # more arrived after an end-of-partition
                _, timestamp = message.timestamp()
                result[partition].append(
                    ConsumedRecord(
                        offset=message.offset(),
                        key=message.key(),
                        value=message.value(),
                        headers=tuple(message.headers() or ()),
                        timestamp=timestamp,
                    )
                )
    finally:
        consumer.close()
    return result
