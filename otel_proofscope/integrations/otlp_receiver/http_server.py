"""OTLP/HTTP front end: ``POST /v1/traces`` and ``/v1/metrics``, protobuf or JSON.

Built on the standard library's ``ThreadingHTTPServer``. Checks run before the body is
read (token, media type, declared length against the cap), so an unauthorized or
oversized request costs no memory; a rejected body is drained (up to
:data:`DRAIN_FACTOR` × cap) only so that clients which send the whole body before reading
the answer see the status instead of a reset connection. The in-flight byte budget is
taken as body bytes arrive and as they inflate, never on what a header declares, and
the body's deadline follows the client's own progress (``limits.BodyClock``); once the
body is in, no deadline runs over our own decode and export. Error bodies are
``google.rpc.Status`` in the request's encoding, as OTLP/HTTP specifies.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import zlib
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from otel_proofscope.integrations.otlp_receiver import codec
from otel_proofscope.integrations.otlp_receiver.core import Ingest, Outcome, Result
from otel_proofscope.integrations.otlp_receiver.grpc_server import GRPC_CODE
from otel_proofscope.integrations.otlp_receiver.limits import (
    RETRY_AFTER_S,
    BodyClock,
    Reservation,
    Watchdog,
)

_log = logging.getLogger("otel_proofscope.serve.http")

#: A rejected body is read and discarded up to this multiple of the cap, then we hang up.
DRAIN_FACTOR = 4
#: Seconds a keep-alive connection may sit idle between requests (a request itself has
#: a whole-request deadline: Ingest.request_deadline_s).
SOCKET_TIMEOUT_S = 15.0
_CHUNK = 64 * 1024
#: Inflated bytes produced (and taken from the budget) per step.
_INFLATE_STEP = 256 * 1024

HTTP_STATUS: dict[Outcome, HTTPStatus] = {
    Outcome.OK: HTTPStatus.OK,
    Outcome.INVALID: HTTPStatus.BAD_REQUEST,
    Outcome.TOO_LARGE: HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    Outcome.UNAUTHENTICATED: HTTPStatus.UNAUTHORIZED,
    Outcome.UNSUPPORTED_MEDIA_TYPE: HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
    Outcome.BUSY: HTTPStatus.SERVICE_UNAVAILABLE,
    Outcome.OVER_BUDGET: HTTPStatus.SERVICE_UNAVAILABLE,
    Outcome.TIMEOUT: HTTPStatus.REQUEST_TIMEOUT,
}


class _BodyError(Exception):
    def __init__(self, outcome: Outcome, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    ingest: Ingest
    watchdog: Watchdog

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback to stderr; a client that resets or stalls is
        # routine for a network receiver, so one log line is enough.
        _log.warning("OTLP/HTTP connection from %s failed: %r", client_address[0],
                     sys.exc_info()[1])


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "proofscope-otlp"
    sys_version = ""
    timeout = SOCKET_TIMEOUT_S
    _body_read = False
    _deadline: int | None = None
    _timed_out = False
    _held: Reservation
    _clock: BodyClock

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("%s %s", self.address_string(), format % args)

    # ── whole-request deadline ──────────────────────────────────────────────────────


    def _expire(self) -> None:
        self._timed_out = True
        self.close_connection = True
        path = getattr(self, "path", "") or ""
        self.server.ingest.timed_out(codec.PATHS.get(path.split("?", 1)[0]))

    def handle_one_request(self) -> None:
        # An idle keep-alive connection waits for its next request under the socket
        # timeout; from the request's first byte, the whole request (request line,
        # headers, body) must arrive within the deadline: a per-read timeout lets a
        # client drip one byte at a time forever.
        try:
            self.rfile.peek(1)  # type: ignore[attr-defined]  # a BufferedReader here
        except (OSError, ValueError):
            self.close_connection = True
            return
        self._timed_out = False
        self._deadline = self.server.watchdog.arm(
            self.connection, self.server.ingest.request_deadline_s, self._expire)
        try:
            super().handle_one_request()
        except OSError:
            if not self._timed_out:
                raise
        finally:
            if self._deadline is not None:
                self.server.watchdog.disarm(self._deadline)
                self._deadline = None
            if self._timed_out:
                self.close_connection = True

    # ── verbs ───────────────────────────────────────────────────────────────────────

    def do_POST(self) -> None:
        ingest = self.server.ingest
        self._body_read = False
        signal = codec.PATHS.get(self.path.split("?", 1)[0])
        if signal is None:
            self._plain(HTTPStatus.NOT_FOUND, "OTLP endpoints: /v1/traces, /v1/metrics")
            return
        encoding = codec.media_type(self.headers.get("Content-Type"))
        reply_as = encoding or codec.Encoding.JSON
        if not ingest.authorized_all(self.headers.get_all("Authorization") or []):
            self._reject(ingest.reject(signal, Outcome.UNAUTHENTICATED,
                                       "missing or wrong bearer token"), reply_as)
            return
        if encoding is None:
            self._reject(ingest.reject(
                signal, Outcome.UNSUPPORTED_MEDIA_TYPE,
                f"Content-Type {self.headers.get('Content-Type')!r} is not supported; use "
                f"{codec.Encoding.PROTOBUF.value} or {codec.Encoding.JSON.value}"), reply_as)
            return
        content_encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if content_encoding not in ("identity", "gzip"):
            self._reject(ingest.reject(signal, Outcome.UNSUPPORTED_MEDIA_TYPE,
                                       f"Content-Encoding {content_encoding!r} is not "
                                       "supported; use gzip or none"), encoding)
            return
        cap = ingest.max_message_bytes
        # Budget taken as the bytes arrive (and as they inflate), not on the declared
        # length: a client that declares 4 MiB and drips one byte a second holds bytes
        # it sent, not 8 MiB of everyone else's budget.
        self._held = Reservation(ingest.budget, self.client_address[0])
        try:
            try:
                self._clock = BodyClock(ingest.request_deadline_s)
                if self._deadline is not None:
                    self.server.watchdog.move(self._deadline, ingest.request_deadline_s)
                body = self._read_body(cap)
                # The client is done once its body is in: the deadline measured the
                # client, never our own decode and export (a 4 MB request that took us
                # 10 s used to be cut off, counted as a timeout and as accepted).
                if self._deadline is not None and not self.server.watchdog.disarm(
                        self._deadline):
                    self._timed_out = True
                self._deadline = None
                if self._timed_out:
                    return
                if content_encoding == "gzip":
                    body = self._gunzip(body, cap)
            except _BodyError as exc:
                if self._timed_out:
                    return  # counted as timeout; the connection is gone
                self._reject(ingest.reject(signal, exc.outcome, str(exc)), encoding)
                return
            if not ingest.admit():
                self._reject(ingest.reject(signal, Outcome.BUSY, "receiver busy, retry later"),
                             encoding)
                return
            try:
                result = ingest.handle(signal, body, encoding)
            finally:
                ingest.release()
                del body
        finally:
            self._held.close()
        if result.outcome is Outcome.OK and result.response is not None:
            self._send(HTTPStatus.OK, codec.encode(result.response, encoding), encoding.value)
        else:
            self._reject(result, encoding)

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] in codec.PATHS:
            self._plain(HTTPStatus.METHOD_NOT_ALLOWED, "use POST", {"Allow": "POST"})
        else:
            self._plain(HTTPStatus.NOT_FOUND, "OTLP endpoints: /v1/traces, /v1/metrics")

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_GET

    # ── body ────────────────────────────────────────────────────────────────────────

    def _recv(self, n: int) -> bytes:
        """Exactly ``n`` body bytes, taken from the budget as they arrive; each read
        moves the deadline by the client's own progress (:class:`BodyClock`)."""
        parts: list[bytes] = []
        left = n
        while left > 0:
            got = self.rfile.read1(min(left, _CHUNK))  # type: ignore[attr-defined]
            if not got:
                break
            if not self._held.take(len(got)):
                self.close_connection = True
                raise _BodyError(Outcome.OVER_BUDGET,
                                 f"receiver over its in-flight byte budget "
                                 f"({self._held.budget.limit} bytes in all, "
                                 f"{self._held.budget.per_client} per client), retry later")
            parts.append(got)
            left -= len(got)
            if self._deadline is not None:
                self.server.watchdog.move(self._deadline, self._clock.advance(len(got)))
        return b"".join(parts)

    def _read_body(self, cap: int) -> bytes:
        self._body_read = True
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked(cap)
        raw = self.headers.get("Content-Length")
        if raw is None:
            self.close_connection = True
            raise _BodyError(Outcome.INVALID, "Content-Length or chunked encoding required")
        try:
            length = int(raw)
            if length < 0:
                raise ValueError(raw)
        except ValueError:
            self.close_connection = True
            raise _BodyError(Outcome.INVALID, f"bad Content-Length {raw!r}") from None
        if length > cap:
            self._drain(length, cap)
            raise _BodyError(Outcome.TOO_LARGE,
                             f"request of {length} bytes exceeds the cap of {cap} bytes")
        body = self._recv(length)
        if len(body) != length:
            self.close_connection = True
            raise _BodyError(Outcome.INVALID, f"body ended after {len(body)} of {length} bytes")
        return body

    def _read_chunked(self, cap: int) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
                if size < 0:
                    raise ValueError(line)
            except ValueError:
                self.close_connection = True
                raise _BodyError(Outcome.INVALID, "malformed chunked body") from None
            if size == 0:
                while self.rfile.readline(1024).strip():  # trailers
                    pass
                return b"".join(parts)
            total += size
            if total > cap:
                # Drained like an oversized Content-Length body (up to DRAIN_FACTOR x
                # cap), so the client reads a 413 instead of a broken pipe that it
                # would retry (and that was counted once per retry).
                self._drain_chunks(size, total, cap)
                raise _BodyError(Outcome.TOO_LARGE,
                                 f"chunked request exceeds the cap of {cap} bytes")
            chunk = self._recv(size)
            self.rfile.readline(16)
            if len(chunk) != size:
                self.close_connection = True
                raise _BodyError(Outcome.INVALID, "chunked body ended early")
            parts.append(chunk)

    def _gunzip(self, body: bytes, cap: int) -> bytes:
        """Inflate within the cap, the inflated bytes taken from the budget as they come
        (a small gzip bomb never gets past the cap); the compressed copy is given back
        once inflated."""
        out = _gunzip(body, cap, self._held)
        self._held.give_back(len(body))
        return out

    def _drain_chunks(self, pending: int, total: int, cap: int) -> None:
        """Skip the rest of a chunked body whose current chunk has ``pending`` bytes."""
        while True:
            if total > DRAIN_FACTOR * cap:
                self.close_connection = True
                return
            if not self._skip(pending):
                return
            self.rfile.readline(16)
            line = self.rfile.readline(1024)
            try:
                pending = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                self.close_connection = True
                return
            if pending <= 0:
                while self.rfile.readline(1024).strip():  # trailers
                    pass
                return
            total += pending

    def _drain(self, length: int, cap: int) -> None:
        if length > DRAIN_FACTOR * cap:
            self.close_connection = True
            return
        self._skip(length)

    def _skip(self, n: int) -> bool:
        """Read and discard ``n`` body bytes; False (and the connection closed) when the
        client stops sending first."""
        while n > 0:
            got = self.rfile.read(min(n, _CHUNK))
            if not got:
                self.close_connection = True
                return False
            n -= len(got)
        return True

    def _discard_unread_body(self) -> None:
        # A request refused before its body was read: drain it so keep-alive stays in sync.
        if self._body_read:
            return
        raw = self.headers.get("Content-Length")
        if raw is None or "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            self.close_connection = True
            return
        try:
            self._drain(int(raw), self.server.ingest.max_message_bytes)
        except (ValueError, OSError):
            self.close_connection = True

    # ── responses ───────────────────────────────────────────────────────────────────

    def _reject(self, result: Result, encoding: codec.Encoding) -> None:
        status = HTTP_STATUS[result.outcome]
        body = codec.status_body(GRPC_CODE[result.outcome].value[0], result.message, encoding)
        extra: dict[str, str] = {}
        if result.outcome is Outcome.UNAUTHENTICATED:
            extra["WWW-Authenticate"] = 'Bearer realm="proofscope"'
        elif result.outcome in (Outcome.BUSY, Outcome.OVER_BUDGET):
            extra["Retry-After"] = str(RETRY_AFTER_S)
        self._send(status, body, encoding.value, extra)

    def _plain(self, status: HTTPStatus, text: str, headers: dict[str, str] | None = None
               ) -> None:
        self._send(status, (text + "\n").encode(), "text/plain; charset=utf-8", headers)

    def _send(self, status: HTTPStatus, body: bytes, content_type: str,
              headers: dict[str, str] | None = None) -> None:
        if self.command == "POST" and status is not HTTPStatus.OK:
            self._discard_unread_body()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _gunzip(body: bytes, cap: int, held: Reservation | None = None) -> bytes:
    # Bounded: a small gzip bomb must not inflate past the cap.
    # A gzip stream may hold several members (RFC 1952 §2.2); each is inflated, and
    # the cap holds for them together (a second member used to be ignored silently).
    parts: list[bytes] = []
    size = 0
    rest = body
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while True:
            try:
                out = d.decompress(rest, min(_INFLATE_STEP, cap + 1 - size))
            except zlib.error as exc:
                raise _BodyError(Outcome.INVALID, f"bad gzip body: {exc}") from None
            size += len(out)
            if size > cap:
                raise _BodyError(Outcome.TOO_LARGE, f"decompressed request exceeds the cap "
                                                    f"of {cap} bytes")
            if held is not None and not held.take(len(out)):
                raise _BodyError(Outcome.OVER_BUDGET,
                                 f"receiver over its in-flight byte budget "
                                 f"({held.budget.limit} bytes), retry later")
            parts.append(out)
            rest = d.unconsumed_tail
            if not rest or not out:
                break
        if not d.eof:
            raise _BodyError(Outcome.INVALID, "truncated gzip body")
        rest = d.unused_data
        if not rest:
            return b"".join(parts)


class HttpReceiver:
    """An OTLP/HTTP server bound to ``host:port`` (port 0 picks a free one)."""

    def __init__(self, ingest: Ingest, host: str = "127.0.0.1", port: int = 4318) -> None:
        cls = _IPv6Server if ":" in host else _Server
        self._server = cls((host, port), _Handler)
        self._server.ingest = ingest
        self._server.watchdog = Watchdog()
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="proofscope-otlp-http", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._server.watchdog.stop()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout_s)
            self._thread = None
        self._server.server_close()
