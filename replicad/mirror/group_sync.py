"""Which consumer-group offsets the mirror commits to the destination, and when a group is
left alone (sans-I/O: the shell reads both clusters and the mirror, passes them in with
`now_ms`, and performs the commits the plan returns).

Rules:
- Translation: a source group's committed offset `o` on a mirrored partition becomes the
  destination offset of the first mirrored record at or after `o` (the partition's exact
  `OffsetMap`), never above the mirrored end `dest_next`. The committed metadata string is
  kept; the leader epoch is not (the source's epochs mean nothing at the destination, and a
  consumer would check them), so -1 is written.
- Never ahead of the data: an `o` beyond what the mirror has written (`o > position`) is
  held at the destination's mirrored end (`dest_next`), counted as held back, and caught up
  on a later sync. A consumer that fails over never skips a record.
- An `o` below the first mirrored offset (data the mirror never had) becomes the first
  mirrored offset: nothing before it exists at the destination.
- Never touch a live group: a group with members at the destination is not written. A
  group that has had members there, or whose destination offset differs from what this
  mirror last wrote there (someone else committed), or whose commit the destination refused
  as from a non-member (it became live between our look and our commit), has FAILED OVER:
  it is never synced again (`failed_over` is persisted with the mirror's progress), its own
  commits win. `resume(group)` is the one way back.
- What this mirror wrote is remembered across restarts (`written`, persisted by the shell
  after every round), so a group that failed over while replicad was stopped, and has no
  members when it starts again, is still recognised by its own commits. A commit is
  remembered as `sent` from the plan on (the shell persists it before sending), with what
  the destination held before it, until its answer: until then either offset found there
  is ours (its answer was lost, or the process stopped before saving it), any other is
  someone else's. A group this mirror never sent a commit has no offset of ours to
  compare: what is there is overwritten.
- A source offset that moves backwards (an operator's reset at the source) is followed
  while the group is idle at the destination: it is written like any other, and said.
- Skipped and named, per group: partitions the mirror halted, topics not mirrored, topics
  promoted (cut over: the destination owns them now), partitions with nothing mirrored yet.
- Only what changed is written: a destination offset already equal to the target is left.
  A group is synced (`last_sync_ms`) at the round whose commit the destination took, or
  that found every offset of it already there.
- Sync lag (`sync_lag_ms`): how long the oldest source commit not yet at the destination
  has been waiting, from the last round that read the group without it (OffsetFetch gives
  no commit time: the commit came after that read, so the lag is never understated, and
  overstated by one interval at most), to the destination's answer taking it. 0 once
  nothing waits.
- Forgetting (so `mirror-groups.json` does not keep every group that ever was): a group
  with no committed offset on a mirrored (or promoted) topic in a complete source listing
  is absent at the source (a listing some broker did not answer says nothing of the
  groups missing from it; a group whose offsets could not be read is not absent). Absent
  for `FORGET_AFTER_ROUNDS` sync intervals, it is looked up at the destination (then again
  at most once per that time); once Kafka has no such group there either (no members, no
  committed offset: deleted, or its offsets expired by the destination's
  offsets.retention.minutes), it is forgotten: what the sync wrote, the commits sent, a
  failover, and its status row. Forgetting needs the group gone on both sides because what
  is kept protects what is at the destination: a failed-over group whose destination group
  still exists stays failed over (and one deleted at the destination while the source
  group lives on stays failed over: `resume` is the one way back); our offsets still there
  are still ours. A group that comes back at the source is synced as a new one.
- Time is passed in (`now_ms`); it is only a stamp (last sync, failed over since, absent
  since) and a measure (sync lag, how long a group has been absent).

Group states and transitions (TRANSITIONS; a missing pair is an error):
    SYNCING --members / foreign_commit / refused_live--> FAILED_OVER --resume--> SYNCING
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from replicad.mirror.offset_map import OffsetMap
from replicad.transitions import move
from replicad.types import OffsetAndMetadata, TopicPartition

# OffsetCommit as an admin (or kafka-consumer-groups --reset-offsets) sends it: no member.
ADMIN_GENERATION = -1
ADMIN_MEMBER_ID = ""
NO_LEADER_EPOCH = -1
# A group absent at the source this many sync intervals is looked up at the destination,
# and forgotten if gone there too (a minute at the default 5 s): long enough that a
# coordinator moving or loading between two listings does not count.
FORGET_AFTER_ROUNDS = 12
DEFAULT_SYNC_INTERVAL_MS = 5_000


class GroupState(enum.Enum):
    SYNCING = "syncing"
    FAILED_OVER = "failed_over"


class GroupEvent(enum.Enum):
    # DescribeGroups at the destination found members.
    MEMBERS = "members"
    # The destination's committed offset is not the one this mirror wrote.
    FOREIGN_COMMIT = "foreign_commit"
    # The destination refused our admin commit as for a live group (UNKNOWN_MEMBER_ID,
    # ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS, ...): members joined since we looked.
    REFUSED_LIVE = "refused_live"
    RESUME = "resume"


TRANSITIONS: Mapping[tuple[GroupState, GroupEvent], GroupState] = {
    (GroupState.SYNCING, GroupEvent.MEMBERS): GroupState.FAILED_OVER,
    (GroupState.SYNCING, GroupEvent.FOREIGN_COMMIT): GroupState.FAILED_OVER,
    (GroupState.SYNCING, GroupEvent.REFUSED_LIVE): GroupState.FAILED_OVER,
    (GroupState.FAILED_OVER, GroupEvent.RESUME): GroupState.SYNCING,
}

# A partition the destination's answer left out: whether it was written is not known.
MISSING_ANSWER = "missing from the answer"

# Destination answers to an admin commit that mean "the group is live there".
LIVE_GROUP_ERRORS = frozenset(
    {
        "unknown_member_id",
        "illegal_generation",
        "rebalance_in_progress",
        "fenced_member_epoch",
        "stale_member_epoch",
    }
)


@dataclass(frozen=True, slots=True)
class MirroredPartition:
    """What the mirror has written of one source partition (from its PartitionMirror)."""

    dest: TopicPartition
    # Source offset below which everything is mirrored or deliberately skipped.
    position: int
    # Destination offset the next mirrored record lands at; None: nothing mirrored yet.
    dest_next: int | None
    offset_map: OffsetMap
    # Why the mirror halted this partition; None while it runs.
    halted: str | None = None


@dataclass(frozen=True, slots=True)
class DestinationGroup:
    """A group as the destination reports it (DescribeGroups + OffsetFetch)."""

    members: int = 0
    state: str = "Dead"
    # Committed offsets at the destination, by destination partition.
    offsets: Mapping[TopicPartition, int] = field(default_factory=dict)
    # The group could not be read: it is not written this round (it might be live).
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Commit:
    """One destination offset to commit, with where it came from."""

    offset: int
    metadata: str | None
    source: TopicPartition
    source_offset: int
    held_back: bool


@dataclass(frozen=True, slots=True)
class Written:
    """Persisted: a destination offset this mirror wrote to a group's partition (or found
    there as its own), with the source offset it stood for."""

    offset: int
    source_offset: int


@dataclass(frozen=True, slots=True)
class Sent:
    """Persisted before sending: a commit whose answer is not in, with the offset the
    destination held before it (None: none). Either may be found there next."""

    offset: int
    source_offset: int
    before: int | None


# group -> destination partition -> what was written there.
WrittenOffsets = Mapping[str, Mapping[TopicPartition, Written]]
# group -> destination partition -> the commit sent there, answer unknown.
SentOffsets = Mapping[str, Mapping[TopicPartition, Sent]]


@dataclass(frozen=True, slots=True)
class FailedOver:
    """Persisted: when and why a group stopped being synced."""

    since_ms: int
    reason: str


@dataclass(frozen=True, slots=True)
class Said:
    """Something the shell logs (once, when it happens)."""

    event: str
    group: str
    fields: Mapping[str, object] = field(default_factory=dict)
    level: str = "info"


@dataclass(frozen=True, slots=True)
class SyncPlan:
    # group -> destination partition -> what to commit.
    commits: Mapping[str, Mapping[TopicPartition, Commit]]
    said: tuple[Said, ...] = ()


@dataclass(slots=True)
class GroupStatus:
    """Per group, for `replicad status` and the metrics."""

    state: GroupState = GroupState.SYNCING
    last_sync_ms: int | None = None
    partitions: int = 0
    held_back_partitions: int = 0
    held_back_offsets: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    failed_over_since_ms: int | None = None
    reason: str | None = None
    sync_lag_ms: int = 0
    error: str | None = None
    sync_errors: int = 0
    resets_followed: int = 0
    # Since when the group has had no committed offset on a mirrored topic at the source.
    absent_since_ms: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "state": self.state.value,
            "last_sync_ms": self.last_sync_ms,
            "partitions": self.partitions,
            "held_back_partitions": self.held_back_partitions,
            "held_back_offsets": self.held_back_offsets,
            "skipped": dict(self.skipped),
            "failed_over_since_ms": self.failed_over_since_ms,
            "reason": self.reason,
            "sync_lag_ms": self.sync_lag_ms,
            "error": self.error,
            "sync_errors": self.sync_errors,
            "resets_followed": self.resets_followed,
            "absent_since_ms": self.absent_since_ms,
        }


@dataclass(frozen=True, slots=True)
class Translated:
    offset: int
    held_back: bool


def translate(source_offset: int, partition: MirroredPartition) -> Translated | None:
    """The destination offset for a source consumer position, never past the mirrored end
    (see the rules); None when nothing of the partition is mirrored yet."""
    if partition.dest_next is None or not partition.offset_map.points:
        return None
    if source_offset > partition.position:
        return Translated(partition.dest_next, held_back=True)
    dest = partition.offset_map.translate(source_offset)
    if dest is None:  # below the first mirrored offset
        dest = partition.offset_map.points[0].dest
    return Translated(min(dest, partition.dest_next), held_back=False)


class GroupSync:
    """The sync rules over every group; see the module docstring."""

    def __init__(
        self,
        failed_over: Mapping[str, FailedOver] | None = None,
        promoted: Iterable[str] = (),
        written: WrittenOffsets | None = None,
        sent: SentOffsets | None = None,
        sync_interval_ms: int = DEFAULT_SYNC_INTERVAL_MS,
    ) -> None:
        self.forget_after_ms = FORGET_AFTER_ROUNDS * sync_interval_ms
        self.failed_over: dict[str, FailedOver] = dict(failed_over or {})
        self.promoted: set[str] = set(promoted)
        self.groups: dict[str, GroupStatus] = {}
        for group, why in self.failed_over.items():
            self.groups[group] = GroupStatus(
                state=GroupState.FAILED_OVER,
                failed_over_since_ms=why.since_ms,
                reason=why.reason,
            )
        # What this mirror last wrote (or found already there), per group and destination
        # partition: a different destination offset is someone else's commit.
        self._written: dict[str, dict[TopicPartition, Written]] = {
            g: dict(w) for g, w in (written or {}).items() if g not in self.failed_over
        }
        # Commits planned whose answer has not come (lost, or not yet): also ours if found.
        self._sent: dict[str, dict[TopicPartition, Sent]] = {
            g: dict(w) for g, w in (sent or {}).items() if g not in self.failed_over
        }
        # Source offsets seen but not yet at the destination: since when (sync lag).
        self._waiting: dict[tuple[str, TopicPartition, int], int] = {}
        # When each group was last read at the source (a new offset came after it).
        self._read_at: dict[str, int] = {}
        # Groups absent at the source: since when, and when last looked up at the destination.
        self._absent_since: dict[str, int] = {}
        self._looked_up: dict[str, int] = {}
        self.commits_total = 0
        self.sync_errors_total = 0

    # -- the group state machine --------------------------------------------------------

    def state(self, group: str) -> GroupState:
        status = self.groups.get(group)
        return status.state if status is not None else GroupState.SYNCING

    def _event(self, group: str, event: GroupEvent, now_ms: int, reason: str) -> Said:
        state = self.state(group)
        new = move(TRANSITIONS, state, event, f"group {group}")
        status = self.groups.setdefault(group, GroupStatus())
        status.state = new
        if new is GroupState.FAILED_OVER:
            self.failed_over[group] = FailedOver(now_ms, reason)
            status.failed_over_since_ms = now_ms
            status.reason = reason
            self._written.pop(group, None)
            self._sent.pop(group, None)
            self._read_at.pop(group, None)
            self._forget_waiting(group)
            return Said(
                "group failed over at the destination; no longer synced",
                group,
                {"reason": reason, "cause": event.value},
                level="warning",
            )
        self.failed_over.pop(group, None)
        status.failed_over_since_ms = None
        status.reason = None
        return Said("group sync resumed", group, {"reason": reason})

    def resume(self, group: str, now_ms: int) -> Said | None:
        """Sync a failed-over group again (the operator's `replicad mirror groups resume`);
        None when the group was not failed over."""
        if self.state(group) is not GroupState.FAILED_OVER:
            return None
        return self._event(group, GroupEvent.RESUME, now_ms, "resumed by the operator")

    def promote(self, topics: Iterable[str]) -> None:
        """These source topics are cut over: their offsets are no longer synced."""
        self.promoted.update(topics)

    # -- one sync round -------------------------------------------------------------------

    def wanted(
        self,
        source: Mapping[str, Mapping[TopicPartition, OffsetAndMetadata]],
        mirrored_topics: Iterable[str],
    ) -> list[str]:
        """The groups worth asking the destination about this round: not failed over, with
        a committed offset on a mirrored (or promoted) topic."""
        topics = set(mirrored_topics)
        return [
            g
            for g, offsets in source.items()
            if self.state(g) is GroupState.SYNCING and any(tp.topic in topics for tp in offsets)
        ]

    def plan(
        self,
        now_ms: int,
        source: Mapping[str, Mapping[TopicPartition, OffsetAndMetadata]],
        destination: Mapping[str, DestinationGroup],
        partitions: Mapping[TopicPartition, MirroredPartition],
    ) -> SyncPlan:
        """The commits of this round. `source`: each chosen group's committed offsets at
        the source; `destination`: the same groups at the destination (a group missing
        there is not written); `partitions`: every mirrored partition."""
        mirrored_topics = {tp.topic for tp in partitions} | self.promoted
        said: list[Said] = []
        commits: dict[str, dict[TopicPartition, Commit]] = {}
        wanted = self.wanted(source, mirrored_topics)
        for group in wanted:
            offsets = source[group]
            dest = destination.get(group)
            status = self.groups.setdefault(group, GroupStatus())
            if dest is None or dest.error is not None:
                status.error = dest.error if dest is not None else "not read at the destination"
                continue
            status.error = None
            if dest.members > 0:
                said.append(
                    self._event(
                        group,
                        GroupEvent.MEMBERS,
                        now_ms,
                        f"{dest.members} member(s) at the destination (state {dest.state})",
                    )
                )
                continue
            foreign = self._foreign_commit(group, dest)
            if foreign is not None:
                said.append(self._event(group, GroupEvent.FOREIGN_COMMIT, now_ms, foreign))
                continue
            planned, status_said = self._plan_group(now_ms, group, offsets, dest, partitions)
            said.extend(status_said)
            if planned:
                commits[group] = planned
        for group in wanted:
            self._read_at[group] = now_ms
        return SyncPlan(commits, tuple(said))

    def _foreign_commit(self, group: str, dest: DestinationGroup) -> str | None:
        """Why the destination's offsets are someone else's, or None. Ours: what we wrote,
        and while a commit's answer is unknown, either it or what was there before it."""
        written = self._written.setdefault(group, {})
        sent = self._sent.pop(group, {})
        for tp in sorted(set(written) | set(sent)):
            there = dest.offsets.get(tp)
            if there is None:
                continue
            maybe = sent.get(tp)
            if maybe is not None and there == maybe.offset:
                # Our commit whose answer was lost (or not saved before a stop).
                written[tp] = Written(maybe.offset, maybe.source_offset)
                continue
            expected = maybe.before if maybe is not None else written[tp].offset
            if maybe is not None and expected is None and tp in written:
                expected = written[tp].offset
            if there != expected:
                left = "nothing" if expected is None else expected
                return (
                    f"{tp} committed at the destination at {there} where the sync left "
                    f"{left}: the group commits there itself"
                )
        return None

    def _plan_group(
        self,
        now_ms: int,
        group: str,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        dest: DestinationGroup,
        partitions: Mapping[TopicPartition, MirroredPartition],
    ) -> tuple[dict[TopicPartition, Commit], list[Said]]:
        status = self.groups[group]
        written = self._written.setdefault(group, {})
        planned: dict[TopicPartition, Commit] = {}
        said: list[Said] = []
        skipped: dict[str, str] = {}
        held_partitions = held_offsets = synced = 0
        oldest_wait = now_ms
        # A source offset not seen before was committed after the group's last read.
        new_since = self._read_at.get(group, now_ms)
        for tp, committed in sorted(offsets.items()):
            if tp.topic in self.promoted:
                skipped[str(tp)] = "promoted"
                continue
            partition = partitions.get(tp)
            if partition is None:
                skipped[str(tp)] = "not mirrored"
                continue
            if partition.halted is not None:
                skipped[str(tp)] = f"mirror halted: {partition.halted}"
                continue
            target = translate(committed.offset, partition)
            if target is None:
                skipped[str(tp)] = "nothing mirrored yet"
                continue
            synced += 1
            if target.held_back:
                held_partitions += 1
                held_offsets += committed.offset - partition.position
                key = (group, tp, committed.offset)
                oldest_wait = min(oldest_wait, self._waiting.setdefault(key, new_since))
            before = written.get(partition.dest)
            if before is not None and committed.offset < before.source_offset:
                status.resets_followed += 1
                said.append(
                    Said(
                        "source offset moved backwards; followed at the destination",
                        group,
                        {
                            "partition": str(tp),
                            "from": before.source_offset,
                            "to": committed.offset,
                            "destination_offset": target.offset,
                        },
                    )
                )
            if dest.offsets.get(partition.dest) == target.offset:
                # Already there (ours from before a restart, or unchanged): not written.
                written[partition.dest] = Written(target.offset, committed.offset)
                if not target.held_back:
                    self._done_waiting(group, tp)
                continue
            if not target.held_back:
                key = (group, tp, committed.offset)
                oldest_wait = min(oldest_wait, self._waiting.setdefault(key, new_since))
            planned[partition.dest] = Commit(
                target.offset, committed.metadata, tp, committed.offset, target.held_back
            )
        status.skipped = skipped
        status.partitions = synced
        status.held_back_partitions = held_partitions
        status.held_back_offsets = held_offsets
        status.sync_lag_ms = now_ms - oldest_wait
        if synced and not planned:
            # Every offset it can have is at the destination already: in sync as of now.
            status.last_sync_ms = now_ms
        if planned:
            self._sent[group] = {
                tp: Sent(c.offset, c.source_offset, dest.offsets.get(tp))
                for tp, c in planned.items()
            }
        return planned, said

    def committed(
        self,
        now_ms: int,
        group: str,
        planned: Mapping[TopicPartition, Commit],
        errors: Mapping[TopicPartition, str | None],
    ) -> list[Said]:
        """The destination's answer to a group's commit: per destination partition, None
        (taken) or the error's name. A refusal meaning "live group" fails the group over."""
        status = self.groups.setdefault(group, GroupStatus())
        said: list[Said] = []
        written = self._written.setdefault(group, {})
        sent = self._sent.get(group, {})
        failed: dict[TopicPartition, str] = {}
        for dest_tp, commit in planned.items():
            error = errors.get(dest_tp, MISSING_ANSWER)
            if error is not None and error != MISSING_ANSWER:
                # A definite refusal: not written, so not ours if found.
                sent.pop(dest_tp, None)
            if error is None:
                sent.pop(dest_tp, None)
                written[dest_tp] = Written(commit.offset, commit.source_offset)
                self.commits_total += 1
                if not commit.held_back:
                    self._done_waiting(group, commit.source)
            else:
                failed[dest_tp] = error
        live = sorted({e for e in failed.values() if e in LIVE_GROUP_ERRORS})
        if live and status.state is GroupState.SYNCING:
            said.append(
                self._event(
                    group,
                    GroupEvent.REFUSED_LIVE,
                    now_ms,
                    f"the destination refused the commit as for a live group ({live[0]})",
                )
            )
        elif failed:
            status.sync_errors += 1
            self.sync_errors_total += 1
            tp, error = min(failed.items())
            status.error = f"{tp}: {error}" + (
                f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            )
        if not sent:
            self._sent.pop(group, None)
        status.last_sync_ms = now_ms
        waits = [since for key, since in self._waiting.items() if key[0] == group]
        status.sync_lag_ms = now_ms - min(waits) if waits else 0
        return said

    # -- forgetting groups gone on both sides ---------------------------------------------

    def absent(
        self,
        now_ms: int,
        source: Mapping[str, Mapping[TopicPartition, OffsetAndMetadata]],
        mirrored_topics: Iterable[str],
        *,
        complete: bool,
        unreadable: Iterable[str] = (),
    ) -> list[str]:
        """Notes which known groups are absent at the source this round (see the rules);
        returns those to look up at the destination now, for `forget`. `source`: the
        chosen groups' committed offsets; `complete`: the listing had every broker;
        `unreadable`: groups whose offsets could not be read (not absent)."""
        topics = set(mirrored_topics) | self.promoted
        present = {g for g, offsets in source.items() if any(tp.topic in topics for tp in offsets)}
        present.update(unreadable)
        for group in present:
            self._absent_since.pop(group, None)
            self._looked_up.pop(group, None)
            if group in self.groups:
                self.groups[group].absent_since_ms = None
        if not complete:
            return []
        known = set(self.groups) | set(self._written) | set(self._sent) | set(self.failed_over)
        due = []
        for group in sorted(known - present):
            since = self._absent_since.setdefault(group, now_ms)
            status = self.groups.setdefault(group, GroupStatus())
            if status.absent_since_ms is None:
                # Nothing of it waits at the source any more.
                status.absent_since_ms = since
                status.partitions = status.held_back_partitions = status.held_back_offsets = 0
                status.sync_lag_ms = 0
                status.skipped = {}
                self._forget_waiting(group)
            looked = self._looked_up.get(group)
            if now_ms - since >= self.forget_after_ms and (
                looked is None or now_ms - looked >= self.forget_after_ms
            ):
                due.append(group)
        return due

    def forget(self, now_ms: int, destination: Mapping[str, DestinationGroup]) -> list[Said]:
        """The destination's answer for the groups `absent` returned: each one gone there
        too (no members, no committed offset) is forgotten; the others are looked up again
        after `forget_after_ms`. A group that could not be read is asked again next round."""
        said = []
        for group, dest in sorted(destination.items()):
            since = self._absent_since.get(group)
            if since is None or dest.error is not None:
                continue
            if dest.members or dest.offsets:
                self._looked_up[group] = now_ms
                continue
            was = self.state(group)
            for kept in (self.groups, self._written, self._sent, self.failed_over):
                kept.pop(group, None)
            self._absent_since.pop(group, None)
            self._looked_up.pop(group, None)
            self._read_at.pop(group, None)
            self._forget_waiting(group)
            said.append(
                Said(
                    "group forgotten: gone at the source and at the destination",
                    group,
                    {"absent_since_ms": since, "state": was.value},
                )
            )
        return said

    def failed(self, group: str, error: str) -> None:
        """`group` could not be read or committed this round (coordinator moved,
        connection lost, an error answer): counted, shown until a sync succeeds."""
        status = self.groups.setdefault(group, GroupStatus())
        status.sync_errors += 1
        self.sync_errors_total += 1
        status.error = error

    def written_on(self, partitions: set[TopicPartition]) -> dict[str, dict[str, int]]:
        """Per group, the destination offsets last written (or found) on `partitions`."""
        out = {}
        for group, written in sorted(self._written.items()):
            mine = {str(tp): w.offset for tp, w in sorted(written.items()) if tp in partitions}
            if mine:
                out[group] = mine
        return out

    @property
    def written(self) -> dict[str, dict[TopicPartition, Written]]:
        """What to persist: per group, the destination offsets this mirror wrote."""
        return {g: dict(w) for g, w in self._written.items() if w}

    @property
    def sent(self) -> dict[str, dict[TopicPartition, Sent]]:
        """What to persist before sending: commits planned, their answer not yet in."""
        return {g: dict(w) for g, w in self._sent.items() if w}

    # -- internals ------------------------------------------------------------------------

    def _done_waiting(self, group: str, tp: TopicPartition) -> None:
        for key in [k for k in self._waiting if k[0] == group and k[1] == tp]:
            del self._waiting[key]

    def _forget_waiting(self, group: str) -> None:
        for key in [k for k in self._waiting if k[0] == group]:
            del self._waiting[key]

    def snapshot(self) -> dict[str, object]:
        groups = {g: s.as_dict() for g, s in sorted(self.groups.items())}
        syncing = [s for s in self.groups.values() if s.state is GroupState.SYNCING]
        return {
            "groups": groups,
            # Gone at the source: not synced any more, only remembered.
            "groups_synced": sum(
                1 for s in syncing if s.last_sync_ms is not None and s.absent_since_ms is None
            ),
            "groups_failed_over": len(self.failed_over),
            "held_back_offsets": sum(s.held_back_offsets for s in syncing),
            "sync_lag_ms": max((s.sync_lag_ms for s in syncing), default=0),
            "commits_total": self.commits_total,
            "sync_errors_total": self.sync_errors_total,
            "promoted_topics": sorted(self.promoted),
        }
