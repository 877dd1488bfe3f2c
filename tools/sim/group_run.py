"""One seeded simulation of serve's group coordinator: the real `GroupCoordinator` (sans-I/O,
time passed in) against simulated members in simulated time.

    python -m tools.sim.group_run --seed N [-v] | --seeds N [--first S] [--events E]

The members are small synchronous clients that behave as Kafka's classic consumer: a new one
joins (and joins again with the member id KIP-394 hands it), the leader of a generation
assigns the PARTITIONS among the members its JoinGroup answer names, each member syncs and
then heartbeats, commits the offsets of its partitions with its generation, and joins again
whenever an answer says the group is rebalancing; UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION and
FENCED_INSTANCE_ID send it back to the start (fenced: it stops). Some are static
(group.instance.id, KIP-345).

Events, drawn with weights from the seed: a member starts; one member sends its next request
(join, sync, heartbeat or commit, as its state says); a member leaves cleanly; one crashes
(says nothing more); a crashed static member restarts under the same instance id; another
process takes a live static member's instance id; time passes (up to past a session
timeout) and the coordinator's timer runs; an answer is held back for a while (a slow
network: the member is silent meanwhile).

After every event:
- no partition is owned by two members of one generation, as the members themselves see it
  (a member the coordinator has fenced may still believe it owns its partitions until it
  learns: a zombie, not an owner);
- no commit was accepted from a member that the coordinator had fenced: a member id that a
  static restart replaced, or that left or was removed, or one committing with a generation
  that is not the group's latest;
- every accepted commit is what OffsetFetch answers afterwards, until the next commit of
  that partition.
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from kio.schema.errors import ErrorCode

from replicad.groups.coordinator import (
    CoordinatorConfig,
    GroupCoordinator,
    JoinRequest,
    JoinResult,
    MemberRef,
    Reply,
    SyncRequest,
    SyncResult,
)
from replicad.types import OffsetAndMetadata, TopicPartition
from tools.sim.seeds import InvariantError, SteppedSeeds

E = ErrorCode
GROUP = "g"
TOPIC = "t"
PARTITIONS = 6
PROTOCOL = (("range", b""),)
SESSION_MS = 6_000
REBALANCE_MS = 10_000
CONFIG = CoordinatorConfig(initial_rebalance_delay_ms=500)
# Errors that send a member back to joining as new (it forgets its member id).
RESET = frozenset({E.unknown_member_id, E.illegal_generation})

WEIGHTS = {
    "start": 4,
    "step": 40,
    "leave": 2,
    "crash": 2,
    "restart": 3,
    "usurp": 1,
    "time": 10,
    "slow": 2,
}
MAX_MEMBERS = 5


class Phase(Enum):
    NEW = "new"  # no member id yet: JoinGroup next
    JOINING = "joining"  # a JoinGroup waits for its answer
    REJOIN = "rejoin"  # has a member id: JoinGroup with it next
    SYNC = "sync"  # joined: SyncGroup next
    SYNCING = "syncing"
    STABLE = "stable"  # heartbeats and commits
    GONE = "gone"  # left, crashed or fenced: says nothing more


@dataclass
class Member:
    name: str
    instance: str | None
    phase: Phase = Phase.NEW
    member_id: str = ""
    generation: int = -1
    joined: JoinResult | None = None
    partitions: frozenset[int] = frozenset()
    # The token of the request whose answer it waits for.
    waiting: object = None
    # Offsets it has read up to, per partition (what it commits).
    position: dict[int, int] = field(default_factory=dict)
    crashed: bool = False
    # Its last request or answer: the coordinator's session deadline for it is at most a
    # session timeout after this.
    last_contact: int = 0


def encode(partitions: frozenset[int]) -> bytes:
    return ",".join(str(p) for p in sorted(partitions)).encode()


def decode(assignment: bytes) -> frozenset[int]:
    return frozenset(int(p) for p in assignment.decode().split(",") if p)


def assign(member_ids: list[str]) -> dict[str, bytes]:
    """The leader's range assignment of the PARTITIONS among `member_ids`."""
    ordered = sorted(member_ids)
    return {
        m: encode(frozenset(p for p in range(PARTITIONS) if p % len(ordered) == i))
        for i, m in enumerate(ordered)
    }


class GroupSim:
    def __init__(
        self,
        seed: int,
        coordinator_factory: Callable[..., GroupCoordinator] = GroupCoordinator,
    ) -> None:
        self.rng = random.Random(seed)
        self.now = 1_000_000
        ids = iter(range(1, 1 << 30))
        self.coordinator = coordinator_factory(
            CONFIG, new_member_id=lambda prefix: f"{prefix or 'm'}-{next(ids)}"
        )
        self.members: list[Member] = []
        self.names = iter(range(1 << 30))
        self.tokens = iter(range(1 << 30))
        self.log: list[str] = []
        self.counts: Counter[str] = Counter()
        # Replies held back by a slow network: (deliver at, reply).
        self.held: list[tuple[int, Reply]] = []
        # What the oracle knows: member ids fenced for good, the latest generation handed
        # out, and the last accepted commit per partition.
        self.fenced: set[str] = set()
        self.latest_generation = 0
        self.committed: dict[int, int] = {}

    # -- plumbing ---------------------------------------------------------------------------

    def say(self, text: str) -> None:
        self.log.append(f"t={self.now} {text}")

    def deliver(self, replies: tuple[Reply, ...]) -> None:
        for reply in replies:
            if self.rng.random() < 0.05:
                self.held.append((self.now + self.rng.randrange(1, SESSION_MS), reply))
                self.counts["slow"] += 1
                continue
            self.receive(reply)

    def receive(self, reply: Reply) -> None:
        member = next((m for m in self.members if m.waiting is reply.token), None)
        if member is None or member.phase is Phase.GONE:
            return  # a crashed member's connection, or an answer no one waits for
        member.waiting = None
        member.last_contact = self.now
        if isinstance(reply.result, JoinResult):
            self.joined(member, reply.result)
        else:
            self.synced(member, reply.result)

    def live(self) -> list[Member]:
        return [m for m in self.members if m.phase is not Phase.GONE]

    # -- a member's side --------------------------------------------------------------------

    def joined(self, m: Member, r: JoinResult) -> None:
        self.say(f"{m.name} join answer {r.error.name} gen={r.generation_id} id={r.member_id}")
        if r.error == E.member_id_required:
            m.member_id, m.phase = r.member_id, Phase.REJOIN
        elif r.error == E.none:
            m.member_id, m.generation, m.joined, m.phase = (
                r.member_id,
                r.generation_id,
                r,
                Phase.SYNC,
            )
            self.latest_generation = max(self.latest_generation, r.generation_id)
        else:
            self.failed(m, r.error)

    def synced(self, m: Member, r: SyncResult) -> None:
        self.say(f"{m.name} sync answer {r.error.name} {r.assignment!r}")
        if r.error == E.none:
            m.partitions, m.phase = decode(r.assignment), Phase.STABLE
        else:
            self.failed(m, r.error)

    def failed(self, m: Member, error: ErrorCode) -> None:
        m.partitions = frozenset()
        if error == E.fenced_instance_id:
            m.phase = Phase.GONE
            self.counts["fenced"] += 1
        elif error in RESET:
            m.member_id, m.generation, m.phase = "", -1, Phase.NEW
        else:  # rebalancing: join again with the member id
            m.phase = Phase.REJOIN

    def step(self, m: Member) -> None:
        """The member's next request, as its phase says."""
        token = next(self.tokens)
        m.last_contact = self.now
        if m.phase in (Phase.NEW, Phase.REJOIN):
            member_id = m.member_id if m.phase is Phase.REJOIN else ""
            m.waiting, m.phase = token, Phase.JOINING
            request = JoinRequest(
                GROUP,
                member_id,
                SESSION_MS,
                REBALANCE_MS,
                "sim",
                PROTOCOL,
                group_instance_id=m.instance,
                client_id=m.name,
            )
            if m.instance is not None and not member_id:
                # KIP-345: a join under a known instance id replaces whoever held it (or the
                # coordinator had removed them already): fenced from now on.
                for other in self.members:
                    if other is not m and other.instance == m.instance and other.member_id:
                        self.fenced.add(other.member_id)
            self.say(f"{m.name} joins id={request.member_id or '-'}")
            self.deliver(self.coordinator.join(request, token, now_ms=self.now).replies)
        elif m.phase is Phase.SYNC:
            assert m.joined is not None
            leader = m.joined.leader_id == m.member_id and m.joined.members
            assignments = assign([j.member_id for j in m.joined.members]) if leader else {}
            m.waiting, m.phase = token, Phase.SYNCING
            self.say(f"{m.name} syncs gen={m.generation} leader={bool(leader)}")
            request = SyncRequest(GROUP, m.generation, m.member_id, assignments, m.instance)
            self.deliver(self.coordinator.sync(request, token, now_ms=self.now).replies)
        elif m.phase is Phase.STABLE:
            if m.partitions and self.rng.random() < 0.5:
                self.commit(m)
            else:
                step = self.coordinator.heartbeat(
                    GROUP, m.generation, MemberRef(m.member_id, m.instance), now_ms=self.now
                )
                self.deliver(step.replies)
                self.say(f"{m.name} heartbeat gen={m.generation}: {step.result.name}")
                if step.result != E.none:
                    self.failed(m, step.result)

    def commit(self, m: Member) -> None:
        offsets = {}
        for p in m.partitions:
            m.position[p] = m.position.get(p, 0) + self.rng.randrange(1, 10)
            offsets[TopicPartition(TOPIC, p)] = OffsetAndMetadata(m.position[p])
        fenced_before = m.member_id in self.fenced or m.generation != self.latest_generation
        step = self.coordinator.commit(
            GROUP, m.generation, MemberRef(m.member_id, m.instance), offsets, now_ms=self.now
        )
        self.deliver(step.replies)
        errors = step.result.errors
        accepted = [tp for tp, e in errors.items() if e == E.none]
        self.say(f"{m.name} commits gen={m.generation} {sorted(offsets)}: {len(accepted)} taken")
        if accepted and fenced_before:
            raise InvariantError(
                f"commit accepted from {m.member_id} (gen {m.generation}), fenced: "
                f"replaced/left={m.member_id in self.fenced}, latest gen={self.latest_generation}"
            )
        for tp in accepted:
            self.committed[tp.partition] = offsets[tp].offset
            self.counts["commits"] += 1
        refused = {e for e in errors.values() if e != E.none}
        if refused:
            self.failed(m, next(iter(refused)))

    # -- events -----------------------------------------------------------------------------

    def event(self) -> None:
        kind = self.rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
        live = self.live()
        if kind == "start" and len(live) < MAX_MEMBERS:
            static = self.rng.random() < 0.5
            name = f"m{next(self.names)}"
            self.members.append(Member(name, f"i-{name}" if static else None))
            self.say(f"{name} starts ({'static' if static else 'dynamic'})")
        elif kind == "step" and live:
            idle = [m for m in live if m.waiting is None]
            if idle:
                self.step(self.rng.choice(idle))
        elif kind == "leave" and live:
            m = self.rng.choice(live)
            if m.member_id:
                step = self.coordinator.leave(
                    GROUP, [MemberRef(m.member_id, m.instance)], now_ms=self.now
                )
                self.deliver(step.replies)
                self.fenced.add(m.member_id)
            m.phase = Phase.GONE
            self.say(f"{m.name} leaves")
        elif kind == "crash" and live:
            m = self.rng.choice(live)
            m.phase, m.crashed = Phase.GONE, True
            self.say(f"{m.name} crashes")
        elif kind == "restart":
            crashed = [
                m
                for m in self.members
                if m.crashed and m.instance and not any(x.instance == m.instance for x in live)
            ]
            if crashed:
                old = self.rng.choice(crashed)
                old.crashed = False
                self.replace(old)
        elif kind == "usurp":
            static = [m for m in live if m.instance and m.member_id]
            if static:
                self.replace(self.rng.choice(static))
                self.counts["usurp"] += 1
        elif kind == "time":
            self.now += self.rng.choice((10, 100, 1_000, 3_000, SESSION_MS + 1))
            self.deliver_held()
            self.deliver(self.coordinator.poll(now_ms=self.now).replies)
            for m in self.members:
                # Silent past its session, and waiting for no answer: removed by now.
                if m.member_id and m.waiting is None and m.last_contact + SESSION_MS <= self.now:
                    self.fenced.add(m.member_id)
        elif kind == "slow":
            self.deliver_held()
        self.counts[kind] += 1

    def replace(self, old: Member) -> None:
        """A new process under `old`'s instance id (it fences old as it joins: `step`)."""
        new = Member(f"m{next(self.names)}", old.instance)
        self.members.append(new)
        self.say(f"{new.name} takes instance {old.instance} from {old.name}")
        new.last_contact = self.now
        self.step(new)

    def deliver_held(self) -> None:
        due = [r for at, r in self.held if at <= self.now]
        self.held = [(at, r) for at, r in self.held if at > self.now]
        for reply in due:
            self.receive(reply)

    # -- invariants -------------------------------------------------------------------------

    def check(self) -> None:
        if GROUP not in self.coordinator.groups:
            self.latest_generation = 0  # forgotten: a new group counts from the start
        by_generation: dict[int, dict[int, str]] = {}
        for m in self.members:
            # A fenced member may still believe it owns its partitions until it learns
            # (a replaced static member keeps the generation): a zombie, not an owner.
            if m.phase is not Phase.STABLE or m.member_id in self.fenced:
                continue
            owners = by_generation.setdefault(m.generation, {})
            for p in m.partitions:
                if p in owners:
                    raise InvariantError(
                        f"partition {p} owned by {owners[p]} and {m.member_id} "
                        f"in generation {m.generation}"
                    )
                owners[p] = m.member_id
        fetched = self.coordinator.fetch_offsets(GROUP, None).offsets
        for p, offset in self.committed.items():
            got = fetched.get(TopicPartition(TOPIC, p))
            if got is None or got.offset != offset:
                raise InvariantError(f"partition {p}: committed {offset}, fetched {got}")


# run_seed(seed, *, events=300, coordinator_factory=GroupCoordinator)
run_seed = SteppedSeeds(GroupSim, "python -m tools.sim.group_run", __doc__, events=300)
run_seeds = run_seed.run_seeds
main = run_seed.main


if __name__ == "__main__":
    sys.exit(main())
