"""A Kafka broker with tiered storage (KIP-405) on, its remote storage Kafka's own
LocalTieredStorage (a directory standing in for an object store), for tests of a source whose
oldest segments exist only in remote storage.

    broker = KafkaBroker(workdir, broker_config=tiered_broker_config(workdir / "remote"))
    broker.create_topic(name, 1, TIERED_TOPIC_CONFIG, segment_bytes=8192)

LocalTieredStorage lives in the test jar of Kafka's storage module (tools/kafka/tiered-pom.xml,
fetched by `make kafka-jars` or on first use into .cache/kafka-tiered); the broker loads it
through `remote.log.storage.manager.class.path`, so its own classpath is unchanged. The
remote log metadata manager is Kafka's default, a topic of this broker.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

from replicad.records.batch import scan_batches
from tools.peers.kafka import KAFKA_TOOLS_DIR, ROOT
from tools.peers.process import PeerNotInstalledError

TIERED_POM = KAFKA_TOOLS_DIR / "tiered-pom.xml"
TIERED_CACHE = Path(os.environ.get("REPLICAD_KAFKA_TIERED_CACHE", ROOT / ".cache" / "kafka-tiered"))
# A topic id as LocalTieredStorage prints it: 16 bytes, unpadded base64.
_TOPIC_ID_CHARS = 22
LOCAL_TIERED_STORAGE = "org.apache.kafka.server.log.remote.storage.LocalTieredStorage"
# Topics: tiered, and local segments deleted once copied (a second after they roll).
TIERED_TOPIC_CONFIG = {
    "remote.storage.enable": "true",
    "local.retention.ms": "1000",
    "local.retention.bytes": "1",
}


@functools.cache
def tiered_storage_classpath() -> str:
    """The jar holding LocalTieredStorage (fetched when missing); PeerNotInstalledError when
    it cannot be had."""
    done = subprocess.run(
        [str(KAFKA_TOOLS_DIR / "jars.sh"), "fetch", str(TIERED_POM), str(TIERED_CACHE)],
        capture_output=True,
        text=True,
        check=False,
    )
    jars = sorted((TIERED_CACHE / "lib").glob("kafka-storage-*-test.jar"))
    if done.returncode != 0 or not jars:
        raise PeerNotInstalledError(
            "Kafka's storage test jar (LocalTieredStorage) is not in .cache/kafka-tiered: "
            f"run `make kafka-jars`. jars.sh said: {done.stderr.strip()[-500:]}"
        )
    return ":".join(str(j) for j in jars)


def tiered_broker_config(storage_dir: Path, *, check_interval_ms: int = 500) -> dict[str, str]:
    """Broker settings for tiered storage in `storage_dir`, copying rolled segments and
    checking retention every `check_interval_ms`."""
    interval = str(check_interval_ms)
    return {
        "remote.log.storage.system.enable": "true",
        "remote.log.storage.manager.class.name": LOCAL_TIERED_STORAGE,
        "remote.log.storage.manager.class.path": tiered_storage_classpath(),
        "rsm.config.dir": str(storage_dir),
        "remote.log.metadata.manager.listener.name": "PLAINTEXT",
        "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
        "rlmm.config.remote.log.metadata.topic.num.partitions": "1",
        "remote.log.manager.task.interval.ms": interval,
        "log.retention.check.interval.ms": interval,
        "log.initial.task.delay.ms": "0",
    }


def remote_segment_files(storage_dir: Path, topic: str, partition: int) -> list[Path]:
    """The .log files LocalTieredStorage holds for one partition, in offset order. Its
    directories are named `<topic>-<partition>-<topic id>` (the id: 22 characters of URL-safe
    base64, which may hold "-" itself), its files `<base offset>-<segment id>.log`."""
    name = f"{topic}-{partition}-"
    found = [
        f
        for d in storage_dir.rglob("*")
        if d.is_dir() and d.name.startswith(name) and len(d.name) == len(name) + _TOPIC_ID_CHARS
        for f in d.glob("*.log")
    ]
    return sorted(found, key=lambda f: int(f.name.split("-", 1)[0]))


def batches_of(data: bytes) -> dict[int, bytes]:
    """Every whole batch of a segment's bytes, by base offset."""
    return {
        h.base_offset: data[h.position : h.end_position]
        for h in scan_batches(memoryview(data)).batches
    }


def batches_by_offset(files: Iterable[Path]) -> dict[int, bytes]:
    """Every whole batch of these segment files, by base offset (the first file's copy where
    two hold one: remote and local storage may overlap)."""
    found: dict[int, bytes] = {}
    for path in files:
        for base, batch in batches_of(path.read_bytes()).items():
            found.setdefault(base, batch)
    return found
