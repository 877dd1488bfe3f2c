"""Hypothesis strategies for the fuzz tests: mutated seeds, structured Kafka responses built
by kio from random field values, and YAML-ish config structures over the real key names.

Importing this module registers a strategy for kio's `Records` type (real batches, damaged
batches, or noise), which `st.from_type` needs to build Fetch responses.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from kio.static.primitive import Records

from replicad.config.schema import SCHEMA, Section, walk
from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import encode_entities, response_type
from tools.chaos.fuzz_targets import FETCH_VERSIONS, RESPONSE_APIS, seeds
from tools.chaos.mutate import mutate
from tools.logdata.batches import batch_stream

_real_records = st.builds(
    lambda seed, count: b"".join(batch_stream(seed, count)),
    st.integers(0, 50),
    st.integers(1, 4),
)
records = st.one_of(
    _real_records,
    st.builds(
        lambda data, rng: mutate(data, rng), _real_records, st.randoms(use_true_random=False)
    ),
    st.binary(max_size=200),
)
st.register_type_strategy(Records, records.map(Records))


def bounded(max_examples: int | None = None, *also: HealthCheck) -> settings:
    """Hypothesis settings for a fuzz test in the suite: the same examples on every run
    (derandomized, no example database, so a CI run never depends on an earlier one), no
    per-example deadline (the machine is shared), and large or slowly drawn inputs allowed
    (what fuzzing a protocol draws); `also` suppresses more health checks."""
    checks = [HealthCheck.too_slow, HealthCheck.data_too_large, *also]
    examples = {} if max_examples is None else {"max_examples": max_examples}
    return settings(
        derandomize=True, database=None, deadline=None, suppress_health_check=checks, **examples
    )


def mutated(target: str) -> st.SearchStrategy[bytes]:
    """A seed of `target` (tools.chaos.fuzz_targets) with a few mutations."""
    pool = seeds(target)
    return st.builds(
        lambda index, rng: mutate(pool[index % len(pool)], rng),
        st.integers(0, len(pool) - 1),
        st.randoms(use_true_random=False),
    )


@st.composite
def fetch_responses(draw: st.DrawFn) -> bytes:
    """A Fetch response of a random version with random field values, encoded by kio,
    prefixed with the version selector byte the fetch-response target reads."""
    index = draw(st.integers(0, len(FETCH_VERSIONS) - 1))
    cls = response_type(ApiKey.FETCH, FETCH_VERSIONS[index])
    body = draw(st.from_type(cls))
    return bytes([index]) + encode_entities(cls.__header_schema__(correlation_id=1), body)


@st.composite
def other_responses(draw: st.DrawFn) -> bytes:
    """Metadata, ListOffsets, OffsetForLeaderEpoch or ApiVersions with random fields."""
    api_index = draw(st.integers(0, len(RESPONSE_APIS) - 1))
    api, versions = RESPONSE_APIS[api_index]
    version_index = draw(st.integers(0, len(versions) - 1))
    cls = response_type(api, versions[version_index])
    body = draw(st.from_type(cls))
    header = encode_entities(cls.__header_schema__(correlation_id=1), body)
    return bytes([api_index, version_index]) + header


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.just(math.inf),
    st.text(max_size=30),
    st.sampled_from(["127.0.0.1:9092", "[::1]:9092", "host:0", ":", "a,b", "orders.*", "[", "1e9"]),
)
_yamlish = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=12), st.integers()), inner, max_size=4),
    ),
    max_leaves=12,
)


def _section_values(section: Section) -> st.SearchStrategy[object]:
    keys = list(section.entries)

    def value_for(key: str) -> st.SearchStrategy[object]:
        entry = section.entries[key]
        if isinstance(entry, Section):
            return st.one_of(_section_values(entry), _yamlish)
        return _yamlish

    known = st.fixed_dictionaries({}, optional={key: value_for(key) for key in keys})
    stray = st.dictionaries(st.text(max_size=12), _yamlish, max_size=2)
    return st.builds(lambda a, b: {**b, **a}, known, stray)


# Every key path exists in this strategy, so generated configs reach every rule.
configs = st.one_of(_section_values(SCHEMA), _yamlish)
CONFIG_KEY_PATHS = [path for path, _ in walk()]
