"""A simulated destination partition for the mirror's simulation (tools/sim/mirror_run.py):
the leader of one Kafka partition as an idempotent producer meets it.

Rules it keeps (Kafka's ProducerStateManager, simplified to what the mirror relies on):
- Per producer id, the epoch and the last five batches' sequence ranges and offsets. A
  batch whose sequence follows the last one is appended; a batch equal to one of the last
  five is a duplicate, answered with the offset it was written at; anything else is
  OUT_OF_ORDER_SEQUENCE_NUMBER. A producer with no state is taken at any sequence (Kafka
  since KIP-360); a new epoch must start at sequence 0; an older epoch is
  INVALID_PRODUCER_EPOCH. A producer's state expires at an expiry check (any time)
  once the newest timestamp of its last appended batch is PRODUCER_EXPIRATION_MS older
  than the broker's wall clock (Kafka's producer.id.expiration.ms, a day by default,
  measured from the batch's max timestamp: a mirror copying old records can lose its
  state while it writes).
- acks=all: an appended batch is answered only once it is replicated (the high
  watermark passed it); until then the log end is ahead of the high watermark.
- A leader change loses what was not replicated (the new leader truncates to the high
  watermark, its producer state with it) and fails the requests waiting for replication
  with NOT_LEADER_OR_FOLLOWER.
- With `old_broker` (Kafka before 2.5, KIP-360), a producer with no state is taken only
  at sequence 0: any other is UNKNOWN_PRODUCER_ID.
- With `max_batch_records`, a batch of more records is refused MESSAGE_TOO_LARGE before
  anything else is looked at (Kafka validates a batch's size before its producer state),
  as a destination topic's max.message.bytes refuses a coalesced run larger than any
  batch the source took.
- `records` is what a consumer reads: the source offset of each record, in log order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

# What a broker remembers per producer (ProducerStateEntry.NUM_BATCHES_TO_RETAIN).
BATCHES_RETAINED = 5
# Shorter than Kafka's day, still far above the simulated request timeouts.
PRODUCER_EXPIRATION_MS = 60_000


@dataclass(slots=True)
class _Batch:
    first_seq: int
    last_seq: int
    offset: int
    # The source offsets of its records (what the simulation checks).
    sources: tuple[int, ...]


@dataclass(slots=True)
class _Producer:
    epoch: int
    # The max timestamp of its last appended batch (Kafka's ProducerStateEntry.lastTimestamp).
    last_timestamp: int = -1
    batches: deque[_Batch] = field(default_factory=lambda: deque(maxlen=BATCHES_RETAINED))


@dataclass(frozen=True, slots=True)
class Answer:
    error: ErrorCode
    base_offset: int = -1


class SimDestination:
    def __init__(self, max_batch_records: int | None = None, *, old_broker: bool = False) -> None:
        self.max_batch_records = max_batch_records
        self.old_broker = old_broker
        self.records: list[int] = []
        self.high_watermark = 0
        self._producers: dict[int, _Producer] = {}
        # Requests waiting for replication: (their answer's key, the batch's offset).
        self._waiting: list[tuple[object, int]] = []
        self.answers_ready: list[tuple[object, Answer]] = []

    @property
    def log_end(self) -> int:
        return len(self.records)

    def produce(
        self,
        key: object,
        pid: int,
        epoch: int,
        seq: int,
        sources: tuple[int, ...],
        max_timestamp: int,
    ) -> Answer | None:
        """One batch; the answer now (an error, a duplicate), or None: it comes with
        `replicate` as (key, answer) in `answers_ready`."""
        count = len(sources)
        if self.max_batch_records is not None and count > self.max_batch_records:
            return Answer(ErrorCode.message_too_large)
        producer = self._producers.get(pid)
        if producer is not None and epoch < producer.epoch:
            return Answer(ErrorCode.invalid_producer_epoch)
        if producer is None or epoch > producer.epoch:
            # A producer the partition has no state for is taken at any sequence (Kafka
            # since KIP-360: its state may have expired); a new epoch starts at 0.
            if seq != 0 and (producer is not None or self.old_broker):
                return Answer(ErrorCode.unknown_producer_id)
            producer = self._producers[pid] = _Producer(epoch)
        for b in producer.batches:
            if b.first_seq == seq and b.last_seq == seq + count - 1:
                if b.sources != sources:
                    raise AssertionError(f"sequence {seq} of producer {pid} reused for other data")
                if b.offset + count > self.high_watermark:
                    # Still being replicated: answered with the original once it is.
                    self._waiting.append((key, b.offset))
                    return None
                return Answer(ErrorCode.none, b.offset)
        last = producer.batches[-1].last_seq if producer.batches else -1
        if seq != last + 1:
            return Answer(ErrorCode.out_of_order_sequence_number)
        base = self.log_end
        producer.batches.append(_Batch(seq, seq + count - 1, base, sources))
        producer.last_timestamp = max_timestamp
        self.records.extend(sources)
        self._waiting.append((key, base))
        return None

    def replicate(self) -> None:
        """The followers caught up: the high watermark is the log end; waiting answers go."""
        self.high_watermark = self.log_end
        for key, base in self._waiting:
            self.answers_ready.append((key, Answer(ErrorCode.none, base)))
        self._waiting.clear()

    def leader_change(self) -> list[object]:
        """A new leader: the unreplicated tail is gone; returns the keys now failed."""
        del self.records[self.high_watermark :]
        for producer in self._producers.values():
            while producer.batches and producer.batches[-1].offset >= self.high_watermark:
                producer.batches.pop()
        failed = [key for key, _base in self._waiting]
        self._waiting.clear()
        return failed

    def expire_producers(self, wall_ms: int) -> int:
        """Kafka's expiry check: producer state whose last batch's newest timestamp is
        PRODUCER_EXPIRATION_MS old by `wall_ms` is dropped; returns how many."""
        old = [
            pid
            for pid, p in self._producers.items()
            if wall_ms - p.last_timestamp >= PRODUCER_EXPIRATION_MS
        ]
        for pid in old:
            del self._producers[pid]
        return len(old)
