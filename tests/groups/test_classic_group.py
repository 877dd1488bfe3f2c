"""One classic group: its transition table, its members and the protocol vote."""

from __future__ import annotations

import pytest

from replicad.errors import LocalProtocolError
from replicad.groups.classic_group import TRANSITIONS, ClassicGroup, GroupState, Member

S = GroupState


def member(member_id: str, *protocols: str, instance: str | None = None) -> Member:
    return Member(
        member_id=member_id,
        group_instance_id=instance,
        client_id="c",
        client_host="h",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=30_000,
        protocol_type="consumer",
        protocols=tuple((p, p.encode()) for p in protocols),
    )


@pytest.mark.parametrize("start", list(S))
@pytest.mark.parametrize("to", list(S))
def test_only_the_tables_transitions_are_allowed(start: GroupState, to: GroupState) -> None:
    group = ClassicGroup("g", state=start)
    if to in TRANSITIONS[start]:
        group.transition(to, 5)
        assert (group.state, group.state_since_ms) == (to, 5)
    else:
        with pytest.raises(LocalProtocolError, match=f"from {start.value} to {to.value}"):
            group.transition(to, 5)
        assert group.state is start


def test_every_state_can_die_and_only_preparing_rebalance_completes() -> None:
    assert all(S.DEAD in allowed for allowed in TRANSITIONS.values())
    into_completing = [s for s, allowed in TRANSITIONS.items() if S.COMPLETING_REBALANCE in allowed]
    assert into_completing == [S.PREPARING_REBALANCE]
    into_stable = [s for s, allowed in TRANSITIONS.items() if S.STABLE in allowed]
    assert into_stable == [S.COMPLETING_REBALANCE]


def test_the_first_member_leads_and_a_leaving_leader_is_replaced() -> None:
    group = ClassicGroup("g")
    group.add(member("a", "range"))
    group.add(member("b", "range"))
    assert group.leader_id == "a" and group.protocol_type == "consumer"
    group.remove("a")
    assert group.leader_id == "b"
    group.remove("b")
    assert group.leader_id is None


def test_a_static_member_is_found_by_instance_id_and_replaced_under_a_new_id() -> None:
    group = ClassicGroup("g")
    group.add(member("a", "range", instance="i"))
    assert group.static_member_id("i") == "a"
    group.replace_static("i", "a2")
    assert group.static_member_id("i") == "a2" and group.leader_id == "a2"
    assert set(group.members) == {"a2"}
    group.remove("a2")
    assert group.static_member_id("i") is None


def test_candidates_are_what_everyone_supports_and_the_vote_picks_the_most_preferred() -> None:
    group = ClassicGroup("g")
    group.add(member("a", "range", "roundrobin", "sticky"))
    group.add(member("b", "sticky", "roundrobin"))
    group.add(member("c", "roundrobin", "sticky"))
    assert group.candidate_protocols() == ["roundrobin", "sticky"]
    # a votes roundrobin, b sticky, c roundrobin.
    assert group.select_protocol() == "roundrobin"
    assert group.supports("consumer", ["sticky"])
    assert not group.supports("consumer", ["range"])
    assert not group.supports("connect", ["sticky"])


def test_an_empty_group_takes_any_type_with_some_protocol() -> None:
    group = ClassicGroup("g")
    assert group.supports("connect", ["x"])
    assert not group.supports("", ["x"])
    assert not group.supports("consumer", [])


def test_no_common_protocol_is_our_bug_if_a_vote_is_asked() -> None:
    group = ClassicGroup("g")
    group.add(member("a", "range"))
    group.add(member("b", "sticky"))
    with pytest.raises(LocalProtocolError):
        group.select_protocol()
