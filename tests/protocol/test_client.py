"""KafkaClient, the control-plane client: it learns the brokers from Metadata, reaches one
for admin requests, reports a source it cannot reach (and since when), and closes what it
opened. Against the scripted leader (tools/peers), which answers ApiVersions and Metadata."""

from __future__ import annotations

import pytest

from replicad.errors import KafkaConnectionError
from replicad.protocol.apis import ApiKey
from replicad.protocol.client import ClientSettings, KafkaClient, parse_host_port
from tools.peers.process import free_port
from tools.peers.scripted_leader import ScriptedLeader

FAST = ClientSettings(connect_timeout_s=5.0, request_timeout_s=5.0)


def test_host_port_parsing():
    assert parse_host_port("k1:9092") == ("k1", 9092)
    assert parse_host_port("[::1]:9093") == ("::1", 9093)
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        parse_host_port("k1")


async def test_learns_the_brokers_and_reaches_one():
    leader = ScriptedLeader("t", node_id=7)
    port = await leader.start()
    client = KafkaClient([f"127.0.0.1:{port}"], FAST)
    try:
        cluster = await client.metadata(["t"])
        assert set(client.brokers) == {7}
        assert cluster.brokers[7].port == port
        assert client.problem is None
        conn = await client.broker_connection()
        assert conn.address.node_id == 7
        assert conn.versions is not None and conn.versions.get(ApiKey.METADATA) is not None
        # The control connection is kept and handed out again.
        assert await client.connection(7) is conn
    finally:
        await client.close()
        await leader.close()
    assert not conn.is_open


async def test_an_unreachable_source_is_reported_with_its_first_failure_time():
    client = KafkaClient([f"127.0.0.1:{free_port()}"], FAST)
    with pytest.raises(KafkaConnectionError, match="no broker reachable"):
        await client.metadata(())
    first = client.problem
    assert first is not None and first.kind == "unreachable"
    with pytest.raises(KafkaConnectionError):
        await client.broker_connection()
    # Still failing: the problem keeps the time it began.
    assert client.problem is not None and client.problem.since_ms == first.since_ms
    with pytest.raises(KafkaConnectionError, match="unknown broker id 3"):
        await client.connection(3)
    await client.close()


async def test_lanes_are_connections_of_their_own_kept_and_closed_with_the_client():
    leader = ScriptedLeader("t", node_id=7)
    port = await leader.start()
    client = KafkaClient([f"127.0.0.1:{port}"], FAST)
    try:
        await client.metadata(["t"])
        control = await client.connection(7)
        assert await client.lane_connection(7, 0) is control
        one, two = await client.lane_connection(7, 1), await client.lane_connection(7, 2)
        assert len({id(control), id(one), id(two)}) == 3
        assert all(c.is_open for c in (control, one, two))
        assert await client.lane_connection(7, 1) is one
        # A lane found closed is connected again.
        await one.close()
        again = await client.lane_connection(7, 1)
        assert again is not one and again.is_open
        with pytest.raises(KafkaConnectionError, match="unknown broker id 3"):
            await client.lane_connection(3, 1)
    finally:
        await client.close()
        await leader.close()
    assert not any(c.is_open for c in (control, two, again))
