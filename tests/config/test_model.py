from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicad.config.model import (
    Config,
    FetchConfig,
    GroupsConfig,
    HostPort,
    IsolationLevel,
    LogFormat,
    LogLevel,
    TopicsConfig,
)
from replicad.config.rules import parse_host_port


def test_config_is_frozen_all_the_way_down() -> None:
    config = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.fetch = FetchConfig()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.fetch.wait_max_ms = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.log.segment_bytes = 1  # type: ignore[misc]


def test_defaults_are_kafkas_replica_fetcher_defaults() -> None:
    fetch = Config().fetch
    assert fetch.response_max_bytes == 10 * 1024 * 1024
    assert fetch.partition_max_bytes == 1024 * 1024
    assert fetch.wait_max_ms == 500
    assert fetch.min_bytes == 1
    assert fetch.backoff_ms == 1000
    assert Config().serve is None


@pytest.mark.parametrize(
    ("address", "text"),
    [
        (HostPort("kafka-1", 9092), "kafka-1:9092"),
        (HostPort("::1", 9092), "[::1]:9092"),
        (HostPort("0.0.0.0", 0), "0.0.0.0:0"),
    ],
)
def test_host_port_prints_as_written(address: HostPort, text: str) -> None:
    assert str(address) == text


hosts = st.one_of(
    st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z0-9-]{1,10}){0,3}", fullmatch=True),
    st.ip_addresses().map(str),
)


@given(host=hosts, port=st.integers(1, 65535))
def test_host_port_text_parses_back(host: str, port: int) -> None:
    address = HostPort(host, port)
    assert parse_host_port(str(address)) == address


def test_wildcards_are_known() -> None:
    assert HostPort("0.0.0.0", 9092).is_wildcard
    assert HostPort("::", 9092).is_wildcard
    assert not HostPort("127.0.0.1", 9092).is_wildcard


def test_topics_selected_by_list() -> None:
    topics = TopicsConfig(include=("orders", "payments"))
    assert topics.selects("orders")
    assert not topics.selects("orders-archive")


def test_topics_regex_must_match_the_whole_name() -> None:
    topics = TopicsConfig(regex=r"orders\..*")
    assert topics.selects("orders.eu")
    assert not topics.selects("old-orders.eu")
    assert not topics.selects("orders")


def test_isolation_level_wire_values() -> None:
    assert IsolationLevel.READ_UNCOMMITTED.wire_value == 0
    assert IsolationLevel.READ_COMMITTED.wire_value == 1


def test_enums_compare_as_their_config_text() -> None:
    assert LogLevel.WARNING == "warning"
    assert str(LogFormat.JSON) == "json"


def test_groups_sync_is_off_unless_asked_for() -> None:
    assert Config().groups == GroupsConfig(
        enabled=False, include=(), exclude=(), sync_interval_ms=5_000
    )


@pytest.mark.parametrize(
    ("include", "exclude", "group", "selected"),
    [
        ((), (), "billing", True),
        (("billing",), (), "billing", True),
        (("billing",), (), "billing-2", False),
        (("billing.*",), (), "billing-2", True),
        # A regex matches the whole id, as topics.regex does.
        (("bill",), (), "billing", False),
        ((), ("console-consumer-.*",), "console-consumer-4711", False),
        (("app-.*",), ("app-test",), "app-test", False),
        (("app-.*",), ("app-test",), "app-prod", True),
    ],
)  # fmt: skip
def test_groups_are_chosen_by_name_or_whole_id_regex(
    include: tuple[str, ...], exclude: tuple[str, ...], group: str, selected: bool
) -> None:
    assert GroupsConfig(include=include, exclude=exclude).selects(group) is selected
