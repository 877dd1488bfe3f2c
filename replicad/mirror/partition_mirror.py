"""The mirror state machine of one partition: which stored batch goes to the destination
next, with which sequence, when, and what each answer means (sans-I/O: the shell feeds log
entries, destination answers and the time, `now_ms`, in, and asks what to send and when
to wake).

Rules:
- The source is the local log, read in offset order from `scanned_to`; `position` is the
  source offset below which everything is mirrored or deliberately skipped, `dest_next`
  the destination offset the next acknowledged batch lands at. Both move together, when
  the oldest batch sent is acknowledged, so (position, dest_next) is always a consistent
  pair to persist: progress never names a batch the destination has not acknowledged.
- Transactions: a consumer reading the destination with read_committed sees what one
  reading the source with read_committed sees, in the same order. A transactional batch
  is held until its producer's next COMMIT or ABORT marker is in the local log: committed
  data is produced (as plain idempotent data: the destination sees no transaction), aborted
  data and every control batch are skipped. A batch held blocks everything after it, as a
  source's last stable offset does for read_committed consumers.
- Pipelining (Kafka's idempotent producer rules): up to `max_in_flight` batches (at most 5,
  the number of batches a broker remembers per producer and partition) are sent and not
  settled -- but only one until the destination acknowledged a batch of the producer
  session: a broker with no state for a producer takes its first batch at any sequence
  (Kafka's ProducerAppendInfo), so a batch sent beside a first one that failed could be
  written without it -- counted from the oldest not acknowledged, with consecutive
  sequences. Answers are taken in any order; the window advances from its oldest batch.
  A batch that failed
  in a way a resend fixes (a retriable error, no answer by its deadline, a lost
  connection) sends it and every batch after it again with the same producer and
  sequences, after a back-off: the destination drops what it already
  has (it answers a duplicate with success), and since it never accepts a sequence gap,
  what it holds stays a prefix of what was sent. Answers of batches sent before such a
  rewind are stale and ignored (their batches are sent again).
- Producer state the destination expired: Kafka forgets a producer whose last batch's
  max timestamp is `producer.id.expiration.ms` (a day by default) older than the broker's
  clock, at a check every 10 minutes -- the mirror keeps the source's timestamps, so a
  backlog older than that (or a partition idle that long) can lose our state at any
  moment, and then the destination takes a batch at any sequence, a resend included. A
  batch is "expiring" when its newest timestamp is older than the expiration less an
  hour (EXPIRY_MARGIN_MS; time passed in as `wall_ms`). An expiring batch goes alone;
  after one is acknowledged the next goes alone too (as a session's first); and an
  expiring batch that failed is not resent blindly (if it was written, the resend could
  be written twice): the producer session is lost, and the reconcile reads the log end.
- OUT_OF_ORDER_SEQUENCE_NUMBER for a batch with an older one still unresolved is the
  destination refusing a gap the older one's failure made: the batch is resent. For the
  oldest unresolved batch, and for UNKNOWN_PRODUCER_ID or a fenced producer, the
  destination no longer agrees with our sequence: the producer session is lost.
- Lost session: no new batch is sent; the answer of every batch written and not answered
  yet, stale ones included, is waited for (or its deadline), so nothing of the old session
  can land after the destination's log end is read (DRAINING); then a new producer session
  reconciles (RECONCILING). The shell says which sends it never wrote (`unsent`).
- Reconcile (at start, and under each new producer session): the destination's log end is
  read once it is settled (the leader's log end equals its high watermark: no write between
  append and acknowledgement; asked again every SETTLE_POLL_MS until it is). A tail not
  replicated yet may still be acknowledged or lost with a leader change: counting it either
  way could lose or duplicate it, so a reconcile waits. The destination log is a
  prefix of what was sent, in order, so `dest_end - dest_next` records are there past
  `dest_next`: walk forward from `position` over the batches whose record counts add up to
  it, then the new producer starts at sequence 0. A destination end below `dest_next`, or
  one that falls inside a batch, means someone else changed the destination: the partition
  halts with the reason (nothing is guessed). A partition with no saved destination offset
  yet takes the destination's end as it is, and sends nothing until the shell confirmed
  that progress is saved (`first_progress_saved`): a crash right after could otherwise not
  tell our records from what the destination held before. The save is asked for at once
  (`first_save_due`), one at a time, and after a failed one (`first_save_failed`) again
  after a back-off.
- A batch that cannot be produced (restamp.mirrorable: magic 0/1) halts the partition, and
  so does an answer no resend can fix. A batch thinned by compaction takes as many
  destination offsets as it has records.
- Coalescing (`coalesce_bytes`, coalesce.py): a run of consecutive small batches decided
  PRODUCE goes as one send, one batch, one sequence range; each of its entries still
  settles at its own destination offsets. A run holds at most `coalesce_bytes` stored
  and `coalesce_records` records. A resend repeats the same run. A run the shell could
  not coalesce whole (`run_cut`: a batch over what is left of the run's decompressed
  bound, or whose records do not decompress or rewrite) was never written: its first batches that
  could be joined go again as one run with the same sequences, and the batch that cut
  it heads the next run (alone, as stored, when it cuts a run by itself). A run the
  destination refuses as too large (its max.message.bytes below the run) took none of
  its sequences: the partition's runs are kept to half that run's bytes from then on,
  and its entries go again with the same sequences in such smaller runs (down to one
  batch, as stored); a stored batch refused so halts (the source took it, so the two
  topics' limits differ).
- Halted partitions stay halted until the daemon restarts; `error` says why.

Phases and the events that move them are the table TRANSITIONS; any other is a bug of the
caller and raises LocalProtocolError.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import random
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from replicad.config.model import MirrorConfig, defaults_of
from replicad.errors import LocalProtocolError
from replicad.mirror.coalesce import (
    JOIN_ATTRIBUTES,
    RUN_RECORDS,
    SMALL_BATCH_BYTES,
    can_join,
)
from replicad.mirror.offset_map import OffsetMap, SyncPoint
from replicad.mirror.restamp import ProducerStamp, mirrorable, next_sequence
from replicad.protocol.backoff import Backoff
from replicad.records.batch import (
    CONTROL_FLAG_MASK,
    MAGIC_V2,
    TRANSACTIONAL_FLAG_MASK,
    BatchHeader,
)
from replicad.records.records import ControlType
from replicad.transitions import move

# What a broker remembers per producer and partition to answer a resent batch as a
# duplicate (Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN); more in flight would let a
# resend past that memory be written twice.
MAX_IN_FLIGHT = 5
# How often a reconcile asks again for a destination log end that is not settled yet.
SETTLE_POLL_MS = 100
# Kafka's producer.id.expiration.ms default: what the mirror assumes of the destination.
PRODUCER_EXPIRATION_MS = 24 * 3600 * 1000
# Batches this much younger than the expiration count as expiring already (clock skew,
# time in flight).
EXPIRY_MARGIN_MS = 3600 * 1000
_TXN_OR_CONTROL = TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK
_MIRROR = defaults_of(MirrorConfig)


class Phase(enum.Enum):
    # Waiting for the destination's log end under the current producer session.
    RECONCILING = "reconciling"
    MIRRORING = "mirroring"
    # The producer session was lost: waiting for the answers still in flight.
    DRAINING = "draining"
    HALTED = "halted"


class Event(enum.Enum):
    RECONCILED = "reconciled"
    SESSION_LOST = "session lost"
    DRAINED = "drained"
    HALT = "halt"


TRANSITIONS: dict[tuple[Phase, Event], Phase] = {
    (Phase.RECONCILING, Event.RECONCILED): Phase.MIRRORING,
    # Renewed by another partition while this one reconciled: read the log end again.
    (Phase.RECONCILING, Event.SESSION_LOST): Phase.RECONCILING,
    (Phase.RECONCILING, Event.HALT): Phase.HALTED,
    (Phase.MIRRORING, Event.SESSION_LOST): Phase.DRAINING,
    (Phase.MIRRORING, Event.HALT): Phase.HALTED,
    (Phase.DRAINING, Event.SESSION_LOST): Phase.DRAINING,
    (Phase.DRAINING, Event.DRAINED): Phase.RECONCILING,
    (Phase.DRAINING, Event.HALT): Phase.HALTED,
    # A halted partition stays halted; a second reason does not replace the first.
    (Phase.HALTED, Event.HALT): Phase.HALTED,
    (Phase.HALTED, Event.SESSION_LOST): Phase.HALTED,
}


def next_phase(phase: Phase, event: Event) -> Phase:
    return move(TRANSITIONS, phase, event, "mirror")


class Decision(enum.Enum):
    PRODUCE = "produce"
    SKIP = "skip"
    HOLD = "hold"  # transactional, outcome not in the local log yet


class Failure(enum.Enum):
    """How a send failed, as the shell read the answer."""

    # A retriable error, no answer, a lost connection: resend with the same sequence.
    RETRY = "retry"
    OUT_OF_ORDER = "out of order sequence"
    # The batch is larger than the destination takes (its max.message.bytes): for a
    # coalesced run, resent as stored; for a stored batch, fatal.
    TOO_LARGE = "too large"
    # The destination forgot or fenced our producer.
    SESSION = "session"
    # Nothing a resend can fix.
    FATAL = "fatal"


@dataclass(slots=True)
class LogEntry:
    """One stored batch: its header, its control record's type for a control batch, and its
    bytes while the shell still holds them (None: read them again from the log). Not
    frozen, though never changed: one is made per stored batch, and a frozen dataclass's
    __init__ (a call of object.__setattr__ per field) cost three times a plain one's."""

    header: BatchHeader
    marker: ControlType | None = None
    data: bytes | memoryview | None = None

    @property
    def held_bytes(self) -> int:
        """Bytes this entry keeps alive."""
        return len(self.data) if self.data is not None else 0


class _Pending:
    __slots__ = ("acked_at", "decision", "entry", "rest", "run", "send")

    def __init__(self, entry: LogEntry, decision: Decision) -> None:
        self.entry = entry
        self.decision = decision
        # On the first entry of a run: while in flight, its send; once acknowledged, the
        # destination offset the run landed at (the run's other entries follow it there,
        # in order: their own are never set).
        self.send: Send | None = None
        self.acked_at: int | None = None
        # On the first entry of a coalesced run once sent: how many entries the run holds
        # (a resend repeats the same batch: the broker knows it by its sequence range).
        self.run = 0
        # On the first entry of a run once sent: the run's other entries (not itself: no
        # reference cycle keeps a settled entry's bytes alive until the collector runs).
        self.rest: Sequence[_Pending] = ()  # shared: no list made a batch


@dataclass(frozen=True, slots=True, eq=False)
class Send:
    """Produce `entry`'s batch (with `more`: the run `entry` opens, coalesced into one
    batch, see coalesce.py) stamped with `stamp` and `base_sequence`; expected to land at
    `expected_dest`; given up as unanswered at `deadline_ms`. Compared by identity: an
    answer counts only for the send still in the window."""

    entry: LogEntry
    stamp: ProducerStamp
    base_sequence: int
    expected_dest: int
    deadline_ms: int
    more: tuple[LogEntry, ...] = ()
    # Old enough that the destination may forget our producer after it (see the rules).
    expiring: bool = False
    # The records of its batches, and their newest timestamp (-1: none given): worked out
    # once when it is made, not at each answer.
    records: int = -1
    newest_ms: int = -1

    @property
    def entries(self) -> tuple[LogEntry, ...]:
        return (self.entry, *self.more)

    @property
    def record_count(self) -> int:
        if self.records >= 0:
            return self.records
        return sum(e.header.record_count for e in self.entries)

    @property
    def newest_timestamp(self) -> int:
        if self.newest_ms >= 0:
            return self.newest_ms
        return max(e.header.max_timestamp for e in self.entries)


@dataclass(frozen=True, slots=True)
class Answered:
    """What one answer did: `stale` (a send the window no longer holds: ignored),
    `batches_done` (acknowledged batches the window settled), `new_session` (the
    producer session is lost: the shell renews it), `halted`."""

    stale: bool = False
    batches_done: int = 0
    new_session: bool = False
    halted: bool = False


@dataclass(frozen=True, slots=True)
class Reconciled:
    """`done`: mirroring may go on. Otherwise `need_more` (feed more of the log first),
    `wait` (the log end was not settled: asked again later), or the partition halted
    (`error`)."""

    done: bool
    batches_found: int = 0
    need_more: bool = False
    wait: bool = False
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Progress:
    """What is persisted: enough to reconcile after a crash."""

    position: int
    dest_next: int | None
    points: tuple[SyncPoint, ...]


@dataclass(frozen=True, slots=True)
class MirrorTiming:
    """The core's times, from the shell's settings (`Mirror._timing`); the defaults of
    those the `mirror:` section sets are its own (written there only)."""

    produce_timeout_ms: int = _MIRROR["produce_timeout_ms"]
    # The connection's own timeout beyond the broker's: how long an answer may take.
    request_timeout_ms: int = _MIRROR["request_timeout_ms"]
    retry_backoff_ms: int = _MIRROR["reconnect_backoff_ms"]
    retry_backoff_max_ms: int = _MIRROR["reconnect_backoff_max_ms"]
    max_in_flight: int = MAX_IN_FLIGHT
    # Coalesce runs of consecutive small batches up to this many bytes into one batch
    # (coalesce.py); 0: every batch is produced as stored.
    coalesce_bytes: int = 0
    # A run's records at most (coalesce.RUN_RECORDS; lower only in tests and simulations).
    coalesce_records: int = RUN_RECORDS
    # One batch in flight until the destination acknowledged one of the producer session,
    # and around expiring batches (see _window_limit); False only where a test looks at a
    # later window.
    first_batch_alone: bool = True
    # The destination's producer.id.expiration.ms as the mirror assumes it.
    producer_expiration_ms: int = PRODUCER_EXPIRATION_MS


class PartitionMirror:
    def __init__(
        self,
        *,
        position: int,
        dest_next: int | None = None,
        points: Iterable[SyncPoint] = (),
        timing: MirrorTiming = MirrorTiming(),
        rng: random.Random | None = None,
    ) -> None:
        if not 1 <= timing.max_in_flight <= MAX_IN_FLIGHT:
            raise LocalProtocolError(f"max_in_flight must be 1..{MAX_IN_FLIGHT}")
        self.timing = timing
        self.position = position
        self.scanned_to = position
        # None until the first reconcile reads an empty-or-not destination.
        self.dest_next = dest_next
        self.offset_map = OffsetMap.of(points)
        self.phase = Phase.RECONCILING
        self.error: str | None = None
        self.stamp: ProducerStamp | None = None
        # The sequence and destination offset of the next batch sent.
        self.sequence = 0
        self._send_dest = 0
        self.records_mirrored = 0
        self.batches_mirrored = 0
        self.batches_skipped = 0
        self.batches_resent = 0
        self.gap_offsets = 0
        # Decided entries the sender has passed (sent, acknowledged, or skipped), in order.
        self._window: deque[_Pending] = deque()
        # The window's run heads (entries that opened a send, acknowledged or not), in
        # order: what the window's questions walk (a run of one-record batches is hundreds
        # of entries, five runs in flight a few thousand).
        self._heads: deque[_Pending] = deque()
        self._in_flight = 0
        # Every send handed out and not answered, failed or past its deadline, stale ones
        # included: what could still land at the destination.
        self._outstanding: set[Send] = set()
        # Entries not passed yet, in order.
        self._pending: deque[_Pending] = deque()
        self._open: dict[int, list[_Pending]] = {}
        self._pending_bytes = 0
        # The newest timestamp of the last batch of this producer session the destination
        # acknowledged (None: none yet): what its state for our producer dates from, as
        # Kafka expires it (see _window_limit).
        self._acked_newest: int | None = None
        # The last producer session this partition lost: never reconciled under again.
        self._lost_stamp: ProducerStamp | None = None
        # The largest run coalesced (halved by each run the destination found too large).
        self._coalesce_limit = timing.coalesce_bytes
        self._backoff = Backoff(
            timing.retry_backoff_ms, timing.retry_backoff_max_ms, rng=rng or random.Random()
        )
        self._retry_at_ms = 0
        # Reconcile: when to ask for the log end, whether an ask is out, and a log end
        # that waits for more of the local log.
        self._ask_at_ms = 0
        self._asking = False
        self._dest_end: int | None = None
        self._stamp_for_end: ProducerStamp | None = None
        # The first progress save: wanted, under way, and when it may be tried again.
        self._first_save_wanted = False
        self._first_saving = False
        self._first_save_at_ms = 0

    # -- the log, in ------------------------------------------------------------------

    def feed(self, entries: Iterable[LogEntry]) -> None:
        """Take in the next stored batches, in offset order from `scanned_to`."""
        pending_list = self._pending
        scanned_to = self.scanned_to
        added = 0
        produce = Decision.PRODUCE  # looked up once, not once a batch
        try:
            for entry in entries:
                h = entry.header
                if h.base_offset < scanned_to:
                    raise LocalProtocolError(
                        f"batch at {h.base_offset} fed after {scanned_to - 1} was scanned"
                    )
                # Neither flag on (the common case): one test for both.
                if h.magic < MAGIC_V2 or not h.attributes & _TXN_OR_CONTROL:
                    pending = _Pending(entry, produce)
                elif h.is_control:
                    pending = _Pending(entry, Decision.SKIP)
                    if entry.marker in (ControlType.COMMIT, ControlType.ABORT):
                        outcome = (
                            Decision.PRODUCE
                            if entry.marker == ControlType.COMMIT
                            else Decision.SKIP
                        )
                        for held in self._open.pop(h.producer_id, ()):
                            held.decision = outcome
                else:
                    pending = _Pending(entry, Decision.HOLD)
                    self._open.setdefault(h.producer_id, []).append(pending)
                pending_list.append(pending)
                data = entry.data
                if data is not None:
                    added += len(data)
                scanned_to = h.base_offset + h.last_offset_delta + 1
        finally:
            self.scanned_to = scanned_to
            self._pending_bytes += added
        if self._dest_end is not None and self.phase is Phase.RECONCILING:
            assert self._stamp_for_end is not None
            self._reconcile(self._stamp_for_end, self._dest_end)

    def wants_more(self, budget_bytes: int) -> bool:
        """Whether the shell should read further: below the memory budget, when the batch
        at the head waits for a marker that only further reading can find, or when a
        reconcile waits for the batches the destination already holds."""
        if self._pending_bytes < budget_bytes or self._dest_end is not None:
            return True
        return bool(self._pending) and self._pending[0].decision is Decision.HOLD

    @property
    def buffered_bytes(self) -> int:
        """Batch bytes read ahead and held, not sent yet."""
        return self._pending_bytes

    @property
    def held_transactions(self) -> int:
        return len(self._open)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def idle(self) -> bool:
        """Nothing in flight and nothing decided to send: mirrored up to what was fed, or
        held by a transaction without its marker yet."""
        return self._in_flight == 0 and not any(
            p.decision is Decision.PRODUCE for p in self._pending
        )

    # -- time ---------------------------------------------------------------------------

    def next_wakeup_ms(self, now_ms: int) -> int | None:
        """The next time after `now_ms` the core has something to do without any input: a
        back-off ending, a send's deadline, a log end to ask for again."""
        times: list[int] = []
        if self.phase is Phase.HALTED:
            return None
        if self._outstanding:
            times.append(min(s.deadline_ms for s in self._outstanding))
        if self.phase is Phase.MIRRORING and self._retry_at_ms:
            times.append(self._retry_at_ms)
        if self.phase is Phase.RECONCILING and not self._asking and self._dest_end is None:
            times.append(self._ask_at_ms)
        if self._first_save_wanted and not self._first_saving:
            times.append(self._first_save_at_ms)
        later = [t for t in times if t > now_ms]
        return min(later) if later else None

    def expire(self, now_ms: int) -> ProducerStamp | None:
        """Sends unanswered past their deadline count as failed (resent); returns the
        producer session this lost (an expiring batch unanswered: see the rules), which
        the shell renews."""
        lost = None
        for p in self._heads:
            if p.send is not None and p.send.deadline_ms <= now_ms:
                send = p.send
                if self.failed(send, Failure.RETRY, now_ms).new_session:
                    lost = send.stamp
                break
        for send in [s for s in self._outstanding if s.deadline_ms <= now_ms]:
            self._outstanding.discard(send)
        self._maybe_drained()
        return lost

    # -- the destination, out and in --------------------------------------------------

    def log_end_wanted(self, now_ms: int) -> bool:
        """Whether the shell should read the destination's log end now (then call
        `on_log_end` or `log_end_failed`)."""
        if self.phase is not Phase.RECONCILING or self._asking or self._dest_end is not None:
            return False
        if now_ms < self._ask_at_ms:
            return False
        self._asking = True
        return True

    def log_end_failed(self, now_ms: int) -> None:
        self._asking = False
        self._ask_at_ms = now_ms + self._backoff.next_delay_ms()

    def on_log_end(
        self, stamp: ProducerStamp, log_end: int, high_watermark: int, now_ms: int
    ) -> Reconciled:
        """The destination partition's log end and high watermark, read under `stamp`."""
        self._asking = False
        if self.phase is not Phase.RECONCILING:
            return Reconciled(False, error=self.error)
        if stamp == self._lost_stamp:
            # Under the session this partition lost, sequence 0 could meet the state the
            # destination keeps: wait for the shell's new one.
            self._ask_at_ms = now_ms + SETTLE_POLL_MS
            return Reconciled(False, wait=True)
        if log_end != high_watermark:
            self._ask_at_ms = now_ms + SETTLE_POLL_MS
            return Reconciled(False, wait=True)
        return self._reconcile(stamp, log_end)

    def first_save_due(self, now_ms: int) -> bool:
        """Whether the shell should save progress now, as the first reconcile wants (then
        `first_progress_saved` or `first_save_failed`)."""
        if not self._first_save_wanted or self._first_saving or now_ms < self._first_save_at_ms:
            return False
        self._first_saving = True
        return True

    def first_progress_saved(self) -> None:
        """The shell saved progress after a partition's first reconcile."""
        self._first_save_wanted = False
        self._first_saving = False

    def first_save_failed(self, now_ms: int) -> None:
        """The first save failed: asked again after a back-off; nothing is sent meanwhile."""
        self._first_saving = False
        self._first_save_at_ms = now_ms + self._backoff.next_delay_ms()

    @property
    def first_save_wanted(self) -> bool:
        return self._first_save_wanted

    def next_send(
        self, now_ms: int, stamp: ProducerStamp, wall_ms: int | None = None
    ) -> Send | None:
        """The next batch to produce now under the mirror's producer session `stamp`, or
        None (window full, backing off, nothing decided, not mirroring). `wall_ms`: the
        wall clock, that batches' timestamps are judged by (None: none is expiring)."""
        if self.stamp is not None and stamp != self.stamp and self.phase is not Phase.HALTED:
            self._lose_session()
        if (
            self.phase is not Phase.MIRRORING
            or self._first_save_wanted
            or now_ms < self._retry_at_ms
            or self._window_batches() >= self._window_limit(wall_ms)
        ):
            return None
        while self._pending and self._pending[0].decision is Decision.SKIP:
            self._pass(self._pending.popleft())
        self._settle()
        if not self._pending or self._pending[0].decision is not Decision.PRODUCE:
            return None
        run = self._run()
        head = run[0]
        # The head is checked here; _run joins to it only batches that pass the same test.
        refused = mirrorable(head.entry.header)
        if refused is not None:
            self.halt(f"source offset {refused.base_offset}: {refused.reason}")
            return None
        timing = self.timing
        entries = tuple([p.entry for p in run])
        count = newest = 0
        for e in entries:
            h = e.header
            count += h.record_count
            if h.max_timestamp > newest:
                newest = h.max_timestamp
        expiring = self._expiring(newest, wall_ms)
        if expiring and self._window_batches() > 0:
            return None  # an expiring batch goes alone: when the window has drained
        deadline = now_ms + timing.produce_timeout_ms + timing.request_timeout_ms
        send = Send(
            entries[0],
            stamp,
            self.sequence,
            self._send_dest,
            deadline,
            entries[1:],
            expiring,
            records=count,
            newest_ms=newest,
        )
        head.run = len(run)
        head.rest = run[1:]
        head.send = send
        popleft = self._pending.popleft
        window = self._window
        for pending in run:
            popleft()
            window.append(pending)
        self._heads.append(head)
        self._in_flight += 1
        self._outstanding.add(send)
        self.sequence = next_sequence(self.sequence, count)
        self._send_dest += count
        return send

    def _run(self) -> list[_Pending]:
        """The entries the next send takes: the head alone, the run it opened before (a
        resend, or what is left of a cut run), or with `coalesce_bytes` the consecutive
        small batches that can join it: at most `coalesce_bytes` stored and
        `coalesce_records` records (their decompressed bytes are bounded when the shell
        coalesces the run: `run_cut`)."""
        head = self._pending[0]
        if head.run:
            return [self._pending[i] for i in range(head.run)]
        limit = self._coalesce_limit
        run = [head]
        first = head.entry
        if not limit or first.data is None:
            return run
        size = len(first.data)
        if size > limit or size > SMALL_BATCH_BYTES or not can_join(first.header, first.header):
            return run
        small_limit = min(SMALL_BATCH_BYTES, limit)
        records = first.header.record_count
        max_records = self.timing.coalesce_records
        kept = first.header.attributes & JOIN_ATTRIBUTES
        produce = Decision.PRODUCE
        append = run.append
        for pending in itertools.islice(self._pending, 1, None):
            entry = pending.entry
            data = entry.data
            if (
                pending.decision is not produce
                or pending.run  # opens a run sent before: resent as it was, never joined
                or data is None
            ):
                break
            length = len(data)
            h = entry.header
            count = h.record_count
            records += count
            size += length
            attributes = h.attributes
            # can_join(first, h) inline (it runs once a batch): the head passed it, so
            # an equal timestamp type is create time; magic, control and thinned as
            # coalesce.mergeable tests them.
            if (
                length > small_limit
                or size > limit
                or records > max_records
                or (attributes & JOIN_ATTRIBUTES) != kept
                or h.magic != MAGIC_V2
                or attributes & CONTROL_FLAG_MASK
                or h.last_offset_delta != count - 1
                or count < 1  # mirrorable's test: such a batch heads a send
            ):
                break
            append(pending)
        return run

    def run_cut(self, send: Send, joined: int) -> None:
        """The shell could not coalesce `send`'s run whole: only its first `joined`
        entries (see the module rules). It was never written, so it took none of its
        sequences: those entries go again as one run (one: as stored) with the same
        sequences, and the entry that cut the run heads the next one."""
        self._outstanding.discard(send)
        slot = self._slot(send)
        if slot is None:
            self._maybe_drained()
            return
        size = slot.run
        self._rewind(slot)
        slot.run = max(1, min(joined, size - 1))
        self._maybe_drained()

    def unsent(self, send: Send) -> None:
        """The shell never wrote `send` (it was stale before it left)."""
        self._outstanding.discard(send)
        self._maybe_drained()

    def current(self, send: Send) -> bool:
        """Whether `send` is still in flight (not rewound, answered or halted)."""
        return self._slot(send) is not None

    def with_data(self, send: Send, data: bytes | memoryview) -> Send | None:
        """`send` with its batch bytes read again by the shell (the same send otherwise);
        None when it is no longer in flight."""
        entry = LogEntry(send.entry.header, send.entry.marker, data)
        for p in self._heads:  # a send without bytes is a batch alone (see _run)
            if p.send is send:
                p.entry = entry
                # Held from now on, and forgotten when settled (_forget_bytes).
                self._pending_bytes += entry.held_bytes
                p.send = dataclasses.replace(send, entry=entry, more=())
                self._outstanding.discard(send)
                self._outstanding.add(p.send)
                return p.send
        return None

    def acked(self, send: Send, dest_base: int, now_ms: int) -> Answered:
        """The destination took `send`'s batch at `dest_base` (-1: where it was expected;
        a duplicate is answered so)."""
        self._outstanding.discard(send)
        slot = self._slot(send)
        if slot is None:
            self._maybe_drained()
            return Answered(stale=True)
        slot.send = None
        slot.acked_at = dest_base if dest_base >= 0 else send.expected_dest
        self._in_flight -= 1
        # The destination's state for our producer now dates from this batch's timestamps.
        self._acked_newest = send.newest_timestamp
        self._backoff.reset()
        done = self._settle()
        self._maybe_drained()
        return Answered(batches_done=done)

    def failed(self, send: Send, failure: Failure, now_ms: int, *, reason: str = "") -> Answered:
        """`send` failed (see Failure); the window rewinds, the session is lost, or the
        partition halts, by the module rules."""
        self._outstanding.discard(send)
        slot = self._slot(send)
        if slot is None:
            self._maybe_drained()
            return Answered(stale=True)
        split = failure is Failure.TOO_LARGE and bool(send.more)
        if split:
            # The destination refused the whole run, so none of its sequences is taken:
            # its entries go again with the same sequences, in runs of at most half its
            # bytes (fewer entries each time: a single batch at last, as stored).
            run_bytes = sum(len(e.data or b"") for e in send.entries)
            self._coalesce_limit = min(self._coalesce_limit, run_bytes // 2)
            failure = Failure.RETRY
        elif failure is Failure.TOO_LARGE:
            failure = Failure.FATAL
        if failure is Failure.FATAL:
            self.halt(
                f"destination refused the batch of source offset "
                f"{send.entry.header.base_offset}: {reason}"
            )
            return Answered(halted=True)
        if failure is Failure.OUT_OF_ORDER and self._unresolved_before(slot):
            failure = Failure.RETRY
        expired = failure is Failure.RETRY and send.expiring and self.timing.first_batch_alone
        if expired:
            # Written or not, the destination may have forgotten us since: a resend could
            # be written twice. Reconcile under a new session (after a back-off).
            failure = Failure.SESSION
        self._rewind(slot)
        if split:
            slot.run = 0
        if failure is Failure.RETRY:
            self.batches_resent += 1
            self._retry_at_ms = now_ms + self._backoff.next_delay_ms()
            self._maybe_drained()
            return Answered()
        lost_here = self.stamp == send.stamp
        self._lose_session()
        if expired:
            self._ask_at_ms = now_ms + self._backoff.next_delay_ms()
        self._maybe_drained()
        return Answered(new_session=lost_here)

    def local_log_starts_at(self, offset: int) -> int:
        """The local log now starts at `offset`. When its retention deleted records not
        read yet and nothing read is pending (what is pending is still sent: its bytes or
        headers are held), go on from `offset`; returns the offsets lost (0: none, or not
        yet)."""
        if self.scanned_to >= offset or self._pending or self._window:
            return 0
        return self.skip_to(offset)

    def skip_to(self, offset: int) -> int:
        """The local log no longer holds [position, offset) (its retention deleted records
        not mirrored yet): go on from `offset`; returns how many offsets were lost. Only
        when nothing is pending (the shell calls it when the log start passed scanned_to)."""
        if self._pending or self._window:
            raise LocalProtocolError("skip_to with batches pending")
        lost = max(0, offset - self.position)
        self.position = self.scanned_to = max(self.position, offset)
        self.gap_offsets += lost
        return lost

    def halt(self, reason: str) -> None:
        if self.phase is not Phase.HALTED:
            self.error = reason
        self.phase = next_phase(self.phase, Event.HALT)
        for p in self._window:
            p.send = None
        self._in_flight = 0
        self._outstanding.clear()
        self._dest_end = None

    def progress(self) -> Progress:
        return Progress(self.position, self.dest_next, tuple(self.offset_map.points))

    # -- internals ------------------------------------------------------------------------

    def _reconcile(self, stamp: ProducerStamp, dest_end: int) -> Reconciled:
        """See the module rules."""
        self._dest_end = None
        if self._window:
            raise LocalProtocolError("reconcile with batches in flight")
        if self.dest_next is None:
            self.dest_next = dest_end
            self._first_save_wanted = True
        if dest_end < self.dest_next:
            return self._halt_result(
                f"destination log end {dest_end} is below the mirrored end {self.dest_next}: "
                "records the mirror wrote are gone (topic recreated, unclean election?)"
            )
        found = 0
        while dest_end > self.dest_next:
            self._drop_skipped()
            if not self._pending or self._pending[0].decision is Decision.HOLD:
                # Wait for more of the log (feed resumes from here).
                self._dest_end = dest_end
                self._stamp_for_end = stamp
                return Reconciled(False, found, need_more=True)
            head = self._pending[0].entry.header
            if self.dest_next + head.record_count > dest_end:
                return self._halt_result(
                    f"destination log end {dest_end} falls inside the batch of source offset "
                    f"{head.base_offset} (expected at {self.dest_next}): something else "
                    "writes to the destination partition"
                )
            pending = self._pending.popleft()
            self._forget_bytes(pending)
            self._advance(pending, self.dest_next)
            found += 1
        self._drop_skipped()
        self.stamp = stamp
        self._acked_newest = None
        self.sequence = 0
        self._send_dest = self.dest_next
        self._retry_at_ms = 0
        self._stamp_for_end = None
        self.phase = next_phase(self.phase, Event.RECONCILED)
        return Reconciled(True, found)

    def _window_limit(self, wall_ms: int | None) -> int:
        """Batches that may be in flight: one until the destination acknowledged one of
        this producer session, while one in flight is expiring, and while the last it
        acknowledged is expiring -- a broker
        with no state for a producer takes its first batch at any sequence, so a second
        batch sent beside a first that fails would be written without it (a gap); once it
        holds our state it refuses any gap."""
        if not self.timing.first_batch_alone:
            return self.timing.max_in_flight
        if self._acked_newest is None or self._old(self._acked_newest, wall_ms):
            return 1
        if any(p.send is not None and p.send.expiring for p in self._heads):
            return 1  # nothing beside an expiring batch (see _expiring)
        return self.timing.max_in_flight

    def _expiring(self, newest_ms: int, wall_ms: int | None) -> bool:
        """Whether the destination may forget our producer after batches whose newest
        timestamp is `newest_ms` (see the module rules)."""
        if not self.timing.first_batch_alone:
            return False
        return self._old(newest_ms, wall_ms)

    def _old(self, timestamp_ms: int, wall_ms: int | None) -> bool:
        """Whether producer state dating from `timestamp_ms` may be expired by now."""
        if wall_ms is None:
            return False
        expiration = self.timing.producer_expiration_ms
        return wall_ms - timestamp_ms >= expiration - min(EXPIRY_MARGIN_MS, expiration // 2)

    def _window_batches(self) -> int:
        """Batches sent since the oldest one not settled, acknowledged or not: a resend of
        that oldest one must still be among the last five the broker remembers."""
        return len(self._heads)

    def _slot(self, send: Send) -> _Pending | None:
        """The run head `send` is in flight from (None: no longer in flight)."""
        for p in self._heads:
            if p.send is send:
                return p
        return None

    def _unresolved_before(self, slot: _Pending) -> bool:
        for p in self._heads:
            if p is slot:
                return False
            if p.send is not None:
                return True
        return False

    def _rewind(self, slot: _Pending) -> None:
        """`slot` and everything the sender passed after it go back to be sent again."""
        slot_send = slot.send
        back: list[_Pending] = []
        while self._window:
            p = self._window.pop()
            if p.run:
                self._heads.pop()
                if p.send is not None:  # a run's first entry counts its send
                    self._in_flight -= 1
            p.send = None
            p.acked_at = None
            back.append(p)
            if p is slot:
                break
        for p in back:  # last popped first: the original order
            self._pending.appendleft(p)
        # The next send repeats `slot`'s sequence and expected destination offset.
        assert slot_send is not None
        self.sequence, self._send_dest = slot_send.base_sequence, slot_send.expected_dest

    def _lose_session(self) -> None:
        self.phase = next_phase(self.phase, Event.SESSION_LOST)
        if self.stamp is not None:
            self._lost_stamp = self.stamp
        self._dest_end = None
        self._stamp_for_end = None
        self._asking = False
        self._ask_at_ms = 0

    def _maybe_drained(self) -> None:
        if self.phase is Phase.DRAINING and self._in_flight == 0 and not self._outstanding:
            # What was acknowledged is settled; the rest goes back to be reconciled.
            self._settle()
            self._heads.clear()
            while self._window:
                p = self._window.pop()
                p.acked_at = None
                self._pending.appendleft(p)
            # A new producer starts its sequences afresh: runs may be formed anew.
            for p in self._pending:
                p.run = 0
            self.phase = next_phase(self.phase, Event.DRAINED)

    def _pass(self, pending: _Pending) -> None:
        """The sender passed `pending` (sent or skipped): it joins the window."""
        self._window.append(pending)
        if pending.run:
            self._heads.append(pending)

    def _settle(self) -> int:
        """Acknowledged runs and skipped entries at the window's head become progress; a
        run settles whole (its entries follow its head in the window)."""
        done = 0
        window = self._window
        while window:
            head = window[0]
            if head.decision is Decision.SKIP:
                window.popleft()
                self._forget_bytes(head)
                self.position = head.entry.header.next_offset
                self.batches_skipped += 1
                continue
            if head.acked_at is None:
                break
            window.popleft()
            self._heads.popleft()
            rest = head.rest
            for _ in rest:
                window.popleft()
            self._advance_run(head, rest)
            done += 1 + len(rest)
        return done

    def _advance_run(self, head: _Pending, rest: list[_Pending]) -> None:
        """`head`'s acknowledged run becomes progress: its batches landed one after the
        other from `head.acked_at`."""
        assert head.acked_at is not None
        first = head.entry.header
        if not rest:
            self._forget_bytes(head)
            self._advance(head, head.acked_at)
            return
        dest = head.acked_at
        records = first.record_count
        held = head.entry.held_bytes
        last = first
        for p in rest:
            entry = p.entry
            h = entry.header
            records += h.record_count
            if entry.data is not None:
                held += len(entry.data)
            last = h
        self._pending_bytes -= held
        if last.next_offset - first.base_offset == records:
            # No offset between the batches: one difference for all, the first's.
            self.offset_map.record(first.base_offset, dest)
        else:
            at = dest
            for p in (head, *rest):
                h = p.entry.header
                self.offset_map.record(h.base_offset, at)
                at += h.record_count
        self.position = last.next_offset
        self.dest_next = dest + records
        self.records_mirrored += records
        self.batches_mirrored += 1 + len(rest)

    def _advance(self, pending: _Pending, dest_base: int) -> bool:
        h = pending.entry.header
        new_point = self.offset_map.record(h.base_offset, dest_base)
        self.position = h.next_offset
        self.dest_next = dest_base + h.record_count
        self.records_mirrored += h.record_count
        self.batches_mirrored += 1
        return new_point

    def _drop_skipped(self) -> None:
        while self._pending and self._pending[0].decision is Decision.SKIP:
            pending = self._pending.popleft()
            self._forget_bytes(pending)
            self.position = pending.entry.header.next_offset
            self.batches_skipped += 1

    def _forget_bytes(self, pending: _Pending) -> None:
        self._pending_bytes -= pending.entry.held_bytes

    def _halt_result(self, reason: str) -> Reconciled:
        self.halt(reason)
        return Reconciled(False, error=reason)
