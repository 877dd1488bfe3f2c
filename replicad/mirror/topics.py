"""Which destination topics to create, and with what (sans-I/O).

Rules:
- A mirrored topic gets the source's partition count (its name is the shell's to choose:
  the source's, or mirror.topic_prefix + it).
- Configs copied: those set on the source topic itself (DescribeConfigs source
  DYNAMIC_TOPIC_CONFIG), less the ones that describe the source cluster's own replicas
  (replication throttles) -- cleanup.policy, retention, compression.type,
  max.message.bytes, min.insync.replicas, message.timestamp.type and the rest go along.
- A destination topic with fewer partitions than the source gets the missing ones
  (CreatePartitions: partitions added at the source are added at the destination).
- A destination topic with more partitions than the source is an error named for the
  topic, never a silent remap: its partitions are not mirrored.
- A destination topic that exists with the same count is used as it is.
- Config sync (`config_changes`): a copied config whose destination value differs is set
  at the destination (IncrementalAlterConfigs SET); a config removed at the source stays
  at the destination (deleting would need to tell a removal from a default).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from replicad.groups.cluster_reader import ConfigEntry
from replicad.protocol.admin import TopicToCreate

# Kafka's ConfigSource numbering (DescribeConfigs v1+).
DYNAMIC_TOPIC_CONFIG = 1
# Configs about the source cluster's replicas, meaningless at the destination.
NOT_COPIED = frozenset(
    {"leader.replication.throttled.replicas", "follower.replication.throttled.replicas"}
)


@dataclass(frozen=True, slots=True)
class TopicPlan:
    create: tuple[TopicToCreate, ...] = ()
    # Topics whose destination exists already as it should be.
    ready: tuple[str, ...] = ()
    # Topic -> the partition count its destination must grow to.
    grow: Mapping[str, int] = field(default_factory=dict)
    # Topic -> why it is not mirrored.
    errors: Mapping[str, str] = field(default_factory=dict)


def copied_configs(entries: Iterable[ConfigEntry]) -> dict[str, str]:
    return {
        e.name: e.value
        for e in entries
        if e.source == DYNAMIC_TOPIC_CONFIG
        and e.value is not None
        and not e.sensitive
        and e.name not in NOT_COPIED
    }


def plan_topics(
    source_partitions: Mapping[str, int],
    dest_partitions: Mapping[str, int],
    source_configs: Mapping[str, Iterable[ConfigEntry]],
    *,
    replication_factor: int,
) -> TopicPlan:
    """`dest_partitions` holds the topics the destination has (name -> partition count)."""
    create: list[TopicToCreate] = []
    ready: list[str] = []
    errors: dict[str, str] = {}
    grow: dict[str, int] = {}
    for topic, count in sorted(source_partitions.items()):
        have = dest_partitions.get(topic)
        if have is None:
            create.append(
                TopicToCreate(
                    topic,
                    count,
                    copied_configs(source_configs.get(topic, ())),
                    replication_factor,
                )
            )
        elif have > count:
            errors[topic] = (
                f"destination topic {topic!r} has {have} partitions, the source {count}: "
                "not mirrored (a partition cannot be removed; delete the destination topic)"
            )
        else:
            if have < count:
                grow[topic] = count
            ready.append(topic)
    return TopicPlan(tuple(create), tuple(ready), grow=grow, errors=errors)


def config_changes(
    source: Iterable[ConfigEntry], destination: Iterable[ConfigEntry]
) -> dict[str, str]:
    """The copied configs of the source topic whose destination value differs."""
    have = {e.name: e.value for e in destination}
    return {k: v for k, v in copied_configs(source).items() if have.get(k) != v}
