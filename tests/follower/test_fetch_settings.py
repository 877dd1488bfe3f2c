"""FetchSettings: one path from the config file, defaults written once (the config model's),
and the response budget that keeps a whole response inside the memory pool."""

from __future__ import annotations

import dataclasses

from replicad.config import Config, config_from_mapping
from replicad.follower.fetch_settings import (
    PARTITION_OVERHEAD_BYTES,
    RESPONSE_OVERHEAD_BYTES,
    TOPIC_OVERHEAD_BYTES,
    FetchSettings,
    response_budget,
)
from replicad.follower.replicator import ReplicatorSettings
from replicad.protocol.client import ClientSettings

REQUIRED = {"source": {"bootstrap_servers": ["k:9092"]}, "topics": {"include": ["t"]}}


def test_the_defaults_are_the_config_models():
    assert FetchSettings.from_config(Config()) == FetchSettings()
    assert ClientSettings.from_config(Config().source) == ClientSettings()


def test_every_key_reaches_the_settings():
    config = config_from_mapping(
        {
            "source": {
                "bootstrap_servers": ["k:9092"],
                "rack_id": "r1",
                "request_timeout_ms": 7_000,
                "reconnect_backoff_ms": 7,
                "reconnect_backoff_max_ms": 700,
                "metadata_max_age_ms": 70_000,
            },
            "topics": {"include": ["t"], "start_from": "latest", "on_gap": "halt"},
            "fetch": {
                "response_max_bytes": 3 << 20,
                "partition_max_bytes": 1 << 19,
                "wait_max_ms": 77,
                "min_bytes": 7,
                "backoff_ms": 17,
                "sessions": False,
                "replica_id": 7,
                "isolation_level": "read_committed",
                "buffer_memory": 64 << 20,
                "sessionless_max_partitions": 17,
                "sessionless_wait_ms": 1_717,
            },
            "checkpoint_interval_ms": 1_700,
        }
    )
    fetch = FetchSettings.from_config(config)
    assert fetch == FetchSettings(
        response_max_bytes=3 << 20,
        partition_max_bytes=1 << 19,
        wait_max_ms=77,
        min_bytes=7,
        backoff_ms=17,
        sessions=False,
        replica_id=7,
        isolation_level=1,
        rack_id="r1",
        start_from="latest",
        on_gap="halt",
        request_timeout_ms=7_000,
        reconnect_backoff_ms=7,
        reconnect_backoff_max_ms=700,
        buffer_memory=64 << 20,
        sessionless_max_partitions=17,
        sessionless_wait_ms=1_717,
    )
    # No field is left at its default by accident: each differs from it here.
    unchanged = [
        f.name for f in dataclasses.fields(FetchSettings) if getattr(fetch, f.name) == f.default
    ]
    assert unchanged == []
    replicator = ReplicatorSettings.from_config(config)
    assert replicator.fetch == fetch
    assert replicator.bootstrap_servers == ("k:9092",)
    assert replicator.metadata_max_age_ms == 70_000
    assert replicator.checkpoint_interval_ms == 1_700
    assert tuple(replicator.selection.include) == ("t",)
    assert replicator.client.request_timeout_s == 7.0


def test_the_defaults_of_a_minimal_config():
    config = config_from_mapping(REQUIRED)
    assert FetchSettings.from_config(config) == FetchSettings()
    settings = ReplicatorSettings.from_config(config)
    by_hand = ReplicatorSettings(("k:9092",), config.data_dir, settings.selection)
    assert settings.metadata_max_age_ms == by_hand.metadata_max_age_ms
    assert settings.checkpoint_interval_ms == by_hand.checkpoint_interval_ms
    assert settings.client == ClientSettings()


def test_response_budget_leaves_room_for_the_fields_around_the_records():
    # Room to spare: the configured max_bytes as it is.
    assert response_budget(1 << 20, 100 << 20, partitions=10, topics=1) == 1 << 20
    # No room: lowered by exactly the overhead of that many partitions and topics.
    overhead = RESPONSE_OVERHEAD_BYTES + 3_334 * PARTITION_OVERHEAD_BYTES + 2 * TOPIC_OVERHEAD_BYTES
    assert response_budget(32 << 20, 32 << 20, partitions=3_334, topics=2) == (32 << 20) - overhead
    # A pool smaller than the overhead still asks for something: one batch comes anyway.
    assert response_budget(1 << 20, 1_000, partitions=10_000, topics=4) == 1
