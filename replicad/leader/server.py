"""`replicad serve`: the asyncio Kafka-protocol server over the local log (the shell).

Rules:
- One task per connection reads a request, answers it, then reads the next: requests on a
  connection are answered one at a time and in order, as Kafka does (it mutes a channel
  while a request is in flight). A waiting Fetch (long-poll) holds its connection only.
- Decoding is frames.py's, deciding is fetch.py's / handlers.py's; this module waits and
  writes. A frame larger than request_limits.py allows (at most `max_request_bytes`),
  undecodable bytes, a request naming more than request_limits.py allows, or an
  API/version no codec can answer closes the connection; anything else gets an answer.
- No connection holds the loop: once a connection has held it for `TURN_MS` (answering
  requests it had buffered, which never waits), it yields to the loop before it reads the
  next, so a client pipelining requests takes turns with the others; one request is the
  most a turn overruns by. Frames larger than `DECODE_INLINE_BYTES` are decoded on a
  worker thread of their own (one at a time, whoever sent them).
- Memory and time a client can take are bounded (Kafka's knobs, ServeSettings): a frame
  over 64 KiB takes its size from the request memory pool (request_pool.py) before it is
  read, and gives it back once answered; the rest of a frame must arrive within
  `request_frame_timeout_ms` of its size; a connection sending no request for
  `connections_max_idle_ms` is closed, and one on a SASL listener that has not
  authenticated within `authentication_timeout_ms` (the TLS handshake has as long, at
  most 60 s).
- Connections beyond `max_connections` (held below the open-file limit, with room for the
  log's files) or `max_connections_per_ip` are closed the moment they are accepted, before
  anything is made for them (listener.py: serve accepts itself, so a flood never holds more
  descriptors than the admitted connections); accept() failing for want of descriptors is
  one rate-limited line, never a traceback per attempt.
- Quotas (off unless `request_quota_percentage` is set; quotas.py): the loop's CPU time a
  request took to decode and answer (never its waits) is charged to its client address;
  over the quota, the answer carries throttle_time_ms (where the response's first field
  is throttle_time_ms) and the connection is not read again until it has passed.
- The loop never waits on the disk. What it reads itself it reads only from the page
  cache (log/nowait.py: preadv2's RWF_NOWAIT, where the file system takes it): a Fetch's
  lookup of the batches it sends (one header pread a partition) and its small regions'
  bytes are read on the loop when all are cached, else all of the read on a worker thread
  in one hop (reads.py: nothing is kept of the try); a READ_COMMITTED partition's
  transaction fold (a Fetch's plan, a ListOffsets) stops where its bytes are not cached,
  has them read ahead on a worker thread, and goes on (`_without_waiting`). On worker
  threads always: a down-conversion, a ListOffsets that searches by timestamp (the time
  index and batches) or, v0, reads the segments' timestamps (handlers.py resolves the
  partitions on the loop, then answers them on the thread). A region sent by sendfile
  (the kernel reads it on the loop's thread) is read into the page cache on a worker
  thread first unless all its pages are there (nowait.all_cached: cachestat). The fold
  of a partition read from the archive (remote_fetch.py: the batches appended since its
  plan folded it) goes through `_without_waiting` too.
- Authentication: SASL steps run on a thread of their own (PLAIN hashes the password with
  PBKDF2), one at a time; a failed one is answered `failed_authentication_delay_ms` later.
- What clients do wrong is a `ServeEvent` (events.py): counted, logged at a limited rate,
  never with a traceback unless the fault is ours. Nothing is keyed by values a client
  chose: requests are counted per API and version served, the rest under one label.
- Writing a response: its size prefix, then its parts in order. On a plaintext
  connection a response with file regions (a Fetch's records) goes straight on the
  socket once the transport has written all it holds: its bytes by writev, each region by
  sendfile from its segment, the socket corked meanwhile (direct_send.py: Kafka's
  transferTo). Elsewhere (TLS, which encrypts in the process) its parts go through the
  transport: a file region by `loop.sendfile`, which first waits for the transport's
  buffer to drain and pauses reading while the kernel copies the file, so it never
  interleaves with buffered writes; file regions up to `SMALL_REGION_BYTES` are read
  instead (on the loop from the page cache, or many in one hop to a worker thread) and
  written with the bytes around them. A lazy down-conversion is converted a chunk at a
  time off the event loop and written with flow control (drain), so at most a chunk and
  the transport's buffer are held. If a segment shrank or vanished before it was sent,
  the bytes still owed are an overflow entry (KIP-283's trailing partial message): the
  frame stays the size it announced and the client drops the partial entry.
- Security (`ServerSecurity`, see leader/security.py for its rules): with TLS the listener
  speaks TLS only, started per connection so that a failed handshake is logged (info, as
  Kafka does) and counted. A connection holds no TLS state until its client has sent
  something (its ClientHello), and at most `TLS_HANDSHAKES_AT_ONCE` handshakes run at once
  (each holds asyncio's 256 KiB read buffer and OpenSSL's state); the others wait, paused,
  within the same handshake deadline. So clients that never finish a handshake cost their
  sockets, not 300 KB each. A connection's principal is its verified client certificate's
  DN, or ANONYMOUS, until SASL names it. On a SASL listener the connection answers ApiVersions,
  SaslHandshake and SaslAuthenticate through its `SaslServer` until it has authenticated;
  any other request before that, and a failed authentication (after its answer), close the
  connection. Whether a Fetch claiming a replica id may follow is decided per connection,
  once its principal is known. Without security none of this runs: one check per request.
- `partition_changed(tp)` (the follower calls it after every append, truncation, high
  watermark move or removal; on the event loop, or from another thread, which is handed
  over to the loop) updates the catalog and the session cache and wakes the waiting
  fetches that read `tp`, directly or through their session.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import os
import random
import resource
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import structlog
from kio.index import UnknownAPIKey, UnknownEntity
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map

from replicad.clock import monotonic_ms, wall_ms
from replicad.config.model import SaslMechanism, ServeSecurityConfig
from replicad.errors import RemoteProtocolError
from replicad.groups.coordinator import CoordinatorConfig
from replicad.leader import direct_send, group_wire, handlers, legacy_codec
from replicad.leader.assemble import assemble
from replicad.leader.catalog import Catalog
from replicad.leader.events import ServeEvent, ServeEvents
from replicad.leader.fetch import (
    FetchHandling,
    FetchRound,
    Role,
    legacy_fetch_request,
)
from replicad.leader.fetch_response import fetch_response_frame
from replicad.leader.frames import (
    Part,
    ResponseFrame,
    encode_response,
    raw_response,
    response_header_v0,
    with_throttle_time,
)
from replicad.leader.group_wire import CONSUMER_PROTOCOL_VERSIONS, GROUP_VERSIONS, Node
from replicad.leader.groups import GroupService
from replicad.leader.listener import Listener, bind_listening
from replicad.leader.quotas import RequestQuota
from replicad.leader.reads import FoldWouldWait, TransactionTracker
from replicad.leader.refusals import READ_ONLY_MESSAGE, error_response
from replicad.leader.remote_fetch import RemoteFetch, hold_for_request
from replicad.leader.request_limits import (
    count_elements,
    plausible_elements,
    plausible_frame_bytes,
)
from replicad.leader.request_pool import RequestMemoryPool
from replicad.leader.security import (
    ANONYMOUS,
    SASL_APIS,
    Admission,
    Principal,
    SaslServer,
    ServerSecurity,
    tls_principal,
)
from replicad.leader.settings import ServeSettings
from replicad.leader.topic_configs import TopicConfigs, describe_configs_response
from replicad.log.config import LogConfig
from replicad.log.manager import LogManager
from replicad.log.nowait import WouldWait, all_cached, not_waiting, read_into_cache
from replicad.log.segment import FileRegion
from replicad.protocol.apis import ApiKey, VersionRange
from replicad.protocol.codec import (
    SIZE,
    DecodedRequest,
    RequestHead,
    decode_request,
    peek_request_head,
    request_type,
    response_header,
    response_type,
)
from replicad.protocol.fetch_request import read_fetch_request
from replicad.records.downconvert import LazyDownConversion, overflow_entry
from replicad.session.cache import ContextKind, FetchSessionCache
from replicad.session.metadata import INVALID_SESSION_ID
from replicad.startup import LoopSignals
from replicad.types import TopicPartition

log = structlog.get_logger("replicad.leader")

ACKS_NONE = 0
# asyncio's own StreamReader buffer limit (start_server's default).
STREAM_LIMIT = 64 * 1024
# How long a client has for its TLS handshake (asyncio's default).
TLS_HANDSHAKE_S = 60.0
# TLS handshakes in progress at once (see the rules): a handshake holds ~300 KB (asyncio's
# read buffer, OpenSSL's state) until it ends; a real client's takes milliseconds.
TLS_HANDSHAKES_AT_ONCE = 64
# DescribeConfigs for topics, with the source's configs (Kafka 4 answers v1 and up).
DESCRIBE_CONFIGS_VERSIONS = VersionRange(1, 4)
# Kafka's sasl.server.max.receive.size: the largest frame read before authentication.
SASL_MAX_RECEIVE_BYTES = 512 * 1024
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
# Frames up to this size are decoded on the loop (kio: well under a millisecond); larger
# ones on the decoding thread.
DECODE_INLINE_BYTES = 64 * 1024
# File regions (a partition's records) up to this size are read on a worker thread, several
# in one hop, and written with the response's other bytes; larger ones go by sendfile. A
# sendfile costs a drain, an open and a few turns of the loop each: for a Fetch of many
# small partitions that was most of the response's time.
SMALL_REGION_BYTES = 64 * 1024
# The most region bytes one hop reads (each batch is written before the next is read).
READ_AHEAD_BYTES = 1024 * 1024
# How long a closed connection waits for its transport to say so.
CLOSE_WAIT_S = 1.0
# Descriptors kept free of connections, beside the log's own (log.max_open_files): for the
# control socket, the metrics listener, sendfile's opens and the follower's connections.
FD_RESERVE = 256
# How long a connection answers buffered requests before the others get a turn: short
# enough that a few pipelining clients add milliseconds to anyone's round trip, long
# enough that a pipelining client is not slowed to one request per turn of the loop.
TURN_MS = 5
# Requests counted under one label whatever API or version they claimed (see the rules).
UNSUPPORTED_LABEL = "unsupported"

T = TypeVar("T")


class _Close(Exception):
    """The connection must be closed instead of answered (reason in the message)."""


class _Closed(Exception):
    """The connection must be closed; what happened has been logged and counted."""


class _Refused(Exception):
    """The connection must be closed for `event` (a ServeEvent), noted by the caller."""

    def __init__(self, event: ServeEvent, **fields: Any) -> None:
        super().__init__(event.message)
        self.event = event
        self.fields = fields


async def _readable(writer: asyncio.StreamWriter) -> None:
    """Wait until the client has sent something (or closed), reading nothing: its paused
    transport has left the selector, so a duplicate of its descriptor is watched (the
    transport's own cannot be registered twice). Without a spare descriptor, return at
    once: the handshake then starts as it would have."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    loop = asyncio.get_running_loop()
    try:
        fd = os.dup(sock.fileno())
    except OSError:
        return
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    try:
        loop.add_reader(fd, wake)
        try:
            await ready
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


class _PausedUntilTls(asyncio.StreamReaderProtocol):
    """A connection of a TLS listener: nothing is read before its TLS starts, so the
    client's first bytes (its ClientHello) go to TLS, not to the plaintext stream."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.ReadTransport)
        transport.pause_reading()
        # Python 3.11.2 (Debian 12's python3) starts reading right after connection_made()
        # even when it paused: its transport adds its reader unconditionally (later 3.11s
        # check is_reading() first). The ClientHello then went to the plaintext stream and
        # every handshake timed out. Pausing again once that reader is in place removes it,
        # and cancels a read of it already queued: the loop runs this before the
        # connection's task and before any read the next select() finds.
        asyncio.get_running_loop().call_soon(_pause_again, transport)
        super().connection_made(transport)


def _pause_again(transport: asyncio.ReadTransport) -> None:
    if not transport.is_closing():
        transport.resume_reading()
        transport.pause_reading()


@dataclasses.dataclass(slots=True)
class _Peer:
    """Who is at the other end of one connection, as far as the server knows yet."""

    address: str
    principal: Principal
    # The replica ids this connection's Fetch may claim as a follower ...
    allowed_followers: frozenset[int]
    # ... and whether its principal may claim one at all (else TOPIC_AUTHORIZATION_FAILED).
    follower_authorized: bool = True
    # The SASL exchange still to go (None: no SASL on this listener).
    sasl: SaslServer | None = None
    told_unauthorized: bool = False
    # When (monotonic_ms) a SASL listener's connection must have authenticated by.
    authenticate_by_ms: int | None = None
    # The client's address without its port: what connection limits and quotas count by.
    ip: str = ""

    @property
    def authenticating(self) -> bool:
        return self.sasl is not None and not self.sasl.done


class LeaderServer:
    """The Kafka-protocol server over `logs`; see the module docstring."""

    def __init__(
        self,
        logs: LogManager,
        settings: ServeSettings,
        *,
        node_id: int = 0,
        allowed_followers: frozenset[int] = frozenset(),
        security: ServerSecurity | None = None,
        now_ms: Callable[[], int] = monotonic_ms,
        rng: random.Random | None = None,
        read_only_groups: Callable[[str], bool] | None = None,
        group_config: CoordinatorConfig | None = None,
        consumer_group_protocol: bool = True,
        remote: RemoteFetch | None = None,
    ) -> None:
        self.settings = settings
        # Offsets below the local log start read from the archive's bucket (remote_fetch.py).
        self.remote = remote
        self.node_id = node_id
        self.allowed_followers = frozenset(allowed_followers)
        self.security = security
        # What is served, and what ApiVersions answers: a SASL listener adds the SASL APIs.
        self._served = {
            **handlers.SUPPORTED_VERSIONS,
            **GROUP_VERSIONS,
            # KIP-848: ConsumerGroupHeartbeat and ConsumerGroupDescribe only when asked for
            # (groups.consumer_protocol; ApiVersions names only what is answered).
            **(CONSUMER_PROTOCOL_VERSIONS if consumer_group_protocol else {}),
            ApiKey.DESCRIBE_CONFIGS: DESCRIBE_CONFIGS_VERSIONS,
        }
        self._supported = (
            {**self._served, **handlers.SASL_VERSIONS}
            if security is not None and security.mechanisms
            else self._served
        )
        self._now_ms = now_ms
        rng = rng if rng is not None else random.Random()
        self.catalog = Catalog(logs, rng=rng)
        self.cache = FetchSessionCache(
            rng=rng,
            max_slots=settings.max_session_slots,
            eviction_ms=settings.session_eviction_ms,
        )
        self.transactions = TransactionTracker()
        self.groups = GroupService(
            self.catalog,
            self._coordinator_node,
            store_dir=logs.data_dir,
            read_only=read_only_groups,
            config=group_config,
        )
        self._cluster_id = handlers.cluster_id_for(logs.data_dir.resolve())
        # The source's topic configs, for DescribeConfigs (leader/topic_configs.py).
        self.topic_configs = TopicConfigs(logs.data_dir)
        self._listener: Listener | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._partition_waiters: dict[TopicPartition, set[asyncio.Future[None]]] = {}
        self._session_waiters: dict[int, set[asyncio.Future[None]]] = {}
        self.port = 0
        self._host = settings.host
        self.requests: Counter[str] = Counter()
        self.counters: Counter[str] = Counter()
        self.events = ServeEvents(self.counters, now_ms=now_ms)
        # One thread decodes large frames, so a flood of them queues there instead of
        # multiplying the threads that contend with the loop for the GIL.
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="serve-decode")
        # SASL steps (PLAIN's PBKDF2) on one thread: guessing costs a core at most.
        self._authenticator = ThreadPoolExecutor(max_workers=1, thread_name_prefix="serve-sasl")
        self.pool = RequestMemoryPool(settings.queued_max_request_bytes)
        if remote is not None:
            remote.pool = self.pool  # what a read of the bucket holds is charged to it
        percentage = settings.request_quota_percentage
        self.quota = RequestQuota(percentage) if percentage else None
        self.max_connections = settings.max_connections
        self._per_ip: Counter[str] = Counter()
        self._log_files = logs.config.max_open_files
        self._previous_exception_handler: Any = None
        self._handshakes = asyncio.Semaphore(TLS_HANDSHAKES_AT_ONCE)
        self._handshaking = 0  # connections holding TLS state before their handshake ended
        # Plaintext responses with file regions go straight on the socket (direct_send.py).
        self._direct = direct_send.available()

    # -- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.max_connections = self._connection_limit()
        self._previous_exception_handler = self._loop.get_exception_handler()
        self._loop.set_exception_handler(self._loop_exception)
        # serve accepts itself: a connection over the limits is closed the moment it is
        # accepted (see listener.py's rules).
        self._listener = Listener(
            await asyncio.to_thread(bind_listening, self.settings.host, self.settings.port),
            admit=lambda peer: self._admit(peer[0], str(peer)),
            connected=self._connected,
            failed=self._accept_failed,
        )
        self._listener.start()
        self._host, self.port = self._listener.host, self._listener.port
        await self.groups.start()
        await asyncio.to_thread(self.topic_configs.load)
        security: dict[str, Any] = {}
        if self.security is not None:
            security = {
                "security_protocol": self.security.protocol,
                "sasl_mechanisms": [m.wire_name for m in self.security.mechanisms],
                "client_auth": str(self.security.client_auth),
            }
            if self.security.followers is not None:
                security["follower_principals"] = sorted(
                    str(p) for p in self.security.followers.follower_principals
                )
        if (
            self.security is not None
            and self.security.tls is None
            and SaslMechanism.PLAIN in self.security.mechanisms
        ):
            log.warning(
                "SASL PLAIN without TLS: clients send their passwords in clear text; "
                "give serve.security.tls.cert_file, or serve SCRAM only",
                setting="serve.security.sasl.mechanisms",
            )
        log.info(
            "serving the replica over the Kafka protocol",
            listen=f"{self._host}:{self.port}",
            advertised=f"{self.advertised[0]}:{self.advertised[1]}",
            node_id=self.node_id,
            allowed_followers=sorted(self.allowed_followers),
            **security,
        )

    async def close(self) -> None:
        await self.groups.close()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._decoder.shutdown(wait=False, cancel_futures=True)
        self._authenticator.shutdown(wait=False, cancel_futures=True)
        if self.remote is not None:
            self.remote.close()
        if self._loop is not None:
            self._loop.set_exception_handler(self._previous_exception_handler)

    def _connection_limit(self) -> int:
        """max_connections, held below the open-file limit (with room for the log's files
        and FD_RESERVE) so that accept() never runs out of descriptors."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.settings.max_connections
        room = max(soft - self._log_files - FD_RESERVE, soft // 2)
        if room < self.settings.max_connections:
            log.warning(
                "open file limit allows fewer connections than max_connections",
                open_file_limit=soft,
                max_connections=self.settings.max_connections,
                connection_limit=room,
            )
        return min(self.settings.max_connections, room)

    def _accept_failed(self, error: OSError) -> None:
        """accept() failed for want of descriptors or memory (the listener rests a second)."""
        self.events.note(
            ServeEvent.OUT_OF_FILE_DESCRIPTORS, error=str(error), connections=len(self._connections)
        )

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """A cancelled callback is not an error (below); anything else goes where it went
        before."""
        if isinstance(context.get("exception"), asyncio.CancelledError):
            # A connection cancelled while it waited for its transport to close (serve
            # stopping, seen under load in CI): a cancellation, not a failure, and asyncio
            # would log it as an error with a traceback.
            log.debug("callback cancelled", message=str(context.get("message", ""))[:200])
            return
        if self._previous_exception_handler is not None:
            self._previous_exception_handler(loop, context)
        else:
            loop.default_exception_handler(context)

    def _coordinator_node(self) -> Node:
        """Where FindCoordinator sends every group: this node."""
        host, port = self.advertised
        return Node(self.node_id, host, port)

    @property
    def advertised(self) -> tuple[str, int]:
        host = self.settings.advertised_host or self._host
        if host in WILDCARD_HOSTS:
            host = "127.0.0.1"
        return host, self.settings.advertised_port or self.port

    # -- the follower's side ---------------------------------------------------------------

    def partition_changed(self, tp: TopicPartition) -> None:
        """Something a fetch of `tp` reports changed; wakes the fetches waiting on it."""
        loop = self._loop
        if loop is not None and threading.get_ident() != self._loop_thread:
            loop.call_soon_threadsafe(self.partition_changed, tp)
            return
        self.catalog.note_changed(tp)
        self.cache.partition_changed(tp)
        _wake(self._partition_waiters.pop(tp, ()))
        for session_id in self.cache.sessions_holding(tp):
            _wake(self._session_waiters.pop(session_id, ()))

    def metrics(self) -> dict[str, Any]:
        cache = self.cache.metrics()
        return {
            "sessions": cache.num_incremental_fetch_sessions,
            "partitions_cached": cache.num_incremental_fetch_partitions_cached,
            "evictions_total": cache.incremental_fetch_session_evictions,
            "partition_visits_total": cache.partition_visits,
            "connections": len(self._connections),
            "waiting_fetches": sum(len(w) for w in self._partition_waiters.values())
            + sum(len(w) for w in self._session_waiters.values()),
            "requests_total": dict(self.requests),
            "request_pool_used_bytes": self.pool.account.used,
            "request_pool_waits_total": self.pool.account.waits,
            "tls_handshakes_in_progress": self._handshaking,
            **self.groups.metrics(),
            **dict(self.counters),
            **(self.remote.metrics() if self.remote is not None else {}),
        }

    # -- connections -----------------------------------------------------------------------

    def _connected(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        """An admitted connection: its slot is counted from now on, until its task ends."""
        assert self._loop is not None
        task = self._loop.create_task(self._connection(conn, peer))
        self._connections.add(task)
        self._per_ip[peer[0]] += 1
        task.add_done_callback(lambda done: self._release(done, peer[0]))

    def _release(self, task: asyncio.Task[None], ip: str) -> None:
        self._connections.discard(task)
        self._per_ip[ip] -= 1
        if self._per_ip[ip] <= 0:
            del self._per_ip[ip]
            if self.quota is not None:
                self.quota.forget(ip)

    async def _connection(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        """One admitted connection, from its transport to its close."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=STREAM_LIMIT)
        tls = self.security is not None and self.security.tls is not None
        made: asyncio.Future[asyncio.StreamWriter] = loop.create_future()

        def connection_made(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            # A callback, as a server's stream protocol has: start_tls() takes the server
            # side only where there is one.
            made.set_result(writer)

        # A TLS listener reads nothing before the connection's TLS starts (see _accept).
        kind = _PausedUntilTls if tls else asyncio.StreamReaderProtocol
        protocol = kind(reader, connection_made)
        try:
            await loop.connect_accepted_socket(lambda: protocol, sock=conn)
        except OSError as exc:
            # The client reset before its transport was made: its mistake, no traceback.
            conn.close()
            log.debug("connection gone before it was served", peer=str(peer), error=str(exc))
            return
        except BaseException:
            conn.close()
            raise
        await self._accept(reader, await made, peer)

    async def _accept(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: tuple[str, int]
    ) -> None:
        ip = peer[0]
        try:
            if self.security is not None and self.security.tls is not None:
                await self._start_tls(writer, str(peer))
            client = self._new_peer(str(peer), writer)
            client.ip = ip
            await self._serve(reader, writer, client)
        except (asyncio.IncompleteReadError, ConnectionError, _Closed):
            pass
        except ssl.SSLError as exc:
            log.info("TLS error; connection closed", peer=str(peer), error=exc.reason)
        except _Close as reason:
            self.events.note(ServeEvent.REFUSED_REQUEST, peer=str(peer), reason=str(reason))
        except _Refused as refused:
            self.events.note(refused.event, **{"peer": str(peer), **refused.fields})
        except RemoteProtocolError as exc:
            self.events.note(ServeEvent.PROTOCOL_ERROR, peer=str(peer), error=str(exc))
        except asyncio.CancelledError:
            pass
        except Exception:
            self.events.note(ServeEvent.UNEXPECTED_ERROR, exc_info=True, peer=str(peer))
        finally:
            writer.close()
            # Bounded: after a failed TLS handshake the socket belongs to asyncio's TLS
            # protocol, and the stream is never told it closed.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await writer.wait_closed()

    def _admit(self, ip: str, address: str) -> bool:
        """Whether a new connection from `ip` is within the connection limits."""
        if len(self._connections) >= self.max_connections:
            self.events.note(
                ServeEvent.CONNECTION_LIMIT, peer=address, max_connections=self.max_connections
            )
            return False
        limit = self.settings.max_connections_per_ip_overrides.get(
            ip, self.settings.max_connections_per_ip
        )
        if self._per_ip[ip] >= limit:
            self.events.note(
                ServeEvent.CONNECTION_LIMIT_PER_IP, peer=address, max_connections_per_ip=limit
            )
            return False
        return True

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: _Peer
    ) -> None:
        turn_started_ms = monotonic_ms()
        if peer.sasl is not None:
            peer.authenticate_by_ms = turn_started_ms + self.settings.authentication_timeout_ms
        while True:
            size = await self._next_frame_size(reader, peer)
            if size < 8:
                raise _Close(f"request frame of {size} bytes")
            self._check_frame_size(size)
            if peer.authenticating and size > SASL_MAX_RECEIVE_BYTES:
                # An unauthenticated client may not make the server hold a large frame.
                raise _Close(f"request frame of {size} bytes before SASL authentication")
            taken = 0
            held = [0]
            throttle_ms = 0
            try:
                try:
                    async with asyncio.timeout(self._frame_time_s(peer)):
                        taken = await self.pool.take(size)
                        frame = await reader.readexactly(size)
                except TimeoutError as exc:
                    raise self._timed_out(peer, ServeEvent.FRAME_TIMEOUT, frame_bytes=size) from exc
                if peer.sasl is not None and await self._sasl_gate(frame, peer, writer):
                    continue
                head = peek_request_head(frame)
                uncharged = [0.0]
                _UNCHARGED.set(uncharged)
                if self.remote is not None:
                    # What a read of the bucket answers holds from the pool until sent.
                    held = hold_for_request()
                cpu_before = time.thread_time()
                response = await self._handle(frame, peer)
                del frame  # its pool bytes are given back below: hold it no longer
                used_ms = 1000 * (time.thread_time() - cpu_before - uncharged[0])
                throttle_ms = self._charge(peer, used_ms)
                if response is not None:
                    position = _throttle_position(head.api_key, head.api_version)
                    if throttle_ms and position is not None:
                        response = with_throttle_time(response, position, throttle_ms)
                    await self._send(writer, response)
            finally:
                self.pool.give_back(taken)
                if held[0]:
                    self.pool.give_back(held[0])
            if throttle_ms:
                # KIP-219: the client was told, and this connection is muted meanwhile.
                await asyncio.sleep(throttle_ms / 1000)
            if monotonic_ms() - turn_started_ms >= TURN_MS:
                # The others' turn: with requests already buffered, nothing above waits.
                await asyncio.sleep(0)
                turn_started_ms = monotonic_ms()

    def _charge(self, peer: _Peer, used_ms: float) -> int:
        """Charge a request's loop time to its client; the throttle time it earned."""
        if self.quota is None:
            return 0
        throttle_ms = self.quota.record(peer.ip, used_ms, self._now_ms())
        if throttle_ms:
            self.events.note(ServeEvent.THROTTLED, peer=peer.address, throttle_ms=throttle_ms)
        return throttle_ms

    async def _next_frame_size(self, reader: asyncio.StreamReader, peer: _Peer) -> int:
        """The next request's size prefix, within the idle (or authentication) deadline."""
        idle_s = self.settings.connections_max_idle_ms / 1000
        try:
            async with asyncio.timeout(min(idle_s, self._authentication_left_s(peer))):
                (size,) = SIZE.unpack(await reader.readexactly(SIZE.size))
        except TimeoutError as exc:
            raise self._timed_out(
                peer, ServeEvent.IDLE_TIMEOUT, idle_ms=int(idle_s * 1000)
            ) from exc
        return int(size)

    def _frame_time_s(self, peer: _Peer) -> float:
        return min(self.settings.request_frame_timeout_ms / 1000, self._authentication_left_s(peer))

    def _authentication_left_s(self, peer: _Peer) -> float:
        if not peer.authenticating or peer.authenticate_by_ms is None:
            return float("inf")
        return max(0.0, (peer.authenticate_by_ms - monotonic_ms()) / 1000)

    def _timed_out(self, peer: _Peer, event: ServeEvent, **fields: Any) -> _Refused:
        """What a deadline's passing closes the connection as: running out of time to
        authenticate wins over the deadline that noticed it."""
        if peer.authenticating and self._authentication_left_s(peer) <= 0:
            return _Refused(ServeEvent.AUTHENTICATION_TIMEOUT, peer=peer.address)
        return _Refused(event, peer=peer.address, **fields)

    def _check_frame_size(self, size: int) -> None:
        if size > self.settings.max_request_bytes:
            raise _Close(f"request frame of {size} bytes")
        held = self.catalog.partition_count(now_ms=self._now_ms())
        limit = plausible_frame_bytes(held, self.settings.max_request_bytes)
        if size > limit:
            raise _Refused(
                ServeEvent.IMPLAUSIBLE_REQUEST,
                frame_bytes=size,
                limit_bytes=limit,
                partitions_held=held,
            )

    # -- security --------------------------------------------------------------------------

    async def _start_tls(self, writer: asyncio.StreamWriter, address: str) -> None:
        assert self.security is not None and self.security.tls is not None
        # Our own deadline around asyncio's: when asyncio's handshake timeout fires, it
        # closes the socket but start_tls() never returns, so every such connection's
        # task (and its buffers) stayed for good -- 1,000 silent clients cost 300 MB.
        handshake_s = min(TLS_HANDSHAKE_S, self.settings.authentication_timeout_ms / 1000)
        try:
            async with asyncio.timeout(handshake_s):
                # No TLS state (asyncio's 256 KiB buffer, OpenSSL's) before the client
                # speaks, and a bounded number of handshakes at once: see the rules.
                await _readable(writer)
                async with self._handshakes:
                    self._handshaking += 1
                    try:
                        await writer.start_tls(
                            self.security.tls, ssl_handshake_timeout=TLS_HANDSHAKE_S
                        )
                    finally:
                        self._handshaking -= 1
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            writer.transport.abort()
            # Info, as Kafka logs it: port checks and scanners fail handshakes all day.
            self.events.note(
                ServeEvent.TLS_HANDSHAKE_FAILED,
                peer=address,
                error=getattr(exc, "reason", None) or str(exc) or type(exc).__name__,
            )
            raise _Closed from exc

    def _new_peer(self, address: str, writer: asyncio.StreamWriter) -> _Peer:
        security = self.security
        if security is None:
            return _Peer(address, ANONYMOUS, self.allowed_followers)
        principal = ANONYMOUS
        if security.tls is not None:
            principal = tls_principal(writer.get_extra_info("peercert"))
        peer = _Peer(address, principal, frozenset(), sasl=security.new_sasl())
        if peer.sasl is None:
            self._authorize(peer, principal)
        return peer

    def _authorize(self, peer: _Peer, principal: Principal) -> None:
        """Settle who the connection is, and so whether and as what it may follow."""
        assert self.security is not None
        peer.principal = principal
        peer.follower_authorized = self.security.may_follow(principal)
        followers = self.security.followers
        peer.allowed_followers = (
            followers.allowed_replica_ids(principal)
            if followers is not None
            else self.allowed_followers
        )

    async def _sasl_gate(self, frame: bytes, peer: _Peer, writer: asyncio.StreamWriter) -> bool:
        """On a SASL listener: True if the frame was a SASL step (answered here); closes
        the connection on anything else before authentication."""
        sasl = peer.sasl
        assert sasl is not None
        head = peek_request_head(frame)
        if head.api_key not in SASL_APIS:
            if sasl.admission(head.api_key) is Admission.CLOSE:
                raise _Refused(ServeEvent.UNAUTHENTICATED_REQUEST, api=_api_name(head.api_key))
            return False
        self._count_request(head)
        supported = handlers.SASL_VERSIONS[head.api_key]
        if not supported.min <= head.api_version <= supported.max:
            raise _Close(f"{_api_name(head.api_key)} v{head.api_version} is not served")
        request = (await self._decode(frame, head)).body
        if head.api_key == ApiKey.SASL_HANDSHAKE:
            reply = sasl.handshake(request)
        else:
            loop = asyncio.get_running_loop()
            reply = await loop.run_in_executor(self._authenticator, sasl.authenticate, request)
        if reply.close and head.api_key == ApiKey.SASL_AUTHENTICATE:
            # Kafka's connection.failed.authentication.delay.ms: a guess costs the guesser.
            await asyncio.sleep(self.settings.failed_authentication_delay_ms / 1000)
        await self._send(writer, encode_response(reply.body, head.correlation_id))
        if reply.principal is not None:
            self.counters["authentications_total"] += 1
            self._authorize(peer, reply.principal)
            log.debug("client authenticated", peer=peer.address, principal=str(reply.principal))
        if reply.close:
            # Never the name or password tried: a user may type one for the other.
            self.events.note(
                ServeEvent.AUTHENTICATION_FAILED,
                peer=peer.address,
                mechanism=str(request.mechanism)
                if head.api_key == ApiKey.SASL_HANDSHAKE
                else str(sasl.mechanism),
                error=ErrorCode(reply.body.error_code).name,
            )
            raise _Closed
        return True

    # -- dispatch --------------------------------------------------------------------------

    async def _handle(self, frame: bytes, peer: _Peer) -> ResponseFrame | None:
        head = peek_request_head(frame)
        api = head.api_key
        self._count_request(head)
        supported = self._served.get(api)
        if api == ApiKey.API_VERSIONS and (supported is None or head.api_version > supported.max):
            # KIP-511: answer in v0's layout, naming what we support.
            body = handlers.api_versions_response(
                0, error=ErrorCode.unsupported_version, supported=self._supported
            )
            return encode_response(body, head.correlation_id)
        if supported is None or not supported.min <= head.api_version <= supported.max:
            return await self._refuse(frame, head)
        decoded = await self._decode(frame, head)
        if api == ApiKey.FETCH:
            return await self._fetch(decoded, peer)
        if api == ApiKey.PRODUCE:
            return self._produce(decoded)
        if api in GROUP_VERSIONS or api in CONSUMER_PROTOCOL_VERSIONS:
            if self.security is not None and peer.principal == ANONYMOUS:
                # serve.security is on: groups are for authenticated principals only.
                self.counters["anonymous_group_requests_total"] += 1
                body = group_wire.refused_response(
                    api, head.api_version, decoded.body, ErrorCode.group_authorization_failed
                )
                return encode_response(body, head.correlation_id)
            # A JoinGroup or SyncGroup waits for the other members: not this request's work.
            with _not_charged():
                body = await self.groups.answer(decoded, peer.ip)
            return encode_response(body, head.correlation_id)
        now_ms = self._now_ms()
        if api == ApiKey.LIST_OFFSETS:
            body = await self._list_offsets(decoded, now_ms)
            if isinstance(decoded.body, legacy_codec.LegacyListOffsetsRequest):
                return raw_response(
                    response_header_v0(head.correlation_id),
                    legacy_codec.encode_list_offsets_response(body),
                )
        else:
            body = self._answer(decoded, now_ms)
        if api == ApiKey.LIST_OFFSETS and self.remote is not None:
            with _not_charged():
                body = await self.remote.list_offsets(decoded.body, body, self.catalog)
        elif api == ApiKey.OFFSET_FOR_LEADER_EPOCH and self.remote is not None:
            with _not_charged():
                body = await self.remote.offset_for_leader_epoch(decoded.body, body, self.catalog)
        return encode_response(body, head.correlation_id)

    def _count_request(self, head: RequestHead) -> None:
        """One more request of its API and version, or of `UNSUPPORTED_LABEL`: a client
        choosing api keys and versions at will adds no state."""
        supported = self._supported.get(head.api_key)
        if supported is not None and supported.min <= head.api_version <= supported.max:
            self.requests[f"{_api_name(head.api_key)} v{head.api_version}"] += 1
        else:
            self.requests[UNSUPPORTED_LABEL] += 1

    async def _decode(self, frame: bytes, head: RequestHead) -> DecodedRequest:
        """The request in `frame` (by kio, or legacy_codec for the versions kio lacks),
        decoded on the loop if small, else on the decoding thread; refused if it names
        more than request_limits.py allows."""
        if len(frame) <= DECODE_INLINE_BYTES:
            decoded = _decode_request(frame, head)
        else:
            loop = asyncio.get_running_loop()
            with _not_charged():
                decoded = await loop.run_in_executor(self._decoder, _decode_request, frame, head)
        held = self.catalog.partition_count(now_ms=self._now_ms())
        counted = count_elements(decoded.body, plausible_elements(held))
        if not counted.plausible:
            raise _Refused(
                ServeEvent.IMPLAUSIBLE_REQUEST,
                api=_api_name(head.api_key),
                elements_over=counted.limit,
                partitions_held=held,
            )
        return decoded

    def _answer(self, request: DecodedRequest, now_ms: int) -> Any:
        api, version = request.head.api_key, request.head.api_version
        if api == ApiKey.API_VERSIONS:
            return handlers.api_versions_response(version, supported=self._supported)
        if api == ApiKey.METADATA:
            host, port = self.advertised
            node = handlers.NodeInfo(self.node_id, host, port, self._cluster_id)
            return handlers.metadata_response(
                version, request.body, self.catalog, node, now_ms=now_ms
            )
        if api == ApiKey.OFFSET_FOR_LEADER_EPOCH:
            return handlers.offset_for_leader_epoch_response(
                version, request.body, self.catalog, now_ms=now_ms
            )
        if api == ApiKey.DESCRIBE_CONFIGS:
            return describe_configs_response(
                version,
                request.body,
                self.topic_configs,
                lambda topic: self.catalog.topic(topic, now_ms=now_ms) is not None,
            )
        raise AssertionError(f"no handler for api {api}")

    async def _list_offsets(self, request: DecodedRequest, now_ms: int) -> Any:
        """ListOffsets: the partitions resolved on the loop, the answers found on a worker
        thread when any reads the disk (a search by timestamp: the time index and batches;
        v0's segment timestamps), as a Fetch's file regions are read (see the rules)."""
        body = request.body
        if isinstance(body, legacy_codec.LegacyListOffsetsRequest):
            legacy = await self._without_waiting(
                lambda: handlers.legacy_offsets_questions(
                    body, self.catalog, self.transactions, now_ms=now_ms
                )
            )
            if not any(q.reads_disk for _, questions in legacy for q in questions):
                return handlers.legacy_offsets_answers(legacy)
            with _not_charged():
                return await asyncio.to_thread(handlers.legacy_offsets_answers, legacy)
        questions = await self._without_waiting(
            lambda: handlers.offset_questions(body, self.catalog, self.transactions, now_ms=now_ms)
        )
        if any(q.reads_disk for q in questions):
            with _not_charged():
                answers = await asyncio.to_thread(handlers.answer_offsets, questions)
        else:
            answers = handlers.answer_offsets(questions)
        return handlers.offsets_response(request.head.api_version, body, answers)

    async def _refuse(self, frame: bytes, head: RequestHead) -> ResponseFrame:
        """An API (or version) we do not serve: its own error, in its own version."""
        try:
            response_cls = response_type(head.api_key, head.api_version)
        except (UnknownAPIKey, UnknownEntity) as exc:
            raise _Close(
                f"api {head.api_key} v{head.api_version} has no layout replicad can answer in"
            ) from exc
        request = None
        with contextlib.suppress(RemoteProtocolError, UnknownAPIKey, UnknownEntity):
            request = (await self._decode(frame, head)).body
        self.counters["refused_requests_total"] += 1
        body = error_response(response_cls, ErrorCode.unsupported_version, request)
        return encode_response(body, head.correlation_id)

    def _produce(self, decoded: DecodedRequest) -> ResponseFrame:
        head = decoded.head
        version = head.api_version
        self.counters["refused_produce_total"] += 1
        if isinstance(decoded.body, legacy_codec.LegacyProduceRequest):
            legacy = decoded.body
            if legacy.acks == ACKS_NONE:
                raise _Close("produce with acks=0 refused (read-only replica)")
            body_bytes = legacy_codec.encode_produce_response(
                version, legacy.topics, ErrorCode.topic_authorization_failed
            )
            return raw_response(response_header_v0(head.correlation_id), body_bytes)
        request = decoded.body
        if int(request.acks) == ACKS_NONE:
            raise _Close("produce with acks=0 refused (read-only replica)")
        body = error_response(
            response_type(ApiKey.PRODUCE, version),
            ErrorCode.topic_authorization_failed,
            request,
            message=READ_ONLY_MESSAGE,
        )
        return encode_response(body, head.correlation_id)

    # -- Fetch -----------------------------------------------------------------------------

    async def _fetch(self, decoded: DecodedRequest, peer: _Peer) -> ResponseFrame:
        head = decoded.head
        version = head.api_version
        if isinstance(decoded.body, legacy_codec.LegacyFetchRequest):
            request = legacy_fetch_request(decoded.body)
        else:
            request = read_fetch_request(version, decoded.body)
        handling = FetchHandling(
            version,
            request,
            cache=self.cache,
            catalog=self.catalog,
            transactions=self.transactions,
            settings=self.settings,
            allowed_followers=peer.allowed_followers,
            now_ms=self._now_ms(),
            follower_authorized=peer.follower_authorized,
        )
        if handling.role is Role.UNAUTHORIZED_FOLLOWER:
            self.counters["unauthorized_follower_fetches_total"] += 1
            if not peer.told_unauthorized:
                peer.told_unauthorized = True
                log.warning(
                    "fetch as a follower from a principal that may not follow: "
                    "TOPIC_AUTHORIZATION_FAILED (serve.security.follower_principals)",
                    peer=peer.address,
                    principal=str(peer.principal),
                    replica_id=request.replica_id,
                )
        elif handling.role is Role.REFUSED_FOLLOWER:
            self.events.note(
                ServeEvent.REFUSED_FOLLOWER, peer=peer.address, replica_id=request.replica_id
            )
        deadline_ms = monotonic_ms() + request.max_wait_ms
        last = await self._read(handling)
        while not last.complete:
            remaining = (deadline_ms - monotonic_ms()) / 1000
            if remaining <= 0:
                break
            with _not_charged():
                await self._wait_for_change(handling, last.answers.keys(), remaining)
            last = await self._read(handling)
        if self.remote is not None:
            # Offsets below the local log start, from the bucket, off the loop.
            with _not_charged():
                last = await self.remote.complete(
                    handling,
                    last,
                    self.catalog,
                    self.transactions,
                    without_waiting=self._without_waiting,
                )
        outcome = handling.finish(last, now_ms=self._now_ms())
        self._count_session_use(handling, outcome.session_id)
        return fetch_response_frame(
            outcome, version=version, correlation_id=head.correlation_id, settings=self.settings
        )

    async def _read(self, handling: FetchHandling) -> FetchRound:
        """One read of the fetch's partitions: planned on the loop (`_without_waiting`: a
        transaction fold's reads), the records (their batch headers) found on the loop when
        their bytes are all in the page cache (log/nowait.py), else on a worker thread
        (reads.py). A read answered at once whose records are SMALL_REGION_BYTES at most has
        them read with the headers, the same way: the send then reads nothing more (a
        1-partition Fetch of cached bytes makes no hop to a worker thread; one not cached
        makes one)."""
        planned = await self._without_waiting(lambda: handling.plan_read(now_ms=self._now_ms()))
        if not planned.reads_disk:
            return handling.round(planned.read_records())
        legacy = handling.version in legacy_codec.LEGACY_FETCH_VERSIONS  # may down-convert
        bytes_up_to = 0 if legacy else SMALL_REGION_BYTES
        bytes_from = handling.min_bytes if handling.request.max_wait_ms > 0 else 0
        try:
            with not_waiting():
                answers = planned.read_records(bytes_up_to=bytes_up_to, bytes_from=bytes_from)
        except WouldWait:  # nothing read yet (reads.py): all of it where it may wait
            self.counters["fetch_reads_off_loop_total"] += 1
            with _not_charged():
                answers = await asyncio.to_thread(
                    planned.read_records, bytes_up_to=bytes_up_to, bytes_from=bytes_from
                )
        self.counters["copied_region_bytes_total"] += planned.bytes_read
        return handling.round(answers)

    async def _without_waiting(self, step: Callable[[], T]) -> T:
        """`step()` on the loop, its transaction folds not waiting on the disk (reads.py's
        TransactionTracker.state, inside log/nowait.py's `not_waiting()`): each time one
        would, its next bytes are read into the page cache on a worker thread, and `step`
        runs again (the fold goes on from where it stopped). A fold that would wait again
        where it did (the bytes read ahead left the cache before it ran), or on a file
        system that cannot tell (tmpfs: memory), runs as it did before this rule, waiting:
        the loop never hops without the fold moving on."""
        stopped: FoldWouldWait | None = None
        while True:
            try:
                with not_waiting():
                    return step()
            except FoldWouldWait as waiting:
                if waiting.cannot_tell or (
                    stopped is not None
                    and (waiting.plog, waiting.offset) == (stopped.plog, stopped.offset)
                ):
                    return step()
                stopped = waiting
            except WouldWait:  # not a fold's (none other is planned): read as before
                return step()
            self.counters["fold_reads_off_loop_total"] += 1
            with _not_charged():
                await asyncio.to_thread(stopped.read_ahead)

    def _count_session_use(self, handling: FetchHandling, session_id: int) -> None:
        context = handling.context
        if context is None:
            return
        if context.kind is ContextKind.INCREMENTAL:
            self.counters["incremental_fetches_total"] += 1
        elif context.kind is ContextKind.FULL and session_id != INVALID_SESSION_ID:
            self.counters["sessions_created_total"] += 1
            if handling.role is Role.FOLLOWER:
                self.counters["privileged_sessions_created_total"] += 1

    async def _wait_for_change(self, handling: FetchHandling, read: Any, timeout_s: float) -> None:
        assert self._loop is not None
        waiter: asyncio.Future[None] = self._loop.create_future()
        keys: list[tuple[dict[Any, set[asyncio.Future[None]]], Any]] = []
        session_id = handling.session_id
        if session_id is not None:
            keys.append((self._session_waiters, session_id))
        for tp in (*handling.partitions, *read):
            keys.append((self._partition_waiters, tp))
        for table, key in keys:
            table.setdefault(key, set()).add(waiter)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            pass
        finally:
            for table, key in keys:
                waiters = table.get(key)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del table[key]

    # -- writing ---------------------------------------------------------------------------

    async def _send(self, writer: asyncio.StreamWriter, response: ResponseFrame) -> None:
        parts = response.with_size_prefix()
        if self._direct and direct_send.takes(writer.transport, parts):
            await self._send_direct(writer, parts)  # type: ignore[arg-type]
        else:
            await self._send_assembled(writer, parts)
        self.counters["responses_total"] += 1

    async def _send_direct(
        self, writer: asyncio.StreamWriter, parts: tuple[bytes | FileRegion, ...]
    ) -> None:
        """A plaintext connection's response with file regions: straight on its socket
        (direct_send.py), once the transport has written all it holds."""
        transport = writer.transport
        if transport.get_write_buffer_size():
            # drain() waits only down to the low-water mark; at 0 it waits for all of it.
            transport.set_write_buffer_limits(high=0)
            try:
                await writer.drain()
            finally:
                transport.set_write_buffer_limits()
        await direct_send.send(transport, parts, self.counters)

    async def _send_assembled(self, writer: asyncio.StreamWriter, parts: tuple[Part, ...]) -> None:
        """Any response on any connection (TLS's with file regions among them): bytes and
        small regions through the transport, assembled into one buffer a run; large
        regions by loop.sendfile; down-conversions a chunk at a time."""
        i = 0
        while i < len(parts):
            part = parts[i]
            if isinstance(part, FileRegion) and part.size > SMALL_REGION_BYTES:
                await self._send_region(writer, part)
                i += 1
            elif isinstance(part, (bytes, FileRegion)):
                i = await self._send_small(writer, parts, i)
            else:
                await self._send_converted(writer, part)
                i += 1
        await writer.drain()

    async def _send_small(
        self, writer: asyncio.StreamWriter, parts: tuple[Part, ...], start: int
    ) -> int:
        """Write parts from `start` on while they are bytes or small file regions (up to
        READ_AHEAD_BYTES of regions), the regions read on the loop when all are in the page
        cache, else in one hop to a worker thread; returns the index of the first part not
        written."""
        end = start
        run: list[bytes | FileRegion] = []
        regions = region_bytes = 0
        while end < len(parts):
            part = parts[end]
            if isinstance(part, FileRegion):
                if part.size > SMALL_REGION_BYTES or (
                    regions and region_bytes + part.size > READ_AHEAD_BYTES
                ):
                    break
                regions += 1
                region_bytes += part.size
            elif not isinstance(part, bytes):
                break
            run.append(part)
            end += 1
        if not regions:  # bytes only
            writer.write(b"".join(data for data in run if isinstance(data, bytes)))
        else:
            try:
                with not_waiting():
                    assembled = assemble(run)
            except WouldWait:  # a region not in the page cache: all of the run off the loop
                self.counters["send_reads_off_loop_total"] += 1
                with _not_charged():
                    assembled = await asyncio.to_thread(assemble, run)
            writer.write(assembled.buffer)
            self.counters["copied_region_bytes_total"] += assembled.region_bytes
            # The segment shrank (truncation) or vanished (retention) since it was read.
            self.counters["short_regions_total"] += assembled.short_regions
        await writer.drain()
        return end

    async def _send_region(self, writer: asyncio.StreamWriter, region: FileRegion) -> None:
        await writer.drain()
        sent = 0
        try:
            with open(region.path, "rb") as f:
                if not all_cached(f.fileno(), region.position, region.size):
                    # sendfile would wait on the disk on the loop: read it in first.
                    self.counters["sendfile_reads_off_loop_total"] += 1
                    with _not_charged():
                        await asyncio.to_thread(
                            read_into_cache, f.fileno(), region.position, region.size
                        )
                sent = await asyncio.get_running_loop().sendfile(
                    writer.transport, f, region.position, region.size
                )
        except FileNotFoundError:
            sent = 0
        self.counters["sendfile_bytes_total"] += sent
        if sent < region.size:
            # The segment shrank (truncation) or vanished (retention) since it was read.
            self.counters["short_regions_total"] += 1
            for piece in overflow_entry(region.size - sent):
                writer.write(piece)

    async def _send_converted(
        self, writer: asyncio.StreamWriter, conversion: LazyDownConversion
    ) -> None:
        chunks = conversion.chunks()
        sent = 0
        while True:
            try:
                chunk = await asyncio.to_thread(_next_or_none, chunks)
            except Exception as exc:  # a segment gone or unreadable mid-conversion
                log.warning("down-conversion stopped early", error=str(exc))
                chunk = None
            if chunk is None:
                break
            writer.write(chunk)
            sent += len(chunk)
            await writer.drain()
        if sent < conversion.size:
            for piece in overflow_entry(conversion.size - sent):
                writer.write(piece)
        self.counters["downconverted_bytes_total"] += sent
        self.counters["downconverted_records_total"] += conversion.stats.records_converted


# Loop CPU seconds spent, during the request being charged, on awaits that are not its own
# work (other connections run meanwhile); set per request, read by `_not_charged`.
_UNCHARGED: contextvars.ContextVar[list[float]] = contextvars.ContextVar("uncharged")


@contextlib.contextmanager
def _not_charged() -> Iterator[None]:
    start = time.thread_time()
    try:
        yield
    finally:
        box = _UNCHARGED.get(None)
        if box is not None:
            box[0] += time.thread_time() - start


@functools.cache
def _throttle_position(api_key: int, version: int) -> int | None:
    """Where throttle_time_ms is in a response of this API and version, when it is the
    response's first field (most APIs since their second version); else None."""
    if api_key == ApiKey.FETCH and version in legacy_codec.LEGACY_FETCH_VERSIONS:
        return SIZE.size if version >= legacy_codec.FETCH_THROTTLE_VERSION else None
    try:
        response_cls = response_type(api_key, version)
    except (UnknownAPIKey, UnknownEntity):
        return None
    fields = dataclasses.fields(response_cls)
    if not fields or fields[0].name != "throttle_time":
        return None
    return len(response_header(response_cls, 0))


def _decode_request(frame: bytes, head: RequestHead) -> DecodedRequest:
    """A request frame decoded by the codec of its API and version: legacy_codec's for
    the layouts kio lacks, kio's otherwise. Pure, so it may run on the decoding thread."""
    version = head.api_version
    legacy_decoder = _LEGACY_DECODERS.get(head.api_key)
    if legacy_decoder is not None and version in legacy_decoder[0]:
        header = legacy_codec.read_request_header_v1(frame)
        body = legacy_decoder[1](version, memoryview(frame)[header.body_position :])
        return DecodedRequest(head, header.client_id, body)
    return decode_request(frame, request_type(head.api_key, version))


_LEGACY_DECODERS: dict[int, tuple[range, Callable[[int, memoryview], Any]]] = {
    ApiKey.FETCH: (legacy_codec.LEGACY_FETCH_VERSIONS, legacy_codec.decode_fetch_request),
    ApiKey.LIST_OFFSETS: (
        legacy_codec.LEGACY_LIST_OFFSETS_VERSIONS,
        lambda _version, body: legacy_codec.decode_list_offsets_request(body),
    ),
    ApiKey.PRODUCE: (
        legacy_codec.LEGACY_PRODUCE_VERSIONS,
        lambda _version, body: legacy_codec.decode_produce_request(body),
    ),
}


def _next_or_none(chunks: Iterator[bytes]) -> bytes | None:
    return next(chunks, None)


def _wake(waiters: Any) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)


def _api_name(api_key: int) -> str:
    return api_key_map.get(api_key, str(api_key)).upper()


# -- `replicad serve` --------------------------------------------------------------------------


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def server_security(
    config: ServeSecurityConfig | None, allowed_followers: frozenset[int]
) -> ServerSecurity | None:
    """The listener's security from `serve.security`; None when it asks for none, so the
    plaintext path stays as it was."""
    if config is None or (config.tls.cert_file is None and not config.sasl.mechanisms):
        return None
    return ServerSecurity.from_config(config, allowed_followers)


async def serve_forever(
    data_dir: Path,
    listen: str,
    *,
    advertised: str | None = None,
    settings: ServeSettings | None = None,
    node_id: int = 0,
    allowed_followers: frozenset[int] = frozenset(),
    security: ServeSecurityConfig | None = None,
    log_config: LogConfig | None = None,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[LeaderServer], None] | None = None,
    group_config: CoordinatorConfig | None = None,
    consumer_group_protocol: bool = True,
    remote: Callable[[], RemoteFetch] | None = None,
) -> int:
    """`replicad serve`: open the data directory (taking its lock), serve it until SIGTERM,
    SIGINT or `stop`, then close everything. Returns the process exit code."""
    host, port = parse_listen(listen)
    values: dict[str, Any] = {"host": host, "port": port}
    if advertised:
        values["advertised_host"], values["advertised_port"] = parse_listen(advertised)
    base = settings if settings is not None else ServeSettings()
    settings = dataclasses.replace(base, **values)
    logs = await asyncio.to_thread(
        LogManager.open,
        Path(data_dir),
        log_config or LogConfig(),
        now_ms=wall_ms(),
    )
    stop = stop or asyncio.Event()
    signals = LoopSignals(asyncio.get_running_loop(), lambda _signum: stop.set())
    if signals.install() is not None:
        stop.set()  # asked to stop while the logs were being opened
    server = LeaderServer(
        logs,
        settings,
        node_id=node_id,
        allowed_followers=allowed_followers,
        security=server_security(security, allowed_followers),
        group_config=group_config,
        consumer_group_protocol=consumer_group_protocol,
        remote=await asyncio.to_thread(remote) if remote is not None else None,
    )
    try:
        await server.start()
        if on_ready is not None:
            on_ready(server)
        await stop.wait()
    finally:
        await server.close()
        log.info("serve stopped", **server.metrics())
        signals.remove()
        await asyncio.to_thread(logs.close)
    return 0
