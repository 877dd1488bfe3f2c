"""The server-side assignors of KIP-848: uniform (balanced, sticky) and range."""

from __future__ import annotations

import random

from replicad.groups.assignors import AssignorMember, range_assignor, uniform
from replicad.types import TopicPartition


def tps(topic: str, *partitions: int) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(topic, p) for p in partitions)


def test_uniform_shares_every_partition_once_and_evenly() -> None:
    members = tuple(AssignorMember(f"m{i}", frozenset({"a", "b"})) for i in range(3))
    out = uniform(members, {"a": 4, "b": 3})
    every = [tp for assigned in out.values() for tp in assigned]
    assert sorted(every) == sorted(tps("a", 0, 1, 2, 3) | tps("b", 0, 1, 2))
    assert sorted(len(v) for v in out.values()) == [2, 2, 3]


def test_uniform_keeps_what_a_member_had_when_another_joins() -> None:
    first = uniform((AssignorMember("m1", frozenset({"a"})),), {"a": 4})
    assert first == {"m1": tps("a", 0, 1, 2, 3)}
    second = uniform(
        (
            AssignorMember("m1", frozenset({"a"}), first["m1"]),
            AssignorMember("m2", frozenset({"a"})),
        ),
        {"a": 4},
    )
    assert len(second["m1"]) == len(second["m2"]) == 2
    assert second["m1"] <= first["m1"]


def test_uniform_gives_a_topic_only_to_its_subscribers() -> None:
    members = (
        AssignorMember("m1", frozenset({"a"})),
        AssignorMember("m2", frozenset({"a", "b"})),
    )
    out = uniform(members, {"a": 2, "b": 2})
    assert out["m1"] <= tps("a", 0, 1)
    assert tps("b", 0, 1) <= out["m2"]
    assert len(out["m1"]) + len(out["m2"]) == 4
    # As even as the subscriptions allow: m1 can only take from a, so m2 takes b.
    assert out == {"m1": tps("a", 0, 1), "m2": tps("b", 0, 1)}


def test_uniform_is_balanced_and_exact_for_random_groups() -> None:
    rng = random.Random(848)
    for _ in range(200):
        topics = {f"t{i}": rng.randint(1, 8) for i in range(rng.randint(1, 3))}
        members = tuple(
            AssignorMember(f"m{i}", frozenset(topics), tps("t0", *rng.sample(range(8), 3)))
            for i in range(rng.randint(1, 5))
        )
        out = uniform(members, topics)
        every = [tp for assigned in out.values() for tp in assigned]
        assert len(every) == len(set(every)) == sum(topics.values())
        sizes = [len(v) for v in out.values()]
        assert max(sizes) - min(sizes) <= 1


def test_range_gives_contiguous_ranges_the_first_members_one_more() -> None:
    members = tuple(AssignorMember(f"m{i}", frozenset({"a"})) for i in (2, 1, 3))
    out = range_assignor(members, {"a": 7})
    assert out == {"m1": tps("a", 0, 1, 2), "m2": tps("a", 3, 4), "m3": tps("a", 5, 6)}


def test_a_topic_nobody_subscribes_to_is_not_assigned() -> None:
    members = (AssignorMember("m1", frozenset({"a"})),)
    assert uniform(members, {"a": 1, "b": 2}) == {"m1": tps("a", 0)}
    assert range_assignor(members, {"a": 1, "b": 2}) == {"m1": tps("a", 0)}
