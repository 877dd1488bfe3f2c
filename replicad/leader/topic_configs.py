"""Topic configs as `replicad serve` answers DescribeConfigs: the source's own, so that
operators' tools (`kafka-topics --describe`, `kafka-configs --describe`) show the real
retention and cleanup policy of a replicated topic.

Rules:
- `replicad run` with a `serve:` section reads the replicated topics' configs from the source
  (DescribeConfigs, ClusterGroupsReader.topic_configs) when a topic appears in the replica
  and every REFRESH_INTERVAL_S after (`TopicConfigSync`), and hands them to serve's
  `TopicConfigs`. They are saved, when they changed, in
  `<data dir>/__replicad_topic_configs/configs.json` (written to a temporary file, fsynced,
  renamed, the directory fsynced; on a thread), so a standalone `replicad serve` opened on
  the data directory later answers with them too. No partition directory name matches that
  directory, so the log store never reads it.
- DescribeConfigs v1-v4 (Kafka 4 answers no v0): a topic this node holds is answered with
  the source's entries (name, value, read-only, source, sensitive, type; a sensitive value
  is null), only the asked keys when the request names some; a topic whose configs were
  never read has no entries; a topic this node does not hold is UNKNOWN_TOPIC_OR_PARTITION.
  Any other resource type (a broker, a broker logger) is answered with no entries: a
  replica has no broker configs of its own worth showing.
- A file that cannot be read is logged and ignored: configs are for show, the next refresh
  brings them back.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from replicad.clock import monotonic_ms
from replicad.errors import KafkaConnectionError, ProtocolError
from replicad.groups.cluster_reader import ClusterGroupsReader, ConfigEntry
from replicad.protocol.apis import ApiKey
from replicad.protocol.client import KafkaClient
from replicad.protocol.codec import response_type
from replicad.protocol.requests import make_entity
from replicad.wire import TOPIC_RESOURCE

log = structlog.get_logger("replicad.leader.topic_configs")

DIRECTORY = "__replicad_topic_configs"
FILE = "configs.json"
REFRESH_INTERVAL_S = 300.0
# How often the sync looks for topics new in the replica.
NEW_TOPIC_CHECK_S = 1.0


class TopicConfigs:
    """The source's configs of the replicated topics, in memory; see the module docstring."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / DIRECTORY / FILE
        self.topics: dict[str, tuple[ConfigEntry, ...]] = {}

    def load(self) -> None:
        """Read the saved configs (blocking: call on a thread)."""
        try:
            saved = json.loads(self.path.read_text())
            self.topics = {
                str(topic): tuple(ConfigEntry(**entry) for entry in entries)
                for topic, entries in saved["topics"].items()
            }
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning(
                "saved topic configs unreadable; ignored", path=str(self.path), error=str(exc)
            )

    def save(self) -> None:
        """Write the configs atomically (blocking: call on a thread)."""
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        document = {
            "version": 1,
            "topics": {
                topic: [_entry_fields(e) for e in entries]
                for topic, entries in sorted(self.topics.items())
            },
        }
        tmp = directory / f"{FILE}.tmp"
        with open(tmp, "w") as f:
            json.dump(document, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def update(self, configs: Mapping[str, tuple[ConfigEntry, ...]]) -> bool:
        """Take `configs` (topic -> entries); whether anything changed."""
        changed = any(self.topics.get(t) != entries for t, entries in configs.items())
        self.topics.update(configs)
        return changed


def _entry_fields(entry: ConfigEntry) -> dict[str, Any]:
    return {
        "name": entry.name,
        "value": entry.value,
        "read_only": entry.read_only,
        "source": entry.source,
        "sensitive": entry.sensitive,
        "config_type": entry.config_type,
    }


def describe_configs_response(
    version: int, body: Any, configs: TopicConfigs, holds: Callable[[str], bool]
) -> Any:
    """DescribeConfigs' answer (see the rules)."""
    cls = response_type(ApiKey.DESCRIBE_CONFIGS, version)
    module = sys.modules[cls.__module__]
    results = []
    for resource in body.resources:
        name, kind = str(resource.resource_name), int(resource.resource_type)
        error, entries = ErrorCode.none, ()
        if kind == TOPIC_RESOURCE:
            if holds(name):
                wanted = resource.configuration_keys
                entries = tuple(
                    e for e in configs.topics.get(name, ()) if not wanted or e.name in wanted
                )
            else:
                error = ErrorCode.unknown_topic_or_partition
        results.append(
            make_entity(
                module.DescribeConfigsResult,
                error_code=error,
                error_message=None if error == ErrorCode.none else f"{name}: not replicated here",
                resource_type=kind,
                resource_name=name,
                configs=tuple(
                    make_entity(
                        module.DescribeConfigsResourceResult,
                        name=e.name,
                        value=None if e.sensitive else e.value,
                        read_only=e.read_only,
                        config_source=e.source,
                        is_sensitive=e.sensitive,
                        synonyms=(),
                        config_type=e.config_type,
                        documentation=None,
                    )
                    for e in entries
                ),
            )
        )
    return make_entity(cls, throttle_time=datetime.timedelta(0), results=tuple(results))


class TopicConfigSync:
    """`replicad run`'s reading of the source's topic configs for serve (see the rules)."""

    def __init__(
        self,
        source: KafkaClient,
        configs: TopicConfigs,
        replicated_topics: Callable[[], Iterable[str]],
        *,
        refresh_interval_s: float = REFRESH_INTERVAL_S,
    ) -> None:
        self.reader = ClusterGroupsReader(source)
        self.configs = configs
        self.replicated_topics = replicated_topics
        self.refresh_interval_s = refresh_interval_s
        self.problem: str | None = None
        # Topics asked once: a topic the source could not describe waits for the refresh.
        self._asked: set[str] = set()

    async def run(self, stop: asyncio.Event) -> None:
        next_refresh_ms = monotonic_ms()
        while not stop.is_set():
            topics = set(self.replicated_topics())
            due = monotonic_ms() >= next_refresh_ms
            wanted = topics if due else topics - self._asked
            if wanted:
                try:
                    await self.refresh(wanted)
                    self.problem = None
                    if due:
                        next_refresh_ms = monotonic_ms() + int(self.refresh_interval_s * 1000)
                except (KafkaConnectionError, ProtocolError, TimeoutError, OSError) as exc:
                    self.problem = str(exc)
                    log.warning("source topic configs not read", error=str(exc))
                    next_refresh_ms = monotonic_ms() + int(self.refresh_interval_s * 1000)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), NEW_TOPIC_CHECK_S)

    async def refresh(self, topics: Iterable[str]) -> None:
        asked = sorted(topics)
        read = await self.reader.topic_configs(asked)
        self._asked.update(asked)
        good = {t: c.entries for t, c in read.items() if c.error is None}
        for topic, c in read.items():
            if c.error is not None:
                log.warning("source topic configs unreadable", topic=topic, error=c.error)
        if good and self.configs.update(good):
            await asyncio.to_thread(self.configs.save)
