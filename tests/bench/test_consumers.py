"""tools/bench/consumers.py: every peer, as it comes and tuned, reads a whole topic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench import consumers
from tools.bench.measure import MARK_PERCENTS, read_marks
from tools.bench.replicate import RECORD, produce
from tools.peers.kcat import kcat_binary

RECORDS = 2_000
PARTITIONS = 3
PYTHON_SETUPS = [s for s in consumers.SETUPS if s.client != consumers.KCAT]
KCAT_SETUPS = [s for s in consumers.SETUPS if s.client == consumers.KCAT]


@pytest.fixture(scope="module")
def topic(kafka_broker, tmp_path_factory) -> str:
    name = f"bench-consumers-{tmp_path_factory.getbasetemp().name}"
    kafka_broker.create_topic(name, PARTITIONS)
    produce(kafka_broker.bootstrap, name, PARTITIONS, RECORDS)
    return name


def test_every_client_comes_as_it_is_and_tuned():
    variants = {(s.client, s.variant) for s in consumers.SETUPS}
    for client in (consumers.CONFLUENT, consumers.KAFKA_PYTHON, consumers.AIOKAFKA, consumers.KCAT):
        assert {(client, consumers.DEFAULT), (client, consumers.TUNED)} <= variants
        assert consumers.setup(client, consumers.DEFAULT).config == {}
        assert consumers.setup(client, consumers.TUNED).config
    with pytest.raises(KeyError):
        consumers.setup("nobody", consumers.TUNED)


def test_tuned_confluent_kafka_does_not_sit_out_a_second_when_its_queue_fills():
    # librdkafka's fetch.queue.backoff.ms defaults to 1000 ms; the tuned reader lowers it.
    tuned = consumers.setup(consumers.CONFLUENT, consumers.TUNED).config
    assert tuned[consumers.QUEUE_BACKOFF] < 1000
    assert (
        consumers.QUEUE_BACKOFF
        not in consumers.setup(consumers.CONFLUENT, consumers.DEFAULT).config
    )
    # kcat's librdkafka refuses the property (test_kcat_writes_every_payload runs it).
    assert consumers.QUEUE_BACKOFF not in consumers.setup(consumers.KCAT, consumers.TUNED).config


def test_settings_name_every_value_and_the_loop():
    line = consumers.setup(consumers.CONFLUENT, consumers.TUNED).settings()
    for key, value in consumers.RDKAFKA_TUNED.items():
        assert f"{key}={value}" in line
    assert "consume(num_messages=" in line
    assert "library defaults" in consumers.setup(consumers.KCAT, consumers.DEFAULT).settings()


def test_kcat_gets_its_librdkafka_settings_as_x_pairs():
    s = consumers.setup(consumers.KCAT, consumers.TUNED)
    argv = consumers.kcat_argv("kcat", s, "127.0.0.1:1", "t")
    assert argv[:2] == ["kcat", "-C"]
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "-X"]
    assert pairs == [f"{k}={v}" for k, v in s.config.items()]


@pytest.mark.parametrize("setup", PYTHON_SETUPS, ids=lambda s: s.name)
def test_python_consumer_reads_the_topic_to_its_end(setup, kafka_broker, topic, tmp_path: Path):
    marks = tmp_path / "marks"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.bench.consumers",
            setup.client,
            setup.variant,
            kafka_broker.bootstrap,
            topic,
            str(PARTITIONS),
            str(RECORDS),
            str(marks),
        ],
        check=True,
        timeout=120,
    )
    got = read_marks(marks, started=0.0)
    assert sorted(got) == list(MARK_PERCENTS)
    assert list(got.values()) == sorted(got.values())


@pytest.mark.parametrize("setup", KCAT_SETUPS, ids=lambda s: s.name)
def test_kcat_writes_every_payload(setup, kafka_broker, topic):
    out = subprocess.run(
        consumers.kcat_argv(kcat_binary(), setup, kafka_broker.bootstrap, topic),
        capture_output=True,
        check=True,
        timeout=120,
    )
    assert len(out.stdout) == RECORDS * (RECORD + 1)
