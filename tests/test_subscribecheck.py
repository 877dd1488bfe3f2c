"""No kafka-python group member subscribes by hand (tools/subscribecheck.py): each goes
through `subscribe_knowing`, which keeps it out of kafka-python 3.0.12's stranded rejoin."""

from __future__ import annotations

from pathlib import Path

from tools.sourcecheck import finding_lines, listed
from tools.subscribecheck import DEFAULT_PATHS, check, check_source, main


def test_no_kafka_python_consumer_subscribes_by_hand() -> None:
    findings = check(DEFAULT_PATHS)
    assert findings == [], listed(
        findings,
        "subscribe through tools.peers.group_member.subscribe_knowing; a subscription"
        " that is the point of the code says so: # subscribe-ok: why",
    )


def test_a_kafka_python_subscription_is_named_by_line() -> None:
    # d453360's two subscribers, as they were.
    source = """
        from kafka import KafkaConsumer

        def consume(bootstrap, topic):
            consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id="g")
            consumer.subscribe([topic])

        class Member:
            def run(self):
                self.consumer = KafkaConsumer(group_id="g")
                self.consumer.subscribe(["t"], listener=None)
    """
    assert finding_lines(check_source, source) == [
        "6: a kafka-python consumer subscribes by hand (consumer.subscribe)",
        "11: a kafka-python consumer subscribes by hand (self.consumer.subscribe)",
    ]


def test_subscribe_knowing_assigned_partitions_confluent_and_the_marker_pass() -> None:
    source = """
        import kafka
        from confluent_kafka import Consumer
        from tools.peers.group_member import subscribe_knowing

        def member(bootstrap, topic):
            consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id="g")
            subscribe_knowing(consumer, [topic])

        def reader(topic):
            consumer = kafka.KafkaConsumer(group_id=None)
            consumer.assign([topic])

        def librdkafka(topic):
            consumer = Consumer({"group.id": "g"})
            consumer.subscribe([topic])

        def race(topic):
            consumer = kafka.KafkaConsumer(group_id="g")
            # subscribe-ok: the race itself, reproduced
            consumer.subscribe([topic])
    """
    assert finding_lines(check_source, source) == []


def test_the_command_prints_each_finding_and_exits_1(tmp_path: Path, capsys) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("c = KafkaConsumer()\nc.subscribe(['t'])\n")
    assert main([str(planted)]) == 1
    out = capsys.readouterr().out
    assert out.strip().endswith(
        "planted.py:2: a kafka-python consumer subscribes by hand (c.subscribe)"
    )
    planted.write_text("c = KafkaConsumer()\nc.assign(['t'])\n")
    assert main([str(planted)]) == 0
