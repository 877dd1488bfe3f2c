"""Topic configs on serve: the source's entries answer DescribeConfigs in every version serve
speaks (asked keys only, sensitive values hidden, a topic not held refused, a broker with no
entries), and the saved file is what a restart reads back."""

from __future__ import annotations

from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from replicad.groups.cluster_reader import ConfigEntry
from replicad.leader.server import DESCRIBE_CONFIGS_VERSIONS
from replicad.leader.topic_configs import DIRECTORY, TopicConfigs, describe_configs_response
from replicad.log.layout import parse_partition_dir
from replicad.protocol.apis import ApiKey
from tests.leader.test_group_wire import nested, request, roundtrip

RETENTION = ConfigEntry("retention.ms", "123456789", source=1, config_type=5)
CLEANUP = ConfigEntry("cleanup.policy", "compact", source=1, config_type=7)
SECRET = ConfigEntry("some.password", "hunter2", source=1, sensitive=True, config_type=9)


def held(topic: str) -> bool:
    return topic == "orders"


@pytest.mark.parametrize(
    "version", range(DESCRIBE_CONFIGS_VERSIONS.min, DESCRIBE_CONFIGS_VERSIONS.max + 1)
)
def test_describe_configs_answers_with_the_sources_entries(tmp_path: Path, version: int) -> None:
    configs = TopicConfigs(tmp_path)
    configs.update({"orders": (RETENTION, CLEANUP, SECRET)})
    resource = nested(ApiKey.DESCRIBE_CONFIGS, version, "DescribeConfigsResource")
    values = {"include_documentation": False} if version >= 3 else {}
    body = request(
        ApiKey.DESCRIBE_CONFIGS,
        version,
        resources=(
            resource(resource_type=2, resource_name="orders", configuration_keys=None),
            resource(resource_type=2, resource_name="orders", configuration_keys=("retention.ms",)),
            resource(resource_type=2, resource_name="elsewhere", configuration_keys=None),
            resource(resource_type=4, resource_name="0", configuration_keys=None),
        ),
        include_synonyms=False,
        **values,
    )
    answer = roundtrip(
        ApiKey.DESCRIBE_CONFIGS, version, describe_configs_response(version, body, configs, held)
    )
    whole, asked, missing, broker = answer.results
    assert [(c.name, c.value, c.is_sensitive) for c in whole.configs] == [
        ("retention.ms", "123456789", False),
        ("cleanup.policy", "compact", False),
        ("some.password", None, True),
    ]
    assert whole.error_code == ErrorCode.none and whole.configs[0].config_source == 1
    assert [c.name for c in asked.configs] == ["retention.ms"]
    assert (missing.error_code, missing.configs) == (ErrorCode.unknown_topic_or_partition, ())
    assert (broker.error_code, broker.configs) == (ErrorCode.none, ())


def test_the_configs_saved_are_read_back_and_an_unreadable_file_is_ignored(
    tmp_path: Path,
) -> None:
    configs = TopicConfigs(tmp_path)
    assert configs.update({"orders": (RETENTION, SECRET)})
    assert not configs.update({"orders": (RETENTION, SECRET)})  # nothing new
    configs.save()
    again = TopicConfigs(tmp_path)
    again.load()
    assert again.topics == {"orders": (RETENTION, SECRET)}
    configs.path.write_text("{not json")
    broken = TopicConfigs(tmp_path)
    broken.load()
    assert broken.topics == {}
    assert parse_partition_dir(DIRECTORY) is None
