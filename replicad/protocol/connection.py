"""One TCP connection to one Kafka broker (the asyncio shell of the protocol layer).

Several requests may be in flight; responses come back in request order on a
Kafka connection, but we still match them by correlation id and treat a
mismatch as the peer's protocol error. A request that times out closes the
connection: later responses could no longer be trusted to line up.

Reads: a buffered protocol, not a stream reader. Each frame's size prefix is read
first; the frame's memory is reserved (`reserve`, the KIP-81 pool) and only then is the
socket read again, straight into the buffer the pool lends for it (recv_into a buffer
the pool owns and lends again once released: no allocation per frame) -- the kernel's
copy is the only one, and while the reservation waits the socket is not read at all
(TCP backpressure reaches the leader). Without a pool, each frame gets its own buffer.
A request may bring its own `decode` for the raw frame (the follower scans Fetch
responses in place, as memoryviews of that buffer); every other response is decoded by
kio (codec.decode_response).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from kio.schema.api_versions.v3.request import ApiVersionsRequest as ApiVersionsRequestV3
from kio.schema.api_versions.v3.response import ApiVersionsResponse as ApiVersionsResponseV3
from kio.schema.errors import ErrorCode

from replicad import __version__
from replicad.clock import monotonic_ms
from replicad.errors import (
    KafkaConnectionError,
    RemoteProtocolError,
    RequestTimeoutError,
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
    is_ssl_error,
)
from replicad.ratelimit import RateLimitedLog

log = structlog.get_logger("replicad.connection")
# One warning a minute per response type that carried error codes newer than ours.
_unknown_codes_said = RateLimitedLog(interval_ms=60_000)

# The share of a SASL session's lifetime (KIP-368) a connection is used for; Kafka's own
# client re-authenticates at 85-95% of it.
SESSION_LIFETIME_USED = 0.85

# What a frame written by parts (`BrokerConnection.send_frame`) is made of.
Buffer = bytes | bytearray | memoryview


def _no_release() -> None:
    return None


def _release_if_held(future: asyncio.Future[Any]) -> None:
    """A held response whose waiter is gone: give its memory back."""
    if not future.cancelled() and future.exception() is None:
        result = future.result()
        if isinstance(result, HeldResponse):
            result.release()


class Lent(Protocol):
    """A buffer lent for one frame (follower/memory_pool.Lease): `buffer` is exactly the
    frame's size; calling it gives the buffer back."""

    buffer: memoryview

    def __call__(self) -> None: ...


# Called with a response's size before its body is read; the returned awaitable
# resolves when the bytes may be held (KIP-81 memory pool), with the buffer to read the
# frame into and its release.
Reserve = Callable[[int], Awaitable[Lent]]


# Decodes a whole response frame (correlation id first, size prefix removed) into the
# body the caller gets; bad bytes raise RemoteProtocolError.
RawDecoder = Callable[[memoryview], Any]


@dataclass(slots=True)
class _Pending:
    response_cls: type
    future: asyncio.Future[Any]
    hold: bool = False
    decode: RawDecoder | None = None


class HeldResponse:
    """A response whose memory reservation the caller releases when done with it.

    `release()` drops the body before it gives the memory back, so the response holds no
    view of a buffer the pool may free or lend again: whoever still holds this object
    after the release holds nothing of the frame. Someone always does for a moment: the
    event loop's handle that resumed the task awaiting this response keeps the response's
    own task (whose result this is) until that step of the task ends, and the release
    happens inside that step. With the body kept, a pool buffer freed in that release (to
    make room for a waiter's larger one) was still held beside its replacement: issue 32's
    transient over `fetch.buffer_memory` at 10,000 partitions (77 MiB counted as
    `freed_in_use`)."""

    __slots__ = ("_release", "body")

    def __init__(self, body: Any, release: Callable[[], None]) -> None:
        self.body = body
        self._release = release

    def release(self) -> None:
        """Drop the body, then give the memory back; a second call does nothing."""
        self.body = None
        release, self._release = self._release, _no_release
        release()


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    node_id: int
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port} (node {self.node_id})"


class _FrameReader(asyncio.BufferedProtocol):
    """The socket side of one connection: size prefix, reservation, frame body, in turn.

    The transport fills the buffer `get_buffer` offers: 4 bytes for the prefix, then the
    whole frame's own buffer. Between the two, reading is paused until the frame's memory
    is reserved. Anything a peer's bytes make go wrong closes the connection with that
    reason; nothing raises into the transport."""

    def __init__(
        self,
        *,
        on_frame: Callable[[memoryview, Callable[[], None]], None],
        reserve: Reserve | None,
        address: str,
    ) -> None:
        self._on_frame = on_frame
        self._reserve = reserve
        self._address = address
        self._prefix = bytearray(SIZE.size)
        self._view = memoryview(self._prefix)
        self._in_frame = False
        self._filled = 0
        self._release: Callable[[], None] = _no_release
        self._transport: asyncio.BaseTransport | None = None
        self._waiting: asyncio.Future[None] | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.bytes_received = 0
        # Why the connection ended: a local verdict on the peer's bytes, or the transport's.
        self.failure: BaseException | None = None
        self.lost: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    # -- asyncio.BufferedProtocol --------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._filled < len(self._view):
            return
        try:
            if not self._in_frame:
                self._prefix_read()
            else:
                self._frame_read()
        except Exception as exc:  # the peer's bytes, or a dispatch failure: end here
            self.fail(exc)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiting is not None:
            self._waiting.cancel()
        self._give_back()
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()
        if not self.lost.done():
            self.lost.set_result(self.failure or exc)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

    # -- frames ---------------------------------------------------------------

    def _prefix_read(self) -> None:
        size = frame_size(self._prefix)
        if self._reserve is None:
            self._start_frame(memoryview(bytearray(size)), _no_release)
            return
        assert self._transport is not None
        self._transport.pause_reading()  # type: ignore[attr-defined]
        self._waiting = asyncio.ensure_future(self._reserve_then_read(size))

    async def _reserve_then_read(self, size: int) -> None:
        assert self._reserve is not None and self._transport is not None
        try:
            lease = await self._reserve(size)
        finally:
            self._waiting = None
        if self.lost.done() or self._transport.is_closing():
            lease()
            return
        self._start_frame(lease.buffer, lease)
        self._transport.resume_reading()  # type: ignore[attr-defined]

    def _start_frame(self, buffer: memoryview, release: Callable[[], None]) -> None:
        self._in_frame = True
        self._view = buffer
        self._filled = 0
        self._release = release

    def _frame_read(self) -> None:
        frame, release = self._view, self._release
        self.bytes_received += len(frame) + SIZE.size
        self._in_frame, self._release = False, _no_release
        self._view = memoryview(self._prefix)
        self._filled = 0
        self._on_frame(frame, release)

    def _give_back(self) -> None:
        release, self._release = self._release, _no_release
        release()

    # -- writing ----------------------------------------------------------------

    async def drain(self) -> None:
        if self.lost.done():
            raise ConnectionResetError("connection lost")
        if not self._write_paused:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        await waiter
        if self.lost.done():
            raise ConnectionResetError("connection lost")

    def fail(self, reason: BaseException) -> None:
        """End the connection because of `reason` (kept as the reason it was lost)."""
        if self.failure is None:
            self.failure = reason
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        elif self._transport is None and not self.lost.done():
            self.lost.set_result(reason)


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
        self._expires_at_ms: int | None = None
        self.client_id = client_id
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self._reserve = reserve
        self._transport: asyncio.Transport | None = None
        self._protocol: _FrameReader | None = None
        self._pending: dict[int, _Pending] = {}
        self._correlation = itertools.count(1)
        self._watch_task: asyncio.Task[None] | None = None
        self._closed_reason: BaseException | None = None
        self.versions: NegotiatedVersions | None = None
        self.bytes_sent = 0
        # Error codes in this connection's responses that this version does not know.
        self.unknown_error_codes = 0

    @property
    def bytes_received(self) -> int:
        return self._protocol.bytes_received if self._protocol is not None else 0

    @property
    def is_open(self) -> bool:
        if self._expires_at_ms is not None and monotonic_ms() >= self._expires_at_ms:
            return False
        return self._transport is not None and self._closed_reason is None

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._transport, self._protocol = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _FrameReader(
                        on_frame=self._dispatch,
                        reserve=self._reserve,
                        address=str(self.address),
                    ),
                    self.address.host,
                    self.address.port,
                    **self.security.open_options(self.address.host, self.connect_timeout_s),
                ),
                self.connect_timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            raise self.security.connect_failure(str(self.address), exc) from exc
        self._watch_task = asyncio.create_task(
            self._watch(self._protocol), name=f"kafka-read-{self.address.node_id}"
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
            from kio.schema.api_versions.v0.request import ApiVersionsRequest as RequestV0

            body = await self.request(RequestV0())
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
            self._expires_at_ms = monotonic_ms() + int(
                step.session_lifetime_ms * SESSION_LIFETIME_USED
            )

    async def request(
        self,
        request: Any,
        *,
        timeout_s: float | None = None,
        hold: bool = False,
        decode: RawDecoder | None = None,
    ) -> Any:
        """Send a kio request entity and wait for its decoded response body.

        hold=True: the response's memory reservation (see `reserve`) stays taken and the
        result is a HeldResponse; the caller must call its `release()`.
        decode: reads the raw response frame instead of kio; its result may hold views
        of the frame's buffer. Held, they may be read until the release, and none may be
        kept past it: the pool lends the buffer again, or frees it (a view kept alive
        then is memory over the pool's bound)."""
        return await self.send(request, timeout_s=timeout_s, hold=hold, decode=decode)

    def send(
        self,
        request: Any,
        *,
        timeout_s: float | None = None,
        hold: bool = False,
        decode: RawDecoder | None = None,
    ) -> asyncio.Future[Any]:
        """`request`, split: the request is written to the socket now, before this
        returns; the result resolves with its response (as `request` would return it).
        Cancelling the result leaves nothing held: a held response that arrives anyway
        is released."""

        def frame(correlation_id: int) -> Sequence[Buffer]:
            return (
                encode_request(request, correlation_id=correlation_id, client_id=self.client_id),
            )

        return self.send_frame(
            request.__api_key__,
            request.__version__,
            frame,
            timeout_s=timeout_s,
            hold=hold,
            decode=decode,
        )

    def send_frame(
        self,
        api_key: int,
        version: int,
        frame: Callable[[int], Sequence[Buffer]],
        *,
        timeout_s: float | None = None,
        hold: bool = False,
        decode: RawDecoder | None = None,
    ) -> asyncio.Future[Any]:
        """As `send`, for a request the caller encodes itself: `frame(correlation_id)` gives
        the buffers of the whole frame (size prefix included, the client id
        `self.client_id`), written one after the other and never joined, so large parts
        (a Produce's batches, replicad/mirror/produce_frame.py) reach the socket without a
        copy while it takes them."""
        if not self.is_open:
            failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            error = KafkaConnectionError(f"connection to {self.address} is closed")
            error.__cause__ = self._closed_reason
            failed.set_exception(error)
            return failed
        assert self._transport is not None and self._protocol is not None
        correlation_id = next(self._correlation) & 0x7FFFFFFF
        response_cls = response_type(api_key, version)
        parts = frame(correlation_id)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = _Pending(response_cls, future, hold, decode)
        write = self._transport.write
        for part in parts:
            write(part)
            self.bytes_sent += len(part)
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        what = f"api {api_key} v{version}"
        return asyncio.ensure_future(self._response(correlation_id, future, timeout, what))

    async def _response(
        self, correlation_id: int, future: asyncio.Future[Any], timeout: float, what: str
    ) -> Any:
        assert self._protocol is not None
        try:
            await self._protocol.drain()
        except OSError as exc:
            self._pending.pop(correlation_id, None)
            if self._closed_reason is not None:
                # The read side failed first and knows why (e.g. a TLS alert): report that.
                raise self._closed_reason from exc
            await self._fail(KafkaConnectionError(f"send to {self.address} failed: {exc}"))
            raise KafkaConnectionError(f"send to {self.address} failed: {exc}") from exc
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError as exc:
            err = RequestTimeoutError(
                f"no response from {self.address} within {timeout:.1f}s ({what})"
            )
            await self._fail(err)
            raise err from exc
        except asyncio.CancelledError:
            future.add_done_callback(_release_if_held)
            raise

    async def _watch(self, protocol: _FrameReader) -> None:
        """Wait for the connection to end and fail what is pending with the reason."""
        reason = await protocol.lost
        await self._fail(self._failure_for(reason))

    def _failure_for(self, reason: BaseException | None) -> BaseException:
        if reason is None:
            return KafkaConnectionError(f"{self.address} closed the connection")
        if is_ssl_error(reason):
            return self.security.read_failure(str(self.address), reason)
        if isinstance(reason, (KafkaConnectionError, RemoteProtocolError)):
            return reason
        if isinstance(reason, OSError):
            reset = (
                self.security.reset_failure(str(self.address), reason)
                if self.versions is None  # still negotiating: nothing was answered yet
                else None
            )
            return reset or KafkaConnectionError(f"read from {self.address} failed: {reason}")
        return KafkaConnectionError(f"read from {self.address} failed: {reason!r}")

    def _dispatch(self, frame: memoryview, release: Callable[[], None]) -> None:
        """Complete the waiting request; its caller owns `release` if it holds the response."""
        handed_over = False
        try:
            handed_over = self._deliver(frame, release)
        finally:
            if not handed_over:
                release()

    def _deliver(self, frame: memoryview, release: Callable[[], None]) -> bool:
        # kio reads read-only buffers only, and copies what it keeps: a response not held
        # is released (its pool buffer lent again) right after it is decoded.
        view = frame.toreadonly()
        correlation_id = peek_correlation_id(view)
        pending = self._pending.pop(correlation_id, None)
        if pending is None:
            raise RemoteProtocolError(
                f"{self.address} answered unknown correlation id {correlation_id}"
            )
        try:
            body = self._decode(view, pending)
        except RemoteProtocolError as exc:
            if not pending.future.done():
                pending.future.set_exception(exc)
            return False
        if pending.future.done():  # the caller gave up (timeout) meanwhile
            return False
        if pending.hold:
            pending.future.set_result(HeldResponse(body, release))
            return True
        pending.future.set_result(body)
        return False

    def _decode(self, view: memoryview, pending: _Pending) -> Any:
        if pending.decode is not None:
            try:
                return pending.decode(view)
            except RemoteProtocolError:
                raise
            except Exception as exc:  # a decoder's bug must not pass for a closed socket
                raise RemoteProtocolError(f"undecodable response: {exc!r}") from exc
        try:
            decoded = decode_response(view, pending.response_cls)
        except RemoteProtocolError:
            # A broker that lacks ApiVersions v3 answers in v0's layout (KIP-511).
            if pending.response_cls is not ApiVersionsResponseV3:
                raise
            # Imported only here: kio's v0 classes cost every start about 10 ms to make.
            from kio.schema.api_versions.v0.response import ApiVersionsResponse as ResponseV0

            decoded = decode_response(view, ResponseV0)
        if decoded.unknown_error_codes:
            self._note_unknown_error_codes(pending.response_cls, decoded.unknown_error_codes)
        return decoded.body

    def _note_unknown_error_codes(self, response_cls: type, codes: tuple[int, ...]) -> None:
        """A broker newer than us: each code was read as UNKNOWN_SERVER_ERROR where it
        stood, and is handled there (the partition or request it belongs to)."""
        self.unknown_error_codes += len(codes)
        name = f"{response_cls.__name__} v{response_cls.__version__}"
        emit = _unknown_codes_said.should_emit(name, monotonic_ms())
        if emit.emit:
            log.warning(
                "error code unknown to this version, read as UNKNOWN_SERVER_ERROR",
                broker=str(self.address),
                response=name,
                codes=sorted(set(codes))[:10],
                repeats_suppressed=emit.suppressed,
            )

    async def _fail(self, reason: BaseException) -> None:
        if self._closed_reason is None:
            self._closed_reason = reason
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            if not entry.future.done():
                entry.future.set_exception(reason)
                # Mark retrieved: a cancelled waiter must not leave "never retrieved" noise.
                entry.future.exception()
        protocol = self._protocol
        if protocol is not None:
            protocol.fail(reason)
            with contextlib.suppress(Exception):
                await asyncio.shield(protocol.lost)

    async def close(self) -> None:
        await self._fail(KafkaConnectionError(f"connection to {self.address} closed by us"))
        task, self._watch_task = self._watch_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
