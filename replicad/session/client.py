"""The follower side of KIP-227 fetch sessions: the counterpart of Kafka's FetchSessionHandler.

One handler per leader connection. It decides what the next Fetch request holds and
what a response means for the session; it never touches a socket or a clock (the
shell passes `now_ms` in). The leader-side counterpart is `replicad.session.cache`.

Rules this handler keeps:

1. State: the metadata of the next request (see `metadata`), and the partitions the
   leader holds for us -- what the last *accepted* response confirmed. Building a plan
   changes no state, so a plan that is never sent leaves no trace; only
   `handle_response`, `handle_send_error` and `close_request` move the state.
   At most one plan is in flight: `handle_response` takes the last plan built.
   No request copies the session (O(changes) at any size): an incremental plan's
   `session_partitions` is the session it was built on with the plan's changes laid over
   it, and an accepted incremental response applies those changes in place. A reset
   starts a new session map, so a plan keeps reading what it was built on; a plan read
   after a later plan was accepted on the same session raises (it would read that one's).
2. A full request lists every wanted partition in the caller's order (KIP-74: under
   `max_bytes` the leader fills the response front to back, so the order is the
   priority; the follower rotates partitions that returned data to the back).
3. An incremental request lists only partitions added (in the caller's order) and
   changed (any field of `PartitionFetch`, in session order), plus the forgotten
   ones. A partition whose topic id changed (topic recreated) is sent with its new id
   and also listed in `to_replace` with the old one (v13+ forgets it by the old id).
   The caller may say which partitions changed since its last build (`changed`: added,
   gone, or a new `PartitionFetch` object); the handler then compares only those, and
   the ones reported since the session last moved, not every partition (O(changes)).
   Changes are then listed in the order they were reported. Without `changed`, every
   partition is compared (`is` first: callers reuse unchanged objects).
4. Topic ids: a request may use ids (v13+) only if every wanted partition -- and every
   forgotten one -- has one (`plan.uses_topic_ids`). A leader refuses a session whose
   use of ids flips (FETCH_SESSION_TOPIC_ID_ERROR); rather than provoke that error the
   handler makes such a request full (close existing, attempt new).
5. Reactions to a response (table `_RESET_FOR`):
     FETCH_SESSION_ID_NOT_FOUND (70)            -> initial (0, 0)
     INVALID_FETCH_SESSION_EPOCH (71), FETCH_SESSION_TOPIC_ID_ERROR (106), any other
       top-level error, a send error            -> close existing, attempt new (ID, 0)
     full response: extra partitions or topic ids, or -- when it created a session --
       omitted partitions                       -> initial
     empty full response with throttle_time_ms  -> initial (KIP-219: not an error)
     incremental response: partitions outside the session, or another session id
                                                -> close existing, attempt new
     incremental response with session id 0     -> initial (the leader closed it)
   A rejected response's data must be discarded by the caller; the next request is
   full, so nothing is lost.
6. Accepted full response with session id 0: stay sessionless; the next request is
   full (0, 0) again and so tries to create a session (Tansu always answers so).
   A sessionless full response may omit partitions: nothing is cached on either side
   and the next full request names them again (`verdict.omitted` lists them). Kafka's
   own client rejects such a response; replicad tolerates it only when no session
   was created, because a leader builds a new session from its response and an
   omitted partition would silently drop out of it. Such a leader is sessionless
   (`sessionless_so_far`, as is every leader with sessions off, and one that has not
   answered a full request at all yet: a send error) until a full response
   creates a session (and is never again, since a leader that once made one can make
   more): its caller may split the partitions over several full requests (the
   follower does, `fetch.sessionless_max_partitions`). Should one of those create a
   session, it holds only that request's partitions; the caller's next build, with every
   partition compared (`changed=None`), adds the rest.
7. Accepted full response with session id S: the session is S, the next epoch is 1.
   Accepted incremental response: the next epoch follows (2^31-1 wraps to 1).
8. `sessions_enabled=False`: every request is (0, -1) and nothing is ever cached.
9. Shutdown: `close_request` gives (ID, -1) with no partitions and drops the session at
   once; its response, if any, carries nothing to act on.
"""

from __future__ import annotations

import enum
import uuid
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from kio.schema.errors import ErrorCode

from replicad.errors import LocalProtocolError
from replicad.session.metadata import (
    FINAL_EPOCH,
    INITIAL,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    LEGACY,
    MAX_EPOCH,
    FetchMetadata,
    PartitionFetch,
    TopicIdPartition,
    next_epoch,
)
from replicad.types import TopicPartition

__all__ = [
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "INVALID_SESSION_ID",
    "MAX_EPOCH",
    "FetchRequestPlan",
    "FetchSessionHandler",
    "PartitionFetch",
    "RecoveryReason",
    "ResponseVerdict",
    "SessionStatus",
    "TopicIdPartition",
    "next_epoch",
]

# How many partitions a detail string names before it says "... and N more".
_DETAIL_LIMIT = 5


class RecoveryReason(enum.Enum):
    """Why the handler reset its session (keys the recovery counters and log rate limits)."""

    FETCH_SESSION_ID_NOT_FOUND = "fetch_session_id_not_found"
    INVALID_FETCH_SESSION_EPOCH = "invalid_fetch_session_epoch"
    FETCH_SESSION_TOPIC_ID_ERROR = "fetch_session_topic_id_error"
    TOP_LEVEL_ERROR = "top_level_error"
    SEND_ERROR = "send_error"
    INVALID_FULL_RESPONSE = "invalid_full_response"
    INVALID_INCREMENTAL_RESPONSE = "invalid_incremental_response"
    # An empty full response throttling us (KIP-219); expected, log it quietly.
    THROTTLED = "throttled"
    SESSION_CLOSED_BY_LEADER = "session_closed_by_leader"
    # Built a full request instead of an incremental one whose use of topic ids would
    # differ from the session's (rule 4).
    TOPIC_ID_USAGE_CHANGED = "topic_id_usage_changed"


class _Reset(enum.Enum):
    INITIAL = "initial"
    CLOSE_EXISTING_ATTEMPT_NEW = "close_existing_attempt_new"


# Rule 5 as a table; a reason missing here cannot come from a response (a bug if it does).
_RESET_FOR: Mapping[RecoveryReason, _Reset] = MappingProxyType(
    {
        RecoveryReason.FETCH_SESSION_ID_NOT_FOUND: _Reset.INITIAL,
        RecoveryReason.INVALID_FETCH_SESSION_EPOCH: _Reset.CLOSE_EXISTING_ATTEMPT_NEW,
        RecoveryReason.FETCH_SESSION_TOPIC_ID_ERROR: _Reset.CLOSE_EXISTING_ATTEMPT_NEW,
        RecoveryReason.TOP_LEVEL_ERROR: _Reset.CLOSE_EXISTING_ATTEMPT_NEW,
        RecoveryReason.SEND_ERROR: _Reset.CLOSE_EXISTING_ATTEMPT_NEW,
        RecoveryReason.INVALID_FULL_RESPONSE: _Reset.INITIAL,
        RecoveryReason.INVALID_INCREMENTAL_RESPONSE: _Reset.CLOSE_EXISTING_ATTEMPT_NEW,
        RecoveryReason.THROTTLED: _Reset.INITIAL,
        RecoveryReason.SESSION_CLOSED_BY_LEADER: _Reset.INITIAL,
    }
)

_REASON_FOR_ERROR: Mapping[int, RecoveryReason] = MappingProxyType(
    {
        ErrorCode.fetch_session_id_not_found: RecoveryReason.FETCH_SESSION_ID_NOT_FOUND,
        ErrorCode.invalid_fetch_session_epoch: RecoveryReason.INVALID_FETCH_SESSION_EPOCH,
        ErrorCode.fetch_session_topic_id_error: RecoveryReason.FETCH_SESSION_TOPIC_ID_ERROR,
    }
)

_EMPTY_PARTITIONS: Mapping[TopicPartition, PartitionFetch] = MappingProxyType({})
_EMPTY_NAMES: Mapping[uuid.UUID, str] = MappingProxyType({})


class _Session:
    """What the leader holds for us, in session order. Changed in place only by an
    accepted incremental response (rule 1: O(changes)); every reset makes a new one."""

    __slots__ = ("last_applied", "moves", "partitions")

    def __init__(self, partitions: dict[TopicPartition, PartitionFetch]) -> None:
        self.partitions = partitions
        # In-place changes so far, and the plan view the last one applied.
        self.moves = 0
        self.last_applied: _PlannedSession | None = None


class _PlannedSession(Mapping[TopicPartition, PartitionFetch]):
    """An incremental plan's `session_partitions` without a copy of the session (rule 1):
    the session it was built on, minus the forgotten partitions, with the partitions the
    plan sends laid over it (changed ones in their place, added ones last, as the leader
    keeps them). Readable until a plan built after it is accepted on the same session
    (before its own acceptance the base is as built; after it, the base holds exactly
    this view's content, in the same order)."""

    __slots__ = ("_built_at", "_forgotten", "_sent", "_session")

    def __init__(
        self,
        session: _Session,
        sent: Mapping[TopicPartition, PartitionFetch],
        forgotten: frozenset[TopicPartition],
    ) -> None:
        self._session = session
        self._built_at = session.moves
        self._sent = sent
        self._forgotten = forgotten

    def _base(self) -> dict[TopicPartition, PartitionFetch]:
        session = self._session
        if session.moves != self._built_at and not (
            session.moves == self._built_at + 1 and session.last_applied is self
        ):
            raise LocalProtocolError(
                "a plan's session partitions read after a later plan was accepted"
            )
        return session.partitions

    def get(self, key: object, default: object = None) -> object:  # type: ignore[override]
        base = self._base()
        if key in self._forgotten:
            return default
        found = self._sent.get(key)  # type: ignore[call-overload]
        if found is not None:
            return found
        return base.get(key, default)  # type: ignore[call-overload]

    def __getitem__(self, key: TopicPartition) -> PartitionFetch:
        found = self.get(key)
        if found is None:
            raise KeyError(key)
        return found  # type: ignore[return-value]

    def __contains__(self, key: object) -> bool:
        base = self._base()
        return key not in self._forgotten and (key in self._sent or key in base)

    def __iter__(self) -> Iterator[TopicPartition]:
        base, forgotten = self._base(), self._forgotten
        for tp in base:
            if tp not in forgotten:
                yield tp
        for tp in self._sent:
            if tp not in base:
                yield tp  # added: last, in the order sent

    def __len__(self) -> int:
        base = self._base()
        if self._session.moves != self._built_at:
            return len(base)  # applied: the base is this view
        added = sum(1 for tp in self._sent if tp not in base)
        return len(base) - len(self._forgotten) + added


@dataclass(frozen=True, slots=True)
class FetchRequestPlan:
    """What the next Fetch request holds, and what the leader will hold once it accepts it."""

    session_id: int
    epoch: int
    is_full: bool
    # The request's partitions, in request order.
    to_send: Mapping[TopicPartition, PartitionFetch]
    # Incremental only: partitions to remove from the session (forgotten_topics_data).
    to_forget: Sequence[TopicPartition]
    # Everything the leader fetches for us once it accepts this request.
    session_partitions: Mapping[TopicPartition, PartitionFetch]
    # `to_forget` with the topic id each partition had in the session (v13+ forgets by id).
    to_forget_ids: Sequence[TopicIdPartition] = ()
    # Partitions whose topic id changed: their old id. They are in `to_send` with the new
    # id; v13+ also lists the old (id, partition) in forgotten_topics_data, below v13
    # nothing more is needed.
    to_replace: Sequence[TopicIdPartition] = ()
    # True: send it as Fetch v13+ (topics by id). False: v12 or older (topics by name).
    uses_topic_ids: bool = False
    # Topic id -> name for every topic in the session, to read a v13+ response.
    topic_names: Mapping[uuid.UUID, str] = field(default_factory=lambda: _EMPTY_NAMES)

    @property
    def is_close(self) -> bool:
        """The shutdown request: close the session and create no other."""
        return self.epoch == FINAL_EPOCH and self.session_id != INVALID_SESSION_ID

    def forgotten_for_topic_ids(self) -> list[TopicIdPartition]:
        """The forgotten_topics_data of a v13+ request: forgotten and replaced, by id."""
        return [*self.to_forget_ids, *self.to_replace]

    def __repr__(self) -> str:
        # Counts, not contents: a plan may hold tens of thousands of partitions.
        kind = "Full" if self.is_full else "Incremental"
        return (
            f"{kind}FetchRequestPlan({FetchMetadata(self.session_id, self.epoch)}, "
            f"to_send={len(self.to_send)}, to_forget={len(self.to_forget)}, "
            f"to_replace={len(self.to_replace)}, session={len(self.session_partitions)}, "
            f"uses_topic_ids={self.uses_topic_ids})"
        )


@dataclass(frozen=True, slots=True)
class ResponseVerdict:
    """What a response (or a failed send) meant for the session."""

    # False: discard the response's data; the next request is full and refetches it.
    accepted: bool
    # Why the session was reset; None when it simply continues (or stays sessionless).
    reason: RecoveryReason | None
    # One line for the log: the node, the session, and what was wrong.
    detail: str
    next_session_id: int
    next_epoch: int
    # Partitions a sessionless full response left out (tolerated, see rule 6).
    omitted: frozenset[TopicPartition] = frozenset()


@dataclass(frozen=True, slots=True)
class SessionStatus:
    """A read-only snapshot for `replicad status`."""

    node_id: int
    sessions_enabled: bool
    session_id: int
    next_epoch: int
    # The next request is incremental.
    is_sessionful: bool
    partition_count: int
    uses_topic_ids: bool
    full_requests: int
    incremental_requests: int
    sessions_created: int
    sessionless_responses: int
    recoveries: Mapping[RecoveryReason, int]
    last_recovery: RecoveryReason | None
    last_recovery_ms: int | None


class FetchSessionHandler:
    """Fetch-session state for one leader connection; see the module docstring for its rules."""

    def __init__(self, node_id: int, *, sessions_enabled: bool = True) -> None:
        self._node_id = node_id
        self._sessions_enabled = sessions_enabled
        self._next: FetchMetadata = INITIAL if sessions_enabled else LEGACY
        # What the leader holds for us, in session order (empty while the next request is full).
        self._session = _Session({})
        self._session_uses_topic_ids = False
        self._session_topic_names: Mapping[uuid.UUID, str] = _EMPTY_NAMES
        # Partitions reported changed since the session last moved (rule 3), in order.
        self._dirty: dict[TopicPartition, None] = {}
        self._in_flight: FetchRequestPlan | None = None
        # The last full request was answered without a session, or not at all (rule 6).
        self._no_session_so_far = False
        self._full_requests = 0
        self._incremental_requests = 0
        self._sessions_created = 0
        self._sessionless_responses = 0
        self._recoveries: Counter[RecoveryReason] = Counter()
        self._last_recovery: RecoveryReason | None = None
        self._last_recovery_ms: int | None = None

    # -- read-only state ----------------------------------------------------

    @property
    def node_id(self) -> int:
        return self._node_id

    @property
    def sessions_enabled(self) -> bool:
        return self._sessions_enabled

    @property
    def session_id(self) -> int:
        return self._next.session_id

    @property
    def epoch(self) -> int:
        """The epoch the next request will carry."""
        return self._next.epoch

    @property
    def is_sessionful(self) -> bool:
        return not self._next.is_full

    @property
    def sessionless_so_far(self) -> bool:
        """Every request is full and none creates a session: sessions are off, or no full
        request has made one so far and the last was answered without one (rule 6; Tansu
        always) or not answered at all (a sessionless leader reading many partitions may
        take longer than the request timeout: Tansu 0.6 at 1,000 partitions under load).
        A leader that created a session once and then answers without one (a Kafka whose
        session cache has no room for us) is not: its cache weighs a new session by its
        partitions, so the next request bids with all of them."""
        return not self._sessions_enabled or (
            self._next.is_full and self._no_session_so_far and self._sessions_created == 0
        )

    @property
    def session_partitions(self) -> Mapping[TopicPartition, PartitionFetch]:
        return MappingProxyType(dict(self._session.partitions))

    def status(self) -> SessionStatus:
        return SessionStatus(
            node_id=self._node_id,
            sessions_enabled=self._sessions_enabled,
            session_id=self._next.session_id,
            next_epoch=self._next.epoch,
            is_sessionful=self.is_sessionful,
            partition_count=len(self._session.partitions),
            uses_topic_ids=self._session_uses_topic_ids,
            full_requests=self._full_requests,
            incremental_requests=self._incremental_requests,
            sessions_created=self._sessions_created,
            sessionless_responses=self._sessionless_responses,
            recoveries=MappingProxyType(dict(self._recoveries)),
            last_recovery=self._last_recovery,
            last_recovery_ms=self._last_recovery_ms,
        )

    # -- requests -----------------------------------------------------------

    def build_request(
        self,
        wanted: Mapping[TopicPartition, PartitionFetch],
        changed: Collection[TopicPartition] | None = None,
    ) -> FetchRequestPlan:
        """The next request for the partitions `wanted` now (ordered: full requests keep it).

        `changed`: the partitions whose entry in `wanted` may differ from the caller's
        previous build (added, gone, or another object); None: compare every partition.
        `wanted` is not kept: a full plan copies it, an incremental one reads it only here."""
        if changed is not None:
            self._dirty.update(dict.fromkeys(changed))
        if self._next.is_full:
            plan = self._full_plan(self._next, wanted)
        else:
            plan = self._incremental_plan(wanted, None if changed is None else self._dirty)
            if plan.uses_topic_ids != self._session_uses_topic_ids:
                self._count(RecoveryReason.TOPIC_ID_USAGE_CHANGED, None)
                plan = self._full_plan(self._next.close_existing_attempt_new(), wanted)
        if plan.is_full:
            self._full_requests += 1
        else:
            self._incremental_requests += 1
        self._in_flight = plan
        return plan

    def close_request(self) -> FetchRequestPlan | None:
        """The FINAL_EPOCH request that closes the session on shutdown; None if there is none.

        The session is dropped at once: if the request never arrives, the leader evicts
        the session in time.
        """
        session_id = self._next.session_id
        self._reset_to(INITIAL)
        if not self._sessions_enabled or session_id == INVALID_SESSION_ID:
            self._in_flight = None
            return None
        plan = FetchRequestPlan(
            session_id=session_id,
            epoch=FINAL_EPOCH,
            is_full=True,
            to_send=_EMPTY_PARTITIONS,
            to_forget=(),
            session_partitions=_EMPTY_PARTITIONS,
        )
        self._in_flight = plan
        return plan

    def _full_plan(
        self, meta: FetchMetadata, wanted: Mapping[TopicPartition, PartitionFetch]
    ) -> FetchRequestPlan:
        if not self._sessions_enabled:
            meta = LEGACY
        partitions = MappingProxyType(dict(wanted))
        uses_ids = all(pf.topic_id is not None for pf in wanted.values())
        return FetchRequestPlan(
            session_id=meta.session_id,
            epoch=meta.epoch,
            is_full=True,
            to_send=partitions,
            to_forget=(),
            session_partitions=partitions,
            uses_topic_ids=uses_ids,
            topic_names=_topic_names(wanted) if uses_ids else _EMPTY_NAMES,
        )

    def _incremental_plan(
        self,
        wanted: Mapping[TopicPartition, PartitionFetch],
        dirty: Mapping[TopicPartition, None] | None,
    ) -> FetchRequestPlan:
        changed: list[TopicPartition] = []
        forgotten: list[TopicIdPartition] = []
        replaced: list[TopicIdPartition] = []
        session_map = self._session.partitions
        # Rule 3: only what was reported changed, or everything.
        candidates = session_map if dirty is None else dirty
        ids_kept = True  # every partition kept its topic id: the session's ids still hold
        for tp in candidates:
            before = session_map.get(tp)
            if before is None:
                continue  # added (below)
            now = wanted.get(tp)
            if now is before:
                continue
            if now is None:
                forgotten.append(TopicIdPartition(before.topic_id, tp))
            elif _replaced(before, now):
                replaced.append(TopicIdPartition(before.topic_id, tp))
                changed.append(tp)
            elif before != now:
                changed.append(tp)
                ids_kept = ids_kept and before.topic_id == now.topic_id
        if dirty is None:
            added = [tp for tp in wanted if tp not in session_map]
        else:
            added = [tp for tp in dirty if tp in wanted and tp not in session_map]
        to_send = {tp: wanted[tp] for tp in (*added, *changed)}
        # Session order: what the leader already holds keeps its place, new ones go last
        # (the leader appends them in the same way).
        gone = frozenset(f.partition for f in forgotten)
        session = _PlannedSession(self._session, to_send, gone)
        if not (added or forgotten or replaced) and ids_kept:
            uses_ids = self._session_uses_topic_ids
            names = self._session_topic_names
        elif self._session_uses_topic_ids and not (forgotten or replaced) and ids_kept:
            # Only partitions added to a session whose every partition has a topic id (rule
            # 4 keeps it so): O(added), the names of new topics after the session's.
            uses_ids = all(wanted[tp].topic_id is not None for tp in added)
            names = _EMPTY_NAMES
            if uses_ids:
                more = dict(self._session_topic_names)
                for tp in added:
                    more.setdefault(wanted[tp].topic_id, tp.topic)  # type: ignore[arg-type]
                names = MappingProxyType(more)
        else:
            # The session after the plan, read off the map (not the view). A session whose
            # every partition has an id keeps them but for what the plan sends (rule 4).
            uses_ids = (
                all(f.topic_id is not None for f in forgotten)
                and all(pf.topic_id is not None for pf in to_send.values())
                and (
                    self._session_uses_topic_ids
                    or all(
                        pf.topic_id is not None
                        for tp, pf in session_map.items()
                        if tp not in gone and tp not in to_send
                    )
                )
            )
            names = _EMPTY_NAMES
            if uses_ids:
                found: dict[uuid.UUID, str] = {}
                for tp, pf in session_map.items():
                    if tp not in gone:
                        found.setdefault(to_send.get(tp, pf).topic_id, tp.topic)  # type: ignore[arg-type]
                for tp in added:
                    found.setdefault(to_send[tp].topic_id, tp.topic)  # type: ignore[arg-type]
                names = MappingProxyType(found)
        return FetchRequestPlan(
            session_id=self._next.session_id,
            epoch=self._next.epoch,
            is_full=False,
            to_send=MappingProxyType(to_send),
            to_forget=tuple(f.partition for f in forgotten),
            session_partitions=session,
            to_forget_ids=tuple(forgotten),
            to_replace=tuple(replaced),
            uses_topic_ids=uses_ids,
            topic_names=names,
        )

    # -- responses ----------------------------------------------------------

    def handle_response(
        self,
        plan: FetchRequestPlan,
        *,
        error_code: int,
        session_id: int,
        partitions: Collection[TopicPartition],
        now_ms: int,
        throttle_time_ms: int = 0,
        topic_ids: Collection[uuid.UUID] = (),
    ) -> ResponseVerdict:
        """Judge the response to `plan` (the last plan built).

        `partitions` are the response's partitions, names resolved with
        `plan.topic_names`; `topic_ids` are the topic ids a v13+ response carried (any
        the plan does not know makes the response invalid).
        """
        self._take_in_flight(plan)
        if plan.is_close:
            return self._verdict(True, None, f"{self._who(plan)}: session closed")
        if error_code != ErrorCode.none:
            reason = _REASON_FOR_ERROR.get(error_code, RecoveryReason.TOP_LEVEL_ERROR)
            return self._recover(
                plan,
                reason,
                f"{self._who(plan)}: top-level error {_error_name(error_code)}",
                now_ms,
            )
        returned = set(partitions)
        unknown_ids = (
            sorted(str(t) for t in set(topic_ids) if t not in plan.topic_names)
            if plan.uses_topic_ids
            else []
        )
        if plan.is_full:
            return self._handle_full(
                plan, session_id, returned, unknown_ids, throttle_time_ms, now_ms
            )
        return self._handle_incremental(plan, session_id, returned, unknown_ids, now_ms)

    def handle_send_error(self, *, now_ms: int) -> ResponseVerdict:
        """The request in flight failed: connection lost, timed out, or response undecodable."""
        plan = self._in_flight
        self._in_flight = None
        if plan is not None and plan.is_close:
            return self._verdict(True, None, f"{self._who(plan)}: close request not delivered")
        if plan is not None and plan.is_full and plan.to_send:
            # Rule 6: a full request no answer came to made no session either (a sessionless
            # leader may take longer than the request timeout to read many partitions).
            self._no_session_so_far = True
        meta = FetchMetadata(plan.session_id, plan.epoch) if plan is not None else self._next
        detail = f"node {self._node_id}: send error during {meta}"
        return self._recover_from(meta, RecoveryReason.SEND_ERROR, detail, now_ms)

    def _handle_full(
        self,
        plan: FetchRequestPlan,
        session_id: int,
        returned: set[TopicPartition],
        unknown_ids: list[str],
        throttle_time_ms: int,
        now_ms: int,
    ) -> ResponseVerdict:
        who = self._who(plan)
        if not returned and throttle_time_ms > 0:
            return self._recover(
                plan,
                RecoveryReason.THROTTLED,
                f"{who}: empty full response, throttled for {throttle_time_ms} ms",
                now_ms,
            )
        creates_session = self._sessions_enabled and session_id != INVALID_SESSION_ID
        extra = [tp for tp in returned if tp not in plan.session_partitions]
        omitted = [tp for tp in plan.session_partitions if tp not in returned]
        if extra or unknown_ids or (omitted and creates_session):
            problems = _problems(extra=extra, omitted=omitted, unknown_ids=unknown_ids)
            return self._recover(
                plan,
                RecoveryReason.INVALID_FULL_RESPONSE,
                f"{who}: invalid full response: {problems}",
                now_ms,
            )
        self._no_session_so_far = not creates_session
        if creates_session:
            self._sessions_created += 1
            self._next = FetchMetadata.new_incremental(session_id)
            self._session = _Session(dict(plan.session_partitions))
            self._session_uses_topic_ids = plan.uses_topic_ids
            self._session_topic_names = plan.topic_names
            self._dirty = {}
            return self._verdict(True, None, f"{who}: full response created session {session_id}")
        self._sessionless_responses += 1
        self._reset_to(INITIAL)
        detail = f"{who}: sessionless full response"
        if omitted:
            detail += f" omitting {_names(omitted)}"
        return self._verdict(True, None, detail, omitted=frozenset(omitted))

    def _handle_incremental(
        self,
        plan: FetchRequestPlan,
        session_id: int,
        returned: set[TopicPartition],
        unknown_ids: list[str],
        now_ms: int,
    ) -> ResponseVerdict:
        who = self._who(plan)
        extra = [tp for tp in returned if tp not in plan.session_partitions]
        if extra or unknown_ids:
            problems = _problems(extra=extra, omitted=(), unknown_ids=unknown_ids)
            return self._recover(
                plan,
                RecoveryReason.INVALID_INCREMENTAL_RESPONSE,
                f"{who}: invalid incremental response: {problems}",
                now_ms,
            )
        if session_id == INVALID_SESSION_ID:
            # The data is valid: the leader answered sessionlessly after closing the session.
            self._count(RecoveryReason.SESSION_CLOSED_BY_LEADER, now_ms)
            self._reset_to(INITIAL)
            return self._verdict(
                True,
                RecoveryReason.SESSION_CLOSED_BY_LEADER,
                f"{who}: incremental response closed the session",
            )
        if session_id != plan.session_id:
            # Kafka's client does not check this; a correct leader never does it.
            return self._recover(
                plan,
                RecoveryReason.INVALID_INCREMENTAL_RESPONSE,
                f"{who}: incremental response for another session {session_id}",
                now_ms,
            )
        self._next = FetchMetadata(plan.session_id, plan.epoch).next_incremental()
        # Rule 1: the plan's changes applied in place; its view now reads the result.
        session = self._session
        held = session.partitions
        for tp in plan.to_forget:
            del held[tp]
        held.update(plan.to_send)  # changed ones keep their place, added ones go last
        session.moves += 1
        view = plan.session_partitions
        session.last_applied = view if isinstance(view, _PlannedSession) else None
        self._session_topic_names = plan.topic_names
        self._dirty = {}
        return self._verdict(True, None, f"{who}: incremental response")

    # -- helpers ------------------------------------------------------------

    def _take_in_flight(self, plan: FetchRequestPlan) -> None:
        if plan is not self._in_flight:
            raise LocalProtocolError(
                f"node {self._node_id}: response handed in for a plan that is not the one in flight"
            )
        self._in_flight = None

    def _recover(
        self, plan: FetchRequestPlan, reason: RecoveryReason, detail: str, now_ms: int
    ) -> ResponseVerdict:
        return self._recover_from(
            FetchMetadata(plan.session_id, plan.epoch), reason, detail, now_ms
        )

    def _recover_from(
        self, meta: FetchMetadata, reason: RecoveryReason, detail: str, now_ms: int
    ) -> ResponseVerdict:
        reset = _RESET_FOR.get(reason)
        if reset is None:
            raise LocalProtocolError(f"no reaction defined for {reason}")
        self._count(reason, now_ms)
        if reset is _Reset.INITIAL:
            self._reset_to(INITIAL)
        else:
            self._reset_to(meta.close_existing_attempt_new())
        return self._verdict(False, reason, detail)

    def _reset_to(self, meta: FetchMetadata) -> None:
        self._next = meta if self._sessions_enabled else LEGACY
        self._session = _Session({})  # a new map: plans over the old one still read it
        self._session_uses_topic_ids = False
        self._session_topic_names = _EMPTY_NAMES
        self._dirty = {}

    def _count(self, reason: RecoveryReason, now_ms: int | None) -> None:
        self._recoveries[reason] += 1
        self._last_recovery = reason
        if now_ms is not None:
            self._last_recovery_ms = now_ms

    def _verdict(
        self,
        accepted: bool,
        reason: RecoveryReason | None,
        detail: str,
        *,
        omitted: frozenset[TopicPartition] = frozenset(),
    ) -> ResponseVerdict:
        return ResponseVerdict(
            accepted=accepted,
            reason=reason,
            detail=detail,
            next_session_id=self._next.session_id,
            next_epoch=self._next.epoch,
            omitted=omitted,
        )

    def _who(self, plan: FetchRequestPlan) -> str:
        return f"node {self._node_id} {FetchMetadata(plan.session_id, plan.epoch)}"


def _replaced(before: PartitionFetch, now: PartitionFetch) -> bool:
    """The partition's topic was recreated: both ids known and different."""
    old, new = before.topic_id, now.topic_id
    return old is not None and new is not None and old != new


def _topic_names(partitions: Mapping[TopicPartition, PartitionFetch]) -> Mapping[uuid.UUID, str]:
    names: dict[uuid.UUID, str] = {}
    for tp, pf in partitions.items():
        if pf.topic_id is not None:
            names.setdefault(pf.topic_id, tp.topic)
    return MappingProxyType(names)


def _error_name(code: int) -> str:
    try:
        return f"{ErrorCode(code).name.upper()} ({code})"
    except ValueError:
        return f"error code {code}"


def _names(partitions: Sequence[TopicPartition]) -> str:
    shown = ", ".join(sorted(str(tp) for tp in partitions)[:_DETAIL_LIMIT])
    more = len(partitions) - _DETAIL_LIMIT
    return f"({shown}{f' and {more} more' if more > 0 else ''})"


def _problems(
    *,
    extra: Sequence[TopicPartition],
    omitted: Sequence[TopicPartition],
    unknown_ids: Sequence[str],
) -> str:
    parts = []
    if omitted:
        parts.append(f"omitted {_names(omitted)}")
    if extra:
        parts.append(f"extra {_names(extra)}")
    if unknown_ids:
        parts.append(f"unknown topic ids ({', '.join(unknown_ids[:_DETAIL_LIMIT])})")
    return "; ".join(parts)
