"""One TCP connection to one Kafka broker (the asyncio shell of the protocol layer).

Several requests may be in flight; responses come back in request order on a
Kafka connection, but we still match them by correlation id and treat a
mismatch as the peer's protocol error. A request that times out closes the
connection: later responses could no longer be trusted to line up.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsRequestV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.api_versions.v3.request import ApiVersionsRequest as ApiVersionsRequestV3
from kio.schema.api_versions.v3.response import ApiVersionsResponse as ApiVersionsResponseV3
from kio.schema.errors import ErrorCode

from replicad import __version__
from replicad.errors import (
    KafkaConnectionError,
    PoolTooSmallError,
    RemoteProtocolError,
    RequestTimeoutError,
    ResponseTooLargeError,
)
from replicad.protocol.apis import NegotiatedVersions, VersionRange, negotiate
from replicad.protocol.codec import (
    SIZE,
    decode_response,
    encode_request,
    frame_size,
    peek_correlation_id,
    response_type,
)
from replicad.protocol.security import (
    PLAINTEXT,
    ConnectionSecurity,
    SaslClient,
    SaslCredentials,
    SaslStep,
)

# The share of a SASL session's lifetime (KIP-368) a connection is used for; Kafka's own
# client re-authenticates at 85-95% of it.
SESSION_LIFETIME_USED = 0.85


def _no_release() -> None:
    return None


# Called with a response's size before its body is read; the returned awaitable
# resolves when the bytes may be held (KIP-81 memory pool). Returns a release callback.
Reserve = Callable[[int], Awaitable[Callable[[], None]]]


@dataclass(slots=True)
class _Pending:
    response_cls: type
    future: asyncio.Future[Any]
    hold: bool = False


@dataclass(frozen=True, slots=True)
class HeldResponse:
    """A response whose memory reservation the caller releases when done with it."""

    body: Any
    release: Callable[[], None]


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    node_id: int
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port} (node {self.node_id})"


class BrokerConnection:
    def __init__(
        self,
        address: BrokerAddress,
        *,
        client_id: str,
        connect_timeout_s: float,
        request_timeout_s: float,
        reserve: Reserve | None = None,
        security: ConnectionSecurity = PLAINTEXT,
    ) -> None:
        self.address = address
        self.security = security
        # When a SASL session with a lifetime (KIP-368) should be given up; see _authenticate.
        self._expires_at: float | None = None
        self.client_id = client_id
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self._reserve = reserve
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, _Pending] = {}
        self._correlation = itertools.count(1)
        self._read_task: asyncio.Task[None] | None = None
        self._closed_reason: BaseException | None = None
        self.versions: NegotiatedVersions | None = None
        self.bytes_received = 0
        self.bytes_sent = 0

    @property
    def is_open(self) -> bool:
        if self._expires_at is not None and time.monotonic() >= self._expires_at:
            return False
        return self._writer is not None and self._closed_reason is None

    async def connect(self) -> None:
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(
                    self.address.host,
                    self.address.port,
                    limit=1 << 20,
                    **self.security.open_options(self.address.host, self.connect_timeout_s),
                ),
                self.connect_timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            raise self.security.connect_failure(str(self.address), exc) from exc
        self._read_task = asyncio.create_task(
            self._read_loop(), name=f"kafka-read-{self.address.node_id}"
        )
        try:
            self.versions = await self._negotiate()
            if self.security.sasl is not None:
                await self._authenticate(self.security.sasl)
        except BaseException:
            await self.close()
            raise

    async def _negotiate(self) -> NegotiatedVersions:
        body = await self.request(
            ApiVersionsRequestV3(
                client_software_name="replicad", client_software_version=__version__
            )
        )
        if body.error_code == ErrorCode.unsupported_version:
            # An old broker answers in v0's layout; ask again in v0.
            body = await self.request(ApiVersionsRequestV0())
        if body.error_code != ErrorCode.none:
            raise RemoteProtocolError(f"ApiVersions failed: {ErrorCode(body.error_code).name}")
        ranges = {
            int(k.api_key): VersionRange(int(k.min_version), int(k.max_version))
            for k in body.api_keys
        }
        return negotiate(ranges)

    async def _authenticate(self, credentials: SaslCredentials) -> None:
        """SaslHandshake + SaslAuthenticate rounds (replicad.protocol.security.SaslClient)."""
        assert self.versions is not None
        exchange = SaslClient(credentials, self.versions, broker=str(self.address))
        step = SaslStep(exchange.start())
        while step.request is not None:
            step = exchange.receive(await self.request(step.request))
        if step.session_lifetime_ms > 0:
            # Kafka closes a connection whose session expired at its next request. Rather
            # than re-authenticate in band, the connection reads as closed a little before,
            # so its owner opens a fresh one between requests, not after a failed one.
            self._expires_at = time.monotonic() + (
                step.session_lifetime_ms * SESSION_LIFETIME_USED / 1000
            )

    async def request(
        self, request: Any, *, timeout_s: float | None = None, hold: bool = False
    ) -> Any:
        """Send a kio request entity and wait for its decoded response body.

        hold=True: the response's memory reservation (see `reserve`) stays taken and the
        result is a HeldResponse; the caller must call its `release()`."""
        if not self.is_open:
            raise KafkaConnectionError(f"connection to {self.address} is closed") from (
                self._closed_reason
            )
        assert self._writer is not None
        correlation_id = next(self._correlation) & 0x7FFFFFFF
        response_cls = response_type(request.__api_key__, request.__version__)
        frame = encode_request(request, correlation_id=correlation_id, client_id=self.client_id)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = _Pending(response_cls, future, hold)
        try:
            self._writer.write(frame)
            self.bytes_sent += len(frame)
            await self._writer.drain()
        except OSError as exc:
            self._pending.pop(correlation_id, None)
            if self._closed_reason is not None:
                # The read side failed first and knows why (e.g. a TLS alert): report that.
                raise self._closed_reason from exc
            await self._fail(KafkaConnectionError(f"send to {self.address} failed: {exc}"))
            raise KafkaConnectionError(f"send to {self.address} failed: {exc}") from exc
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError as exc:
            err = RequestTimeoutError(
                f"no response from {self.address} within {timeout:.1f}s "
                f"(api {request.__api_key__} v{request.__version__})"
            )
            await self._fail(err)
            raise err from exc

    async def _read_loop(self) -> None:
        assert self._reader is not None
        reader = self._reader
        try:
            while True:
                prefix = await reader.readexactly(SIZE.size)
                size = frame_size(prefix)
                release = await self._reserve(size) if self._reserve else _no_release
                handed_over = False
                try:
                    frame = await reader.readexactly(size)
                    self.bytes_received += size + SIZE.size
                    handed_over = self._dispatch(frame, release)
                finally:
                    if not handed_over:
                        release()
        except asyncio.IncompleteReadError:
            await self._fail(KafkaConnectionError(f"{self.address} closed the connection"))
        except ssl.SSLError as exc:
            await self._fail(self.security.read_failure(str(self.address), exc))
        except PoolTooSmallError as exc:
            await self._fail(ResponseTooLargeError(f"{self.address}: {exc}"))
        except (OSError, RemoteProtocolError) as exc:
            reason: BaseException = exc
            if isinstance(exc, OSError):
                reset = (
                    self.security.reset_failure(str(self.address), exc)
                    if self.versions is None  # still negotiating: nothing was answered yet
                    else None
                )
                reason = reset or KafkaConnectionError(f"read from {self.address} failed: {exc}")
            await self._fail(reason)
        except asyncio.CancelledError:
            raise

    def _dispatch(self, frame: bytes, release: Callable[[], None]) -> bool:
        """Complete the waiting request; True if its caller now owns `release`."""
        correlation_id = peek_correlation_id(frame)
        pending = self._pending.pop(correlation_id, None)
        if pending is None:
            raise RemoteProtocolError(
                f"{self.address} answered unknown correlation id {correlation_id}"
            )
        try:
            try:
                decoded = decode_response(frame, pending.response_cls)
            except RemoteProtocolError:
                # A broker that lacks ApiVersions v3 answers in v0's layout (KIP-511).
                if pending.response_cls is not ApiVersionsResponseV3:
                    raise
                decoded = decode_response(frame, ApiVersionsResponseV0)
        except RemoteProtocolError as exc:
            if not pending.future.done():
                pending.future.set_exception(exc)
            return False
        if pending.future.done():  # the caller gave up (timeout) meanwhile
            return False
        if pending.hold:
            pending.future.set_result(HeldResponse(decoded.body, release))
            return True
        pending.future.set_result(decoded.body)
        return False

    async def _fail(self, reason: BaseException) -> None:
        if self._closed_reason is None:
            self._closed_reason = reason
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            if not entry.future.done():
                entry.future.set_exception(reason)
                # Mark retrieved: a cancelled waiter must not leave "never retrieved" noise.
                entry.future.exception()
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()

    async def close(self) -> None:
        await self._fail(KafkaConnectionError(f"connection to {self.address} closed by us"))
        task, self._read_task = self._read_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
