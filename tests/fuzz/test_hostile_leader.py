"""The running daemon against a leader whose answers are damaged anywhere, not only inside
record batches: the proxy flips bytes in responses of every API, fields no checksum covers
included. Kafka's wire format cannot tell a damaged offset or length from a real one, so
the replica is not required to match the source here; what is required is that the daemon
survives, lets no error escape its handling, and writes only whole batches that pass
their checksums, with offsets that never repeat.
"""

from __future__ import annotations

import pytest

from replicad.protocol.apis import ApiKey
from replicad.types import TopicPartition
from tools.chaos.follower import Follower
from tools.chaos.invariant import check_replica
from tools.chaos.proxy import ChaosProxy, wait_for_delivery
from tools.chaos.scenarios import fill, new_topic, wait_for
from tools.chaos.wire_data import fetch_response_claiming, metadata_with_null_brokers

pytestmark = pytest.mark.kafka

PARTITIONS = 2
FLIPS = 40


def test_bytes_damaged_anywhere_in_any_response(kafka_broker, tmp_path) -> None:
    topic = new_topic(kafka_broker, "hostile", PARTITIONS)
    fill(kafka_broker, {topic: PARTITIONS}, 1500, seed=900)
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    with ChaosProxy(lambda: ("127.0.0.1", kafka_broker.port), seed=9) as proxy:
        follower = Follower(tmp_path, proxy.address, [topic])
        follower.start()
        try:
            for i in range(FLIPS):
                # Mostly Fetch (the bulk of the traffic), every other API now and then.
                proxy.flip_anywhere(1, api_key=ApiKey.FETCH if i % 4 else None)
                wait_for_delivery(proxy, timeout_s=10)
                assert follower.running, follower.output()[-3000:]
            delivered = proxy.stats().flipped_anywhere
            proxy.heal()
            alive = follower.status()
            assert alive is not None and follower.running
        finally:
            code = follower.stop()
    assert delivered >= FLIPS // 2
    assert code == 0, follower.output()[-3000:]
    assert follower.unexpected_lines() == []
    # Whatever was written: whole batches, valid checksums, no offset twice.
    report = check_replica(kafka_broker.log_dir, follower.data_dir, partitions, caught_up=False)
    for check in report.partitions:
        assert check.duplicated == 0, report.summary()
        assert "checksum" not in (check.problem or ""), report.summary()
        assert "torn" not in (check.problem or ""), report.summary()


def test_one_response_with_an_absurd_array_length_does_not_kill_the_daemon(
    kafka_broker, tmp_path
) -> None:
    """One Fetch response whose aborted_transactions claims 2^32 - 1 entries (the frame cut
    short after the claim): kio's native reader would abort the process reserving room for
    them; the frame guard refuses the frame first. The daemon counts and logs it, drops
    that connection, fetches again on a new one and replicates what is produced after."""
    topic = new_topic(kafka_broker, "absurd", 1)
    fill(kafka_broker, {topic: 1}, 300, seed=901)
    tp = TopicPartition(topic, 0)
    with ChaosProxy(lambda: ("127.0.0.1", kafka_broker.port)) as proxy:
        follower = Follower(tmp_path, proxy.address, [topic])
        follower.start()
        try:
            assert wait_for(lambda: follower.ends([tp])[tp] > 0, 60) is not None
            errors_before = errors(follower)
            proxy.replace_responses(
                1,
                lambda head, _: fetch_response_claiming(
                    head.api_version, 2**32 - 1, correlation_id=head.correlation_id
                ),
            )
            assert wait_for_delivery(proxy, timeout_s=20)
            refused = wait_for(lambda: errors(follower) > errors_before, 20)
            assert refused is not None, follower.output()[-3000:]
            assert follower.running, f"exit {follower.exit_code()}: {follower.output()[-1500:]}"
            # Logged with the claim it refused (the frame guard in front of kio, or a Fetch
            # scanner of the follower's own: both hold counts to the bytes left).
            logged = [
                line
                for line in follower.output().splitlines()
                if "leader connection failed" in line and "Fetch" in line and "claims" in line
            ]
            assert logged, follower.output()[-3000:]
            # Fetching goes on over a new connection: records produced now arrive.
            end_before = follower.ends([tp])[tp]
            fill(kafka_broker, {topic: 1}, 200, seed=903)
            assert wait_for(lambda: follower.ends([tp])[tp] > end_before, 60) is not None
        finally:
            code = follower.stop()
    assert code == 0, follower.output()[-3000:]
    assert follower.unexpected_lines() == []
    report = check_replica(kafka_broker.log_dir, follower.data_dir, [tp], caught_up=False)
    assert report.ok and report.duplicated == 0, report.summary()


def errors(follower: Follower) -> int:
    """The daemon's error count (connection and partition errors) as of now."""
    assert follower.status() is not None, follower.output()[-1500:]
    return follower.counters().errors


def test_a_null_broker_list_in_metadata_does_not_kill_the_daemon(kafka_broker, tmp_path) -> None:
    topic = new_topic(kafka_broker, "nullbrokers", 1)
    fill(kafka_broker, {topic: 1}, 300, seed=902)
    tp = TopicPartition(topic, 0)
    with ChaosProxy(lambda: ("127.0.0.1", kafka_broker.port)) as proxy:
        proxy.replace_responses(
            1,
            lambda head, body: metadata_with_null_brokers(body, head.api_version),
            api_key=ApiKey.METADATA,
        )
        follower = Follower(tmp_path, proxy.address, [topic])
        follower.start()
        try:
            replicated = wait_for(lambda: follower.ends([tp])[tp] > 0 or not follower.running, 60)
            assert proxy.stats().replaced == 1
            assert replicated is not None and follower.running, (
                f"exit {follower.exit_code()}: {follower.output()[-1500:]}"
            )
        finally:
            follower.kill()
