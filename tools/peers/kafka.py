"""A real Apache Kafka broker for tests: single node, KRaft, on 127.0.0.1.

The jars come from `tools/kafka/kafka.sh fetch` (run by `make kafka-jars`); the
Kafka version is pinned in `tools/kafka/pom.xml`. A `KafkaBroker` owns one work
directory:

    <workdir>/server.properties   the config it was started with
    <workdir>/data/               log.dirs: `<topic>-<partition>/*.log` segments (`log_dir`)
    <workdir>/logs/server.log     the broker's log4j output
    <workdir>/broker.out          the JVM's own stdout/stderr (crashes, GC warnings)

Ports (client listener and controller) are picked free at the first start and
kept across `restart()`, so clients can reconnect to the same address and the
broker finds its own data again.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from tools.peers.admin import create_topic_and_wait
from tools.peers.broker import BrokerProcess, tail
from tools.peers.process import (
    LOOPBACK,
    PeerError,
    PeerNotInstalledError,
    free_port,
    spawn,
)
from tools.wait import DEADLINE_S

ROOT = Path(__file__).resolve().parents[2]
# Where kafka.sh keeps the jars; the same override it honours.
KAFKA_CACHE = Path(os.environ.get("REPLICAD_KAFKA_CACHE", ROOT / ".cache" / "kafka"))
KAFKA_TOOLS_DIR = ROOT / "tools" / "kafka"
KAFKA_SH = KAFKA_TOOLS_DIR / "kafka.sh"
BROKER_LOG4J = KAFKA_TOOLS_DIR / "log4j2-broker.properties"
TOOLS_LOG4J = KAFKA_TOOLS_DIR / "log4j2-tools.properties"

NODE_ID = 1
# Main classes tests run. Kafka 4.x moved DumpLogSegments out of core (Scala) into
# kafka-tools; the old name still works through run_kafka_class's alias table.
DUMP_LOG_SEGMENTS = "org.apache.kafka.tools.DumpLogSegments"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
STORAGE_TOOL = "kafka.tools.StorageTool"
_MOVED_CLASSES = {"kafka.tools.DumpLogSegments": DUMP_LOG_SEGMENTS}
BROKER_HEAP = "1g"
# Short-lived tools (StorageTool, DumpLogSegments) start faster with the client
# compiler alone and a small serial heap.
# The JVM's own warnings go to stderr, not stdout with the tool's output: the run that
# dumps a tool's class archive warns of each class it cannot archive ("[warning][cds]").
TOOL_JVM_OPTS = (
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Xlog:disable",
    "-Xlog:all=warning:stderr",
)
# What Kafka's own kafka-run-class.sh passes to a broker, minus the GC log.
BROKER_JVM_OPTS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)
# More options for every broker JVM the harness starts, split as a shell would: the suite
# sets the client compiler alone (tests/conftest.py says why). Benchmarks leave it unset,
# so a Kafka peer there runs as Kafka's own scripts start it.
BROKER_EXTRA_OPTS_ENV = "REPLICAD_KAFKA_BROKER_JVM_OPTS"
# Kafka 4 refuses `segment.bytes` below 1 MiB; the topic config it keeps for its
# own tests, `internal.segment.bytes`, has no floor. A batch larger than a
# segment is refused (RECORD_LIST_TOO_LARGE), so producers must batch smaller.
MIN_SEGMENT_BYTES = 1024 * 1024


def jvm_tmpdir_option() -> str:
    """java.io.tmpdir as this process's temporary directory (TMPDIR; the suite gives its
    run one of its own, tests/conftest.py): snappy-java and lz4-java unpack their native
    libraries there and remove them only when the JVM exits cleanly, which a killed broker
    or a stopped console consumer never does."""
    return f"-Djava.io.tmpdir={tempfile.gettempdir()}"


# Exit codes of a JVM that ran its shutdown hooks (and so wrote its CDS archive).
CLEAN_JVM_EXITS = (0, 143, -15)
# Set to "0" to run Kafka's JVMs without class-data sharing (see _cds_options).
CDS_ENV = "REPLICAD_KAFKA_CDS"


def harness_broker_config() -> dict[str, str]:
    """Settings every test broker gets, before the caller's `broker_config`.

    Internal topics fit one node, topics exist only when a test creates them,
    and a consumer group starts at once. The offsets and transaction-state
    topics get 4 partitions, not 50, so the first group or transaction on a
    fresh broker does not wait for 50 coordinators to load. A broker restarted
    after a kill cannot register again until its old session has expired
    (DUPLICATE_BROKER_REGISTRATION), so the session is 4 s instead of 9 s.
    The controller writes a no-op record to the metadata log every 5 s of quiet, not
    every 0.5 s (KIP-835's liveness record; nothing here waits on it): an idle test
    broker's CPU 1.79-1.82 -> 1.31-1.44 CPU-s a minute (its raft thread's share gone,
    twice each, load 14-22), and a run keeps several brokers idle for most of 20 minutes.
    """
    return {
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "broker.heartbeat.interval.ms": "1000",
        "broker.session.timeout.ms": "4000",
        "metadata.max.idle.interval.ms": "5000",
    }


@functools.cache
def kafka_classpath() -> str:
    """The classpath of the cached Kafka jars; PeerNotInstalledError when they are missing."""
    if shutil.which("java") is None:
        raise PeerNotInstalledError(
            "java not found: Kafka 4 needs Java 17+ (openjdk-17-jre-headless)"
        )
    result = subprocess.run(
        [str(KAFKA_SH), "classpath"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0 or not result.stdout.strip():
        raise PeerNotInstalledError(
            "the Apache Kafka jars are not in .cache/kafka/lib (or are stale for "
            "tools/kafka/pom.xml): run `make kafka-jars` (or tools/kafka/kafka.sh fetch). "
            f"kafka.sh said: {result.stderr.strip()}"
        )
    return result.stdout.strip()


@functools.cache
def kafka_version() -> str:
    """The Apache Kafka version pinned in tools/kafka/pom.xml, e.g. "4.3.1"."""
    result = subprocess.run([str(KAFKA_SH), "version"], capture_output=True, text=True, check=True)
    return result.stdout.strip()


def run_kafka_class(
    main_class: str, *args: str, timeout_s: float = 300, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a Kafka command-line class on the cached classpath; no broker needed.

    E.g. `run_kafka_class(DUMP_LOG_SEGMENTS, "--deep-iteration", "--files", path)`.
    Its stdout and stderr are captured as text. With `check`, a non-zero exit
    raises PeerError carrying the tool's stderr.
    """
    main_class = _MOVED_CLASSES.get(main_class, main_class)
    kind = _tool_kind(main_class)
    cds, pending = _cds_options(kind)
    argv = _tool_argv(cds, main_class, args)
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        _cds_settle(kind, pending, clean=False)
        raise PeerError(f"{main_class} did not finish within {timeout_s:.0f} s") from exc
    _cds_settle(kind, pending, clean=result.returncode == 0)
    if check and result.returncode != 0:
        raise PeerError(
            f"{main_class} {' '.join(args)} exited with {result.returncode}: "
            f"{result.stderr.strip()[-4000:]}"
        )
    return result


def kafka_tool_argv(main_class: str, *args: str) -> list[str]:
    """The command line of a Kafka tool a test starts and stops itself (a console or
    verifiable consumer): run_kafka_class's JVM options, and that tool's CDS archive when
    one exists (run_kafka_class makes it). Such a JVM is stopped rather than left to exit,
    so it never dumps one."""
    main_class = _MOVED_CLASSES.get(main_class, main_class)
    cds = _cds_archive(_tool_kind(main_class))
    share = [f"-XX:SharedArchiveFile={cds}"] if _cds_wanted() and cds.is_file() else []
    return _tool_argv(share, main_class, args)


def _tool_argv(cds: Sequence[str], main_class: str, args: Sequence[str]) -> list[str]:
    """A Kafka tool's JVM command line: the tools' JVM and log options, the class-data
    sharing options `cds`, the cached classpath, `main_class` and its `args`."""
    return [
        "java",
        *TOOL_JVM_OPTS,
        *cds,
        jvm_tmpdir_option(),
        f"-Dlog4j2.configurationFile={TOOLS_LOG4J}",
        "-cp",
        kafka_classpath(),
        main_class,
        *args,
    ]


def dump_log_segments(*files: Path | str, deep: bool = True, timeout_s: float = 300) -> str:
    """Kafka's own DumpLogSegments over segment (or index) files; returns its output.

    With `deep`, every record of every batch is decoded and printed (and so
    checked by Kafka's own code), not just the batch headers.
    """
    args = ["--deep-iteration"] if deep else []
    args += ["--files", ",".join(str(f) for f in files)]
    return run_kafka_class(DUMP_LOG_SEGMENTS, *args, timeout_s=timeout_s).stdout


def segment_config(segment_bytes: int) -> dict[str, str]:
    """The topic config that makes a topic's segments `segment_bytes` long, at any size."""
    key = "segment.bytes" if segment_bytes >= MIN_SEGMENT_BYTES else "internal.segment.bytes"
    return {key: str(segment_bytes)}


def _new_cluster_id() -> str:
    # Kafka prints a Uuid as unpadded URL-safe base64; one starting with "-"
    # would read as a command-line option, so Kafka never makes those either.
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def topic_config(
    segment_bytes: int | None, config: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A topic's config: segments of `segment_bytes` (if given), then `config` over it."""
    settings = segment_config(segment_bytes) if segment_bytes is not None else {}
    settings.update(config or {})
    return settings


class KafkaTopics:
    """Topics on an Apache Kafka peer, a broker or a cluster: replication factor 1, the
    peer's `segment_bytes` unless `create_topic` is told another (`config` wins over both),
    and back only once every partition is served. A peer says how it creates them
    (`_create_topics`) and how long that may take (`CREATE_TIMEOUT_S`)."""

    CREATE_TIMEOUT_S: float = DEADLINE_S
    segment_bytes: int | None

    def create_topic(
        self,
        name: str,
        partitions: int,
        config: Mapping[str, str] | None = None,
        *,
        segment_bytes: int | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Create a topic and wait until every partition is served."""
        self.create_topics(
            [name], partitions, config, segment_bytes=segment_bytes, timeout_s=timeout_s
        )

    def create_topics(
        self,
        names: Iterable[str],
        partitions: int,
        config: Mapping[str, str] | None = None,
        *,
        segment_bytes: int | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """`create_topic` for several topics of `partitions` partitions each."""
        size = segment_bytes if segment_bytes is not None else self.segment_bytes
        wait_s = self.CREATE_TIMEOUT_S if timeout_s is None else timeout_s
        self._create_topics(list(names), partitions, topic_config(size, config), wait_s)

    def _create_topics(
        self, names: list[str], partitions: int, settings: dict[str, str], timeout_s: float
    ) -> None:
        raise NotImplementedError


class KafkaBroker(KafkaTopics, BrokerProcess):
    """One Apache Kafka broker (combined broker + controller) in `workdir`.

    `broker_config` entries override `harness_broker_config()`. `segment_bytes`
    is the segment size of every topic `create_topic` makes (unless it is told
    otherwise), for tests that want several segments per partition; it may be
    below Kafka's 1 MiB floor (see `segment_config`).
    """

    what = "Kafka broker"

    def __init__(
        self,
        workdir: Path,
        *,
        broker_config: Mapping[str, str] | None = None,
        segment_bytes: int | None = None,
        heap: str = BROKER_HEAP,
        port: int | None = None,
    ) -> None:
        """`port`: the client listener's port (default: a free one, picked at start)."""
        super().__init__(workdir)
        self.log_dir = self.workdir / "data"
        self.server_log = self.workdir / "logs" / "server.log"
        self.jvm_output = self.workdir / "broker.out"
        self._config = harness_broker_config()
        self._config.update(broker_config or {})
        self.segment_bytes = segment_bytes
        self._heap = heap
        # A KafkaCluster's nodes (tools/peers/kafka_cluster.py) set their own id and share one
        # cluster id; a lone broker is node 1 of a cluster of its own.
        self.node_id = NODE_ID
        self.cluster_id = _new_cluster_id()
        self._port = port
        self._controller_port: int | None = None if port is None else free_port()
        self._formatted = False
        self._cds_pending: Path | None = None

    # -- topics and tools ------------------------------------------------------------

    def _create_topics(
        self, names: list[str], partitions: int, settings: dict[str, str], timeout_s: float
    ) -> None:
        for name in names:
            create_topic_and_wait(self.bootstrap, name, partitions, settings, timeout_s=timeout_s)

    def partition_dir(self, topic: str, partition: int) -> Path:
        """The broker's own directory of one partition's segments."""
        return self.log_dir / f"{topic}-{partition}"

    def run_class(
        self, main_class: str, *args: str, timeout_s: float = 300, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """`run_kafka_class`; a method too so tests holding a broker need no other import."""
        return run_kafka_class(main_class, *args, timeout_s=timeout_s, check=check)

    # -- what BrokerProcess asks -----------------------------------------------------

    @property
    def bind_log(self) -> Path:
        return self.server_log

    def _check_installed(self) -> None:
        kafka_classpath()  # fails with the `make kafka-jars` hint when the jars are missing

    def _pick_ports(self) -> None:
        self._port, self._controller_port = _two_free_ports()

    def _prepare(self) -> None:
        self._write_config()
        if not self._formatted:
            self._format_storage()

    def _serves(self, brokers: Mapping[int, object]) -> bool:
        # A broker appears in metadata only once it is registered and unfenced.
        return self.node_id in brokers

    def _forget_failed_start(self) -> None:
        # Formatted for the old ports: format again.
        shutil.rmtree(self.log_dir, ignore_errors=True)
        self._formatted = False

    def _exited(self, code: int | None) -> None:
        _cds_settle("broker", self._cds_pending, clean=code in CLEAN_JVM_EXITS)
        self._cds_pending = None

    def _logs_tail(self) -> str:
        return f"{tail(self.server_log)}\n{tail(self.jvm_output, 20)}"

    # -- internals -------------------------------------------------------------------

    def _write_config(self) -> None:
        assert self._port is not None and self._controller_port is not None
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": f"{self.node_id}@{LOOPBACK}:{self._controller_port}",
            "listeners": (
                f"PLAINTEXT://{LOOPBACK}:{self._port},CONTROLLER://{LOOPBACK}:{self._controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self._port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            **self._config,
        }
        self.workdir.mkdir(parents=True, exist_ok=True)
        text = "".join(f"{key}={value}\n" for key, value in settings.items())
        (self.workdir / "server.properties").write_text(text)

    def _format_storage(self) -> None:
        run_kafka_class(
            STORAGE_TOOL,
            "format",
            "--cluster-id",
            self.cluster_id,
            "--config",
            str(self.workdir / "server.properties"),
            # A hang's deadline: a JVM formatting a directory, met at 120 s at load 60.
            timeout_s=600,
        )
        self._formatted = True

    def discard(self) -> None:
        """End a broker whose data is thrown away: SIGKILL, as a controlled shutdown writes
        a producer snapshot for each partition (seconds at the end of a test) -- unless this
        JVM is the one dumping the class-data archive, which it writes only when it exits
        cleanly (the first broker of a fresh clone): then a clean stop."""
        if self._cds_pending is not None:
            self.stop()
        else:
            self.kill()

    def _launch(self) -> None:
        self.server_log.parent.mkdir(parents=True, exist_ok=True)
        cds, self._cds_pending = _cds_options("broker")
        argv = [
            "java",
            f"-Xmx{self._heap}",
            "-Xms256m",
            *broker_jvm_opts(),
            *cds,
            jvm_tmpdir_option(),
            f"-Dkafka.logs.dir={self.server_log.parent}",
            f"-Dlog4j2.configurationFile={BROKER_LOG4J}",
            "-cp",
            kafka_classpath(),
            "kafka.Kafka",
            str(self.workdir / "server.properties"),
        ]
        with self.jvm_output.open("ab") as out:
            self._proc = spawn(argv, cwd=self.workdir, env=os.environ, output=out)


def broker_jvm_opts() -> list[str]:
    """A broker JVM's options after its heap: Kafka's own, then BROKER_EXTRA_OPTS_ENV's."""
    return [*BROKER_JVM_OPTS, *shlex.split(os.environ.get(BROKER_EXTRA_OPTS_ENV, ""))]


# -- class-data sharing ------------------------------------------------------------------
#
# Loading and verifying Kafka's classes is a third of a broker's start and of
# every tool run. The first JVM of a kind ("broker", or a tool's main class) that exits
# cleanly dumps the classes it loaded into a CDS archive in the Kafka cache,
# keyed by classpath and JVM since an archive only fits those; later JVMs of
# that kind map the archive instead. An archive the JVM cannot use is ignored
# by it (-Xshare:auto), never fatal.


def _tool_kind(main_class: str) -> str:
    """A tool's archive is its own: one made by another tool holds few of its classes. A
    console consumer's JVM took 2.5-2.7 CPU-s with no archive, 2.0-2.3 with StorageTool's
    (the tools' one archive until then), 1.27 with its own (load 15-20)."""
    return f"tools-{main_class.rsplit('.', 1)[-1]}"


@functools.cache
def _cds_archive(kind: str) -> Path:
    java = Path(shutil.which("java") or "java").resolve()
    key = hashlib.sha256(f"{kafka_classpath()}\n{java}".encode()).hexdigest()[:16]
    return KAFKA_CACHE / "cds" / f"{kind}-{key}.jsa"


def _cds_options(kind: str) -> tuple[list[str], Path | None]:
    """JVM options for class-data sharing, and the file a dump goes to (None: no dump)."""
    if not _cds_wanted():
        return [], None
    archive = _cds_archive(kind)
    if archive.is_file():
        return [f"-XX:SharedArchiveFile={archive}"], None
    archive.parent.mkdir(parents=True, exist_ok=True)
    # Several JVMs may dump at once: each to its own file, the first rename wins.
    pending = archive.with_name(f"{archive.name}.{uuid.uuid4().hex[:8]}.tmp")
    return [f"-XX:ArchiveClassesAtExit={pending}"], pending


def _cds_wanted() -> bool:
    return os.environ.get(CDS_ENV, "1") != "0"


def _cds_settle(kind: str, pending: Path | None, *, clean: bool) -> None:
    """Keep a dump from a JVM that exited cleanly as the archive; drop any other."""
    if pending is None or not pending.exists():
        return
    if clean and not _cds_archive(kind).exists():
        os.replace(pending, _cds_archive(kind))
    else:
        pending.unlink(missing_ok=True)


def _two_free_ports() -> tuple[int, int]:
    first = free_port()
    second = free_port()
    while second == first:
        second = free_port()
    return first, second
