"""Destination topics: created like the source's, a different partition count refused."""

from __future__ import annotations

from replicad.groups.cluster_reader import ConfigEntry
from replicad.mirror.topics import (
    DYNAMIC_TOPIC_CONFIG,
    config_changes,
    copied_configs,
    plan_topics,
)

DEFAULT_CONFIG = 5


def test_topic_level_configs_are_copied_but_not_throttles_or_defaults() -> None:
    entries = [
        ConfigEntry("cleanup.policy", "compact", source=DYNAMIC_TOPIC_CONFIG),
        ConfigEntry("retention.ms", "1000", source=DYNAMIC_TOPIC_CONFIG),
        ConfigEntry("compression.type", "zstd", source=DYNAMIC_TOPIC_CONFIG),
        ConfigEntry("segment.ms", "1", source=DEFAULT_CONFIG),
        ConfigEntry("leader.replication.throttled.replicas", "*", source=DYNAMIC_TOPIC_CONFIG),
        ConfigEntry("secret", "x", source=DYNAMIC_TOPIC_CONFIG, sensitive=True),
    ]
    assert copied_configs(entries) == {
        "cleanup.policy": "compact",
        "retention.ms": "1000",
        "compression.type": "zstd",
    }


def test_plan() -> None:
    plan = plan_topics(
        {"new": 3, "same": 2, "other": 4, "fewer": 1},
        {"same": 2, "other": 2, "fewer": 3},
        {"new": [ConfigEntry("cleanup.policy", "compact", source=DYNAMIC_TOPIC_CONFIG)]},
        replication_factor=-1,
    )
    assert [(t.name, t.partitions, dict(t.configs)) for t in plan.create] == [
        ("new", 3, {"cleanup.policy": "compact"})
    ]
    assert plan.ready == ("other", "same")
    assert plan.grow == {"other": 4}
    assert "has 3 partitions, the source 1" in plan.errors["fewer"]


def test_config_changes_are_the_copied_configs_the_destination_lacks() -> None:
    source = [
        ConfigEntry("retention.ms", "7200000", source=DYNAMIC_TOPIC_CONFIG),
        ConfigEntry("cleanup.policy", "compact", source=DYNAMIC_TOPIC_CONFIG),
        ConfigEntry("segment.ms", "1", source=DEFAULT_CONFIG),
    ]
    dest = [
        ConfigEntry("retention.ms", "3600000", source=DYNAMIC_TOPIC_CONFIG),
        ConfigEntry("cleanup.policy", "compact", source=DYNAMIC_TOPIC_CONFIG),
        ConfigEntry("segment.ms", "604800000", source=DEFAULT_CONFIG),
    ]
    assert config_changes(source, dest) == {"retention.ms": "7200000"}
    assert config_changes(source[1:], dest) == {}
