"""The consumers tools/bench/replicate sets next to replicad, each in two configurations.

Every peer runs twice: as it comes (its defaults, and the consume loop of its own
documentation's first example) and tuned for throughput as its own documentation
recommends. Both are in the table, with the settings printed under it, so a reader can
tell a slow peer from a badly configured one. A benchmark is worth what its weakest
peer configuration is worth: the peer must be at its best before any ratio is quoted.

Where the tuned values come from:
- librdkafka (confluent-kafka, kcat): CONFIGURATION.md. The consumer prefetches into a
  local queue bounded by `queued.max.messages.kbytes` (64 MiB by default, per partition
  for kcat's per-partition consumer) and `queued.min.messages`; per-partition fetches by
  `fetch.message.max.bytes` (alias `max.partition.fetch.bytes`, 1 MiB). Confluent's
  "Optimize ... Clients for Throughput" page: raise `fetch.min.bytes` (default 1) to about
  100,000. confluent-kafka's API: `consume(num_messages, timeout)` returns a list per call
  instead of one message per `poll()`; `num_messages` must stay below what the local queue
  holds, or every call waits out its whole timeout (the old reader of this benchmark asked
  100,000 of a queue holding about 65,000: idle three quarters of its run).
  `fetch.queue.backoff.ms` (default 1000, since librdkafka 2.4): "How long to postpone the
  next fetch request for a topic+partition in case the current fetch queue thresholds
  (queued.min.messages or queued.max.messages.kbytes) have been exceded. This property may
  need to be decreased if ... the application is experiencing long (~1s) delays between
  messages. Low values may increase CPU utilization." A reader that drains its queue in
  well under a second otherwise sits out the rest of that second each time the queue
  fills: confluent-kafka's tuned row sets it to 10 ms (a fetch at most 100 times a second
  per partition while the queue is full), the default row keeps 1000. kcat cannot: its
  librdkafka (2.0.2 here) predates the property (added in 2.2.0, before which that backoff
  was a fixed second) and refuses it as unknown.
- kafka-python and aiokafka: their consumer docstrings. `check_crcs` "adds some
  overhead, so it may be disabled in cases seeking extreme performance"; `poll()` /
  `getmany()` with `max_records` hand back whole fetched batches instead of one record a
  call; `max_partition_fetch_bytes` (1 MiB) bounds each partition's share of a fetch.
  replicad does check every batch's CRC; these peers, tuned, do not.

Run as a child of the benchmark (the child is what is measured):

    python -m tools.bench.consumers CLIENT VARIANT BOOTSTRAP TOPIC PARTITIONS RECORDS MARKS

It reads the topic from its start until RECORDS records were seen, and appends to the file
MARKS one line per tenth of the records, `<percent> <time.monotonic()>`, from which the
benchmark takes the steady-state rate (between 10% and 90% of the records).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tools.bench.measure import MARK_PERCENTS

KIB = 1024
MIB = 1024 * KIB
CONFLUENT = "confluent-kafka"
KAFKA_PYTHON = "kafka-python"
AIOKAFKA = "aiokafka"
KCAT = "kcat"
DEFAULT = "default"
TUNED = "tuned"


@dataclass(frozen=True, slots=True)
class PeerSetup:
    """One consumer in one configuration: what is passed to it, and how it is driven."""

    client: str
    variant: str
    # Passed to the client as they are (constructor keywords, a librdkafka config dict,
    # or kcat's -X pairs).
    config: Mapping[str, object] = field(default_factory=dict)
    # How records are taken from the client, as printed under the table.
    loop: str = ""

    @property
    def name(self) -> str:
        return f"{self.client} ({self.variant})"

    def settings(self) -> str:
        """One line for the notes under the table."""
        pairs = ", ".join(f"{k}={v}" for k, v in self.config.items()) or "library defaults"
        return f"{self.name}: {pairs}; {self.loop}"


# librdkafka: a queue of 512 MiB holds about half a million 1 KiB records, far more than one
# consume() call asks for; 8 MiB per partition fetch (8 partitions: 64 MiB, the whole
# fetch.max.bytes-sized response) keeps each fetch round trip large; once the queue is full,
# the next fetch is tried after 10 ms rather than a whole second.
QUEUE_BACKOFF = "fetch.queue.backoff.ms"
RDKAFKA_TUNED = {
    "fetch.min.bytes": 100_000,
    "fetch.message.max.bytes": 8 * MIB,
    "fetch.max.bytes": 64 * MIB,
    "queued.min.messages": 1_000_000,
    "queued.max.messages.kbytes": 512 * KIB,
    QUEUE_BACKOFF: 10,
}
# kafka-python and aiokafka take the same settings under the same names: both tuned alike,
# the fetch sizes librdkafka gets above, CRCs left unchecked.
PYTHON_CLIENT_TUNED = {
    "check_crcs": False,
    "fetch_min_bytes": 100_000,
    "max_partition_fetch_bytes": 8 * MIB,
    "fetch_max_bytes": 64 * MIB,
}
CONSUME_BATCH = 10_000
CONSUME_TIMEOUT_S = 1.0
MAX_RECORDS = 100_000
POLL_TIMEOUT_MS = 1000

SETUPS: tuple[PeerSetup, ...] = (
    PeerSetup(CONFLUENT, DEFAULT, {}, "poll(1.0), one message a call"),
    PeerSetup(
        CONFLUENT,
        TUNED,
        RDKAFKA_TUNED,
        f"consume(num_messages={CONSUME_BATCH:,}, timeout={CONSUME_TIMEOUT_S})",
    ),
    PeerSetup(KAFKA_PYTHON, DEFAULT, {}, "for message in consumer"),
    PeerSetup(
        KAFKA_PYTHON,
        TUNED,
        PYTHON_CLIENT_TUNED,
        f"poll(timeout_ms={POLL_TIMEOUT_MS}, max_records={MAX_RECORDS:,})",
    ),
    PeerSetup(AIOKAFKA, DEFAULT, {}, "async for message in consumer"),
    PeerSetup(
        AIOKAFKA,
        TUNED,
        PYTHON_CLIENT_TUNED,
        f"getmany(timeout_ms={POLL_TIMEOUT_MS}, max_records={MAX_RECORDS:,})",
    ),
    PeerSetup(KCAT, DEFAULT, {}, "kcat -C -o beginning -e -q > file (payload and newline)"),
    PeerSetup(
        KCAT,
        TUNED,
        # kcat consumes each partition on its own queue: the queue bound is per partition.
        # Its librdkafka has no fetch.queue.backoff.ms (see above).
        {
            **{k: v for k, v in RDKAFKA_TUNED.items() if k != QUEUE_BACKOFF},
            "queued.max.messages.kbytes": 128 * KIB,
        },
        "kcat -C -o beginning -e -q > file (payload and newline)",
    ),
)


def setup(client: str, variant: str) -> PeerSetup:
    for s in SETUPS:
        if s.client == client and s.variant == variant:
            return s
    raise KeyError(f"no consumer setup {client} ({variant})")


def kcat_argv(kcat: str, s: PeerSetup, bootstrap: str, topic: str) -> list[str]:
    """kcat's command line: the topic from its start to its end, payloads to stdout."""
    argv = [kcat, "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q"]
    for key, value in s.config.items():
        argv += ["-X", f"{key}={value}"]
    return argv


# -- the child --------------------------------------------------------------------------


class Marks:
    """Counts records and writes a mark at every tenth of `total`."""

    def __init__(self, path: str, total: int) -> None:
        self._out = open(path, "a")  # noqa: SIM115 (closed by close())
        self._thresholds = [(p, total * p // 100) for p in MARK_PERCENTS]
        self.next_at = self._thresholds[0][1]
        self.seen = 0

    def add(self, records: int) -> None:
        """Counts `records` more and writes the marks they reach: every reader's one count."""
        self.seen += records
        if self.seen >= self.next_at:
            self.passed()

    def passed(self) -> None:
        """Called when seen >= next_at."""
        while self._thresholds and self.seen >= self._thresholds[0][1]:
            percent, _ = self._thresholds.pop(0)
            self._out.write(f"{percent} {time.monotonic()}\n")
        self._out.flush()
        self.next_at = self._thresholds[0][1] if self._thresholds else sys.maxsize

    @property
    def done(self) -> bool:
        return not self._thresholds

    def close(self) -> None:
        self._out.close()


def confluent(s: PeerSetup, bootstrap: str, topic: str, partitions: int, marks: Marks) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            **s.config,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    if s.variant == DEFAULT:
        while not marks.done:
            message = consumer.poll(1.0)
            if message is not None and not message.error():
                marks.add(1)
    else:
        while not marks.done:
            messages = consumer.consume(CONSUME_BATCH, CONSUME_TIMEOUT_S)
            marks.add(sum(1 for message in messages if not message.error()))
    consumer.close()


def kafka_python(s: PeerSetup, bootstrap: str, topic: str, partitions: int, marks: Marks) -> None:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, **s.config
    )
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    consumer.seek_to_beginning()
    if s.variant == DEFAULT:
        for _ in consumer:
            marks.add(1)
            if marks.done:
                break
    else:
        while not marks.done:
            batches = consumer.poll(POLL_TIMEOUT_MS, MAX_RECORDS)
            marks.add(sum(len(records) for records in batches.values()))
    consumer.close()


def aiokafka(s: PeerSetup, bootstrap: str, topic: str, partitions: int, marks: Marks) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def main() -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, **s.config
        )
        await consumer.start()
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        await consumer.seek_to_beginning()
        if s.variant == DEFAULT:
            async for _ in consumer:
                marks.add(1)
                if marks.done:
                    break
        else:
            while not marks.done:
                batches = await consumer.getmany(
                    timeout_ms=POLL_TIMEOUT_MS, max_records=MAX_RECORDS
                )
                marks.add(sum(len(records) for records in batches.values()))
        await consumer.stop()

    asyncio.run(main())


READERS: dict[str, Callable[[PeerSetup, str, str, int, Marks], None]] = {
    CONFLUENT: confluent,
    KAFKA_PYTHON: kafka_python,
    AIOKAFKA: aiokafka,
}


def main(argv: list[str]) -> int:
    client, variant, bootstrap, topic, partitions, records, marks_path = argv
    marks = Marks(marks_path, int(records))
    try:
        READERS[client](setup(client, variant), bootstrap, topic, int(partitions), marks)
    finally:
        marks.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
