"""tools/peers/kafka.py: the Apache Kafka test broker and Kafka's own command-line tools."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from tools.peers import kafka
from tools.peers.kafka import (
    CONSOLE_CONSUMER,
    DUMP_LOG_SEGMENTS,
    MIN_SEGMENT_BYTES,
    KafkaBroker,
    dump_log_segments,
    kafka_classpath,
    kafka_version,
    run_kafka_class,
)
from tools.peers.process import PeerError, PeerNotInstalledError, taken_port
from tools.peers.produce import (
    CheckedProducer,
    consume_all,
    produce_mixed,
    read_broker_batches,
)

ROOT = Path(__file__).resolve().parents[2]


def produce_values(bootstrap: str, topic: str, values: list[bytes], partition: int = 0) -> None:
    producer = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    for value in values:
        producer.produce(topic, value=value, partition=partition)
    assert producer.flush(30) == 0


def test_the_pinned_kafka_version_is_a_4x_release() -> None:
    assert re.fullmatch(r"4\.\d+\.\d+", kafka_version())
    jars = kafka_classpath().split(":")
    assert any(Path(jar).name == f"kafka_2.13-{kafka_version()}.jar" for jar in jars)
    assert all(Path(jar).is_file() for jar in jars)


def test_broker_listens_on_loopback_and_keeps_its_data_in_log_dir(kafka_broker) -> None:
    assert re.fullmatch(r"127\.0\.0\.1:\d+", kafka_broker.bootstrap)
    meta = (kafka_broker.log_dir / "meta.properties").read_text()
    assert "node.id=1" in meta
    assert kafka_broker.running
    # The broker logs to its file, and says which version it is.
    assert f"Kafka version: {kafka_version()}" in kafka_broker.server_log.read_text()


def test_create_topic_waits_for_leaders_and_makes_partition_dirs(kafka_broker, unique_topic):
    kafka_broker.create_topic(unique_topic, 3)
    topic = kafka_broker.admin().list_topics(topic=unique_topic, timeout=10).topics[unique_topic]
    assert sorted(topic.partitions) == [0, 1, 2]
    assert {p.leader for p in topic.partitions.values()} == {1}
    for partition in range(3):
        assert kafka_broker.partition_dir(unique_topic, partition).is_dir()


def test_topics_are_not_created_by_asking_for_them(kafka_broker, unique_topic):
    metadata = kafka_broker.admin().list_topics(topic=unique_topic, timeout=10)
    assert metadata.topics[unique_topic].error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert unique_topic not in kafka_broker.admin().list_topics(timeout=10).topics


def test_creating_a_topic_twice_is_a_peer_error(kafka_broker, unique_topic):
    kafka_broker.create_topic(unique_topic, 1)
    with pytest.raises(PeerError, match="TOPIC_ALREADY_EXISTS"):
        kafka_broker.create_topic(unique_topic, 1)


def test_segments_below_kafkas_floor_roll_often(kafka_broker, unique_topic):
    segment = 128 * 1024
    assert segment < MIN_SEGMENT_BYTES
    kafka_broker.create_topic(unique_topic, 1, segment_bytes=segment)
    produce_mixed(
        kafka_broker.bootstrap,
        unique_topic,
        partitions=1,
        records=3000,
        seed=1,
        max_batch_bytes=64 * 1024,
    )
    files = sorted(kafka_broker.partition_dir(unique_topic, 0).glob("*.log"))
    assert len(files) >= 3
    assert all(f.stat().st_size <= segment for f in files)
    whole = b"".join(f.read_bytes() for f in files)
    assert read_broker_batches(kafka_broker.log_dir, unique_topic, 0) == whole


def test_console_consumer_reads_what_a_client_produced(kafka_broker, unique_topic):
    kafka_broker.create_topic(unique_topic, 1)
    values = [f"value-{i}".encode() for i in range(20)]
    produce_values(kafka_broker.bootstrap, unique_topic, values)
    result = kafka_broker.run_class(
        CONSOLE_CONSUMER,
        "--bootstrap-server",
        kafka_broker.bootstrap,
        "--topic",
        unique_topic,
        "--from-beginning",
        "--max-messages",
        str(len(values)),
        "--timeout-ms",
        "30000",
    )
    assert result.stdout.splitlines() == [v.decode() for v in values]


def test_dump_log_segments_answers_to_its_old_and_new_name(kafka_broker, unique_topic):
    kafka_broker.create_topic(unique_topic, 1)
    produce_values(kafka_broker.bootstrap, unique_topic, [b"a", b"b", b"c"])
    segment = next(kafka_broker.partition_dir(unique_topic, 0).glob("*.log"))
    old = kafka_broker.run_class("kafka.tools.DumpLogSegments", "--files", str(segment))
    new = run_kafka_class(DUMP_LOG_SEGMENTS, "--files", str(segment))
    assert "baseOffset: 0 lastOffset: 2 count: 3" in old.stdout
    assert old.stdout == new.stdout
    assert "| offset: 2" in dump_log_segments(segment)


def test_the_suites_brokers_run_with_the_extra_jvm_options_it_sets(monkeypatch) -> None:
    from tests.conftest import BROKER_JVM_OPTS_ENV

    assert BROKER_JVM_OPTS_ENV == kafka.BROKER_EXTRA_OPTS_ENV
    assert os.environ[BROKER_JVM_OPTS_ENV] == "-XX:TieredStopAtLevel=1"
    assert kafka.broker_jvm_opts()[-1] == "-XX:TieredStopAtLevel=1"
    monkeypatch.setenv(BROKER_JVM_OPTS_ENV, "-Xss1m '-Dx=a b'")
    assert kafka.broker_jvm_opts() == [*kafka.BROKER_JVM_OPTS, "-Xss1m", "-Dx=a b"]
    monkeypatch.delenv(BROKER_JVM_OPTS_ENV)
    assert kafka.broker_jvm_opts() == list(kafka.BROKER_JVM_OPTS)


def test_a_running_broker_has_them_on_its_command_line(kafka_broker) -> None:
    argv = Path(f"/proc/{kafka_broker.pid}/cmdline").read_bytes().split(b"\0")
    assert b"-XX:TieredStopAtLevel=1" in argv


def test_each_tool_keeps_a_class_archive_of_its_own(tmp_path, monkeypatch) -> None:
    """The first clean run of a tool dumps the classes it loaded for its later runs; another
    tool's archive is not used (it holds few of its classes)."""
    monkeypatch.setenv(kafka.CDS_ENV, "1")
    monkeypatch.setattr(kafka, "KAFKA_CACHE", tmp_path)
    kafka._cds_archive.cache_clear()
    try:
        storage = kafka._cds_archive(kafka._tool_kind(kafka.STORAGE_TOOL))
        dump = kafka._cds_archive(kafka._tool_kind(kafka.DUMP_LOG_SEGMENTS))
        assert storage != dump
        # The run that dumps warns of classes it cannot archive: on stderr, not in the output.
        out = kafka.run_kafka_class(kafka.STORAGE_TOOL, "random-uuid").stdout
        assert len(out.split()) == 1, out
        assert storage.is_file() and not dump.exists()
        share = f"-XX:SharedArchiveFile={storage}"
        assert kafka._cds_options(kafka._tool_kind(kafka.STORAGE_TOOL)) == ([share], None)
        assert share in kafka.kafka_tool_argv(kafka.STORAGE_TOOL)
        assert not any("SharedArchive" in a for a in kafka.kafka_tool_argv(kafka.DUMP_LOG_SEGMENTS))
        assert list((tmp_path / "cds").glob("*.tmp")) == []
    finally:
        kafka._cds_archive.cache_clear()


def test_a_failing_kafka_tool_raises_with_its_stderr() -> None:
    with pytest.raises(PeerError, match="ClassNotFoundException"):
        run_kafka_class("org.example.NoSuchTool")
    result = run_kafka_class("org.example.NoSuchTool", check=False)
    assert result.returncode != 0


def test_missing_jars_point_at_make_peers(tmp_path, monkeypatch):
    monkeypatch.setenv("REPLICAD_KAFKA_CACHE", str(tmp_path / "empty-cache"))
    kafka_classpath.cache_clear()
    try:
        with pytest.raises(PeerNotInstalledError, match="make kafka-jars"):
            kafka_classpath()
        with pytest.raises(PeerNotInstalledError, match="make kafka-jars"):
            KafkaBroker(tmp_path / "broker").start()
    finally:
        kafka_classpath.cache_clear()


def test_the_fixture_fails_rather_than_skips_without_jars(pytester, tmp_path, monkeypatch):
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())
    pytester.makepyfile(
        test_needs_kafka="""
        def test_uses_the_broker(kafka_broker):
            assert kafka_broker.bootstrap
        """
    )
    monkeypatch.setenv("REPLICAD_KAFKA_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*real peer not installed*make kafka-jars*"])


def test_restart_keeps_ports_and_data_and_a_killed_broker_recovers(make_kafka_broker, unique_topic):
    broker = make_kafka_broker()
    broker.create_topic(unique_topic, 2)
    summary = produce_mixed(broker.bootstrap, unique_topic, partitions=2, records=500, seed=3)
    bootstrap, first_pid = broker.bootstrap, broker.pid

    broker.restart()
    assert broker.bootstrap == bootstrap
    assert broker.pid != first_pid
    read = consume_all(broker.bootstrap, unique_topic)
    assert {p: len(r) for p, r in read.items()} == {
        p.partition: p.visible_records for p in summary.partitions
    }

    broker.kill()
    assert not broker.running
    broker.start()
    assert broker.bootstrap == bootstrap
    again = consume_all(broker.bootstrap, unique_topic)
    assert again == read


def test_a_port_taken_before_the_broker_binds_it_is_retried(tmp_path, monkeypatch):
    import tools.peers.kafka as kafka_module

    real = kafka_module._two_free_ports
    with taken_port() as taken:
        calls = iter([(taken, real()[1])])
        monkeypatch.setattr(kafka_module, "_two_free_ports", lambda: next(calls, None) or real())
        broker = KafkaBroker(tmp_path / "broker")
        try:
            broker.start()
            assert broker.port != taken
            assert "Address already in use" in broker.server_log.read_text()
        finally:
            broker.stop()
