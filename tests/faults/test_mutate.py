"""Byte mutations: deterministic per random state, always a change or a shape change."""

from __future__ import annotations

import random

from tools.chaos.mutate import MUTATIONS, mutate, mutate_one_of


def test_same_random_state_same_mutation() -> None:
    seed = bytes(range(200))
    assert mutate(seed, random.Random(5)) == mutate(seed, random.Random(5))
    assert mutate(seed, random.Random(5)) != mutate(seed, random.Random(6))


def test_mutations_change_the_input_most_of_the_time() -> None:
    seed = bytes(range(256)) * 2
    rng = random.Random(1)
    changed = sum(mutate(seed, rng) != seed for _ in range(500))
    assert changed > 450  # a boundary write may put back the byte that was there


def test_every_mutation_survives_empty_and_tiny_inputs() -> None:
    rng = random.Random(2)
    for mutation in MUTATIONS:
        for size in (0, 1, 3, 9):
            data = bytearray(size)
            mutation(data, rng)
            assert isinstance(data, bytearray)


def test_mutate_one_of_draws_from_the_seeds() -> None:
    seeds = [b"a" * 100, b"b" * 100]
    outputs = {mutate_one_of(seeds, random.Random(i))[:1] for i in range(50)}
    assert {b"a", b"b"} <= outputs | {b""}
