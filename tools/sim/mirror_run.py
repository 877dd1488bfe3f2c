"""One seeded simulation of the mirror: the real mirror core (`PartitionMirror`, one per
partition) and the real log store (`PartitionLog` on a temporary directory, read as the
shell reads it) against a simulated destination (mirror_destination.py) in simulated time.

    python -m tools.sim.mirror_run --seed N [-v] | --seeds N [--first S] [--events E]

What stands in for the asyncio shell (replicad/mirror/shell.py) is small and synchronous:
a step per partition reads the local log ahead, saves a new partition's first progress
when its core says (some saves fail: the core says when to try again), answers the core's
log-end questions, and writes the sends it gets to one simulated connection, restamped
(and runs coalesced, when the seed turns coalesce_bytes on, some cut by a small bound on
their decompressed bytes) as the shell does; answers go
back through the same ProduceAnswer classification the shell uses.

Events, drawn with weights from the seed: source appends (plain batches, transactional
batches, COMMIT and ABORT markers), mirror steps, the destination taking a request,
replicating (acks=all answers go), answers delivered, lost, duplicated, a request refused
OUT_OF_ORDER_SEQUENCE_NUMBER, the destination's producer-expiry check (Kafka's, by the
timestamps of a producer's last batch: some seeds mirror records older than the expiry,
and an idle partition's state expires too; a producer forgotten is taken at any
sequence), a coalesced run refused MESSAGE_TOO_LARGE (some seeds' destinations), a leader
change that loses the unreplicated tail, a dropped connection, time passing,
progress saved, and a crash that loses the core, everything on the wire and what was not
saved. After every event:
- the destination holds each source record (read_committed) once, in order: its records
  are a prefix of the source's committed records in offset order, stopping at the first
  open transaction;
- progress (in memory and saved) never names more than the destination acknowledged.
At the end the faults stop, every transaction is decided, and the destination must hold
every record.
"""

from __future__ import annotations

import random
import sys
import tempfile
import traceback
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from kio.schema.errors import ErrorCode

from replicad.log.config import LogConfig
from replicad.log.partition import PartitionLog
from replicad.mirror.coalesce import RUN_RECORDS, RunCut, run_plain_bytes
from replicad.mirror.destination import ProduceAnswer
from replicad.mirror.partition_mirror import (
    Failure,
    MirrorTiming,
    PartitionMirror,
    Phase,
    Progress,
    Send,
)
from replicad.mirror.producer_session import ProducerSession
from replicad.mirror.restamp import ProducerStamp
from replicad.mirror.shell import coalesced_run, produced_batch, read_batch, read_entries
from replicad.protocol.error_codes import error_code_of
from replicad.records.batch import (
    scan_batches,
)
from replicad.records.records import ControlType
from replicad.types import TopicPartition
from tools.logdata.batches import control_batch, producer_batch
from tools.sim.invariants import InvariantError
from tools.sim.mirror_destination import PRODUCER_EXPIRATION_MS, SimDestination
from tools.sim.seeds import SCRATCH, SimResult, seed_main
from tools.sim.seeds import run_seeds as seeds_run

WEIGHTS: dict[str, int] = {
    "append": 10,
    "txn": 3,
    "marker": 3,
    "step": 25,
    "deliver": 16,
    "replicate": 10,
    "answer": 16,
    "lose_answer": 2,
    "dup_answer": 2,
    "out_of_order": 1,
    "expire_producers": 2,
    "leader_change": 1,
    "disconnect": 1,
    "tick": 8,
    "save": 4,
    "crash": 1,
}
COMMIT, ABORT = ControlType.COMMIT, ControlType.ABORT
REPLAY = "python -m tools.sim.mirror_run --seed {seed} -v"
# How often a new partition's first progress save fails (a full or failing disk).
FIRST_SAVE_FAILS = 0.3
# The wall clock at simulated time 0 (records carry timestamps of it).
WALL_BASE_MS = 1_700_000_000_000

CoreFactory = Callable[..., PartitionMirror]


@dataclass
class _SourceBatch:
    base: int
    count: int
    # None: plain; else the transaction's producer id (its fate in `fate`).
    txn: int | None = None
    control: bool = False


@dataclass
class _Source:
    """One source partition: its real log, and what a read_committed consumer reads."""

    log: PartitionLog
    batches: list[_SourceBatch] = field(default_factory=list)
    # Producer id -> COMMIT / ABORT once decided; open transactions are absent.
    fate: dict[tuple[int, int], int] = field(default_factory=dict)
    open: dict[int, int] = field(default_factory=dict)  # pid -> transaction number
    txn_of: dict[int, tuple[int, int]] = field(default_factory=dict)  # batch base -> txn

    def expected(self) -> list[int]:
        """Source offsets a read_committed reader of the destination may see, in order, up to
        the first transaction still open (the mirror holds everything after it)."""
        out: list[int] = []
        for b in self.batches:
            if b.control:
                continue
            if b.txn is not None:
                fate = self.fate.get(self.txn_of[b.base])
                if fate is None:
                    break
                if fate == ABORT:
                    continue
            out.extend(range(b.base, b.base + b.count))
        return out


@dataclass(eq=False)
class _Request:
    partition: int
    send: Send
    incarnation: int
    connection: int
    sources: tuple[int, ...]
    pid: int
    epoch: int
    seq: int
    max_timestamp: int


class MirrorSimulation:
    def __init__(
        self,
        seed: int,
        data_dir: Path,
        *,
        events: int = 200,
        core_factory: CoreFactory = PartitionMirror,
    ) -> None:
        self.seed = seed
        self.rng = rng = random.Random(seed)
        self.events = events
        self.core_factory = core_factory
        self.now_ms = 1_000_000
        self.timing = MirrorTiming(
            produce_timeout_ms=1_000,
            request_timeout_ms=1_000,
            retry_backoff_ms=50,
            retry_backoff_max_ms=1_000,
            max_in_flight=rng.choice((1, 2, 5, 5)),
            coalesce_bytes=rng.choice((0, 0, 200, 4_096)),
            # Some runs cut by their record count before their bytes.
            coalesce_records=rng.choice((RUN_RECORDS, RUN_RECORDS, 4)),
            producer_expiration_ms=PRODUCER_EXPIRATION_MS,
        )
        # Some seeds' runs are cut by their decompressed bound (run_plain_bytes in the
        # shell), mid-run or at a batch that alone is over it. Drawn from a generator of
        # its own, so every other draw of a seed stays what it was before this one.
        self.plain_limit = random.Random(f"{seed} plain").choice(
            (run_plain_bytes(self.timing.coalesce_bytes),) * 2 + (120, 300)
        )
        # How old the records a source batch holds are, when appended: some seeds mirror a
        # backlog older than the destination's producer expiry (or close to it).
        self.ages = rng.choice(((0,), (0, 0, 20_000, 45_000, 90_000)))
        self.budget = rng.choice((300, 2_000, 1 << 20))
        self.read_bytes = rng.choice((1_024, 65_536))
        config = LogConfig(segment_bytes=rng.choice((4_096, 1 << 20)))
        partitions = rng.choice((1, 2))
        self.sources = [
            _Source(
                PartitionLog.create(
                    data_dir / f"t-{p}", TopicPartition("t", p), config, now_ms=self.now_ms
                )
            )
            for p in range(partitions)
        ]
        # Some seeds' destinations refuse batches larger than any the source holds (1-5
        # records): a coalesced run over it goes again as stored.
        max_batch_records = rng.choice((None, None, 6, 9))
        # Some seeds' destinations answer a forgotten producer UNKNOWN_PRODUCER_ID (Kafka
        # before 2.5) instead of taking its batch at any sequence.
        old_broker = rng.random() < 0.3
        self.dests = [
            SimDestination(max_batch_records, old_broker=old_broker) for _ in range(partitions)
        ]
        self.next_pid = 1000
        self.next_txn = 0
        self.session = self._new_session()
        self.incarnation = 0
        self.connection = 0
        self.requests: deque[_Request] = deque()
        self.answers: deque[tuple[_Request, ProduceAnswer]] = deque()
        self.unanswered: set[_Request] = set()
        self.saved: dict[int, Progress] = {}
        self.cores: list[PartitionMirror] = []
        self.log: list[str] = []
        self.counts: Counter[str] = Counter()
        self._start_cores()

    @property
    def wall_ms(self) -> int:
        return WALL_BASE_MS + self.now_ms

    # -- the mirror process ---------------------------------------------------------------

    def _init_producer_id(self) -> ProducerStamp:
        self.next_pid += 1
        return ProducerStamp(self.next_pid, 0)

    def _new_session(self) -> ProducerSession:
        """A process's producer session (the shell's start: granted at once)."""
        session = ProducerSession(50, 1_000, rng=random.Random(self.rng.random()))
        assert session.ask_wanted(self.now_ms)
        session.granted(self._init_producer_id())
        return session

    @property
    def stamp(self) -> ProducerStamp:
        stamp = self.session.usable
        assert stamp is not None
        return stamp

    def _start_cores(self) -> None:
        self.cores = []
        for p, source in enumerate(self.sources):
            saved = self.saved.get(p)
            rng = random.Random(self.rng.random())
            if saved is None:
                core = self.core_factory(
                    position=source.log.log_start_offset, timing=self.timing, rng=rng
                )
            else:
                core = self.core_factory(
                    position=saved.position,
                    dest_next=saved.dest_next,
                    points=saved.points,
                    timing=self.timing,
                    rng=rng,
                )
            self.cores.append(core)

    def save(self) -> None:
        self.saved = {p: core.progress() for p, core in enumerate(self.cores)}

    def step(self, p: int) -> None:
        """What the shell's _step does for one partition."""
        core, plog, dest = self.cores[p], self.sources[p].log, self.dests[p]
        if core.phase is Phase.HALTED:
            raise InvariantError(f"partition {p} halted: {core.error}")
        lost = core.expire(self.now_ms)
        if lost is not None:
            self._renew(lost)
        if core.scanned_to < plog.high_watermark and core.wants_more(self.budget):
            keep = core.buffered_bytes < self.budget
            entries = read_entries(
                plog, core.scanned_to, plog.high_watermark, self.read_bytes, keep
            )
            if entries:
                core.feed(entries)
        if core.first_save_due(self.now_ms):
            if self.rng.random() < FIRST_SAVE_FAILS:
                core.first_save_failed(self.now_ms)
                self.counts["first_save_failed"] += 1
                self.note(f"p{p} first progress save failed")
            else:
                self.save()
                core.first_progress_saved()
        if core.log_end_wanted(self.now_ms):
            if self.rng.random() < 0.1:
                core.log_end_failed(self.now_ms)
                self.note("log end unanswered")
            else:
                result = core.on_log_end(self.stamp, dest.log_end, dest.high_watermark, self.now_ms)
                self.note(f"p{p} log end {dest.log_end}/{dest.high_watermark}: {result}")
        while (send := core.next_send(self.now_ms, self.stamp, self.wall_ms)) is not None:
            if send.entry.data is None:
                again = core.with_data(send, read_batch(plog, send.entry.header.base_offset))
                assert again is not None
                send = again
            assert send.entry.data is not None
            made = coalesced_run(send, self.plain_limit) if send.more else None
            if isinstance(made, RunCut):
                # As the shell does: the run was never written; cut where the batch starts.
                core.run_cut(send, made.joined)
                self.counts["run_cut"] += 1
                self.note(f"p{p} run of {len(send.entries)} cut after {made.joined}")
                continue
            batch = b"".join(produced_batch(send, made))
            h = scan_batches(batch).batches[0]
            base = send.entry.header.base_offset
            sources = tuple(
                o for e in send.entries for o in range(e.header.base_offset, e.header.next_offset)
            )
            if len(send.entries) > 1:
                self.counts["coalesced"] += 1
            if len(sources) != h.record_count:
                raise InvariantError(f"p{p}: a batch of {h.record_count} records for {sources}")
            request = _Request(
                p,
                send,
                self.incarnation,
                self.connection,
                sources,
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.max_timestamp,
            )
            self.requests.append(request)
            self.unanswered.add(request)
            self.note(
                f"p{p} send {base}+{h.record_count} seq {h.base_sequence} pid {h.producer_id}"
            )

    def answer(self, request: _Request, answer: ProduceAnswer) -> None:
        """What the shell's _answered does with one partition's answer."""
        self.unanswered.discard(request)
        if request.incarnation != self.incarnation or request.connection != self.connection:
            return  # the process or connection that sent it is gone
        core = self.cores[request.partition]
        failure = answer.failure
        if failure is None:
            result = core.acked(request.send, answer.base_offset, self.now_ms)
        else:
            result = core.failed(request.send, failure, self.now_ms, reason=answer.reason)
            if result.new_session:
                self._renew(request.send.stamp)
        self.note(f"p{request.partition} answer {answer.error_name or 'ok'} -> {result}")

    def expire(self) -> None:
        """Time passed: a request unanswered past its deadline times the connection out
        (BrokerConnection closes it, failing everything on it; the broker drops what it had
        not read), then the cores give up on their own late sends."""
        if any(
            r.send.deadline_ms <= self.now_ms
            for r in self.unanswered
            if r.incarnation == self.incarnation and r.connection == self.connection
        ):
            self.note("a request timed out: connection closed")
            self.fail_connection()
        for core in self.cores:
            lost = core.expire(self.now_ms)
            if lost is not None:
                self._renew(lost)

    def fail_connection(self) -> None:
        """The connection is gone: every request on it fails (the shell's _failed_send)."""
        self.connection += 1
        failed = [r for r in self.unanswered if r.incarnation == self.incarnation]
        self.requests.clear()
        self.answers.clear()
        self.unanswered.clear()
        for r in sorted(failed, key=lambda r: (r.partition, r.seq)):
            if self.cores[r.partition].failed(r.send, Failure.RETRY, self.now_ms).new_session:
                self._renew(r.send.stamp)

    def _renew(self, lost: ProducerStamp) -> None:
        """A partition lost the producer session `lost`: a new one for all (once)."""
        if self.session.lost(lost):  # the shell's _renew: the session core decides
            assert self.session.ask_wanted(self.now_ms)
            self.session.granted(self._init_producer_id())
            self.counts["new_session"] += 1

    # -- events ---------------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.log.append(f"[{self.now_ms}] {text}")

    def append_source(self, p: int, kind: str) -> None:
        source = self.sources[p]
        plog = source.log
        base = plog.log_end_offset
        if kind == "marker":
            if not source.open:
                return
            pid = self.rng.choice(sorted(source.open))
            fate = COMMIT if self.rng.random() < 0.7 else ABORT
            batch = control_batch(base, producer_id=pid, control_type=fate)
            txn = (pid, source.open.pop(pid))
            source.fate[txn] = fate
            record = _SourceBatch(base, 1, pid, control=True)
            source.txn_of[base] = txn
        else:
            count = self.rng.randint(1, 5)
            values = [b"%d" % (base + i) * self.rng.randint(1, 20) for i in range(count)]
            at = {"timestamp_ms": self.wall_ms - self.rng.choice(self.ages)}
            if kind == "txn":
                pid = self.rng.randint(1, 3)
                if pid not in source.open:
                    self.next_txn += 1
                    source.open[pid] = self.next_txn
                batch = producer_batch(
                    base, values, producer_id=pid, producer_epoch=0, transactional=True, **at
                )
                source.txn_of[base] = (pid, source.open[pid])
                record = _SourceBatch(base, count, pid)
            else:
                batch = producer_batch(base, values, **at)
                record = _SourceBatch(base, count)
        plog.append(batch, scan_batches(batch).batches, now_ms=self.now_ms)
        plog.high_watermark = plog.log_end_offset
        source.batches.append(record)
        self.note(f"p{p} source {kind} at {base}")

    def deliver(self) -> None:
        request = self.requests.popleft()
        dest = self.dests[request.partition]
        answer = dest.produce(
            request, request.pid, request.epoch, request.seq, request.sources, request.max_timestamp
        )
        self.note(f"p{request.partition} destination takes seq {request.seq}: {answer}")
        if answer is not None and answer.error == ErrorCode.message_too_large:
            self.counts["too_large"] += 1
        if answer is not None and answer.error == ErrorCode.unknown_producer_id:
            self.counts["unknown_producer_id"] += 1
        if answer is not None:
            self.answers.append((request, _produce_answer(answer.error, answer.base_offset)))

    def replicate(self, p: int) -> None:
        dest = self.dests[p]
        dest.replicate()
        for key, answer in dest.answers_ready:
            assert isinstance(key, _Request)
            self.answers.append((key, _produce_answer(answer.error, answer.base_offset)))
        dest.answers_ready.clear()

    def _quiet(self, p: int) -> bool:
        progress = self.cores[p].progress()
        return progress.dest_next == self.dests[p].log_end == self.dests[
            p
        ].high_watermark and not any(r.partition == p for r in self.unanswered)

    def run_event(self, kind: str) -> None:
        rng = self.rng
        p = rng.randrange(len(self.sources))
        self.counts[kind] += 1
        if kind in ("append", "txn", "marker"):
            self.append_source(p, kind)
        elif kind == "step":
            self.step(p)
        elif kind == "deliver" and self.requests:
            self.deliver()
        elif kind == "replicate":
            self.replicate(p)
        elif kind == "answer" and self.answers:
            self.answer(*self.answers.popleft())
        elif kind == "lose_answer" and self.answers:
            request, _ = self.answers.popleft()
            self.note(f"p{request.partition} answer to seq {request.seq} lost")
        elif kind == "dup_answer" and self.answers:
            request, answer = self.answers[0]
            self.answer(request, answer)
        elif kind == "out_of_order" and self.requests:
            request = self.requests.popleft()
            self.note(f"p{request.partition} seq {request.seq} refused out of order")
            self.answers.append((request, _produce_answer(45, -1)))
        elif kind == "expire_producers":
            if all(self._quiet(q) for q in range(len(self.sources))):
                # The mirror idles (every write acknowledged, nothing on the wire: no
                # request lives as long as the expiry, a day in Kafka): its producer's last
                # batches get older than the expiry.
                self.now_ms += PRODUCER_EXPIRATION_MS
                self.note(f"idle for {PRODUCER_EXPIRATION_MS} ms")
            expired = self.dests[p].expire_producers(self.wall_ms)
            self.note(f"p{p} expiry check at the destination: {expired} producers forgotten")
        elif kind == "leader_change":
            failed = self.dests[p].leader_change()
            self.note(f"p{p} destination leader change, {len(failed)} unreplicated lost")
            for key in failed:
                assert isinstance(key, _Request)
                self.answers.append((key, _produce_answer(6, -1)))
        elif kind == "disconnect":
            self.note("connection dropped")
            self.fail_connection()
        elif kind == "tick":
            self.now_ms += rng.choice((1, 10, 100, 1_000, 3_000))
            self.expire()
        elif kind == "save":
            self.save()
            self.note(f"saved {self.saved}")
        elif kind == "crash":
            self.note("crash: the core, the wire and unsaved progress are lost")
            self.incarnation += 1
            self.requests.clear()
            self.answers.clear()
            self.unanswered.clear()
            self.connection += 1
            self.session = self._new_session()
            self._start_cores()

    # -- invariants -------------------------------------------------------------------------

    def check(self, *, complete: bool = False) -> None:
        for p, (source, dest) in enumerate(zip(self.sources, self.dests, strict=True)):
            want = source.expected()
            got = dest.records
            if got != want[: len(got)]:
                at = next(
                    (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                    min(len(got), len(want)),
                )
                raise InvariantError(
                    f"p{p}: destination record {at} is source offset "
                    f"{got[at] if at < len(got) else None}, expected "
                    f"{want[at] if at < len(want) else None} (duplicate, loss or reorder)"
                )
            if complete and got != want:
                raise InvariantError(f"p{p}: destination holds {len(got)} of {len(want)} records")
            progresses = [("in memory", self.cores[p].progress())]
            if p in self.saved:
                progresses.append(("saved", self.saved[p]))
            for what, progress in progresses:
                if progress.dest_next is not None and progress.dest_next > dest.high_watermark:
                    raise InvariantError(
                        f"p{p}: {what} progress names destination offset {progress.dest_next}, "
                        f"the destination acknowledged up to {dest.high_watermark}"
                    )

    def finish(self) -> None:
        """Faults stop: every transaction decided, the wire drained, time moves on."""
        for p, source in enumerate(self.sources):
            while source.open:
                self.append_source(p, "marker")
        for _ in range(400):
            for p in range(len(self.sources)):
                self.step(p)
            while self.requests:
                self.deliver()
            for p in range(len(self.sources)):
                self.replicate(p)
            while self.answers:
                self.answer(*self.answers.popleft())
            self.check()
            done = all(
                core.phase is Phase.MIRRORING
                and core.idle
                and core.scanned_to == source.log.high_watermark
                for core, source in zip(self.cores, self.sources, strict=True)
            )
            if done:
                break
            self.now_ms += 200
            self.expire()
        self.check(complete=True)

    def run(self) -> None:
        kinds = list(WEIGHTS)
        weights = [WEIGHTS[k] for k in kinds]
        for _ in range(self.events):
            kind = self.rng.choices(kinds, weights)[0]
            self.run_event(kind)
            self.check()
        self.finish()


def _produce_answer(code: int, base_offset: int) -> ProduceAnswer:
    error = error_code_of(code)
    if error == ErrorCode.none:
        return ProduceAnswer(base_offset)
    return ProduceAnswer(-1, error, error.name)


def run_seed(
    seed: int, *, events: int = 200, core_factory: CoreFactory = PartitionMirror
) -> SimResult:
    with tempfile.TemporaryDirectory(prefix=f"mirror-sim-{seed}-", dir=SCRATCH) as tmp:
        sim = MirrorSimulation(seed, Path(tmp), events=events, core_factory=core_factory)
        try:
            sim.run()
        except Exception as exc:  # a failing seed is a result, with its trace
            error = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, InvariantError):
                error += "\n" + traceback.format_exc(limit=4)
            return _result(sim, False, error)
        finally:
            for source in sim.sources:
                source.log.close()
        return _result(sim, True, None)


def _result(sim: MirrorSimulation, ok: bool, error: str | None) -> SimResult:
    return SimResult(
        sim.seed, len(sim.log), ok, error, sim.log, dict(sim.counts), replay=REPLAY, tail=15
    )


# run_seeds(seeds, *, stop_at_first=False, **run_seed's options)
run_seeds = partial(seeds_run, run_seed)


def main(argv: list[str] | None = None) -> int:
    return seed_main("python -m tools.sim.mirror_run", __doc__, run_seed, events=200, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
