"""Serve settings: Kafka's defaults, and the per-topic down-conversion switch."""

from __future__ import annotations

from replicad.leader.settings import ServeSettings


def test_defaults_are_kafkas() -> None:
    settings = ServeSettings()
    assert settings.max_session_slots == 1000
    assert settings.session_eviction_ms == 120_000
    assert settings.fetch_max_bytes == 55 * 1024 * 1024
    assert settings.downconversion_chunk_bytes == 128 * 1024
    assert settings.downconversion_enabled("any")


def test_a_topic_setting_wins_over_the_servers() -> None:
    off = ServeSettings(downconversion_enable=False, topic_downconversion_enable={"legacy": True})
    assert not off.downconversion_enabled("t") and off.downconversion_enabled("legacy")
    on = ServeSettings(topic_downconversion_enable={"modern": False})
    assert on.downconversion_enabled("t") and not on.downconversion_enabled("modern")
