"""The schema against the dataclasses, its pointers for unknown keys, and the example config
that documents it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from replicad.config import Config, ServeConfig, load_config
from replicad.config.model import ArchiveConfig, HostPort, MirrorConfig
from replicad.config.schema import (
    KAFKA_NAMES,
    SCHEMA,
    Section,
    default_of,
    find,
    leaf_paths,
    unknown_key_message,
    walk,
)
from replicad.log.config import LogConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "replicad.yaml"


def sections() -> list[tuple[str, Section]]:
    found = [("", SCHEMA)]
    found += [(path, entry) for path, entry in walk() if isinstance(entry, Section)]
    return found


@pytest.mark.parametrize(("path", "section"), sections(), ids=[p or "top" for p, _ in sections()])
def test_every_section_has_exactly_its_dataclass_fields(path: str, section: Section) -> None:
    assert list(section.entries) == [f.name for f in dataclasses.fields(section.cls)]


def test_log_section_is_the_log_stores_own_settings() -> None:
    log = find("log")
    assert isinstance(log, Section) and log.cls is LogConfig


def test_defaults_come_from_the_dataclasses() -> None:
    assert default_of("fetch.buffer_memory") == 100 * 1024 * 1024
    assert default_of("log.segment_bytes") == LogConfig().segment_bytes
    assert default_of("serve.listen") is dataclasses.MISSING


def test_every_kafka_name_points_at_a_real_key() -> None:
    for kafka_name, path in KAFKA_NAMES.items():
        assert path in leaf_paths(), kafka_name


@pytest.mark.parametrize(
    ("section", "key", "message"),
    [
        ("source", "bootstap_servers", "unknown key (did you mean bootstrap_servers?)"),
        ("fetch", "partition-max-bytes", "unknown key (did you mean partition_max_bytes?)"),
        ("fetch", "max_bytes",
         "unknown key (did you mean response_max_bytes or partition_max_bytes?)"),
        ("fetch", "replica.fetch.max.bytes",
         "unknown key (Kafka's replica.fetch.max.bytes is fetch.partition_max_bytes here)"),
        ("fetch", "max_wait", "unknown key (did you mean wait_max_ms?)"),
        ("source", "bootstap", "unknown key (did you mean bootstrap_servers?)"),
        ("fetch", "sesions", "unknown key (did you mean sessions?)"),
        ("", "bootstrap_servers", "unknown key (did you mean source.bootstrap_servers?)"),
        ("", "include", "unknown key (did you mean topics.include?)"),
        ("logging", "colour", "unknown key (keys here are: level, format)"),
        ("logging", 3, "unknown key (keys here are: level, format)"),
    ],
)  # fmt: skip
def test_unknown_keys_point_at_what_was_meant(section: str, key: object, message: str) -> None:
    assert unknown_key_message(section, key) == message


def example_block(text: str) -> str:
    """The commented-out `serve:`, `mirror:` and `archive:` blocks of the example,
    uncommented, in place of serve: null, mirror: null and archive: null."""
    lines = text.splitlines()
    body = "\n".join(lines)
    for section in ("serve", "mirror", "archive"):
        start = next(i for i, line in enumerate(lines) if line.startswith(f"#   {section}:"))
        block = []
        for line in lines[start:]:
            if not line.startswith("#   "):
                break
            block.append(line[4:])
        assert f"\n{section}: null" in body
        body = body.replace(f"\n{section}: null", "\n" + "\n".join(block))
    return body


def keys_of(mapping: object, prefix: str = "") -> set[str]:
    found: set[str] = set()
    assert isinstance(mapping, dict)
    for key, value in mapping.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(find(path), Section) and isinstance(value, dict):
            found |= keys_of(value, path)
        else:
            found.add(path)
    return found


def test_example_config_validates_and_shows_the_defaults() -> None:
    config = load_config(EXAMPLE)
    # Everything but the two required choices is left at its default.
    expected = dataclasses.replace(
        Config(),
        source=dataclasses.replace(
            Config().source, bootstrap_servers=(HostPort("localhost", 9092),)
        ),
        topics=dataclasses.replace(Config().topics, include=("orders", "payments")),
    )
    assert config == expected


# Keys whose default depends on who runs replicad (config/defaults.py): the example shows
# them commented out, with the value the shipped systemd unit gives them.
USER_DEPENDENT = {"data_dir": "# data_dir: ", "control.socket": "  # socket: "}


def test_example_config_documents_every_key(tmp_path: Path) -> None:
    text = example_block(EXAMPLE.read_text())
    present = keys_of(yaml.safe_load(text))
    assert set(leaf_paths()) == present | set(USER_DEPENDENT)
    for commented in USER_DEPENDENT.values():
        assert f"\n{commented}" in text
    # The commented serve example is valid too, once uncommented.
    turned_on = tmp_path / "serve.yaml"
    turned_on.write_text(text)
    serve = load_config(turned_on).serve
    assert serve == ServeConfig(
        HostPort("0.0.0.0", 9092),
        HostPort("replica1.example.internal", 9092),
        node_id=0,
        allowed_followers=(7,),
    )
    mirror = load_config(turned_on).mirror
    assert mirror == MirrorConfig(bootstrap_servers=(HostPort("backup-kafka", 9092),))
    assert load_config(turned_on).archive == ArchiveConfig(bucket="replica")


def test_example_config_explains_every_key() -> None:
    # Each key has a comment right above it, or above the key it pairs with
    # (reconnect_backoff_ms / reconnect_backoff_max_ms share one).
    lines = EXAMPLE.read_text().splitlines()
    key_line = re.compile(r"^\s*\w+:")
    for index, line in enumerate(lines):
        if not key_line.match(line):
            continue
        above = index - 1
        if above >= 0 and key_line.match(lines[above]):
            above -= 1
        assert above >= 0 and lines[above].lstrip().startswith("#"), f"line {index + 1}: {line}"
