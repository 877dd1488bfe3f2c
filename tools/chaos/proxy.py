"""A fault-injecting TCP proxy between a Kafka client and one broker (127.0.0.1 only).

The proxy runs its own asyncio loop in a background thread, so a synchronous test
can start it, point replicad at it and inject faults while it checks the replica:

    with ChaosProxy(lambda: ("127.0.0.1", broker.port)) as proxy:
        run replicad with --bootstrap-servers proxy.address
        proxy.flip_batches(3)      # damage one batch in each of the next 3 Fetch responses
        proxy.cut()                # close every connection now
        proxy.stall(5.0)           # forward nothing for 5 s, connections kept open
        proxy.set_delay_ms(200)    # hold every response 200 ms
        proxy.truncate_responses(2, close=True)

Rules:
- It is frame-aware: requests are forwarded whole and remembered (api key, version,
  correlation id) so each response is known for what it is. Kafka answers in request
  order on a connection; a response whose correlation id is not the oldest pending one
  is forwarded untouched and counted (`unmatched`).
- Metadata responses are rewritten so the broker is advertised at the proxy's own
  address: clients learn broker addresses from Metadata, and a proxy in front of the
  bootstrap port alone would be bypassed after the first request. In front of a cluster
  (one proxy per node), `advertise` gives every node's address and its proxy's, so a
  Metadata answer from any node sends the client to every node through its proxy.
- Faults apply to responses (broker -> client), except `stall`, which holds both
  directions. Each fault is counted when it is delivered (`ProxyStats`), so a test can
  compare what was injected with what the client says it saw.
- `truncate_responses(close=True)` sends part of a frame and closes the connection (the
  client reads a short frame); `close=False` sends a frame whose size prefix matches its
  cut-down body, so the client reads a complete frame that does not decode, and the
  connection stays up.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from replicad.protocol.apis import ApiKey
from replicad.protocol.codec import (
    MAX_FRAME_BYTES,
    SIZE,
    RequestHead,
    peek_correlation_id,
    peek_request_head,
    with_size_prefix,
)
from tools.chaos.frames import (
    Address,
    FrameError,
    fetch_batch_spans,
    flip_anywhere,
    flip_in_batch,
    rewrite_metadata,
)
from tools.peers.process import LOOPBACK
from tools.peers.service import Service

# Commands from the test thread wait this long for the proxy's loop.
COMMAND_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """What the proxy has done so far."""

    connections: int = 0
    open_connections: int = 0
    refused_connections: int = 0
    requests: int = 0
    responses: int = 0
    unmatched: int = 0
    cuts: int = 0  # connections closed by cut()
    stalls: int = 0
    delayed_responses: int = 0
    truncated_closed: int = 0
    truncated_short: int = 0
    flipped_batches: int = 0
    flipped_anywhere: int = 0
    metadata_rewrites: int = 0
    replaced: int = 0
    rewritten: int = 0  # responses passed through a rewrite_responses function
    bytes_to_client: int = 0
    bytes_to_broker: int = 0

    @property
    def faults(self) -> int:
        """Every fault delivered: a cut connection, a stall, a damaged or truncated frame
        (delays are not faults, they are weather)."""
        return (
            self.cuts
            + self.stalls
            + self.truncated_closed
            + self.truncated_short
            + self.flipped_batches
            + self.flipped_anywhere
            + self.refused_connections
            + self.replaced
            + self.rewritten
        )


@dataclass(slots=True)
class _Counters:
    values: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, n: int = 1) -> None:
        self.values[name] = self.values.get(name, 0) + n


@dataclass(slots=True, eq=False)
class _Connection:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    pending: deque[RequestHead] = field(default_factory=deque)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def close(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.close()


@dataclass(slots=True)
class _Plan:
    """Faults waiting for the next matching responses."""

    flip_batches: int = 0
    flip_anywhere: int = 0
    flip_api: int | None = ApiKey.FETCH
    truncate: int = 0
    truncate_close: bool = True
    truncate_api: int | None = ApiKey.FETCH
    delay_ms: int = 0
    refuse: bool = False
    replace: int = 0
    replace_api: int | None = ApiKey.FETCH
    replacement: Callable[[RequestHead, bytes], bytes] | None = None
    # api key -> a rewrite of every response of that api, until healed
    rewrites: dict[int, Callable[[RequestHead, bytes], bytes]] = field(default_factory=dict)


class ChaosProxy(Service):
    """See the module doc. `upstream` is the broker's address, or a callable giving it
    (a broker picks its port when it starts, after the proxy may already exist)."""

    what = "chaos proxy"

    def __init__(
        self,
        upstream: Address | Callable[[], Address],
        *,
        seed: int = 0,
        rewrite_metadata: bool = True,
        port: int = 0,
        advertise: Callable[[], Mapping[Address, Address]] | None = None,
    ) -> None:
        """`advertise`: {broker address: where to send clients instead} for every broker a
        Metadata answer names (default: this proxy's upstream, at this proxy)."""
        self._upstream = upstream if callable(upstream) else (lambda: upstream)
        self._advertise = advertise
        self._rng = random.Random(seed)
        self._rewrite = rewrite_metadata
        self._requested_port = port
        self._port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._serving: set[asyncio.Task[Any]] = set()
        self._counters = _Counters()
        self._plan = _Plan()
        self._flowing: asyncio.Event | None = None
        self._stall_until = 0.0
        self._stall_handle: asyncio.TimerHandle | None = None
        self._lock = threading.Lock()

    # -- life cycle (test thread) ------------------------------------------------

    @property
    def address(self) -> str:
        """Where clients connect: 127.0.0.1:PORT."""
        return self.bootstrap

    def start(self) -> Self:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._open())
            except BaseException as exc:  # reported to the starting thread
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._close_all())
                loop.close()

        self._thread = threading.Thread(target=run, name="chaos-proxy", daemon=True)
        self._thread.start()
        ready.wait(COMMAND_TIMEOUT_S)
        if failure:
            raise failure[0]
        if self._port is None:
            raise RuntimeError("the proxy did not start")
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(COMMAND_TIMEOUT_S)

    # -- faults (test thread) ------------------------------------------------------

    def cut(self) -> int:
        """Close every open connection now; returns how many were closed."""
        return int(self._call(self._cut()))

    def stall(self, seconds: float) -> None:
        """Forward nothing, either way, for `seconds`; connections stay open."""
        self._call(self._stall(seconds))

    def set_delay_ms(self, delay_ms: int) -> None:
        """Hold every response `delay_ms` before forwarding it (0: no delay)."""
        with self._lock:
            self._plan.delay_ms = max(0, delay_ms)

    def refuse_connections(self, refuse: bool) -> None:
        """Accept and at once close new connections (the broker looks down)."""
        with self._lock:
            self._plan.refuse = refuse

    def truncate_responses(
        self, count: int = 1, *, close: bool = True, api_key: int | None = ApiKey.FETCH
    ) -> None:
        """Cut short the next `count` responses of `api_key` (None: any API)."""
        with self._lock:
            self._plan.truncate += count
            self._plan.truncate_close = close
            self._plan.truncate_api = api_key

    def flip_batches(self, count: int = 1) -> None:
        """Damage one checksummed byte of one whole batch in each of the next `count`
        Fetch responses that hold a whole batch."""
        with self._lock:
            self._plan.flip_batches += count

    def flip_anywhere(self, count: int = 1, *, api_key: int | None = ApiKey.FETCH) -> None:
        """Damage one byte anywhere after the correlation id of the next `count`
        responses of `api_key` (None: any API): hostile bytes, unprotected fields too."""
        with self._lock:
            self._plan.flip_anywhere += count
            self._plan.flip_api = api_key

    def replace_responses(
        self,
        count: int,
        replacement: Callable[[RequestHead, bytes], bytes],
        *,
        api_key: int | None = ApiKey.FETCH,
    ) -> None:
        """Answer the next `count` requests of `api_key` with `replacement(head, body)`
        instead of the broker's body (a scripted hostile answer)."""
        with self._lock:
            self._plan.replace += count
            self._plan.replace_api = api_key
            self._plan.replacement = replacement

    def rewrite_responses(
        self, api_key: int, rewrite: Callable[[RequestHead, bytes], bytes]
    ) -> None:
        """Pass every response of `api_key` through `rewrite(head, body)` from now until
        `heal` (a broker that answers differently: newer error codes, fewer versions)."""
        with self._lock:
            self._plan.rewrites[api_key] = rewrite

    def heal(self) -> None:
        """No delay, no refusal, nothing pending: the path is clean again (a stall
        already running still runs out)."""
        with self._lock:
            self._plan = _Plan()

    def pending_faults(self) -> int:
        """Faults asked for and not yet delivered."""
        with self._lock:
            plan = self._plan
            return plan.flip_batches + plan.flip_anywhere + plan.truncate + plan.replace

    def stats(self) -> ProxyStats:
        """The counters, read on the proxy's loop: a response handed to a socket is
        counted in the same step, so what a client has received is always counted."""
        thread = self._thread
        if self._loop is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError, TimeoutError):
                return self._call(self._stats())
        return self._snapshot()

    async def _stats(self) -> ProxyStats:
        return self._snapshot()

    def _snapshot(self) -> ProxyStats:
        with self._lock:
            values = dict(self._counters.values)
        values["open_connections"] = len(self._connections)
        return ProxyStats(**values)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters.add(name, n)

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError("the proxy is not started")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(COMMAND_TIMEOUT_S)

    # -- the loop (proxy thread) ---------------------------------------------------

    async def _open(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(
            self._serve, LOOPBACK, self._requested_port, limit=1 << 20
        )
        self._port = int(self._server.sockets[0].getsockname()[1])

    async def _close_all(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.close()
        for task in list(self._serving):
            task.cancel()
        if self._serving:
            await asyncio.wait(self._serving, timeout=COMMAND_TIMEOUT_S)

    async def _cut(self) -> int:
        conns = list(self._connections)
        for conn in conns:
            conn.close()
        self._count("cuts", len(conns))
        return len(conns)

    async def _stall(self, seconds: float) -> None:
        assert self._flowing is not None
        loop = asyncio.get_running_loop()
        self._flowing.clear()
        self._stall_until = max(self._stall_until, loop.time() + seconds)
        if self._stall_handle is not None:
            self._stall_handle.cancel()
        self._stall_handle = loop.call_at(self._stall_until, self._flowing.set)
        self._count("stalls")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)
        with self._lock:
            refuse = self._plan.refuse
        self._count("connections")
        if refuse:
            self._count("refused_connections")
            writer.close()
            return
        conn = _Connection(client=writer)
        try:
            host, port = self._upstream()
            up_reader, up_writer = await asyncio.open_connection(host, port, limit=1 << 20)
        except OSError:
            # The broker is down: the client sees what it would see without a proxy.
            writer.close()
            return
        conn.upstream = up_writer
        self._connections.add(conn)
        conn.tasks = [
            asyncio.create_task(self._requests(conn, reader, up_writer)),
            asyncio.create_task(self._responses(conn, up_reader, writer)),
        ]
        try:
            await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._connections.discard(conn)
            conn.close()
            for task in conn.tasks:
                task.cancel()
            await asyncio.gather(*conn.tasks, return_exceptions=True)

    async def _gate(self) -> None:
        assert self._flowing is not None
        await self._flowing.wait()

    async def _read_frame(self, reader: asyncio.StreamReader) -> bytes | None:
        try:
            prefix = await reader.readexactly(SIZE.size)
            (size,) = SIZE.unpack(prefix)
            if size < 0 or size > MAX_FRAME_BYTES:
                return None
            return await reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            return None

    async def _requests(
        self, conn: _Connection, reader: asyncio.StreamReader, upstream: asyncio.StreamWriter
    ) -> None:
        while True:
            body = await self._read_frame(reader)
            if body is None:
                return
            await self._gate()
            # A request without a header is forwarded as it is; the broker answers (or not).
            with contextlib.suppress(FrameError):
                conn.pending.append(peek_request_head(body))
            try:
                upstream.write(with_size_prefix(body))
                await upstream.drain()
            except (ConnectionError, OSError):
                return
            self._count("requests")
            self._count("bytes_to_broker", len(body) + SIZE.size)

    async def _responses(
        self, conn: _Connection, reader: asyncio.StreamReader, client: asyncio.StreamWriter
    ) -> None:
        while True:
            body = await self._read_frame(reader)
            if body is None:
                return
            head = self._match(conn, body)
            with self._lock:
                delay_ms = self._plan.delay_ms
            if delay_ms:
                await asyncio.sleep(delay_ms / 1000)
                self._count("delayed_responses")
            await self._gate()
            out, close_after, counted = self._damage(head, body)
            try:
                client.write(out)
            except (ConnectionError, OSError):
                return
            # Counted once handed to the socket: the client may act on it before drain returns.
            self._count("responses")
            self._count("bytes_to_client", len(out))
            if counted:
                self._count(counted)
            try:
                await client.drain()
            except (ConnectionError, OSError):
                return
            if close_after:
                conn.close()
                return

    def _match(self, conn: _Connection, body: bytes) -> RequestHead | None:
        try:
            correlation_id = peek_correlation_id(body)
        except FrameError:
            self._count("unmatched")
            return None
        if conn.pending and conn.pending[0].correlation_id == correlation_id:
            return conn.pending.popleft()
        self._count("unmatched")
        return None

    def _damage(self, head: RequestHead | None, body: bytes) -> tuple[bytes, bool, str | None]:
        """(bytes to send, close the connection after them, the counter of the fault)."""
        if head is None:
            return with_size_prefix(body), False, None
        if head.api_key == ApiKey.METADATA and self._rewrite:
            body = self._rewrite_metadata(head, body)
        with self._lock:
            plan = self._plan
            replacement = None
            if plan.replace > 0 and plan.replace_api in (None, head.api_key):
                plan.replace -= 1
                replacement = plan.replacement
        if replacement is not None:
            return with_size_prefix(replacement(head, body)), False, "replaced"
        with self._lock:
            rewrite = self._plan.rewrites.get(head.api_key)
        if rewrite is not None:
            return with_size_prefix(rewrite(head, body)), False, "rewritten"
        with self._lock:
            plan = self._plan
            want_truncate = plan.truncate > 0 and plan.truncate_api in (None, head.api_key)
            want_anywhere = plan.flip_anywhere > 0 and plan.flip_api in (None, head.api_key)
            want_flip = plan.flip_batches > 0 and head.api_key == ApiKey.FETCH
            if want_truncate:
                plan.truncate -= 1
                close = plan.truncate_close
        if want_truncate:
            return self._truncate(body, close)
        if want_flip:
            damaged = self._flip_batch(head, body)
            if damaged is not None:
                return with_size_prefix(damaged), False, "flipped_batches"
        if want_anywhere:
            with self._lock:
                self._plan.flip_anywhere -= 1
            return with_size_prefix(flip_anywhere(body, self._rng).body), False, "flipped_anywhere"
        return with_size_prefix(body), False, None

    def _truncate(self, body: bytes, close: bool) -> tuple[bytes, bool, str | None]:
        # Keep the correlation id so the client pairs the short frame with its request.
        keep = self._rng.randrange(4, max(5, len(body)))
        if close:
            return (with_size_prefix(body)[: SIZE.size + keep], True, "truncated_closed")
        return with_size_prefix(body[:keep]), False, "truncated_short"

    def _flip_batch(self, head: RequestHead, body: bytes) -> bytes | None:
        try:
            spans = fetch_batch_spans(body, head.api_version)
        except FrameError:
            return None
        if not spans:
            return None  # wait for a response that carries a whole batch
        with self._lock:
            if self._plan.flip_batches <= 0:
                return None
            self._plan.flip_batches -= 1
        return flip_in_batch(body, self._rng.choice(spans), self._rng).body

    def _rewrite_metadata(self, head: RequestHead, body: bytes) -> bytes:
        if self._advertise is not None:
            addresses = dict(self._advertise())
        else:
            addresses = {self._upstream(): (LOOPBACK, self.port)}
        try:
            result = rewrite_metadata(body, head.api_version, addresses)
        except FrameError:
            return body
        if result.brokers_rewritten:
            self._count("metadata_rewrites")
        return result.body


def wait_for_delivery(proxy: ChaosProxy, *, timeout_s: float) -> bool:
    """Wait until every fault asked of `proxy` has been delivered; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proxy.pending_faults() == 0:
            return True
        time.sleep(0.05)
    return proxy.pending_faults() == 0
