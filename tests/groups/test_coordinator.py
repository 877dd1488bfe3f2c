"""The classic group coordinator, rule by rule, with time passed in (no clock, no sockets).

Each test drives `GroupCoordinator` as `replicad serve` does: a token per JoinGroup /
SyncGroup, replies collected from every call, `poll(now_ms)` for the timers.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from kio.schema.errors import ErrorCode as E

from replicad.groups.classic_group import NO_DEADLINE, GroupState
from replicad.groups.coordinator import (
    CoordinatorConfig,
    GroupCoordinator,
    JoinRequest,
    JoinResult,
    MemberRef,
    Step,
    SyncRequest,
    SyncResult,
)
from replicad.types import OffsetAndMetadata, TopicPartition
from tests.groups.test_consumer_protocol import encoded

SESSION = 10_000
REBALANCE = 30_000
DELAY = 3_000
TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def subscription(*topics: str) -> bytes:
    return encoded("consumer_protocol_subscription", 0, topics=topics, user_data=None)


class Harness:
    """A coordinator, a clock, and the answers it has given so far, by token."""

    def __init__(self, **config: Any) -> None:
        ids = itertools.count(1)
        self.coordinator = GroupCoordinator(
            CoordinatorConfig(initial_rebalance_delay_ms=config.pop("delay", DELAY), **config),
            new_member_id=lambda prefix: f"{prefix}-{next(ids)}",
        )
        self.now = 1_000
        self.answers: dict[object, JoinResult | SyncResult] = {}
        self._tokens = itertools.count(1)

    def _take(self, step: Step) -> Step:
        for reply in step.replies:
            assert reply.token not in self.answers, f"answered twice: {reply.token}"
            self.answers[reply.token] = reply.result
        return step

    def join(
        self,
        member_id: str = "",
        *,
        group: str = "g",
        instance: str | None = None,
        protocols: tuple[tuple[str, bytes], ...] = (("range", subscription("t")),),
        protocol_type: str = "consumer",
        session: int = SESSION,
        rebalance: int = REBALANCE,
        v4: bool = True,
        v9: bool = True,
        client: str = "c",
    ) -> int:
        token = next(self._tokens)
        request = JoinRequest(
            group,
            member_id,
            session,
            rebalance,
            protocol_type,
            protocols,
            group_instance_id=instance,
            client_id=client,
            require_known_member_id=v4,
            supports_skip_assignment=v9,
        )
        self._take(self.coordinator.join(request, token, now_ms=self.now))
        return token

    def join_new(self, **kwargs: Any) -> int:
        """A new dynamic member's two JoinGroups (KIP-394): the token of the second."""
        first = self.join(**kwargs)
        answer = self.answer(first)
        assert answer.error == E.member_id_required
        return self.join(answer.member_id, **kwargs)

    def sync(
        self,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes] | None = None,
        *,
        group: str = "g",
        instance: str | None = None,
        protocol_name: str | None = None,
    ) -> int:
        token = next(self._tokens)
        request = SyncRequest(
            group,
            generation,
            member_id,
            assignments or {},
            group_instance_id=instance,
            protocol_name=protocol_name,
        )
        self._take(self.coordinator.sync(request, token, now_ms=self.now))
        return token

    def answer(self, token: int) -> Any:
        return self.answers[token]

    def pending(self, token: int) -> bool:
        return token not in self.answers

    def heartbeat(
        self, member_id: str, generation: int, *, instance: str | None = None, group: str = "g"
    ) -> E:
        step = self.coordinator.heartbeat(
            group, generation, MemberRef(member_id, instance), now_ms=self.now
        )
        return self._take(step).result

    def leave(self, *who: MemberRef, group: str = "g") -> Any:
        return self._take(self.coordinator.leave(group, who, now_ms=self.now)).result

    def commit(
        self,
        member_id: str,
        generation: int,
        offsets: dict[TopicPartition, int],
        *,
        instance: str | None = None,
        group: str = "g",
        metadata: str = "",
    ) -> dict[TopicPartition, E]:
        step = self.coordinator.commit(
            group,
            generation,
            MemberRef(member_id, instance),
            {tp: OffsetAndMetadata(o, 3, metadata) for tp, o in offsets.items()},
            now_ms=self.now,
        )
        return dict(step.result.errors)

    def advance(self, ms: int) -> None:
        self.now += ms
        self._take(self.coordinator.poll(now_ms=self.now))

    def settle(self, tokens: list[int]) -> list[Any]:
        """Let the initial delay pass (extended while members came) until `tokens` are
        answered; their answers."""
        for _ in range(REBALANCE // DELAY):
            if not any(self.pending(t) for t in tokens):
                break
            self.advance(DELAY)
        return [self.answer(t) for t in tokens]

    def static_pair(self, *, assign: bool = True) -> tuple[JoinResult, JoinResult]:
        """Static members i1 (the leader, the first to join) and i2, joined and synced in
        generation 1: i1 hands out b"A1" and b"A2" when `assign`, nothing otherwise."""
        one, two = self.settle([self.join(instance="i1"), self.join(instance="i2")])
        self.sync(one.member_id, 1, {one.member_id: b"A1", two.member_id: b"A2"} if assign else {})
        self.sync(two.member_id, 1)
        return one, two

    def state(self, group: str = "g") -> GroupState:
        return self.coordinator.groups[group].state

    def stable_group(self, members: int = 1, **kwargs: Any) -> list[JoinResult]:
        """`members` members through join and sync to Stable; their JoinResults."""
        tokens = [self.join_new(**kwargs) for _ in range(members)]
        results = self.settle(tokens)
        leader = next(r for r in results if r.members)
        assignments = {r.member_id: r.member_id.encode() for r in results}
        syncs = [
            self.sync(r.member_id, r.generation_id, assignments if r is leader else None)
            for r in results
        ]
        assert all(self.answer(s).error == E.none for s in syncs)
        assert self.state() is GroupState.STABLE
        return results


# -- JoinGroup --------------------------------------------------------------------------------


def test_a_join_with_no_group_id_or_a_session_timeout_out_of_bounds_is_refused() -> None:
    h = Harness()
    assert h.answer(h.join(group="")).error == E.invalid_group_id
    assert h.answer(h.join(session=5_999)).error == E.invalid_session_timeout
    assert h.answer(h.join(session=1_800_001)).error == E.invalid_session_timeout


def test_a_new_member_gets_its_id_with_member_id_required_and_joins_with_it() -> None:
    h = Harness()
    first = h.answer(h.join(client="app"))
    assert first.error == E.member_id_required
    assert first.member_id == "app-1"
    assert h.coordinator.groups["g"].pending_members == {"app-1": h.now + SESSION}
    token = h.join("app-1")
    assert h.pending(token)  # the initial rebalance delay runs
    assert h.state() is GroupState.PREPARING_REBALANCE


def test_a_join_before_v4_needs_no_second_round() -> None:
    h = Harness(delay=0)
    result = h.answer(h.join(v4=False))
    assert result.error == E.none
    assert (result.generation_id, result.leader_id) == (1, result.member_id)


def test_an_unknown_member_id_is_refused() -> None:
    h = Harness()
    assert h.answer(h.join("nobody")).error == E.unknown_member_id
    h.stable_group()
    assert h.answer(h.join("nobody")).error == E.unknown_member_id


def test_a_pending_member_that_never_joins_again_is_forgotten_after_its_session() -> None:
    h = Harness()
    member = h.answer(h.join()).member_id
    h.advance(SESSION - 1)
    assert member in h.coordinator.groups["g"].pending_members
    h.advance(1)
    assert "g" not in h.coordinator.groups  # nothing left in it: Dead
    assert h.answer(h.join(member)).error == E.unknown_member_id


def test_the_first_rebalance_waits_the_initial_delay_and_completes_with_a_leader() -> None:
    h = Harness()
    token = h.join_new()
    h.advance(DELAY - 1)
    assert h.pending(token)
    h.advance(1)
    result = h.answer(token)
    assert result.error == E.none
    assert result.generation_id == 1
    assert result.leader_id == result.member_id
    assert result.protocol_name == "range"
    assert [m.member_id for m in result.members] == [result.member_id]
    assert h.state() is GroupState.COMPLETING_REBALANCE


def test_members_joining_during_the_initial_delay_extend_it_within_rebalance_timeout() -> None:
    h = Harness()
    first = h.join_new(rebalance=7_000)
    h.advance(2_000)
    second = h.join_new(rebalance=7_000)
    h.advance(1_000)  # the first delay ends; a member came: wait once more
    assert h.pending(first) and h.pending(second)
    h.advance(2_999)
    assert h.pending(first)
    third = h.join_new(rebalance=7_000)
    h.advance(1)  # 3 s more were taken; 1 s of the 7 s is left for one last wait
    assert h.pending(third)
    h.advance(1_000)
    results = [h.answer(t) for t in (first, second, third)]
    assert {r.generation_id for r in results} == {1}
    assert len(next(r for r in results if r.members).members) == 3


def test_another_protocol_type_or_no_common_protocol_is_inconsistent() -> None:
    h = Harness()
    h.stable_group()
    assert h.answer(h.join(protocol_type="connect")).error == E.inconsistent_group_protocol
    other = (("sticky", b""),)
    assert h.answer(h.join(protocols=other)).error == E.inconsistent_group_protocol
    assert h.answer(h.join(group="x", protocols=())).error == E.inconsistent_group_protocol
    assert "x" not in h.coordinator.groups


def test_the_protocol_is_chosen_by_the_members_votes_ties_by_the_leader() -> None:
    h = Harness()
    a, b = ("a", subscription("t")), ("b", subscription("t"))
    tokens = [
        h.join_new(protocols=(a, b)),
        h.join_new(protocols=(b, a)),
        h.join_new(protocols=(b, a)),
    ]
    h.settle(tokens)
    assert {h.answer(t).protocol_name for t in tokens} == {"b"}

    h2 = Harness()
    tokens = [h2.join_new(protocols=(a, b)), h2.join_new(protocols=(b, a))]
    h2.settle(tokens)
    assert {h2.answer(t).protocol_name for t in tokens} == {"a"}  # the leader's first


def test_a_member_joining_a_stable_group_rebalances_it_and_everyone_must_rejoin() -> None:
    h = Harness()
    (first,) = h.stable_group()
    newcomer = h.join_new()
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert h.heartbeat(first.member_id, 1) == E.rebalance_in_progress
    assert h.pending(newcomer)
    again = h.join(first.member_id)  # everyone joined: no waiting for the timeout
    results = [h.answer(newcomer), h.answer(again)]
    assert {r.generation_id for r in results} == {2}
    assert h.answer(again).members and not h.answer(newcomer).members  # the leader stays


def test_a_member_that_does_not_rejoin_within_the_rebalance_timeout_is_removed() -> None:
    h = Harness()
    first, second = h.stable_group(2, session=60_000)
    token = h.join(first.member_id, protocols=(("range", subscription("t", "u")),), session=60_000)
    h.advance(REBALANCE - 1)
    assert h.heartbeat(second.member_id, 1) == E.rebalance_in_progress
    assert h.pending(token)
    h.advance(1)
    result = h.answer(token)
    assert result.generation_id == 2
    assert [m.member_id for m in result.members] == [first.member_id]
    assert second.member_id not in h.coordinator.groups["g"].members


def test_rejoining_with_nothing_new_returns_the_current_generation() -> None:
    h = Harness()
    first, second = h.stable_group(2)
    follower = second if first.members else first
    again = h.answer(h.join(follower.member_id))
    assert (again.error, again.generation_id, again.members) == (E.none, 1, ())
    assert h.state() is GroupState.STABLE
    leader = first if first.members else second
    assert h.pending(h.join(leader.member_id))  # the leader asking again is a rebalance
    assert h.state() is GroupState.PREPARING_REBALANCE


def test_a_second_join_while_the_first_waits_answers_the_first() -> None:
    h = Harness()
    member, other = h.stable_group(2)
    first = h.join(member.member_id, protocols=(("range", subscription("x")),))
    second = h.join(member.member_id, protocols=(("range", subscription("x")),))
    assert h.answer(first).error == E.rebalance_in_progress
    assert h.pending(second)
    h.join(other.member_id)
    assert h.answer(second).generation_id == 2


# -- SyncGroup --------------------------------------------------------------------------------


def test_followers_wait_for_the_leaders_assignment_then_the_group_is_stable() -> None:
    h = Harness()
    tokens = [h.join_new(), h.join_new()]
    h.settle(tokens)
    leader, follower = sorted((h.answer(t) for t in tokens), key=lambda r: not r.members)
    waiting = h.sync(follower.member_id, 1)
    assert h.pending(waiting)
    done = h.sync(leader.member_id, 1, {follower.member_id: b"F", leader.member_id: b"L"})
    assert h.answer(waiting) == SyncResult(E.none, b"F", "consumer", "range")
    assert h.answer(done).assignment == b"L"
    assert h.state() is GroupState.STABLE
    assert h.answer(h.sync(follower.member_id, 1)).assignment == b"F"  # again, at once


def test_a_member_the_leader_left_out_is_assigned_nothing() -> None:
    h = Harness()
    tokens = [h.join_new(), h.join_new()]
    h.settle(tokens)
    leader, follower = sorted((h.answer(t) for t in tokens), key=lambda r: not r.members)
    h.sync(leader.member_id, 1, {leader.member_id: b"L"})
    assert h.answer(h.sync(follower.member_id, 1)).assignment == b""


def test_sync_checks_member_generation_protocol_and_state() -> None:
    h = Harness()
    assert h.answer(h.sync("x", 1)).error == E.unknown_member_id  # no group
    (member,) = h.stable_group()
    mid = member.member_id
    assert h.answer(h.sync("x", 1)).error == E.unknown_member_id
    assert h.answer(h.sync(mid, 0)).error == E.illegal_generation
    assert h.answer(h.sync(mid, 1, protocol_name="roundrobin")).error == (
        E.inconsistent_group_protocol
    )
    h.join_new()
    assert h.answer(h.sync(mid, 1)).error == E.rebalance_in_progress


def test_a_rebalance_starting_before_the_leader_syncs_voids_the_waiting_syncs() -> None:
    h = Harness()
    tokens = [h.join_new(), h.join_new()]
    h.settle(tokens)
    follower = next(h.answer(t) for t in tokens if not h.answer(t).members)
    waiting = h.sync(follower.member_id, 1)
    h.join_new()
    assert h.answer(waiting).error == E.rebalance_in_progress


def test_members_that_never_sync_are_removed_after_the_rebalance_timeout() -> None:
    h = Harness()
    tokens = [h.join_new(), h.join_new()]
    h.settle(tokens)
    leader, follower = sorted((h.answer(t) for t in tokens), key=lambda r: not r.members)
    h.sync(leader.member_id, 1, {})
    # The follower heartbeats but never syncs (a client stuck between the two).
    for _ in range(REBALANCE // 5_000 - 1):
        h.advance(5_000)
        assert h.heartbeat(follower.member_id, 1) == E.none
        assert h.heartbeat(leader.member_id, 1) == E.none
    h.advance(5_000)
    assert follower.member_id not in h.coordinator.groups["g"].members
    assert h.state() is GroupState.PREPARING_REBALANCE


# -- Heartbeat and sessions -------------------------------------------------------------------


def test_heartbeat_answers_by_state_and_checks_the_member() -> None:
    h = Harness()
    assert h.heartbeat("x", 0) == E.unknown_member_id  # no group
    tokens = [h.join_new()]
    h.advance(DELAY)
    mid = h.answer(tokens[0]).member_id
    assert h.heartbeat(mid, 1) == E.none  # CompletingRebalance
    assert h.heartbeat(mid, 0) == E.illegal_generation
    assert h.heartbeat("x", 1) == E.unknown_member_id
    h.sync(mid, 1, {})
    assert h.heartbeat(mid, 1) == E.none  # Stable
    h.join_new()
    assert h.heartbeat(mid, 1) == E.rebalance_in_progress


def test_a_silent_member_is_removed_after_its_session_timeout_and_the_group_rebalances() -> None:
    h = Harness()
    first, second = h.stable_group(2)
    h.advance(SESSION - 1_000)
    assert h.heartbeat(first.member_id, 1) == E.none
    assert second.member_id in h.coordinator.groups["g"].members
    h.advance(1_000)
    # `second` never heartbeat: gone after its session, and the group rebalances.
    members = h.coordinator.groups["g"].members
    assert second.member_id not in members and first.member_id in members
    assert h.state() is GroupState.PREPARING_REBALANCE
    rejoin = h.join(first.member_id)
    assert h.answer(rejoin).generation_id == 2


def test_the_last_member_timing_out_leaves_the_group_empty_with_a_new_generation() -> None:
    h = Harness()
    h.stable_group()
    h.advance(SESSION)
    assert h.state() is GroupState.EMPTY
    assert h.coordinator.groups["g"].generation_id == 2
    assert h.coordinator.describe("g").members == ()


def test_a_member_waiting_for_its_join_answer_is_not_timed_out() -> None:
    h = Harness()
    waiting, late = h.stable_group(2, session=6_000, rebalance=20_000)
    token = h.join(waiting.member_id, session=6_000, rebalance=20_000)
    for _ in range(3):  # 15 s: `waiting` is silent, `late` heartbeats but is slow to rejoin
        h.advance(5_000)
        assert h.heartbeat(late.member_id, 1) == E.rebalance_in_progress
    assert h.pending(token)
    h.join(late.member_id, session=6_000, rebalance=20_000)
    assert h.answer(token).generation_id == 2
    assert len(h.answer(token).members) == 2


# -- LeaveGroup -------------------------------------------------------------------------------


def test_leave_removes_members_in_a_batch_and_rebalances() -> None:
    h = Harness()
    a, b, c = h.stable_group(3)
    result = h.leave(MemberRef(a.member_id), MemberRef("ghost"), MemberRef(b.member_id))
    assert result.error == E.none
    assert [m.error for m in result.members] == [E.none, E.unknown_member_id, E.none]
    assert list(h.coordinator.groups["g"].members) == [c.member_id]
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert h.answer(h.join(c.member_id)).generation_id == 2


def test_leave_of_an_unknown_group_and_of_a_pending_member() -> None:
    h = Harness()
    assert h.leave(MemberRef("m")).members[0].error == E.unknown_member_id
    pending = h.answer(h.join()).member_id
    assert h.leave(MemberRef(pending)).members[0].error == E.none
    assert "g" not in h.coordinator.groups


def test_a_member_leaving_while_its_join_waits_gets_unknown_member_id_there() -> None:
    h = Harness()
    token = h.join_new()
    h.leave(MemberRef(h.coordinator.groups["g"].leader_id or ""))
    assert h.answer(token).error == E.unknown_member_id


# -- static membership (KIP-345) --------------------------------------------------------------


def test_a_static_member_joins_without_member_id_required() -> None:
    h = Harness()
    token = h.join(instance="i1")
    assert h.pending(token)
    h.advance(DELAY)
    assert h.answer(token).member_id == "i1-1"


def test_a_static_member_restarting_in_a_stable_group_takes_its_place_without_rebalance() -> None:
    h = Harness()
    _, two = h.static_pair()
    # i2 restarts: no member id, the same instance id.
    back = h.answer(h.join(instance="i2"))
    assert back.error == E.none
    assert back.member_id != two.member_id
    assert back.generation_id == 1 and h.state() is GroupState.STABLE
    assert h.answer(h.sync(back.member_id, 1, instance="i2")).assignment == b"A2"
    # The old member id is fenced wherever it shows up.
    assert h.heartbeat(two.member_id, 1, instance="i2") == E.fenced_instance_id
    assert h.commit(two.member_id, 1, {TP0: 5}, instance="i2") == {TP0: E.fenced_instance_id}
    assert h.answer(h.sync(two.member_id, 1, instance="i2")).error == E.fenced_instance_id
    assert h.heartbeat(back.member_id, 1, instance="i2") == E.none


def test_the_static_leader_restarting_is_told_to_skip_the_assignment() -> None:
    h = Harness()
    token = h.join(instance="i1")
    h.advance(DELAY)
    h.sync(h.answer(token).member_id, 1, {})
    back = h.answer(h.join(instance="i1"))
    assert back.skip_assignment and back.members and back.leader_id == back.member_id


def test_the_static_leader_restarting_before_join_v9_is_answered_as_a_follower() -> None:
    h = Harness()
    leader, _ = h.static_pair()
    back = h.answer(h.join(instance="i1", v9=False))
    # Kafka's answer to a client that cannot skip the assignment: the old id leads, no
    # members; it syncs as a follower and the group does not rebalance.
    assert (back.leader_id, back.members, back.skip_assignment) == (leader.member_id, (), False)
    assert back.generation_id == 1 and h.state() is GroupState.STABLE
    assert h.answer(h.sync(back.member_id, 1, instance="i1")).assignment == b"A1"
    assert h.coordinator.groups["g"].leader_id == back.member_id


def test_a_static_member_replaced_while_it_waits_is_fenced_there() -> None:
    h = Harness()
    first = h.join(instance="i1")
    second = h.join(instance="i1")
    assert h.answer(first).error == E.fenced_instance_id
    h.advance(DELAY)
    assert h.answer(second).error == E.none


def test_a_static_member_changing_protocols_in_a_stable_group_rebalances() -> None:
    h = Harness()
    h.join(instance="i1")
    h.advance(DELAY)
    h.sync("i1-1", 1, {})
    # Only protocols every member supports are candidates: it adds one and prefers it.
    sticky = (("sticky", subscription("t")), ("range", subscription("t")))
    token = h.join(instance="i1", protocols=sticky)
    # A rebalance, which completes at once: its only member joined (the initial delay is
    # an Empty group's, and this one was Stable).
    assert h.answer(token).protocol_name == "sticky"
    assert h.answer(token).generation_id == 2


def test_a_static_member_not_rejoining_is_kept_until_its_session_times_out() -> None:
    h = Harness()
    one, _ = h.static_pair(assign=False)
    rejoin = h.join(one.member_id, instance="i1", protocols=(("range", subscription("u")),))
    h.advance(SESSION - 1)
    assert h.pending(rejoin)
    h.heartbeat(one.member_id, 1, instance="i1")
    h.advance(1)  # i2's session is over: removed, and the rebalance completes
    assert h.answer(rejoin).generation_id == 2
    assert "i2" not in h.coordinator.groups["g"].static_members


def test_a_static_member_leaves_by_its_instance_id() -> None:
    h = Harness()
    token = h.join(instance="i1")
    h.advance(DELAY)
    h.sync(h.answer(token).member_id, 1, {})
    result = h.leave(MemberRef("", "i1"), MemberRef("other", "i9"))
    assert [m.error for m in result.members] == [E.none, E.unknown_member_id]
    assert h.state() is GroupState.EMPTY and not h.coordinator.groups["g"].static_members


def test_a_known_instance_id_with_another_member_id_is_fenced_on_leave_and_join() -> None:
    h = Harness()
    token = h.join(instance="i1")
    h.advance(DELAY)
    h.sync(h.answer(token).member_id, 1, {})
    assert h.leave(MemberRef("i1-old", "i1")).members[0].error == E.fenced_instance_id
    assert h.answer(h.join("i1-old", instance="i1")).error == E.fenced_instance_id


# -- offsets ----------------------------------------------------------------------------------


def test_an_admin_commit_creates_a_group_without_protocol_and_is_fetched_back() -> None:
    h = Harness()
    assert h.commit("", -1, {TP0: 7}) == {TP0: E.none}
    group = h.coordinator.groups["g"]
    assert group.state is GroupState.EMPTY and group.protocol_type is None
    fetched = h.coordinator.fetch_offsets("g", [TP0, TP1])
    assert fetched.offsets[TP0].offset == 7 and fetched.offsets[TP0].leader_epoch == 3
    assert fetched.offsets[TP1] is None
    assert set(h.coordinator.fetch_offsets("g", None).offsets) == {TP0}
    assert h.coordinator.fetch_offsets("unknown", [TP0]).offsets == {TP0: None}


def test_a_commit_with_a_generation_into_an_unknown_group_is_an_illegal_generation() -> None:
    h = Harness()
    assert h.commit("m", 3, {TP0: 1}) == {TP0: E.illegal_generation}
    assert "g" not in h.coordinator.groups


def test_commits_are_fenced_by_member_generation_and_state() -> None:
    h = Harness()
    first, second = h.stable_group(2)
    assert h.commit("", -1, {TP0: 1}) == {TP0: E.unknown_member_id}  # the group has members
    assert h.commit("ghost", 1, {TP0: 1}) == {TP0: E.unknown_member_id}
    assert h.commit(first.member_id, 0, {TP0: 1}) == {TP0: E.illegal_generation}
    assert h.commit(first.member_id, 1, {TP0: 1}) == {TP0: E.none}
    h.join_new()  # PreparingRebalance: commits still accepted from the old generation
    assert h.commit(first.member_id, 1, {TP0: 2}) == {TP0: E.none}
    h.join(first.member_id)
    h.join(second.member_id)
    assert h.state() is GroupState.COMPLETING_REBALANCE
    assert h.commit(first.member_id, 2, {TP0: 3}) == {TP0: E.rebalance_in_progress}
    assert h.coordinator.fetch_offsets("g", [TP0]).offsets[TP0].offset == 2


def test_a_removed_members_commit_is_refused() -> None:
    h = Harness()
    first, second = h.stable_group(2)
    h.leave(MemberRef(second.member_id))
    assert h.commit(second.member_id, 1, {TP0: 9}) == {TP0: E.unknown_member_id}
    rejoined = h.answer(h.join(first.member_id))
    assert h.commit(first.member_id, 1, {TP0: 9}) == {TP0: E.rebalance_in_progress}
    h.sync(first.member_id, rejoined.generation_id, {})
    assert h.commit(first.member_id, 1, {TP0: 9}) == {TP0: E.illegal_generation}


def test_metadata_over_the_limit_is_refused_for_that_partition() -> None:
    h = Harness(offset_metadata_max_bytes=4)
    assert h.commit("", -1, {TP0: 1}, metadata="12345") == {TP0: E.offset_metadata_too_large}
    assert h.commit("", -1, {TP0: 1}, metadata="1234") == {TP0: E.none}


def test_a_commit_keeps_the_member_alive() -> None:
    h = Harness()
    (member,) = h.stable_group()
    for _ in range(3):
        h.advance(SESSION - 1)
        assert h.commit(member.member_id, 1, {TP0: 1}) == {TP0: E.none}
    assert h.state() is GroupState.STABLE


def test_offsets_of_an_empty_group_expire_after_the_retention_counted_from_empty() -> None:
    h = Harness(offsets_retention_ms=60_000)
    (member,) = h.stable_group()
    h.commit(member.member_id, 1, {TP0: 4})
    h.leave(MemberRef(member.member_id))
    assert h.state() is GroupState.EMPTY  # the rebalance had nobody to wait for
    h.now += 59_999
    assert h.coordinator.expire_offsets(now_ms=h.now) == {}
    h.now += 1
    assert h.coordinator.expire_offsets(now_ms=h.now) == {"g": (TP0,)}
    assert "g" not in h.coordinator.groups  # Empty with no offsets: Dead


def test_offsets_of_a_group_without_protocol_expire_each_by_its_commit_time() -> None:
    h = Harness(offsets_retention_ms=60_000)
    h.commit("", -1, {TP0: 1})
    h.now += 30_000
    h.commit("", -1, {TP1: 1})
    h.now += 30_000
    assert h.coordinator.expire_offsets(now_ms=h.now) == {"g": (TP0,)}
    assert set(h.coordinator.fetch_offsets("g", None).offsets) == {TP1}


def test_a_stable_consumer_groups_offsets_of_unsubscribed_topics_expire() -> None:
    h = Harness(offsets_retention_ms=60_000)
    (member,) = h.stable_group()
    other = TopicPartition("old", 0)
    h.commit(member.member_id, 1, {TP0: 1, other: 1})
    h.now += 60_000
    assert h.coordinator.expire_offsets(now_ms=h.now) == {"g": (other,)}


# -- administration ---------------------------------------------------------------------------


def test_list_groups_filters_by_state_and_type() -> None:
    h = Harness()
    h.stable_group()
    h.commit("", -1, {TP0: 1}, group="simple")
    listed = {g.group_id: g for g in h.coordinator.list_groups()}
    assert (listed["g"].state, listed["g"].protocol_type) == ("Stable", "consumer")
    assert (listed["simple"].state, listed["simple"].protocol_type) == ("Empty", "")
    assert [g.group_id for g in h.coordinator.list_groups(states=["empty"])] == ["simple"]
    assert h.coordinator.list_groups(types=["consumer"]) == ()
    assert len(h.coordinator.list_groups(types=["Classic"])) == 2
    assert h.coordinator.states()["Stable"] == 1


def test_describe_shows_metadata_and_assignments_only_when_stable() -> None:
    h = Harness()
    assert h.coordinator.describe("nope") is None
    token = h.join_new()
    h.advance(DELAY)
    mid = h.answer(token).member_id
    described = h.coordinator.describe("g")
    assert described.state == "CompletingRebalance" and described.protocol_name == ""
    assert described.members[0].metadata == b""
    h.sync(mid, 1, {mid: b"A"})
    described = h.coordinator.describe("g")
    assert (described.state, described.protocol_type, described.protocol_name) == (
        "Stable",
        "consumer",
        "range",
    )
    assert described.members[0].metadata == subscription("t")
    assert described.members[0].assignment == b"A"


def test_delete_groups_only_empty_ones_with_their_offsets() -> None:
    h = Harness()
    h.stable_group()
    h.commit("", -1, {TP0: 1}, group="e")
    errors = h.coordinator.delete_groups(["g", "e", "none"], now_ms=h.now)
    assert errors == {"g": E.non_empty_group, "e": E.none, "none": E.group_id_not_found}
    assert "e" not in h.coordinator.groups
    assert h.coordinator.fetch_offsets("e", [TP0]).offsets == {TP0: None}


def test_offset_delete_refuses_subscribed_topics_of_a_live_consumer_group() -> None:
    h = Harness()
    (member,) = h.stable_group()
    other = TopicPartition("old", 0)
    h.commit(member.member_id, 1, {TP0: 1, other: 1})
    result = h.coordinator.delete_offsets("g", [TP0, other], now_ms=h.now)
    assert result.error == E.none
    assert result.errors == {TP0: E.group_subscribed_to_topic, other: E.none}
    assert result.deleted == (other,)
    assert h.coordinator.delete_offsets("x", [TP0], now_ms=h.now).error == E.group_id_not_found


def test_offset_delete_of_a_live_group_of_another_protocol_is_non_empty() -> None:
    h = Harness()
    h.stable_group(protocol_type="connect", protocols=(("default", b"\x00"),))
    assert h.coordinator.delete_offsets("g", [TP0], now_ms=h.now).error == E.non_empty_group


def test_offset_delete_of_an_empty_group_deletes_and_an_emptied_group_is_gone() -> None:
    h = Harness()
    h.commit("", -1, {TP0: 1})
    result = h.coordinator.delete_offsets("g", [TP0], now_ms=h.now)
    assert result.deleted == (TP0,)
    assert "g" not in h.coordinator.groups


def test_next_deadline_is_the_earliest_timer() -> None:
    h = Harness()
    assert h.coordinator.next_deadline_ms() == NO_DEADLINE
    h.join()
    assert h.coordinator.next_deadline_ms() == h.now + SESSION
    h.join_new()
    assert h.coordinator.next_deadline_ms() == h.now + DELAY


@pytest.mark.parametrize("members", [1, 4])
def test_no_commit_from_a_fenced_generation_and_assignments_cover_each_generation(
    members: int,
) -> None:
    """A short run of joins and leaves: every generation's assignment names each member
    once, and each old generation's commits are refused."""
    h = Harness()
    results = h.stable_group(members)
    for generation in range(1, 4):
        newcomer = h.join_new()
        rejoins = [h.join(r.member_id) for r in results]
        answers = [h.answer(t) for t in (*rejoins, newcomer)]
        assert {a.generation_id for a in answers} == {generation + 1}
        for r in results:
            assert h.commit(r.member_id, generation, {TP0: generation}) == {
                TP0: E.rebalance_in_progress
            }
        leader = next(a for a in answers if a.members)
        assert sorted(m.member_id for m in leader.members) == sorted(a.member_id for a in answers)
        for a in answers:
            h.sync(a.member_id, a.generation_id, {m.member_id: b"" for m in leader.members})
        for r in results:
            assert h.commit(r.member_id, generation, {TP0: 0}) == {TP0: E.illegal_generation}
        results = answers
