"""One seeded simulation of serve's consumer group protocol (KIP-848): the real
`GroupCoordinator` (sans-I/O, time passed in) against simulated members in simulated time.

    python -m tools.sim.consumer_group_run --seed N [-v] | --seeds N [--first S] [--events E]

The members behave as Kafka's Java consumer with group.protocol=consumer: a new one joins
with epoch 0 and its own member id; each heartbeat carries its epoch and the partitions it
owns; an answer's assignment is applied at once (what it no longer names is revoked, after
a commit; what is new is taken) and reported with the next heartbeat; it commits its
partitions' offsets with its epoch; FENCED_MEMBER_EPOCH and UNKNOWN_MEMBER_ID make it give
up everything and join again with epoch 0 under the same id.

Events, drawn with weights from the seed: a member starts; one member heartbeats or
commits; one leaves (epoch -1); one crashes (says nothing more); time passes (up to past a
session timeout) and the coordinator's timer runs; an answer is lost (the member resends
with the epoch it had: the coordinator's allowance for a lost answer, or a fence); the
topic grows a partition.

After every event:
- the coordinator never lets two members hold one partition (assigned, or pending its
  revocation), and every partition a member the coordinator still has believes it owns is
  one the coordinator holds for it: so no partition is owned by two members, as they see
  it, except by a member the coordinator has removed (a zombie until it hears so);
- a commit is accepted only from a member the coordinator has (not one that left or was
  removed), with the epoch the coordinator last gave it -- or an older one (its answer was
  lost: KIP-1251) for partitions the coordinator still assigns it;
- every accepted commit is what OffsetFetch answers afterwards, until the next one.
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from replicad.groups.consumer_group import ConsumerHeartbeat, HeartbeatResult
from replicad.groups.coordinator import (
    CoordinatorConfig,
    GroupCoordinator,
    MemberRef,
)
from replicad.types import OffsetAndMetadata, TopicPartition
from tools.sim.seeds import InvariantError, SteppedSeeds

E = ErrorCode
GROUP = "g"
TOPIC = "t"
SESSION_MS = 6_000
REBALANCE_MS = 10_000
CONFIG = CoordinatorConfig(consumer_session_timeout_ms=SESSION_MS)
REJOIN = frozenset({E.fenced_member_epoch, E.unknown_member_id})
WEIGHTS = {"start": 4, "step": 40, "leave": 2, "crash": 2, "time": 8, "lost": 3, "grow": 1}
MAX_MEMBERS = 5
MAX_PARTITIONS = 9


@dataclass
class Member:
    member_id: str
    epoch: int = 0
    owned: frozenset[TopicPartition] = frozenset()
    gone: bool = False
    # The member's own positions (what it commits).
    position: dict[TopicPartition, int] | None = None
    last_contact: int = 0


class ConsumerGroupSim:
    def __init__(
        self, seed: int, coordinator_factory: Callable[..., GroupCoordinator] = GroupCoordinator
    ) -> None:
        self.rng = random.Random(seed)
        self.now = 1_000_000
        self.coordinator = coordinator_factory(CONFIG)
        self.partitions = self.rng.randint(1, 6)
        self.members: list[Member] = []
        self.names = iter(range(1 << 30))
        self.log: list[str] = []
        self.counts: Counter[str] = Counter()
        # The oracle: the epoch the coordinator last answered each member id with, and the
        # last accepted commit per partition.
        self.answered_epoch: dict[str, int] = {}
        self.committed: dict[TopicPartition, int] = {}

    def say(self, text: str) -> None:
        self.log.append(f"t={self.now} {text}")

    def live(self) -> list[Member]:
        return [m for m in self.members if not m.gone]

    # -- a member's side --------------------------------------------------------------------

    def heartbeat(self, m: Member, *, lose_answer: bool = False) -> None:
        m.last_contact = self.now
        joining = m.epoch == 0
        req = ConsumerHeartbeat(
            GROUP,
            m.member_id,
            m.epoch,
            rebalance_timeout_ms=REBALANCE_MS if joining else -1,
            subscribed_topic_names=(TOPIC,) if joining else None,
            owned=m.owned if joining or self.rng.random() < 0.8 else None,
        )
        result = self.coordinator.consumer_heartbeat(req, {TOPIC: self.partitions}, now_ms=self.now)
        if result.error == E.none:
            self.answered_epoch[m.member_id] = result.member_epoch
        self.say(
            f"{m.member_id} hb epoch={m.epoch} owned={_show(req.owned)}: {result.error.name} "
            f"epoch={result.member_epoch} assignment={_show(result.assignment)}"
            + (" (lost)" if lose_answer else "")
        )
        if lose_answer:
            self.counts["lost"] += 1
            return
        self.apply(m, result)

    def apply(self, m: Member, result: HeartbeatResult) -> None:
        if result.error in REJOIN:
            m.owned, m.epoch = frozenset(), 0
            self.counts["fenced"] += 1
            return
        if result.error != E.none:
            raise InvariantError(f"{m.member_id}: unexpected {result.error.name}")
        m.epoch = result.member_epoch
        if result.assignment is not None:
            revoked = m.owned - result.assignment
            if revoked:
                self.commit(m, revoked)
            m.owned = result.assignment

    def commit(self, m: Member, partitions: frozenset[TopicPartition]) -> None:
        if m.position is None:
            m.position = {}
        offsets = {}
        for tp in partitions:
            m.position[tp] = m.position.get(tp, 0) + self.rng.randrange(1, 10)
            offsets[tp] = OffsetAndMetadata(m.position[tp])
        group = self.coordinator.consumer_groups.get(GROUP)
        held = group.members.get(m.member_id) if group is not None else None
        assigned = held.assigned if held is not None else frozenset()
        step = self.coordinator.commit(
            GROUP, m.epoch, MemberRef(m.member_id), offsets, now_ms=self.now, version=10
        )
        accepted = [tp for tp, e in step.result.errors.items() if e == E.none]
        self.say(f"{m.member_id} commits epoch={m.epoch} {_show(partitions)}: {len(accepted)}")
        current = self.answered_epoch.get(m.member_id) == m.epoch
        if accepted and (held is None or not (current or set(accepted) <= assigned)):
            raise InvariantError(
                f"commit of {_show(set(accepted))} accepted from {m.member_id} epoch {m.epoch}: "
                f"in the group={held is not None}, assigned={_show(assigned)}, "
                f"its last answered epoch={self.answered_epoch.get(m.member_id)}"
            )
        for tp in accepted:
            self.committed[tp] = offsets[tp].offset
            self.counts["commits"] += 1

    # -- events -----------------------------------------------------------------------------

    def event(self) -> None:
        kind = self.rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
        live = self.live()
        if kind == "start" and len(live) < MAX_MEMBERS:
            m = Member(f"m{next(self.names)}")
            self.members.append(m)
            self.say(f"{m.member_id} starts")
            self.heartbeat(m)
        elif kind in ("step", "lost") and live:
            m = self.rng.choice(live)
            if kind == "step" and m.owned and self.rng.random() < 0.3:
                self.commit(m, m.owned)
            else:
                self.heartbeat(m, lose_answer=kind == "lost")
        elif kind == "leave" and live:
            m = self.rng.choice(live)
            if m.owned:
                self.commit(m, m.owned)
            result = self.coordinator.consumer_heartbeat(
                ConsumerHeartbeat(GROUP, m.member_id, -1), {TOPIC: self.partitions}, now_ms=self.now
            )
            self.say(f"{m.member_id} leaves: {result.error.name}")
            m.gone = True
        elif kind == "crash" and live:
            m = self.rng.choice(live)
            m.gone = True
            self.say(f"{m.member_id} crashes")
        elif kind == "time":
            self.now += self.rng.choice((10, 100, 1_000, 3_000, SESSION_MS + 1))
            self.coordinator.poll(now_ms=self.now)
        elif kind == "grow" and self.partitions < MAX_PARTITIONS:
            self.partitions += 1
            self.say(f"the topic has {self.partitions} partitions")
        self.counts[kind] += 1

    # -- invariants -------------------------------------------------------------------------

    def check(self) -> None:
        group = self.coordinator.consumer_groups.get(GROUP)
        held_by: dict[TopicPartition, str] = {}
        if group is not None:
            for member in group.members.values():
                for tp in member.assigned | member.pending_revocation:
                    if tp in held_by:
                        raise InvariantError(
                            f"{tp} held by {held_by[tp]} and {member.member_id} at once"
                        )
                    held_by[tp] = member.member_id
        for m in self.live():
            if group is None or m.member_id not in group.members:
                continue  # removed: a zombie until it hears so
            foreign = {tp for tp in m.owned if held_by.get(tp) != m.member_id}
            if foreign:
                raise InvariantError(f"{m.member_id} owns {_show(foreign)}, held for others")
        fetched = self.coordinator.fetch_offsets(GROUP, None).offsets
        for tp, offset in self.committed.items():
            got = fetched.get(tp)
            if got is None or got.offset != offset:
                raise InvariantError(f"{tp}: committed {offset}, fetched {got}")


def _show(partitions: frozenset[TopicPartition] | set[TopicPartition] | None) -> str:
    if partitions is None:
        return "-"
    return "[" + ",".join(str(tp.partition) for tp in sorted(partitions)) + "]"


# run_seed(seed, *, events=300, coordinator_factory=GroupCoordinator)
run_seed = SteppedSeeds(
    ConsumerGroupSim, "python -m tools.sim.consumer_group_run", __doc__, events=300
)
run_seeds = run_seed.run_seeds
main = run_seed.main


if __name__ == "__main__":
    sys.exit(main())
