"""Control-plane access to a cluster: bootstrap, Metadata, and one control
connection per broker for ListOffsets and OffsetForLeaderEpoch.

Fetch traffic uses separate connections owned by the fetchers, so that a full
memory pool (KIP-81), which stops reading fetch sockets, never starves metadata.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from replicad.clock import wall_ms
from replicad.config.model import MirrorConfig, SourceConfig, defaults_of
from replicad.errors import AuthenticationError, KafkaConnectionError, ProtocolError
from replicad.protocol.apis import ApiKey
from replicad.protocol.backoff import Backoff
from replicad.protocol.connection import BrokerAddress, BrokerConnection
from replicad.protocol.metadata import ClusterMetadata
from replicad.protocol.requests import metadata_request
from replicad.protocol.security import PLAINTEXT, ConnectionSecurity, connection_security

log = structlog.get_logger("replicad.client")

BOOTSTRAP_NODE_ID = -1
_SOURCE = defaults_of(SourceConfig)


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How a client connects (source: or mirror:); defaults are source:'s."""

    client_id: str = _SOURCE["client_id"]
    connect_timeout_s: float = _SOURCE["connect_timeout_ms"] / 1000
    request_timeout_s: float = _SOURCE["request_timeout_ms"] / 1000
    reconnect_backoff_ms: int = _SOURCE["reconnect_backoff_ms"]
    reconnect_backoff_max_ms: int = _SOURCE["reconnect_backoff_max_ms"]
    # TLS and SASL for every broker connection (replicad.protocol.security).
    security: ConnectionSecurity = PLAINTEXT

    @classmethod
    def from_config(cls, section: SourceConfig | MirrorConfig) -> ClientSettings:
        """A client's connection settings from its config section (source: or mirror:);
        ConfigError if its TLS files no longer load."""
        return cls(
            client_id=section.client_id,
            connect_timeout_s=section.connect_timeout_ms / 1000,
            request_timeout_s=section.request_timeout_ms / 1000,
            reconnect_backoff_ms=section.reconnect_backoff_ms,
            reconnect_backoff_max_ms=section.reconnect_backoff_max_ms,
            security=connection_security(section.security),
        )


def parse_host_port(text: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True, slots=True)
class SourceProblem:
    """Why the last Metadata request reached no broker, and since when (wall ms) it has
    kept failing: `replicad status` reports it (control/health.py)."""

    kind: str  # "unreachable" (no answer), or "refused" (TLS or SASL said no)
    error: str
    since_ms: int


class KafkaClient:
    def __init__(self, bootstrap_servers: Sequence[str], settings: ClientSettings) -> None:
        self.settings = settings
        # The source as the last Metadata request found it; None while it answers.
        self.problem: SourceProblem | None = None
        self.bootstrap = [
            BrokerAddress(BOOTSTRAP_NODE_ID, *parse_host_port(s)) for s in bootstrap_servers
        ]
        self.brokers: dict[int, BrokerAddress] = {}
        self._connections: dict[int, BrokerConnection] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        # More connections to a broker (`lane_connection`), by (node id, lane).
        self._lanes: dict[tuple[int, int], BrokerConnection] = {}
        self._lane_locks: dict[tuple[int, int], asyncio.Lock] = {}
        self._rng = random.Random()

    def new_connection(self, address: BrokerAddress, **kwargs: Any) -> BrokerConnection:
        return BrokerConnection(
            address,
            client_id=self.settings.client_id,
            connect_timeout_s=self.settings.connect_timeout_s,
            request_timeout_s=self.settings.request_timeout_s,
            security=self.settings.security,
            **kwargs,
        )

    async def connection(self, node_id: int) -> BrokerConnection:
        """The control connection to a broker, (re)connected on demand."""
        return await self._on_demand(self._connections, self._locks, node_id, node_id)

    async def lane_connection(self, node_id: int, lane: int) -> BrokerConnection:
        """Connection `lane` to a broker (lane 0 is the control connection), (re)connected
        on demand. A broker takes one request at a time from a connection (it reads the
        next once it has answered), so requests that should not queue behind each other
        -- a mirror's Produce requests waiting for acks=all -- go on lanes of their own."""
        if lane == 0:
            return await self.connection(node_id)
        return await self._on_demand(self._lanes, self._lane_locks, (node_id, lane), node_id)

    async def _on_demand(
        self,
        conns: dict[Any, BrokerConnection],
        locks: dict[Any, asyncio.Lock],
        key: int | tuple[int, int],
        node_id: int,
    ) -> BrokerConnection:
        """`conns[key]`, a connection to broker `node_id`, (re)connected if it is not open;
        one caller at a time connects it."""
        async with locks.setdefault(key, asyncio.Lock()):
            conn = conns.get(key)
            if conn is not None and conn.is_open:
                return conn
            address = self.brokers.get(node_id)
            if address is None:
                raise KafkaConnectionError(f"unknown broker id {node_id}")
            conn = self.new_connection(address)
            await conn.connect()
            conns[key] = conn
            return conn

    async def broker_connection(self) -> BrokerConnection:
        """A connection to any known broker (the brokers are learnt first if need be), for
        requests any broker answers (ListGroups, DescribeConfigs, CreateTopics, ...)."""
        if not self.brokers:
            await self.metadata(())
        errors: list[str] = []
        for node_id in sorted(self.brokers):
            try:
                return await self.connection(node_id)
            except (KafkaConnectionError, ProtocolError) as exc:  # the next may answer
                errors.append(str(exc))
        raise KafkaConnectionError(f"no broker reachable: {'; '.join(errors)}")

    async def _any_connection(self) -> BrokerConnection:
        """A connection to some known broker, bootstrap servers last."""
        for node_id in list(self._connections):
            conn = self._connections[node_id]
            if conn.is_open:
                return conn
        candidates = list(self.brokers.values())
        self._rng.shuffle(candidates)
        errors: list[Exception] = []
        for address in [*candidates, *self.bootstrap]:
            try:
                if address.node_id == BOOTSTRAP_NODE_ID:
                    conn = self.new_connection(address)
                    await conn.connect()
                    return conn
                return await self.connection(address.node_id)
            except (KafkaConnectionError, ProtocolError) as exc:
                errors.append(exc)
        text = "; ".join(str(e) for e in errors)
        if errors and all(isinstance(e, AuthenticationError) for e in errors):
            raise AuthenticationError(f"every broker refused us: {text}")
        raise KafkaConnectionError(f"no broker reachable: {text}")

    async def metadata(self, topics: Sequence[str] | None) -> ClusterMetadata:
        """One Metadata round trip to any reachable broker (raises if none answers)."""
        try:
            conn = await self._any_connection()
            assert conn.versions is not None
            version = conn.versions.require(ApiKey.METADATA)
            try:
                body = await conn.request(metadata_request(version, topics))
            finally:
                if conn.address.node_id == BOOTSTRAP_NODE_ID:
                    await conn.close()
        except (KafkaConnectionError, ProtocolError) as exc:
            kind = "refused" if isinstance(exc, AuthenticationError) else "unreachable"
            since = self.problem.since_ms if self.problem is not None else wall_ms()
            self.problem = SourceProblem(kind, str(exc), since)
            raise
        self.problem = None
        cluster = ClusterMetadata.from_response(body)
        self.brokers = dict(cluster.brokers)
        return cluster

    async def metadata_with_retry(
        self, topics: Sequence[str] | None, *, stop: asyncio.Event | None = None
    ) -> ClusterMetadata | None:
        """Metadata, retrying with backoff until it works (None if `stop` is set first)."""
        backoff = Backoff(
            self.settings.reconnect_backoff_ms, self.settings.reconnect_backoff_max_ms
        )
        while True:
            if stop is not None and stop.is_set():
                return None
            try:
                if stop is None:
                    return await self.metadata(topics)
                # A stop must not wait for an unreachable source's connect timeout.
                asking = asyncio.ensure_future(self.metadata(topics))
                stopping = asyncio.ensure_future(stop.wait())
                try:
                    await asyncio.wait({asking, stopping}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stopping.cancel()
                if not asking.done():
                    asking.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await asking
                    return None
                return asking.result()
            except (KafkaConnectionError, ProtocolError) as exc:
                delay = backoff.next_delay_ms()
                log.warning(
                    "metadata unavailable, retrying",
                    error=str(exc),
                    retry_in_ms=delay,
                    bootstrap=[f"{a.host}:{a.port}" for a in self.bootstrap],
                )
                if stop is None:
                    await asyncio.sleep(delay / 1000)
                    continue
                try:
                    await asyncio.wait_for(stop.wait(), delay / 1000)
                    return None
                except TimeoutError:
                    continue

    async def close(self) -> None:
        conns = [*self._connections.values(), *self._lanes.values()]
        self._connections, self._lanes = {}, {}
        for conn in conns:
            await conn.close()
