"""The config loader over random YAML-ish structures (every real key path included) and
mutated YAML files: only ConfigError comes out.

The random structures are 100 a run in the suite (derandomized: the same 100 each time);
drawing them is nearly all of this file's time (300 took 16 s). A longer run:
`REPLICAD_CONFIG_EXAMPLES=5000 pytest tests/fuzz/test_config.py -k random`."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from tools.chaos.fuzz_targets import config, config_mapping, seeds
from tools.chaos.strategies import CONFIG_KEY_PATHS, bounded, configs, mutated

BOUNDED = bounded(int(os.environ.get("REPLICAD_CONFIG_EXAMPLES", "100")))


def test_the_structures_reach_every_key() -> None:
    assert "source.bootstrap_servers" in CONFIG_KEY_PATHS
    assert "fetch.buffer_memory" in CONFIG_KEY_PATHS


def test_every_seed_loads_or_says_why() -> None:
    for seed in seeds("config"):
        config(seed)


@BOUNDED
@given(configs)
def test_random_structures(raw: object) -> None:
    config_mapping(raw)


@settings(BOUNDED, max_examples=150)
@given(mutated("config"))
def test_mutated_yaml_files(data: bytes) -> None:
    config(data)


@settings(BOUNDED, max_examples=100)
@given(st.text(alphabet="{}[]:,-&*!|>'\"#%@` \n\tab01", max_size=80))
def test_yaml_syntax_soup(text: str) -> None:
    config(text.encode())
