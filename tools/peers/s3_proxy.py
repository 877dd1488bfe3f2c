"""A fault-injecting HTTP proxy in front of the S3 test server (127.0.0.1 only).

    with S3FaultProxy(server.endpoint) as proxy:
        point the archive at proxy.endpoint
        proxy.fail_next(3)           # the next 3 requests answer 503 SlowDown
        proxy.reset_next(1)          # the next request's connection is closed unanswered
        proxy.set_delay_ms(200)      # every answer waits 200 ms
        proxy.set_down(True)         # every request answers 503 until set_down(False)
        proxy.hold()                 # requests wait, unanswered, until proxy.release()
        proxy.refuse_checksums(True) # a request with a x-amz-checksum-<algorithm> header
                                     # answers 501 NotImplemented, as a store without S3's
                                     # flexible checksums does

Requests are forwarded whole (method, path, query, headers, body) over a new connection,
so signatures stay valid (the Host header is the one the client signed); answers come back
whole. Every fault is counted when it is delivered (`stats`), so a test can compare what was
injected with what the client says it saw. It is a real peer's stand-in only for what the
real server cannot do on demand: fail.
"""

from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self
from urllib.parse import urlsplit

from tools.peers.process import LOOPBACK

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
NOT_IMPLEMENTED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NotImplemented</Code>'
    b"<Message>A header you provided implies functionality that is not implemented."
    b"</Message></Error>"
)
# Headers that name a checksum of the body (not x-amz-checksum-mode, a read's request).
CHECKSUM_HEADER_PREFIX = "x-amz-checksum-"
CHECKSUM_MODE_HEADER = "x-amz-checksum-mode"


@dataclass
class ProxyStats:
    forwarded: int = 0
    failed: int = 0  # 503 SlowDown answered
    refused: int = 0  # 501 NotImplemented answered (refuse_checksums)
    reset: int = 0  # connections closed unanswered
    held: int = 0  # requests waiting for release() now


class S3FaultProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or LOOPBACK, parts.port or 80)
        self._lock = threading.Lock()
        self._fail = 0
        self._reset = 0
        self._down = False
        self._delay_s = 0.0
        self._refuse_checksums = False
        self._released = threading.Event()
        self._released.set()
        self.stats = ProxyStats()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://{LOOPBACK}:{self._server.server_address[1]}"

    def fail_next(self, count: int) -> None:
        with self._lock:
            self._fail += count

    def reset_next(self, count: int) -> None:
        with self._lock:
            self._reset += count

    def set_down(self, down: bool) -> None:
        with self._lock:
            self._down = down

    def set_delay_ms(self, delay_ms: int) -> None:
        with self._lock:
            self._delay_s = delay_ms / 1000

    def refuse_checksums(self, refuse: bool) -> None:
        with self._lock:
            self._refuse_checksums = refuse

    def _refuses(self, headers: dict[str, str]) -> bool:
        with self._lock:
            if not self._refuse_checksums or not any(
                k.lower().startswith(CHECKSUM_HEADER_PREFIX) and k.lower() != CHECKSUM_MODE_HEADER
                for k in headers
            ):
                return False
            self.stats.refused += 1
            return True

    def hold(self) -> None:
        """Requests from now on wait (unanswered, counted in stats.held) until release()."""
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def _wait_if_held(self) -> None:
        if self._released.is_set():
            return
        with self._lock:
            self.stats.held += 1
        self._released.wait()
        with self._lock:
            self.stats.held -= 1

    def _fault(self) -> str | None:
        with self._lock:
            if self._reset:
                self._reset -= 1
                self.stats.reset += 1
                return "reset"
            if self._down or self._fail:
                self._fail = max(self._fail - 1, 0)
                self.stats.failed += 1
                return "fail"
            self.stats.forwarded += 1
            return None

    def start(self) -> Self:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass  # the test's output is for what it asserts

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                proxy._wait_if_held()
                fault = proxy._fault()
                if proxy._delay_s:
                    time.sleep(proxy._delay_s)
                if fault == "reset":
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault == "fail":
                    self._error(503, SLOW_DOWN)
                    return
                if proxy._refuses(dict(self.headers.items())):
                    self._error(501, NOT_IMPLEMENTED)
                    return
                upstream = http.client.HTTPConnection(*proxy._upstream, timeout=60)
                try:
                    # Hop-by-hop headers stay here (100-continue was answered already).
                    headers = {
                        k: v
                        for k, v in self.headers.items()
                        if k.lower() not in ("expect", "connection")
                    }
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    upstream.close()
                self.send_response(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _error(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="s3-fault-proxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
