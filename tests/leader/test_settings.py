"""Serve settings: Kafka's defaults, and the per-topic down-conversion switch."""

from __future__ import annotations

import pytest

from replicad.config.model import HostPort, ServeConfig
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


def test_the_config_files_serve_section_gives_the_addresses() -> None:
    config = ServeConfig(
        listen=HostPort("0.0.0.0", 9092), advertised=HostPort("replica.example", 19092)
    )
    settings = ServeSettings.from_config(config, max_session_slots=5)
    assert (settings.host, settings.port) == ("0.0.0.0", 9092)
    assert (settings.advertised_host, settings.advertised_port) == ("replica.example", 19092)
    assert settings.max_session_slots == 5
    plain = ServeSettings.from_config(ServeConfig(listen=HostPort("127.0.0.1", 0)))
    assert (plain.advertised_host, plain.advertised_port) == (None, None)
    assert plain.downconversion_enabled("t")


def test_message_downconversion_enable_is_read_from_the_config_file(tmp_path) -> None:
    """KIP-283's switch under its Kafka names too; a value that is not a boolean is named."""
    from replicad.config import load_config
    from replicad.errors import ConfigErrors

    base = "source: {bootstrap_servers: [k:9092]}\ntopics: {include: [t]}\n"
    path = tmp_path / "replicad.yaml"
    path.write_text(base + "serve: {listen: 127.0.0.1:0, message_downconversion_enable: false}\n")
    settings = ServeSettings.from_config(load_config(path).serve)
    assert not settings.downconversion_enabled("t")
    path.write_text(base + "serve: {listen: 127.0.0.1:0, message_downconversion_enable: maybe}\n")
    with pytest.raises(ConfigErrors, match=r"serve\.message_downconversion_enable"):
        load_config(path)


def test_the_limits_on_clients_are_read_from_the_config_file(tmp_path) -> None:
    """Kafka's max.connections.per.ip.overrides as "address:count" items; a bad item is
    named with its path; the other limits come through as given."""
    from replicad.config import load_config
    from replicad.errors import ConfigErrors

    base = "source: {bootstrap_servers: [k:9092]}\ntopics: {include: [t]}\n"
    path = tmp_path / "replicad.yaml"
    path.write_text(
        base + "serve: {listen: 127.0.0.1:0, max_connections_per_ip: 50, "
        'max_connections_per_ip_overrides: "10.0.0.5:500,::1:7", request_quota_percentage: 20}\n'
    )
    settings = ServeSettings.from_config(load_config(path).serve)
    assert settings.max_connections_per_ip == 50
    assert dict(settings.max_connections_per_ip_overrides) == {"10.0.0.5": 500, "::1": 7}
    assert settings.request_quota_percentage == 20
    path.write_text(
        base + "serve: {listen: 127.0.0.1:0, max_connections_per_ip_overrides: [lots]}\n"
    )
    with pytest.raises(ConfigErrors, match=r"serve\.max_connections_per_ip_overrides\[0\]"):
        load_config(path)


@pytest.mark.parametrize(
    "bad", [{"fetch_max_bytes": 0}, {"downconversion_chunk_bytes": -1}, {"max_session_slots": -1}]
)
def test_impossible_settings_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        ServeSettings(**bad)
