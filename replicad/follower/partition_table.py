"""The follower's core for one leader: its partitions' state machine, sans-I/O.

`PartitionTable` decides; `fetcher.py` (the asyncio shell) and `tools/sim` (a simulated
cluster) do what it decides. It imports no asyncio, socket or clock: every handler takes
`now_ms`, every input is an already-parsed answer, every output is data.

Events in: a partition added (its state loaded from disk) or removed (metadata
answered), a parsed Fetch response, OffsetForLeaderEpoch and ListOffsets answers, a
send or connection failure, disk full / disk back, the outcome of each action the
shell performed (`truncated`, `appended`, `append_failed`), and a partition's state changed
by the shell itself (`touched`: a log opened or unusable, metadata's new leader epoch or
topic id in place).

Actions out (`Action`; actions.py holds them and the answers the table is given):
truncate P to N, truncate P fully and start at N, append these validated batches, set
P's high watermark, halt P with a reason, look the leaders up again. A partition's
back-off is state (`PartitionState.delayed_until_ms`; `next_wakeup_ms` says when the
shell should look again); the leader's -- after a connection failure, a
refused response or a shell error -- is a delay returned to the shell (`connection_failed`,
`ResponseOutcome.retry_in_ms`, `loop_failed`), growing with jitter. What to fetch next
is `next_fetch` (partitions, offsets and epochs, built through the KIP-227 session
handler); what to ask first is `epoch_questions` and `offset_questions`.

Rules kept here (each repeated where it is kept):
- R1 fetch offset: a partition's fetch offset is its local log end, except between a
  response's validation and its append (then it is where that append will end, so a
  pipelined request asks for what follows). After a failed append or a truncation it
  goes back to the log end.
- R2 leader changes / fencing: a metadata or leadership error backs the partition off
  and asks for metadata; FENCED/UNKNOWN_LEADER_EPOCH are among those.
- R3 divergence (KIP-320): a Fetch v12+ DivergingEpoch, or an OffsetForLeaderEpoch
  answer (older leaders, asked after a leader change and at start), truncates where
  `decide_truncation` says; rule 4 there asks again.
- R4 out of range: ListOffsets earliest and latest decide: leader ends below us ->
  truncate to its end; leader starts above us -> the gap (`on_gap`: reset = start over
  at its start, halt = stop the partition); else transient, back off.
- R5 high watermark: what the log serves onward is min(leader's, local log end), at
  least the log start, and it only rises here. A restart's loaded checkpoint is the
  floor until a leader reports a higher one; only a truncation lowers it (the log
  store lowers it with the log end).
- R6 unknown error codes are UNKNOWN_SERVER_ERROR for their partition alone
  (`error_code_of`): counted, backed off, retried.
- R7 corrupt data is never appended: counted, logged every time, refetched with backoff.
- R8 another lineage: a leader's batch that starts below our log end and holds it, on a
  non-empty log (validate.py rule 7: the leader's log starts inside a batch of another
  lineage than ours), halts the partition with the reason, as Kafka fails it; refetching
  would never get past it.
- R9 answers by name (Fetch below v13, ListOffsets, OffsetForLeaderEpoch) may be a
  re-created topic's: before they change a partition whose log has a topic id, a
  Metadata answer received after them must name the same id (`confirm_topic_ids`); a
  new id halts the partition (topic re-created), a missing topic drops the actions and
  asks for metadata. A halt they made (R8, R4's gap) is confirmed too: with a new id it
  is the re-creation's, said so (found by tools/sim, seed 27926). Fetch v13+ names the
  topic by id: the leader refuses an old one.
- R10 epochs of fetched batches (validate.py rule 8; found by tools/sim, seed 8667 at
  Fetch v4: two unclean elections metadata never showed, then the same leader served a
  batch of epoch 3 at our log end, and the follower kept a divergent tail of epoch 1).
  A batch whose leader epoch is above the one we know is not appended, nor anything
  after it (Kafka's follower keeps nothing above the epoch it fetched with,
  KAFKA-18723). Where the leader checked nothing (below Fetch v9 it is not fenced by our
  epoch, below v12 it sends no DivergingEpoch), the batch at our log end must carry the
  epoch our log ends with, unless an OffsetForLeaderEpoch check just found that join to
  be the leader's (`join_checked`, used up by the next answer): a new epoch there is a
  leader change we have not checked. Either way the partition asks for metadata, backs
  off and checks divergence (R3) before it fetches again; an answer that arrives while
  that check is pending was asked before it and is dropped unread (as Kafka's fetcher
  drops data for a partition that is truncating).
- R11 a sessionless leader (sessions off, or no full request has made a session so far and
  the last was answered without one, as Tansu always does, or not answered at all) gets at
  most `sessionless_max_partitions` partitions a request, in passes: a pass asks every
  partition once, a share at a time (each one sent goes to the back of the rotation), so
  every partition is asked within a pass even when none returns data (Tansu 0.6 answered a
  Fetch of 1,000 partitions with no records at all, and 4 of them alone with their
  batches). Within a pass the partitions known to be behind go first in each share (the
  leader's high watermark above our fetch offset, or asked in a share and not served since:
  no records, not found caught up, or no answer; under read_committed the last stable
  offset stands for the high watermark), then the others in rotation order: Tansu
  reads a request's partitions in order until its max wait has passed and answers the rest
  without records, so what it cuts is what needed nothing. After an answer that left a
  partition behind without records (the leader's wait ran out before it read it), the next
  share's max wait is at least `sessionless_wait_ms` (Kafka, which answers at once when it
  has data, leaves one behind only when the response is full: a longer wait costs it
  nothing then). A partition an answer cut short (behind, answered without records and
  without an error after the last partition the answer gave records) keeps its place: it
  goes first in the next share, stays in the pass, and that answer is not counted in its
  `answers_since_move` (session 14's Tansu soaks: after a full minute hundreds of partitions
  were behind, Tansu read 20 of each share of 100, and the rest waited a whole pass and were
  judged after two such answers: 7,670 and 11,442 stalls). An answer that gave no partition
  records cut nothing short: a leader that does not move on is counted. Status says whether
  a leader is fetched in shares (the stall rule waits for a partition's turn:
  control/stalls.py). Should such a request create a
  session after all (a Kafka whose session cache had no room at first), the next request
  adds the partitions it left out. A leader that keeps a session, or once made one, gets
  every partition at once (KIP-227), as before.
- R12 caught up: an answer without records that finds a partition at the leader's served
  end (R11's) starts its idle time again (`progress_ms`, `answers_since_move` 0), as a
  Kafka leader counts a follower's lag from when it last caught up (lastCaughtUpTimeMs):
  a partition with no new records for minutes is not idle for the stall rule, and once it
  has some it must move within the stall time of the last answer that found it caught up.
- R13 what to fetch is examined again only where it may have changed (issue 34: at 10,000
  partitions a walk over every partition cost 24-25 ms of a 26.8 ms request, for a share of
  100 as for one session). `_want` is one partition's entry (None: not fetchable now), kept
  in `_last_wanted`; a request examines again only the partitions marked since the last
  one -- by every handler here that changes a partition (add, remove, an answer naming it,
  appended, truncated, append_failed, the offsets and epoch answers and questions,
  logs_not_opened, disk_back, confirm_topic_ids), by the shells through `touched` for what
  they change themselves, and by the end of its delay or disk-full pause (a heap of
  `delayed_until_ms`) -- and every partition once FULL_WALK_EVERY_MS has passed since the
  last full walk: a change nothing marks (a log start moved by local retention, a mark
  forgotten) is asked at most that late, never lost. The session handler is told the
  partitions whose entry appeared, went or became another object since the last request
  built (`_wanted_changes`), as before. The same examination (`_refresh`) keeps the
  partitions without a log, asking ListOffsets, or waiting for a divergence check, and the
  questions before a request read those (without_log, offset_questions, epoch_questions,
  epoch_check_due, may_pipeline), each after examining what was marked. A sessionless
  leader's pass (R11) is walked once when it begins: its fetchable partitions go into two
  queues in rotation order (behind, the others), a partition examined again is queued
  again when its kind changed, and a share takes from the queues, checking each entry as
  it comes out; so a share costs about its own size. A full request lists the partitions
  in rotation order (KIP-74).
- R14 a request that ended without an answer counts a turn for the partitions it named
  (`answers_since_move`, the stall rule's wait for a turn: control/stalls.py) only when the
  leader had it and failed it: it timed out, or its answer was malformed, on a connection
  that had answered a Fetch before. A request lost with its connection (closed or reset by
  the peer, abandoned for a new connection, or the first on a new connection not answered
  in time: a broker restarting) gave its partitions no turn: the leader, not they, was
  away, and health names a leader that does not answer (`failing_since_ms`). Counted, the
  Tansu-on-S3 soak's restarts and network faults ended two requests naming a partition
  while it waited for its turn after a full disk, and 104 partitions were called stalled
  the moment the leader answered again (session 16). A leader that answers other shares
  and times out on one, every time, still has that share's partitions judged.
- R15 ListOffsets asks at most `_offsets_share` partitions a request (OFFSETS_SHARE_MAX at
  first), those not yet asked first in the order they need it: a leader that does not
  answer one in time (`offsets_not_answered`) is asked half as many next (down to one), and
  an answer doubles the share again. Tansu on S3 storage answers ListOffsets in about 35 ms
  a partition, one at a time: a request for 10,000 partitions never came back within the
  request timeout, was asked again whole, and nothing was replicated in 11 minutes
  (session 17's soak at 10,000 partitions). The partitions answered start fetching while
  the others wait for their share.
- R16 a share that got no usable answer (failed by the leader, lost with its connection, or
  abandoned for a new connection) keeps its place once: its partitions go first in the next
  share, in their order, and stay in the pass under way (R11's `_keep_places`), whether or
  not it counted a turn (R14); if that retry gets no usable answer either, they wait for
  the next pass (a share the leader never answers must not hold the others back, and is
  judged at a turn a pass, R14). Taken out of the pass when sent, they waited for the next
  pass: at 10,000 partitions on Tansu on S3 storage a pass took 46-90 s, so a partition
  whose turn a network fault failed was idle for longer than the stall time before it was
  asked again, and one failed twice so was called stalled (session 18's soak: 103 stalls,
  each over within a minute at its next turn).
"""

from __future__ import annotations

import heapq
import itertools
import random
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from replicad.follower.actions import (
    Action,
    Append,
    EpochAnswer,
    EpochQuestion,
    Halt,
    LocalLog,
    NextFetch,
    OffsetAnswer,
    OffsetsAnswer,
    RequestMetadata,
    ResponseOutcome,
    SetHighWatermark,
    StartAt,
    Truncate,
)
from replicad.follower.fetch_response import FetchedPartition, FetchResponseView
from replicad.follower.fetch_settings import FetchSettings, response_budget
from replicad.follower.fetcher_stats import FetcherStats
from replicad.follower.partition_phase import ASKS_OFFSETS, PartitionPhase, PhaseEvent
from replicad.follower.partition_state import TURNS_KEPT, PartitionState
from replicad.follower.truncation import decide_truncation
from replicad.follower.validate import validate_fetched
from replicad.log.epoch import EpochEndOffset
from replicad.protocol.backoff import Backoff
from replicad.protocol.error_codes import error_code_of, error_name
from replicad.protocol.fetch_request import (
    FETCH_SESSION_VERSION,
    FetchRequest,
    ForgottenPartition,
    RequestedPartition,
)
from replicad.ratelimit import RateLimitedLog
from replicad.session.client import (
    FetchRequestPlan,
    FetchSessionHandler,
    PartitionFetch,
    ResponseVerdict,
)
from replicad.types import TopicPartition
from replicad.wire import (
    FETCH_CURRENT_LEADER_EPOCH_VERSION,
    FETCH_LAST_FETCHED_EPOCH_VERSION,
    FETCH_TOPIC_ID_VERSION,
    READ_COMMITTED,
)

log = structlog.get_logger("replicad.fetcher")


# A full disk is tried again this soon at the latest (sooner on `disk_back`).
DISK_FULL_RETRY_MS = 5_000

# R13: every partition is examined again at least this often, marked or not.
FULL_WALK_EVERY_MS = 1_000
# R15: the most partitions one ListOffsets request asks (Kafka answers 1,000 in milliseconds;
# a leader that cannot in time is asked fewer).
OFFSETS_SHARE_MAX = 1_000
# ASKS_OFFSETS as a tuple: `in` finds a member by identity, with no Enum.__hash__ (a
# Python-level call) per partition examined.
_ASKS_OFFSETS = tuple(ASKS_OFFSETS)

# Errors after which the partition's leadership must be looked up again (R2).
METADATA_ERRORS = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.leader_not_available,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
        ErrorCode.kafka_storage_error,
        ErrorCode.unknown_topic_id,
        ErrorCode.inconsistent_topic_id,
        ErrorCode.offline_replica if hasattr(ErrorCode, "offline_replica") else ErrorCode.none,
    }
) - {ErrorCode.none}


class PartitionTable:
    """The partitions one leader serves us, and what to do about each."""

    def __init__(
        self,
        node_id: int,
        settings: FetchSettings,
        *,
        rng: random.Random | None = None,
        full_walk_every_ms: int = FULL_WALK_EVERY_MS,
    ) -> None:
        self.node_id = node_id
        self.settings = settings
        self.stats = FetcherStats()
        # The leader-wide back-off (connection failures, refused responses, loop errors);
        # its jitter comes from `rng` (seeded by the simulation).
        self._backoff = Backoff(
            settings.reconnect_backoff_ms,
            settings.reconnect_backoff_max_ms,
            rng=rng or random.Random(),
        )
        self.partitions: OrderedDict[TopicPartition, PartitionState] = OrderedDict()
        # Partitions per topic, for the bound on a response's size (response_max_bytes).
        self._topic_members: dict[str, int] = {}
        self.session = FetchSessionHandler(node_id, sessions_enabled=settings.sessions)
        # The fetchable partitions' entries as last examined, and the partitions whose entry
        # appeared, went or changed since the last request was built (R13, `_wanted`).
        self._last_wanted: dict[TopicPartition, PartitionFetch] = {}
        self._wanted_changes: list[TopicPartition] = []
        # R13: the partitions to examine again at the next build (an ordered set: the
        # simulation's runs repeat only if nothing here iterates in hash order); when each
        # delay or disk-full pause examined last ends, as a heap of (ms, sequence, tp) with
        # the ms each partition's live entry has; when the next full walk is due.
        self._stale: dict[TopicPartition, None] = {}
        self._delays: list[tuple[int, int, TopicPartition]] = []
        self._delay_at: dict[TopicPartition, int] = {}
        self._sequence = itertools.count()
        self._full_walk_every_ms = full_walk_every_ms
        self._full_walk_ms = 0
        # R13: as last examined, the partitions without a log, those asking ListOffsets
        # (ASKS_OFFSETS) and those waiting for a divergence check (ordered sets).
        self._logless: dict[TopicPartition, None] = {}
        self._asking: dict[TopicPartition, None] = {}
        # R15: partitions a ListOffsets request asks at most.
        self._offsets_share = OFFSETS_SHARE_MAX
        self._checking: dict[TopicPartition, None] = {}
        # The last request was a sessionless leader's share of the partitions (R11); the
        # partitions the current pass has not asked yet, each with its place in the pass
        # (rotation order when the pass began; those an answer cut short go before, those
        # added after); and those asked in a share and not served since (no records, not
        # found caught up, or no answer).
        self._sent_a_share = False
        self._pass_left: dict[TopicPartition, int] = {}
        self._unserved: set[TopicPartition] = set()
        # R11 and R13: the pass's fetchable partitions as two heaps of (place, tp), the
        # others at [False] and those behind at [True], and which heap holds each one's live
        # entry; the place the next partition cut short takes, and the next one added.
        self._pass_queues: tuple[list[tuple[int, TopicPartition]], ...] = ([], [])
        self._pass_queued: dict[TopicPartition, bool] = {}
        self._pass_front = 0
        self._pass_next = 0
        # The last answer left a partition behind without records: the next share waits
        # longer (R11).
        self._cut = False
        # The partitions the request in flight names: when its exchange ends (answered,
        # refused, failed, or abandoned for a new connection) each counts one answer since
        # its log last moved, whether the answer named it or not (`_exchange_ended`).
        self._out: Mapping[TopicPartition, PartitionFetch] = {}
        # R16: the share last asked again first after it got no usable answer.
        self._kept_share: frozenset[TopicPartition] = frozenset()
        # R14: the connection under the request has answered a Fetch.
        self._connection_answered = False
        self._say = RateLimitedLog(interval_ms=60_000)
        # No log is made before this (monotonic ms): the disk was full at the last try.
        self._open_logs_after_ms = 0

    # -- membership (metadata answered; state loaded from disk) --------------------------

    def add(self, state: PartitionState, local: LocalLog | None = None) -> None:
        """Track a partition; its `state` as the replicator built it from metadata and its
        log as loaded at start (the loaded high watermark is the floor, R5). Without a log
        the partition waits: the shell opens it between requests (`without_log`), since
        creating thousands of logs at once costs seconds of fsyncs."""
        if local is not None:
            state.log = local
        if state.tp not in self.partitions:
            topic = state.tp.topic
            self._topic_members[topic] = self._topic_members.get(topic, 0) + 1
            if self._pass_left:
                # R11: asked in the pass under way, after those there.
                self._pass_left[state.tp] = self._pass_next
                self._pass_next += 1
        self.partitions[state.tp] = state
        self._stale[state.tp] = None  # R13

    def remove(self, tp: TopicPartition) -> PartitionState | None:
        state = self.partitions.pop(tp, None)
        self._pass_left.pop(tp, None)
        self._pass_queued.pop(tp, None)
        self._unserved.discard(tp)
        self._delay_at.pop(tp, None)
        self._stale.pop(tp, None)
        self._logless.pop(tp, None)
        self._asking.pop(tp, None)
        self._checking.pop(tp, None)
        if self._last_wanted.pop(tp, None) is not None:
            self._wanted_changes.append(tp)  # R13: the next request forgets it
        if state is not None:
            left = self._topic_members[tp.topic] - 1
            if left:
                self._topic_members[tp.topic] = left
            else:
                del self._topic_members[tp.topic]
        return state

    def touched(self, tp: TopicPartition) -> None:
        """R13: a shell changed this partition's state outside the table (opened its log,
        halted it, or metadata gave it a new leader epoch or topic id in place): what to
        fetch of it is examined again at the next request."""
        if tp in self.partitions:
            self._stale[tp] = None

    def without_log(self, now_ms: int) -> list[PartitionState]:
        """Partitions whose log the shell has to open before they take part (a halted one
        takes no part: its log stays as it is); none while the disk that refused the last
        ones may still be full (`logs_not_opened`)."""
        if now_ms < self._open_logs_after_ms:
            return []
        self._refresh(now_ms)
        partitions = self.partitions
        return [
            s for tp in self._logless if (s := partitions[tp]).phase is not PartitionPhase.HALTED
        ]

    def logs_not_opened(self, tps: Sequence[TopicPartition], error: str, now_ms: int) -> None:
        """The disk was full when these partitions' logs were made: each waits unopened, as
        a partition whose append a full disk refused (status: `last_error`,
        `disk_full_ago_ms`, health's `partitions_disk_full`; not stalled), and no log is
        made again before DISK_FULL_RETRY_MS."""
        self._open_logs_after_ms = now_ms + max(self.settings.backoff_ms, DISK_FULL_RETRY_MS)
        for tp in tps:
            state = self.partitions.get(tp)
            if state is not None:
                state.disk_full_ms = now_ms
                state.delay(now_ms, DISK_FULL_RETRY_MS, "disk full: log not created")
                self._stale[tp] = None
        self._say_once(
            "enospc:logs", now_ms, "disk full, logs not created", partitions=len(tps), error=error
        )

    def response_max_bytes(self) -> int:
        """This leader's max_bytes: see response_budget (every partition it leads may be in
        one response). A response names a topic again for each run of its partitions
        (Kafka groups only consecutive partitions of one topic, and a session's rotation
        interleaves topics), so with two topics or more each partition may bring a topic
        entry of its own (found by tools/sim: 3 entries for 2 topics, a response past
        fetch.buffer_memory)."""
        topics = len(self._topic_members)
        return response_budget(
            self.settings.response_max_bytes,
            self.settings.buffer_memory,
            partitions=len(self.partitions),
            topics=topics if topics <= 1 else len(self.partitions),
        )

    # -- what to ask first --------------------------------------------------------------

    def epoch_questions(
        self, now_ms: int, *, fetch_version: int, ofle_version: int | None
    ) -> dict[TopicPartition, EpochQuestion]:
        """OffsetForLeaderEpoch questions for partitions whose leader changed (R3), when
        the leader's Fetch cannot say DivergingEpoch itself (below v12)."""
        questions: dict[TopicPartition, EpochQuestion] = {}
        self._refresh(now_ms)
        partitions = self.partitions
        for state in [partitions[tp] for tp in self._checking]:
            if (
                not state.epoch_check_pending
                or now_ms < state.delayed_until_ms
                or state.log is None
            ):
                continue
            latest = state.log.latest_epoch()
            if fetch_version >= FETCH_LAST_FETCHED_EPOCH_VERSION or latest is None:
                state.epoch_check_pending = False  # Fetch itself will tell, or nothing to check
                self._stale[state.tp] = None
            elif ofle_version is None:
                state.epoch_check_pending = False
                self._stale[state.tp] = None
                # Nothing can check a new epoch at our end (R10): take it as it comes.
                state.join_checked = (state.log.log_end_offset, latest)
                self._say_once(
                    "no-ofle",
                    now_ms,
                    "leader has no OffsetForLeaderEpoch; cannot check for divergence",
                    leader=self.node_id,
                )
            else:
                questions[state.tp] = EpochQuestion(state.leader_epoch, latest)
        return questions

    def on_epoch_answers(
        self,
        asked: Iterable[TopicPartition],
        answers: Iterable[EpochAnswer],
        now_ms: int,
    ) -> list[Action]:
        """R3 for older leaders: truncate where the leader's epoch ends; rule 4 of
        decide_truncation keeps the question pending for the next turn."""
        asked = set(asked)
        actions: list[Action] = []
        for answer in answers:
            state = self.partitions.get(answer.tp)
            if state is None or answer.tp not in asked:
                continue
            self._stale[answer.tp] = None
            error = error_code_of(answer.error_code)  # R6
            if error is not ErrorCode.none:
                self.stats.partition_errors[error.name] += 1
                state.delay(now_ms, self.settings.backoff_ms, f"OffsetForLeaderEpoch {error.name}")
                if error in METADATA_ERRORS:
                    actions.append(
                        RequestMetadata(f"{answer.tp}: OffsetForLeaderEpoch {error.name}")
                    )
                continue
            leader = EpochEndOffset(answer.leader_epoch, answer.end_offset)
            complete = self._truncation(state, leader, "leader epoch", actions)
            state.epoch_check_pending = not complete
        return actions

    def epoch_check_due(self, now_ms: int) -> bool:
        """Whether a partition waits for a divergence check (R3) whose delay has passed:
        the shell then asks `epoch_questions`."""
        self._refresh(now_ms)
        partitions = self.partitions
        return any(now_ms >= partitions[tp].delayed_until_ms for tp in self._checking)

    def offset_questions(self, now_ms: int) -> list[PartitionState]:
        """Partitions that need ListOffsets now: no start yet, or out of range (R4); at most
        the share a request asks (R15)."""
        self._refresh(now_ms)
        partitions = self.partitions
        due = (
            s
            for tp in self._asking
            if now_ms >= (s := partitions[tp]).delayed_until_ms and s.log is not None
        )
        return list(itertools.islice(due, self._offsets_share))

    def offsets_not_answered(self) -> None:
        """R15: a ListOffsets request got no answer in time: the next asks half as many."""
        self._offsets_share = max(1, self._offsets_share // 2)

    def offsets_answer(self, answers: Iterable[OffsetAnswer]) -> tuple[OffsetsAnswer, list[Action]]:
        """Read one ListOffsets answer (R6: an unknown code is an error of its partition)."""
        offsets: dict[TopicPartition, int] = {}
        errors: dict[TopicPartition, ErrorCode] = {}
        actions: list[Action] = []
        for answer in answers:
            error = error_code_of(answer.error_code)
            if error is ErrorCode.none:
                offsets[answer.tp] = answer.offset
                continue
            errors[answer.tp] = error
            self.stats.partition_errors[error.name] += 1
            if error in METADATA_ERRORS:
                actions.append(RequestMetadata(f"{answer.tp}: ListOffsets {error.name}"))
        return OffsetsAnswer(offsets, errors), actions

    def on_offsets(
        self,
        asked: Iterable[TopicPartition],
        earliest: OffsetsAnswer,
        latest: OffsetsAnswer,
        now_ms: int,
    ) -> list[Action]:
        """Where each asked partition starts (NEEDS_OFFSET) or resumes (TRUNCATING, R4)."""
        self._offsets_share = min(OFFSETS_SHARE_MAX, self._offsets_share * 2)  # R15
        actions: list[Action] = []
        for tp in asked:
            state = self.partitions.get(tp)
            if state is None:
                continue
            self._stale[tp] = None
            if state.phase not in ASKS_OFFSETS:
                # Halted since it was asked (its topic re-created upstream, its log
                # unusable): the answer must not revive it (partition_phase.py).
                continue
            lo, hi = earliest.offsets.get(tp), latest.offsets.get(tp)
            if lo is None or hi is None:
                # This partition alone waits and asks again; the others go on.
                error = latest.errors.get(tp) or earliest.errors.get(tp)
                why = f"ListOffsets {error.name}" if error is not None else "ListOffsets failed"
                state.delay(now_ms, self.settings.backoff_ms, why)
                continue
            local = state.log
            if state.phase is PartitionPhase.NEEDS_OFFSET:
                start = lo if self.settings.start_from == "earliest" else hi
                if local.log_end_offset != start or local.log_start_offset != start:
                    actions.append(StartAt(tp, start, f"start_from={self.settings.start_from}"))
                state.fetch_offset = start
                state.move(PhaseEvent.START_FOUND)
                # Its idle time counts from here, not from its creation: the wait for
                # ListOffsets is not a log that does not move (10,000 new partitions on
                # three nodes at load 35 waited 17-25 s, and a stall was reported 10 s
                # after the partition could first fetch).
                state.progress_ms = now_ms
                log.info(
                    "starting partition",
                    tp=str(tp),
                    offset=start,
                    start_from=self.settings.start_from,
                )
                continue
            self._resolve_out_of_range(state, lo, hi, now_ms, actions)
        return actions

    def _resolve_out_of_range(
        self, state: PartitionState, lo: int, hi: int, now_ms: int, actions: list[Action]
    ) -> None:
        """R4: the leader's log ends below ours (truncate), starts above ours (on_gap), or
        the out-of-range was transient (back off)."""
        end = state.log.log_end_offset
        tp = state.tp
        if hi < end:
            log.warning(
                "leader's log ends below ours, truncating", tp=str(tp), local_end=end, leader_end=hi
            )
            actions.append(Truncate(tp, hi, "leader's log ends below ours"))
            self.stats.truncations += 1
        elif lo > end:
            state.gaps += 1
            if self.settings.on_gap == "halt":
                state.move(
                    PhaseEvent.GAP_HALT, f"gap: leader starts at {lo}, local log ends at {end}"
                )
                log.error(
                    "leader's log starts above ours; partition halted (on_gap=halt)",
                    tp=str(tp),
                    local_end=end,
                    leader_start=lo,
                )
                actions.append(Halt(tp, state.last_error))
                return
            log.warning(
                "leader's log starts above ours; skipping the gap (on_gap=reset)",
                tp=str(tp),
                local_end=end,
                leader_start=lo,
                skipped=lo - end,
            )
            actions.append(StartAt(tp, lo, "gap (on_gap=reset)"))
            state.gap_offsets += lo - end
            state.fetch_offset = lo
        else:
            state.delay(now_ms, self.settings.backoff_ms, "offset out of range (transient)")
            state.fetch_offset = end
        state.move(PhaseEvent.RECONCILED)

    # -- the next request ---------------------------------------------------------------

    def next_fetch(self, now_ms: int, *, max_version: int) -> NextFetch | None:
        """The next Fetch request, or None when no partition is fetchable now."""
        # A request abandoned unanswered (a new connection): no turn (R14), its place kept
        # (R16).
        out, self._out = self._out, {}
        self._keep_share(out)
        wanted = self._wanted(now_ms)
        if not wanted:
            return None
        if max_version < FETCH_SESSION_VERSION and self.session.sessions_enabled:
            # Before the plan is built: a plan of a sessionful handler would be answered to
            # the sessionless one (found by tools/sim at Fetch v4: the first request to a
            # leader below v7 failed as replicad's own bug).
            self.session = FetchSessionHandler(self.node_id, sessions_enabled=False)
        changed: list[TopicPartition] | None = self._wanted_changes
        if self._sent_a_share:
            # R11: a session made from a share holds only its partitions: compare every
            # partition, so the next request adds the rest.
            changed, self._sent_a_share = None, False
        share = self._sessionless_share(wanted)
        if share is None and (changed is None or not self.session.is_sessionful):
            # A full request (or the first after a share made a session) lists the
            # partitions in rotation order (KIP-74); `_wanted` keeps them in the order they
            # became fetchable, and an incremental request does not need more.
            partitions = self.partitions
            wanted = {tp: wanted[tp] for tp in partitions if tp in wanted}
        plan = self.session.build_request(share or wanted, changed=changed)
        self._wanted_changes = []
        self.stats.last_request_partitions = len(plan.to_send)
        self.stats.in_shares = share is not None
        self._out = plan.to_send
        if share:
            self._sent_a_share = True
            self.stats.sessionless_shares += 1
            self._unserved.update(share)
            for tp in share:
                self.partitions.move_to_end(tp)  # R11: the next request asks the next ones
        version = self.usable_fetch_version(max_version, plan)
        self.stats.requests += 1
        max_wait_ms = self.settings.wait_max_ms
        if share and self._cut:
            max_wait_ms = max(max_wait_ms, self.settings.sessionless_wait_ms)
        return NextFetch(plan, version, self.request(plan, version, max_wait_ms=max_wait_ms))

    def _sessionless_share(
        self, wanted: dict[TopicPartition, PartitionFetch]
    ) -> dict[TopicPartition, PartitionFetch] | None:
        """R11: this request's share of a sessionless leader's partitions, or None to ask
        them all. The share comes from the pass under way, behind first; when the pass has
        fewer left than the share holds, the next pass begins (with every partition) and
        fills the rest."""
        cap = self.settings.sessionless_max_partitions
        if len(wanted) <= cap or not self.session.sessionless_so_far:
            if self._pass_left:
                self._pass_left = {}
                self._pass_queues = ([], [])
                self._pass_queued = {}
            self._unserved.clear()
            return None
        share = self._from_pass(cap)
        if len(share) < cap:
            self._begin_pass(share)
            self.stats.share_passes += 1
            share.update(self._from_pass(cap - len(share)))
        return share

    def _begin_pass(self, taken: Mapping[TopicPartition, PartitionFetch]) -> None:
        """R11: a new pass over every partition but those `taken`, in rotation order; the
        fetchable ones queued by kind (R13: the one walk over the table a pass)."""
        left: dict[TopicPartition, int] = {}
        queues: tuple[list[tuple[int, TopicPartition]], ...] = ([], [])
        queued: dict[TopicPartition, bool] = {}
        wanted = self._last_wanted
        place = -1
        for place, (tp, state) in enumerate(self.partitions.items()):
            if tp in taken:
                continue
            left[tp] = place
            if tp in wanted:
                behind = self._behind(tp, state)
                queues[behind].append((place, tp))  # in order: a heap already
                queued[tp] = behind
        self._pass_left, self._pass_queues, self._pass_queued = left, queues, queued
        self._pass_front, self._pass_next = 0, place + 1

    def _from_pass(self, count: int) -> dict[TopicPartition, PartitionFetch]:
        """Up to `count` fetchable partitions the pass has not asked yet, those known to be
        behind first, each kind in its place in the pass; taken out of the pass. A queue's
        entry is checked when it comes out (R13): one whose kind changed goes to the other
        queue, one not fetchable now waits out of the queues until `_queue` puts it back."""
        left, queued = self._pass_left, self._pass_queued
        wanted, partitions = self._last_wanted, self.partitions
        queues = self._pass_queues
        behind_queue, others_queue = queues[True], queues[False]
        chosen: tuple[list[tuple[int, TopicPartition]], ...] = ([], [])
        taken = 0
        while taken < count:
            if behind_queue:
                queue, kind = behind_queue, True
            elif others_queue:
                queue, kind = others_queue, False
            else:
                break
            place, tp = heapq.heappop(queue)
            if left.get(tp) != place or queued.get(tp) is not kind:
                continue  # superseded: taken, moved in the pass, or queued again
            if tp not in wanted:
                del queued[tp]
                continue
            if self._behind(tp, partitions[tp]) is not kind:
                queued[tp] = not kind
                heapq.heappush(queues[not kind], (place, tp))
                continue
            del left[tp], queued[tp]
            chosen[kind].append((place, tp))
            taken += 1
        behind, others = sorted(chosen[True]), sorted(chosen[False])
        return {tp: wanted[tp] for _, tp in (*behind, *others)}

    def _queue(self, tp: TopicPartition, state: PartitionState) -> None:
        """R11 and R13: a partition of the pass under way, examined again: in the queue of
        its kind if fetchable (an entry of the other kind is dropped when it comes out)."""
        if tp not in self._last_wanted:
            return
        behind = self._behind(tp, state)
        if self._pass_queued.get(tp) is behind:
            return
        self._pass_queued[tp] = behind
        heapq.heappush(self._pass_queues[behind], (self._pass_left[tp], tp))

    def _behind(self, tp: TopicPartition, state: PartitionState) -> bool:
        """R11: known to be behind: asked in a share and not served since, or the leader's
        served end above our fetch offset."""
        return tp in self._unserved or (
            self._served_end(state.high_watermark, state.last_stable_offset) > state.fetch_offset
        )

    def _served_end(self, high_watermark: int, last_stable_offset: int) -> int:
        """R11: where the leader's answers to us end, for "behind": its high watermark, or
        under read_committed its last stable offset when it says one (Kafka's Fetch serves
        a consumer only below it: a partition held by an open transaction is answered
        without records however far its high watermark is, and is not behind). A replica
        (replica_id >= 0) is served to the log end whatever the isolation level."""
        if (
            self.settings.isolation_level == READ_COMMITTED
            and self.settings.replica_id < 0
            and last_stable_offset >= 0
        ):
            return min(high_watermark, last_stable_offset)
        return high_watermark

    def usable_fetch_version(self, version: int, plan: FetchRequestPlan) -> int:
        if version >= FETCH_TOPIC_ID_VERSION and not plan.uses_topic_ids:
            # Some partition has no topic id (old broker, Metadata < v10): use names.
            version = FETCH_TOPIC_ID_VERSION - 1
        if version < FETCH_SESSION_VERSION and self.session.sessions_enabled:
            self.session = FetchSessionHandler(self.node_id, sessions_enabled=False)
        return version

    def _wanted(self, now_ms: int) -> dict[TopicPartition, PartitionFetch]:
        """The fetchable partitions (in the order they became so) and their entries."""
        self._refresh(now_ms)
        return self._last_wanted

    def _refresh(self, now_ms: int) -> None:
        """R13: examine again only what may have changed: the partitions marked since the
        last time, those whose delay or disk-full pause has ended, and every partition once
        FULL_WALK_EVERY_MS has passed. Each change of a fetchable partition's entry (one
        that appeared, went or is another object) is kept for the session handler, which
        skips the rest; the partitions without a log, asking ListOffsets or waiting for a
        divergence check are kept for the questions before a request."""
        stale, self._stale = self._stale, {}
        partitions = self.partitions
        full = now_ms >= self._full_walk_ms
        if full:
            self._full_walk_ms = now_ms + self._full_walk_every_ms
        delays, delay_at = self._delays, self._delay_at
        while delays and delays[0][0] <= now_ms:
            at, _, tp = heapq.heappop(delays)
            if delay_at.get(tp) == at:
                del delay_at[tp]
                stale[tp] = None
        wanted = self._last_wanted
        # Kept until a request is built: a build that wants nothing builds no request, and
        # the partitions it dropped must still be forgotten by the next one (found by
        # tools/sim, seed 2292: dropped while nothing was fetchable, they stayed in the
        # leader's session and came back in its answers, past the response budget).
        changes = self._wanted_changes
        left = self._pass_left
        logless, asking, checking = self._logless, self._asking, self._checking
        # A full walk examines every partition: those marked are among them (a mark of a
        # partition not here changes nothing).
        for tp in partitions if full else stale:
            state = partitions.get(tp)
            if state is None:
                continue  # removed: `remove` dropped its entry
            want = self._want(state, now_ms)
            if state.log is None:
                logless[tp] = None
            else:
                logless.pop(tp, None)
            if state.phase in _ASKS_OFFSETS:
                asking[tp] = None
            else:
                asking.pop(tp, None)
            if state.epoch_check_pending:
                checking[tp] = None
            else:
                checking.pop(tp, None)
            if want is None:
                if wanted.pop(tp, None) is not None:
                    changes.append(tp)
                until = state.delayed_until_ms
                if until > now_ms and delay_at.get(tp) != until:
                    delay_at[tp] = until
                    heapq.heappush(delays, (until, next(self._sequence), tp))
            elif wanted.get(tp) is not want:
                wanted[tp] = want
                changes.append(tp)
            if tp in left:
                self._queue(tp, state)
        # An emptied dict keeps its size (10,000 new partitions fill the first two at start).
        if not logless:
            self._logless = {}
        if not asking:
            self._asking = {}
        if not checking:
            self._checking = {}

    def _want(self, state: PartitionState, now_ms: int) -> PartitionFetch | None:
        """What to ask of one partition now; None when it is not fetchable now. A few
        attribute reads: the PartitionFetch object is rebuilt only when one of its inputs
        changed, and the session handler skips unchanged objects by identity."""
        if state.phase is PartitionPhase.PAUSED_DISK_FULL and now_ms >= state.delayed_until_ms:
            state.move(PhaseEvent.DISK_RETRY)  # try again: space may be back
            state.disk_retry_ms = now_ms
        local = state.log
        if local is None or not state.fetchable(now_ms):
            return None
        latest = local.latest_epoch()
        if state.fetched_epoch is not None and (latest is None or state.fetched_epoch > latest):
            # Validated, not yet appended: the epoch of what was fetched.
            latest = state.fetched_epoch
        last_fetched_epoch = -1 if latest is None else latest
        want = state.want
        # The last object is its own key: no tuple per partition per build, none kept.
        if (
            want is None
            or want.fetch_offset != state.fetch_offset
            or want.log_start_offset != local.log_start_offset
            or want.current_leader_epoch != state.leader_epoch
            or want.last_fetched_epoch != last_fetched_epoch
            or want.topic_id != state.topic_id
        ):
            want = state.want = PartitionFetch(
                fetch_offset=state.fetch_offset,
                log_start_offset=local.log_start_offset,
                max_bytes=self.settings.partition_max_bytes,
                current_leader_epoch=state.leader_epoch,
                last_fetched_epoch=last_fetched_epoch,
                topic_id=state.topic_id,
            )
        return want

    def request(
        self, plan: FetchRequestPlan, version: int, *, max_wait_ms: int | None = None
    ) -> FetchRequest:
        """What `plan` asks, as a Fetch of `version` says it (forgotten by id from v13);
        `max_wait_ms`: fetch.wait_max_ms unless given (a sessionless share's, R11)."""
        use_epochs = version >= FETCH_LAST_FETCHED_EPOCH_VERSION
        if version >= FETCH_TOPIC_ID_VERSION:
            forgotten = tuple(
                ForgottenPartition(f.partition.topic, f.topic_id, f.partition.partition)
                for f in plan.forgotten_for_topic_ids()
                if f.topic_id is not None
            )
        else:
            forgotten = tuple(
                ForgottenPartition(tp.topic, None, tp.partition) for tp in plan.to_forget
            )
        return FetchRequest(
            max_wait_ms=self.settings.wait_max_ms if max_wait_ms is None else max_wait_ms,
            min_bytes=self.settings.min_bytes,
            max_bytes=self.response_max_bytes(),
            isolation_level=self.settings.isolation_level,
            session_id=plan.session_id,
            session_epoch=plan.epoch,
            partitions=tuple(
                RequestedPartition.of(
                    tp,
                    pf.fetch_offset,
                    pf.max_bytes,
                    topic_id=pf.topic_id,
                    log_start_offset=pf.log_start_offset,
                    current_leader_epoch=pf.current_leader_epoch,
                    last_fetched_epoch=pf.last_fetched_epoch if use_epochs else -1,
                )
                for tp, pf in plan.to_send.items()
            ),
            forgotten=forgotten,
            replica_id=self.settings.replica_id,
            rack_id=self.settings.rack_id,
        )

    # -- answers by name (R9) -------------------------------------------------------

    def topics_to_confirm(self, actions: Iterable[Action]) -> list[str]:
        """The topics whose id a Metadata answer must confirm before `actions` (answers
        by name) are performed: those of partitions the actions change whose log has an id.
        A halt is confirmed too: one an answer by name made (R8's another lineage, R4's gap)
        may have been made by a re-created topic's answer, and then says so instead."""
        topics = set()
        for action in actions:
            if isinstance(action, RequestMetadata):
                continue
            if self._known_topic_id(action.tp) is not None:
                topics.add(action.tp.topic)
        return sorted(topics)

    def confirm_topic_ids(
        self, actions: Iterable[Action], topic_ids: Mapping[str, uuid.UUID | None]
    ) -> list[Action]:
        """R9: `actions` from answers by name, kept for the partitions whose topic still has
        the id of their log in `topic_ids` (a Metadata answer received after those
        answers; None for a topic listed without an id: nothing to confirm with). A
        partition of a topic with another id halts (re-created upstream; its local data is
        kept); one whose topic is not listed waits for metadata. A partition the answers
        halted (R8, R4's gap) stays halted (HALTED is final), for the re-creation when its
        topic has another id (found by tools/sim, seed 27926: at Fetch v4 the re-created
        topic's first batch, across our log end, halted the old replica as another
        lineage)."""
        kept: list[Action] = []
        dropped: set[TopicPartition] = set()
        for action in actions:
            if isinstance(action, RequestMetadata):
                kept.append(action)
                continue
            tp = action.tp
            known = self._known_topic_id(tp)
            listed = tp.topic in topic_ids
            now = topic_ids.get(tp.topic)
            if known is None or (listed and now in (None, known)):
                kept.append(action)
                continue
            if isinstance(action, Halt) and not listed:
                kept.append(action)  # halted already; metadata will tell the rest
                continue
            if tp in dropped:
                continue
            dropped.add(tp)
            self._stale[tp] = None
            state = self.partitions[tp]
            state.fetched_epoch = None
            state.fetch_offset = state.log.log_end_offset  # R1: nothing was appended
            if not listed:
                kept.append(RequestMetadata(f"{tp}: topic missing from metadata"))
                continue
            reason = (
                f"topic re-created upstream: its id is now {now}, the local log's is {known} "
                "(an answer by name was the new topic's); local data kept"
            )
            state.move(PhaseEvent.TOPIC_RECREATED, reason)
            self.stats.partition_errors["topic_recreated"] += 1
            log.error("topic re-created upstream; partition halted", tp=str(tp), reason=reason)
            kept.append(Halt(tp, reason))
        return kept

    def confirm_outcome(
        self, outcome: ResponseOutcome, topic_ids: Mapping[str, uuid.UUID | None]
    ) -> ResponseOutcome:
        """confirm_topic_ids over a Fetch answer's actions and appends."""
        kept = self.confirm_topic_ids([*outcome.actions, *outcome.appends], topic_ids)
        return replace(
            outcome,
            actions=tuple(a for a in kept if not isinstance(a, Append)),
            appends=tuple(a for a in kept if isinstance(a, Append)),
        )

    def _known_topic_id(self, tp: TopicPartition) -> uuid.UUID | None:
        state = self.partitions.get(tp)
        if state is None:
            return None
        stored = getattr(state.log, "topic_id", None)
        return stored if stored is not None else state.topic_id

    def may_pipeline(self, outcome: ResponseOutcome, now_ms: int) -> bool:
        """Whether the next request may go out before this response's appends: only when
        no partition waits for a question (those answers truncate logs) and no append
        restarts a log."""
        if not outcome.accepted:
            return False
        if any(a.fetched.restart_at is not None for a in outcome.appends):
            return False
        self._refresh(now_ms)
        if self._checking or self._logless:
            return False
        partitions = self.partitions
        return not any(now_ms >= partitions[tp].delayed_until_ms for tp in self._asking)

    def next_wakeup_ms(self, now_ms: int, *, idle_ms: int = 1000) -> int:
        """When to look again with nothing to send: the first back-off to end, within idle_ms.
        R13: read off the heap of delays, not a walk over every partition. After the
        examination, every partition waiting out a delay or a disk-full pause is in it at
        its `delayed_until_ms`; entries superseded (another delay since) are dropped as
        `_refresh` drops them, and one whose partition no longer waits until then (its
        pause ended early: disk_back) is kept for `_refresh` but wakes nobody."""
        self._refresh(now_ms)
        wake = now_ms + idle_ms
        delays, delay_at, partitions = self._delays, self._delay_at, self.partitions
        kept: list[tuple[int, int, TopicPartition]] = []
        while delays and delays[0][0] < wake:
            entry = heapq.heappop(delays)
            at, _, tp = entry
            if delay_at.get(tp) != at:
                continue  # superseded
            kept.append(entry)
            state = partitions.get(tp)
            if state is not None and state.delayed_until_ms == at:
                wake = at  # after the examination every entry left ends after now_ms
                break
        for entry in kept:
            heapq.heappush(delays, entry)
        return wake

    # -- the response -------------------------------------------------------------------

    def on_response(
        self, fetch: NextFetch, body: FetchResponseView, now_ms: int
    ) -> ResponseOutcome:
        """Judge a response (session rules) and each partition's answer; what to do."""
        plan = fetch.plan
        self.stats.responses += 1
        self.stats.failing_since_ms = None
        self._connection_answered = True
        names = plan.topic_names
        by_id = fetch.version >= FETCH_TOPIC_ID_VERSION
        entries: list[tuple[TopicPartition, FetchedPartition]] = []
        seen_ids: list[uuid.UUID] = []
        for topic in body.responses:
            if by_id:
                if topic.topic_id is not None:
                    seen_ids.append(topic.topic_id)
                name = names.get(topic.topic_id) if topic.topic_id is not None else None
            else:
                name = topic.topic
            if name is None:
                continue  # an id the plan does not know: the session handler rejects it
            for pd in topic.partitions:
                entries.append((TopicPartition(name, int(pd.partition_index)), pd))
        stale = self._stale
        for tp, _ in entries:
            stale[tp] = None  # R13: an answer may change what to ask of it
        verdict = self.session.handle_response(
            plan,
            error_code=body.error_code,
            session_id=body.session_id,
            partitions=[tp for tp, _ in entries],
            now_ms=now_ms,
            throttle_time_ms=body.throttle_time_ms,
            topic_ids=seen_ids,
        )
        cut = self._cut_short(plan, entries) if verdict.accepted else []
        served = frozenset(tp for tp, pd in entries if pd.records)
        self._exchange_ended([tp for tp, _ in entries], cut, served, refused=not verdict.accepted)
        self._keep_places(cut)
        if verdict.accepted:
            self._kept_share = frozenset()
        else:
            self._keep_share(plan.to_send)  # R16: refused whole, asked again first
        self._note_recovery(verdict, now_ms)
        if not verdict.accepted:
            self.stats.rejected_responses += 1
            if body.error_code != ErrorCode.none:
                self.stats.last_error = error_name(body.error_code)
            # A leader that keeps refusing must not be hammered: back off, growing.
            return ResponseOutcome(False, retry_in_ms=self._backoff.next_delay_ms())
        self._backoff.reset()
        self._cut = False
        actions: list[Action] = []
        appends: list[Append] = []
        session = plan.session_partitions
        for tp, pd in entries:
            state = self.partitions.get(tp)
            asked = session.get(tp)
            if state is None or asked is None:
                continue  # moved to another leader or dropped while the request was out
            if state.phase is not PartitionPhase.FETCHING:
                # Halted, paused or waiting for ListOffsets since the request went out (or
                # moved back from another leader in such a phase): an answer must not
                # revive it (found by tools/sim: a halted partition went back to
                # TRUNCATING on a stale answer and skipped its gap).
                continue
            self.stats.bytes_fetched += len(pd.records or b"")
            if asked.fetch_offset != state.fetch_offset:
                # R1: asked before an append failed or a truncation: not for where the log
                # ends now; dropped unread, fetched again.
                continue
            if state.epoch_check_pending:
                # R10: asked before a leader change or an epoch we must check first.
                continue
            # R10: did the leader check where our log ends (fenced by our epoch, or
            # DivergingEpoch)?
            leader_checked = fetch.version >= FETCH_LAST_FETCHED_EPOCH_VERSION or (
                fetch.version >= FETCH_CURRENT_LEADER_EPOCH_VERSION
                and asked.current_leader_epoch >= 0
            )
            append = self._partition_answer(state, pd, now_ms, actions, leader_checked)
            if append is not None:
                appends.append(append)
        for append in appends:
            # KIP-74 rotation: partitions that returned data go to the back.
            self.partitions.move_to_end(append.tp)
        return ResponseOutcome(True, tuple(actions), tuple(appends))

    def _cut_short(
        self, plan: FetchRequestPlan, entries: Sequence[tuple[TopicPartition, FetchedPartition]]
    ) -> list[TopicPartition]:
        """R11: the partitions of a share the leader's wait ran out before, in the request's
        order: answered without records and without an error while behind (for where we
        fetch from now), after the last partition the answer gave records (Tansu reads a
        request in order and answers the rest without records). None when it gave none: a
        leader that moves on with no partition is not cutting a share short."""
        unserved = self._unserved
        if not unserved:
            return []
        order = {tp: i for i, tp in enumerate(plan.to_send)}
        last_served = max((order.get(tp, -1) for tp, pd in entries if pd.records), default=-1)
        if last_served < 0:
            return []
        cut: list[tuple[int, TopicPartition]] = []
        for tp, pd in entries:
            at = order.get(tp, -1)
            if at <= last_served or pd.records or tp not in unserved:
                continue
            state = self.partitions.get(tp)
            asked = plan.to_send.get(tp)
            if (
                state is None
                or asked is None
                or state.phase is not PartitionPhase.FETCHING
                or asked.fetch_offset != state.fetch_offset
                or error_code_of(pd.error_code) is not ErrorCode.none
            ):
                continue
            if self._served_end(pd.high_watermark, pd.last_stable_offset) > state.fetch_offset:
                cut.append((at, tp))
        return [tp for _, tp in sorted(cut)]

    def _keep_places(self, cut: Sequence[TopicPartition]) -> None:
        """R11: partitions a share's answer cut short go first in the next share, in their
        order, and stay in the pass under way."""
        for tp in reversed(cut):
            self.partitions.move_to_end(tp, last=False)
            self._pass_front -= 1
            self._pass_left[tp] = self._pass_front
            self._pass_queued.pop(tp, None)
            self._stale[tp] = None

    def _keep_share(self, out: Mapping[TopicPartition, PartitionFetch]) -> None:
        """R16: the request `out` is over without a usable answer; if it was a share, its
        partitions go first in the next share (those still in the table, in its order),
        unless it was that retry already."""
        if not out:
            return
        kept, self._kept_share = self._kept_share, frozenset()
        if not self.stats.in_shares or not kept.isdisjoint(out):
            return
        self._keep_places([tp for tp in out if tp in self.partitions])
        self._kept_share = frozenset(out)

    def _partition_answer(
        self,
        state: PartitionState,
        pd: FetchedPartition,
        now_ms: int,
        actions: list[Action],
        leader_checked: bool,
    ) -> Append | None:
        """Apply one partition's answer; the batches to append if it returned any."""
        error = error_code_of(pd.error_code)  # R6
        tp = state.tp
        if error is ErrorCode.none:
            state.high_watermark = pd.high_watermark
            state.last_stable_offset = pd.last_stable_offset
            state.leader_log_start_offset = pd.log_start_offset
            served_end = self._served_end(pd.high_watermark, pd.last_stable_offset)
            if not pd.records and served_end > state.fetch_offset:
                self._cut = True  # R11: behind, and nothing read for it
            elif self._unserved and (pd.records or pd.high_watermark >= 0):
                self._unserved.discard(tp)  # R11: served, or nothing to serve
            if not pd.records and 0 <= served_end <= state.fetch_offset:
                # R12: caught up: its idle time counts from here.
                state.progress_ms = max(state.progress_ms, now_ms)
                state.answers_since_move = 0
                state.turns = ""
            diverging = pd.diverging_epoch
            if diverging.epoch >= 0 and diverging.end_offset >= 0:
                # R3, Fetch v12+. The answer's high watermark counts too (R5), once the log
                # is truncated: in an incremental session the leader does not send an
                # unchanged one again (found by tools/sim: after a crash the replica kept
                # serving up to its checkpointed high watermark until new data came).
                before = len(actions)
                self._truncation(
                    state,
                    EpochEndOffset(diverging.epoch, diverging.end_offset),
                    "diverging epoch",
                    actions,
                    high_watermark=pd.high_watermark,
                )
                if len(actions) == before:  # nothing to truncate: raise it now
                    self._raise_high_watermark(state, actions)
                self.stats.partition_errors["diverging_epoch"] += 1
                return None
            append = self._validate(state, pd.records, now_ms, actions, leader_checked)
            if state.phase is PartitionPhase.HALTED:  # R8
                actions.append(Halt(tp, state.last_error or "halted"))
                return None
            if append is None:
                self._raise_high_watermark(state, actions)
            return append
        self.stats.partition_errors[error.name] += 1
        if error is ErrorCode.offset_out_of_range:
            state.move(PhaseEvent.OUT_OF_RANGE)  # R4: ListOffsets decides
            self._say_once(
                f"oor:{tp}",
                now_ms,
                "offset out of range, reconciling",
                tp=str(tp),
                fetch_offset=state.fetch_offset,
            )
        elif error in METADATA_ERRORS:
            state.delay(now_ms, self.settings.backoff_ms, error.name)  # R2
            actions.append(RequestMetadata(f"{tp}: {error.name}"))
        else:
            state.delay(now_ms, self.settings.backoff_ms, error.name)
            self._say_once(
                f"err:{tp}:{error.name}",
                now_ms,
                "partition error, backing off",
                tp=str(tp),
                error=error.name,
            )
        return None

    def _validate(
        self,
        state: PartitionState,
        records: memoryview | None,
        now_ms: int,
        actions: list[Action],
        leader_checked: bool,
    ) -> Append | None:
        """What of the records may be written (R7, R10); the fetch offset moves past it
        (R1)."""
        if not records:
            # Nothing to validate: no batch, so no partial, corrupt, foreign or unchecked
            # one (what an empty answer says, its high watermark, log start, diverging
            # epoch or error, the caller took). It still uses up the join check (R10): a
            # check is for the answer to the request it was made before.
            state.join_checked = None
            return None
        tp = state.tp
        local = state.log
        empty = local.log_end_offset == local.log_start_offset
        latest = local.latest_epoch()
        if state.fetched_epoch is not None and (latest is None or state.fetched_epoch > latest):
            latest = state.fetched_epoch  # validated, not yet appended (as in _wanted)
        join, state.join_checked = state.join_checked, None  # used up by this answer
        end_epoch = (
            None
            if leader_checked or empty or latest is None or join == (state.fetch_offset, latest)
            else latest
        )
        fetched = validate_fetched(
            records,
            fetch_offset=state.fetch_offset,
            log_is_empty=empty,
            max_epoch=state.leader_epoch,
            end_epoch=end_epoch,
        )
        if fetched.partial_dropped:
            self.stats.partial_batches_dropped += 1
        if fetched.epoch_stop is not None:
            self._unchecked_epoch(state, fetched.epoch_stop, latest, now_ms, actions)
        if fetched.foreign is not None:
            self._halt_foreign(state, fetched.foreign)
            return None
        if fetched.corrupt is not None:
            state.corrupt_count += 1
            self.stats.crc_failures += 1
            state.delay(now_ms, self.settings.backoff_ms, f"corrupt data: {fetched.corrupt}")
            # Logged every time with where it was: corruption must never be silent.
            log.warning(
                "corrupt batch from leader, not written; refetching",
                tp=str(tp),
                offset=fetched.next_fetch_offset,
                leader=self.node_id,
                reason=fetched.corrupt,
            )
        if not fetched.batches:
            return None
        state.fetch_offset = fetched.next_fetch_offset
        state.fetched_epoch = fetched.batches.max_leader_epoch()
        return Append(tp, fetched)

    def _unchecked_epoch(
        self,
        state: PartitionState,
        stop: tuple[int, int],
        latest: int | None,
        now_ms: int,
        actions: list[Action],
    ) -> None:
        """R10: a batch of an epoch our log was not checked against: metadata, then the
        divergence check (R3), before the partition fetches again."""
        base, epoch = stop
        if epoch > state.leader_epoch >= 0:
            why = (
                f"batch at offset {base} has leader epoch {epoch}, above the epoch "
                f"{state.leader_epoch} we know"
            )
        else:
            why = (
                f"batch at offset {base} starts leader epoch {epoch} at our log end (ours "
                f"ends with epoch {latest}) and the leader did not check our log"
            )
        state.epoch_check_pending = True
        state.delay(now_ms, self.settings.backoff_ms, why)
        actions.append(RequestMetadata(f"{state.tp}: {why}"))
        self.stats.partition_errors["unchecked_epoch"] += 1
        self._say_once(
            f"epoch:{state.tp}",
            now_ms,
            "batch of an unchecked leader epoch not appended; checking divergence first",
            tp=str(state.tp),
            offset=base,
            batch_epoch=epoch,
            known_epoch=state.leader_epoch,
            leader=self.node_id,
        )

    def _halt_foreign(self, state: PartitionState, batch: tuple[int, int]) -> None:
        """R8: the partition stops here; the caller's Halt action says why."""
        end = state.log.log_end_offset
        state.move(
            PhaseEvent.ANOTHER_LINEAGE,
            f"another lineage: the leader's batch at offsets {batch[0]}..{batch[1]} holds "
            f"our log end {end} (its log starts at {state.leader_log_start_offset}, inside a "
            "batch another leader wrote); delete the partition's local log to copy it anew",
        )
        self.stats.partition_errors["another_lineage"] += 1
        log.error(
            "leader's log is of another lineage at our log end; partition halted",
            tp=str(state.tp),
            local_end=end,
            batch_base_offset=batch[0],
            batch_last_offset=batch[1],
            leader_log_start=state.leader_log_start_offset,
            leader=self.node_id,
        )

    def _truncation(
        self,
        state: PartitionState,
        leader: EpochEndOffset,
        why: str,
        actions: list[Action],
        *,
        high_watermark: int | None = None,
    ) -> bool:
        """R3: truncate where the leader's epoch end says; True when no further question
        is needed (decide_truncation's rule 4 asks again)."""
        local = state.log
        decision = decide_truncation(
            leader,
            local_end_for=local.end_offset_for_epoch,
            log_end_offset=local.log_end_offset,
            high_watermark=local.high_watermark,
        )
        if decision.offset < local.log_end_offset:
            log.info(
                "log diverged from leader, truncating",
                tp=str(state.tp),
                why=why,
                leader_epoch=leader.epoch,
                leader_end_offset=leader.end_offset,
                local_end=local.log_end_offset,
                truncate_to=decision.offset,
                rule=decision.rule,
            )
            actions.append(Truncate(state.tp, decision.offset, why, high_watermark))
            self.stats.truncations += 1
        else:
            state.fetch_offset = local.log_end_offset
            latest = local.latest_epoch()
            if decision.complete and latest is not None:
                state.join_checked = (local.log_end_offset, latest)  # R10
        return decision.complete

    def _raise_high_watermark(self, state: PartitionState, actions: list[Action]) -> None:
        """R5: what we serve onward, replicated here and committed upstream; only raised
        here (a leader's lower value changes nothing until a truncation lowers the log)."""
        local = state.log
        hw = min(max(state.high_watermark, local.log_start_offset), local.log_end_offset)
        if hw > local.high_watermark:
            actions.append(SetHighWatermark(state.tp, hw))

    # -- outcomes of the shell's actions ------------------------------------------------

    def truncated(self, action: Truncate | StartAt) -> list[Action]:
        """A Truncate or StartAt was performed: R1, fetch from the log end; R5, the high
        watermark the answer carried may now rise up to the new log end."""
        state = self.partitions.get(action.tp)
        if state is None:
            return []
        self._stale[action.tp] = None
        state.fetch_offset = state.log.log_end_offset
        state.fetched_epoch = None
        actions: list[Action] = []
        if isinstance(action, Truncate) and action.high_watermark is not None:
            self._raise_high_watermark(state, actions)
        return actions

    def appended(self, append: Append, now_ms: int) -> list[Action]:
        """The batches are in the log: progress, and the high watermark may rise (R5)."""
        state = self.partitions.get(append.tp)
        if state is None:
            return []
        self._stale[append.tp] = None
        fetched = append.fetched
        state.fetched_epoch = None
        state.fetch_offset = state.log.log_end_offset
        state.progress_ms = now_ms
        state.answers_since_move = 0
        state.turns = ""
        state.bytes_replicated += len(fetched.data)
        state.records_replicated += fetched.batches.record_count
        self.stats.bytes_appended += len(fetched.data)
        self.stats.batches_appended += len(fetched.batches)
        if fetched.corrupt is None:
            state.succeeded()
        actions: list[Action] = []
        self._raise_high_watermark(state, actions)
        return actions

    def append_failed(self, append: Append, error: str, now_ms: int, *, disk_full: bool) -> None:
        """R1: back to the log end (the next response's data for it is dropped unread);
        a full disk pauses the partition until `disk_back` or DISK_FULL_RETRY_MS."""
        state = self.partitions.get(append.tp)
        if state is None:
            return
        self._stale[append.tp] = None
        state.fetched_epoch = None
        state.fetch_offset = state.log.log_end_offset
        if disk_full:
            state.move(PhaseEvent.DISK_FULL)
            state.disk_full_ms = now_ms
            # The leader served it and the disk refused: for the turn rule that answer is
            # the one that would have moved it (control/stalls.py, waits_for_turn). Counted
            # as an answer that left it behind, a partition of a leader fetched in shares was
            # stalled while it waited for its next turn after the retry (a pass over 10,000
            # partitions on Tansu took 100 s against the 30 s stall time, session 13).
            state.answers_since_move = 0
            state.turns = ""
            state.delay(now_ms, max(self.settings.backoff_ms, DISK_FULL_RETRY_MS), "disk full")
            self._say_once(
                f"enospc:{append.tp}",
                now_ms,
                "disk full, partition paused",
                tp=str(append.tp),
                error=error,
            )
            return
        state.delay(now_ms, self.settings.backoff_ms, f"log error: {error}")
        self._say_once(
            f"logerr:{append.tp}", now_ms, "append failed", tp=str(append.tp), error=error
        )

    def disk_back(self, now_ms: int) -> None:
        """Space is back: paused partitions fetch again at once."""
        for state in self.partitions.values():
            if state.phase is PartitionPhase.PAUSED_DISK_FULL:
                state.move(PhaseEvent.DISK_BACK)
                state.delayed_until_ms = now_ms
                state.disk_retry_ms = now_ms
                self._stale[state.tp] = None

    # -- failures -----------------------------------------------------------------------

    def send_failed(self, now_ms: int, *, leader_failed_it: bool = False) -> None:
        """The request in flight got no usable answer: the session starts over (KIP-227).
        `leader_failed_it`: it timed out or was answered malformed, rather than lost with its
        connection; a turn for its partitions only if the connection had answered (R14)."""
        out = self._out
        if leader_failed_it and self._connection_answered:
            self._exchange_ended(failed=True)
        else:
            self._out = {}
        self._keep_share(out)
        self._connection_answered = False  # the shell closes the connection
        self._note_recovery(self.session.handle_send_error(now_ms=now_ms), now_ms)

    def connection_lost(self, now_ms: int) -> None:
        """The connection closed between requests: Kafka's rule for a network error all
        the same -- close the session, next request (ID, 0)."""
        self._connection_answered = False
        if self.session.is_sessionful:
            self._note_recovery(self.session.handle_send_error(now_ms=now_ms), now_ms)

    def connection_failed(self, error: str, now_ms: int) -> int:
        """How long to wait before connecting again (growing, with jitter); for the health
        model, since when this leader keeps failing."""
        self._connection_answered = False
        self.stats.connection_errors += 1
        self.stats.last_error = error
        if self.stats.failing_since_ms is None:
            self.stats.failing_since_ms = now_ms
        return self._backoff.next_delay_ms()

    def loop_failed(self, error: str) -> int:
        """A bug or an unforeseen local failure in the shell: how long to wait before the
        next turn (replication from this leader must not end silently, nor spin)."""
        self.stats.loop_errors += 1
        self.stats.last_error = error
        return self._backoff.next_delay_ms()

    def _exchange_ended(
        self,
        answered: Iterable[TopicPartition] = (),
        cut: Iterable[TopicPartition] = (),
        served: frozenset[TopicPartition] = frozenset(),
        *,
        refused: bool = False,
        failed: bool = False,
    ) -> None:
        """The request in flight is over, answered or failed by the leader (R14): each
        partition it named, and each the answer names (an incremental session's answer may
        name partitions the request left out), counts an answer since its log last moved
        (`appended` sets it back to 0). Counted whether the answer named it, with or without
        an error, or never came in time: the stall rule waits for a partition of a leader
        fetched in shares until it has two (control/stalls.py), and a partition that leader
        never answers (a sessionless answer may leave partitions out; a share may time out
        every time) must not wait for its turn forever. Not counted: the partitions the
        answer `cut` short (R11, `_cut_short`): they keep their place and wait for the next
        share. Each counted turn is recorded by its kind (`PartitionState.turns`): `served`
        are the partitions the answer gave records (not moved by them: not appended),
        `refused` an answer refused whole, `failed` no answer (in time, or well-formed)."""
        out, self._out = self._out, {}
        named = set(answered)
        counted = set(named)
        counted.update(out)
        counted.difference_update(cut)
        for tp in counted:
            state = self.partitions.get(tp)
            if state is not None:
                state.answers_since_move += 1
                if failed:
                    kind = "f"
                elif refused:
                    kind = "r"
                elif tp not in named:
                    kind = "o"
                elif tp in served:
                    kind = "d"
                else:
                    kind = "n" if served else "e"
                state.turns = (state.turns + kind)[-TURNS_KEPT:]

    def _note_recovery(self, verdict: ResponseVerdict, now_ms: int) -> None:
        reason = verdict.reason
        if reason is None:
            return
        name = reason.name.lower()
        self.stats.session_recoveries[name] += 1
        self._say_once(
            f"session:{name}",
            now_ms,
            "fetch session reset",
            leader=self.node_id,
            reason=name,
            detail=verdict.detail,
        )

    def _say_once(self, key: str, now_ms: int, event: str, **fields: Any) -> None:
        emit = self._say.should_emit(key, now_ms)
        if emit.emit:
            if emit.suppressed:
                fields["repeats_suppressed"] = emit.suppressed
            log.info(event, **fields)
