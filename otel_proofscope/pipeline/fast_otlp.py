"""OTLP span export over gRPC or HTTP/protobuf with the direct wire-format encoder.

The bytes come from :func:`otel_proofscope.otlp.encode.encode_export_request` (same
``ExportTraceServiceRequest`` as the official encoder, a fraction of its cost; it is
re-exported here for the code that imported it from this module).

:class:`FastOTLPSpanExporter` sends those bytes over gRPC or HTTP/protobuf, reads the
standard ``OTEL_EXPORTER_OTLP_*`` variables like the official exporters, retries
retryable failures with jittered backoff strictly inside its timeout, and reports
spans a receiver rejected through a partial-success response to the drop ledger.
"""

from __future__ import annotations

import gzip
import logging
import os
import random
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_proofscope.ledger import DROPS, DropLedger
from otel_proofscope.otlp.encode import encode_export_request
from otel_proofscope.pipeline.failure_log import FailureLog
from otel_proofscope.pipeline.invalid_spans import count_invalid
from otel_proofscope.semconv import DropReason

__all__ = ["FastOTLPSpanExporter"]

_log = logging.getLogger(__name__)

_GRPC_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
_BACKOFF_BASE_S = 0.25
_BACKOFF_MAX_S = 4.0
_DEFAULT_TIMEOUT_S = 10.0
_PROTOCOLS = ("grpc", "http/protobuf")


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _traces_env(suffix: str) -> str | None:
    """``OTEL_EXPORTER_OTLP_TRACES_<suffix>``, else ``OTEL_EXPORTER_OTLP_<suffix>``."""
    return _env(f"OTEL_EXPORTER_OTLP_TRACES_{suffix}", f"OTEL_EXPORTER_OTLP_{suffix}")


def _read_file(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


@dataclass
class _Attempt:
    """One send's outcome: ``response`` is the raw ExportTraceServiceResponse on
    success; ``retry_after`` a server-requested delay."""

    ok: bool
    retryable: bool = False
    detail: str = ""
    response: bytes | None = None
    retry_after: float | None = None


class _GrpcTransport:
    def __init__(self, endpoint: str | None, insecure: bool | None,
                 headers: dict[str, str], compression: str) -> None:
        import grpc
        from opentelemetry.exporter.otlp.proto.grpc import _OTLP_GRPC_CHANNEL_OPTIONS

        self._grpc = grpc
        url = endpoint or _traces_env("ENDPOINT") or "http://localhost:4317"
        parsed = urlparse(url)
        # The official gRPC exporter's rules: TRACES_INSECURE, then https => secure,
        # then OTEL_EXPORTER_OTLP_INSECURE, else secure unless the scheme is http.
        if insecure is None and (traces := os.environ.get("OTEL_EXPORTER_OTLP_TRACES_INSECURE")):
            insecure = traces.strip().lower() == "true"
        if parsed.scheme == "https":
            insecure = False
        if insecure is None:
            generic = os.environ.get("OTEL_EXPORTER_OTLP_INSECURE")
            insecure = (generic.strip().lower() == "true" if generic is not None
                        else parsed.scheme == "http")
        self.target = parsed.netloc or url
        options = [*_OTLP_GRPC_CHANNEL_OPTIONS,
                   # A collector that comes back is found within 2 s, not gRPC's 120 s.
                   ("grpc.initial_reconnect_backoff_ms", 200),
                   ("grpc.min_reconnect_backoff_ms", 200),
                   ("grpc.max_reconnect_backoff_ms", 2000)]
        algo = {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}.get(
            compression, grpc.Compression.NoCompression)
        if insecure:
            self._channel = grpc.insecure_channel(self.target, options=options,
                                                  compression=algo)
        else:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read_file(_traces_env("CERTIFICATE")),
                private_key=_read_file(_traces_env("CLIENT_KEY")),
                certificate_chain=_read_file(_traces_env("CLIENT_CERTIFICATE")))
            self._channel = grpc.secure_channel(self.target, creds, options=options,
                                                compression=algo)
        self._metadata = tuple(headers.items())
        self._call = self._channel.unary_unary(
            _GRPC_EXPORT_METHOD, request_serializer=lambda b: b,
            response_deserializer=lambda b: b)
        self._retryable = frozenset({
            grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED,
            grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DATA_LOSS})

    def send(self, body: bytes, timeout: float) -> _Attempt:
        try:
            response = self._call(body, timeout=timeout, metadata=self._metadata)
        except self._grpc.RpcError as error:
            code = error.code()
            return _Attempt(False, code in self._retryable,
                            f"{code}: {error.details()}", retry_after=_grpc_retry_after(error))
        return _Attempt(True, response=response)

    def close(self) -> None:
        self._channel.close()


def _grpc_retry_after(error: Any) -> float | None:
    try:
        from google.rpc.error_details_pb2 import RetryInfo  # type: ignore[import-untyped]

        raw = dict(error.trailing_metadata() or ()).get("google.rpc.retryinfo-bin")
        if raw is None:
            return None
        delay = RetryInfo.FromString(raw).retry_delay
        return float(delay.seconds + delay.nanos / 1e9)
    except Exception:
        return None


class _HttpTransport:
    def __init__(self, endpoint: str | None, headers: dict[str, str],
                 compression: str) -> None:
        import requests
        from opentelemetry.exporter.otlp.proto.http import _OTLP_HTTP_HEADERS

        self._requests = requests
        if endpoint:
            self.target = endpoint
        elif traces := os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
            self.target = traces
        else:
            base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
            self.target = f"{base.removesuffix('/')}/v1/traces"
        self._headers = {k.lower(): v for k, v in _OTLP_HTTP_HEADERS.items()}
        self._headers.update(headers)
        self._compression = compression if compression in ("gzip", "deflate") else "none"
        if self._compression != "none":
            self._headers["content-encoding"] = self._compression
        self._verify: bool | str = _traces_env("CERTIFICATE") or True
        key, cert = _traces_env("CLIENT_KEY"), _traces_env("CLIENT_CERTIFICATE")
        self._cert: Any = (cert, key) if cert and key else cert
        self._session = requests.Session()

    def send(self, body: bytes, timeout: float) -> _Attempt:
        if self._compression == "gzip":
            body = gzip.compress(body, compresslevel=6)
        elif self._compression == "deflate":
            body = zlib.compress(body)
        requests = self._requests
        try:
            response = self._session.post(self.target, data=body, headers=self._headers,
                                          timeout=timeout, verify=self._verify,
                                          cert=self._cert)
        except (requests.ConnectionError, requests.Timeout) as error:
            return _Attempt(False, True, repr(error))
        except requests.RequestException as error:
            return _Attempt(False, False, repr(error))
        status = response.status_code
        if 200 <= status < 300:
            return _Attempt(True, response=response.content)
        retry_after = None
        header = response.headers.get("retry-after")
        if header:
            try:
                retry_after = max(0.0, float(header))
            except ValueError:
                retry_after = None
        return _Attempt(False, status in _RETRYABLE_HTTP, f"HTTP {status} {response.reason}",
                        retry_after=retry_after)

    def close(self) -> None:
        self._session.close()


class FastOTLPSpanExporter(SpanExporter):
    """OTLP span exporter (gRPC or HTTP/protobuf) using :func:`encode_export_request`.

    Configured like the official exporters from ``OTEL_EXPORTER_OTLP[_TRACES]_*``
    (ENDPOINT, PROTOCOL, HEADERS, TIMEOUT in seconds, INSECURE, COMPRESSION,
    CERTIFICATE, CLIENT_KEY, CLIENT_CERTIFICATE); constructor arguments win.
    ``export`` never takes longer than ``timeout`` seconds, retries included, and
    returns FAILURE for a batch it could not deliver (the caller counts it as lost).
    Spans a receiver rejects in a partial-success response were delivered and refused,
    so they are recorded here, in ``ledger`` under reason ``invalid``; so is a span
    with a time OTLP cannot carry, refused alone before sending (the rest of its batch
    is sent).
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        protocol: str | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | str | None = None,
        compression: str | None = None,
        insecure: bool | None = None,
        sink: str = "otlp",
        ledger: DropLedger = DROPS,
    ) -> None:
        from opentelemetry.util.re import parse_env_headers

        self.protocol = (protocol or _traces_env("PROTOCOL") or "grpc").strip().lower()
        if self.protocol not in _PROTOCOLS:
            raise ValueError(f"unsupported OTLP protocol {self.protocol!r}: "
                             f"FastOTLPSpanExporter speaks {' and '.join(_PROTOCOLS)}")
        if timeout is None:
            raw = _traces_env("TIMEOUT")
            try:
                timeout = float(raw) if raw else _DEFAULT_TIMEOUT_S
            except ValueError:
                _log.warning("invalid OTLP timeout %r, using %.0f s", raw, _DEFAULT_TIMEOUT_S)
                timeout = _DEFAULT_TIMEOUT_S
        self.timeout = float(timeout)
        merged = dict(parse_env_headers(_traces_env("HEADERS") or "", liberal=True))
        if isinstance(headers, str):
            headers = parse_env_headers(headers, liberal=True)
        merged.update({k.lower(): v for k, v in (headers or {}).items()})
        compression = (compression or _traces_env("COMPRESSION") or "none").strip().lower()
        if compression not in ("none", "gzip", "deflate"):
            _log.warning("unsupported OTLP compression %r, sending uncompressed", compression)
            compression = "none"
        self._sink = sink
        self._ledger = ledger
        self._stop = threading.Event()
        self._closed = False
        self._warned_invalid = False
        self._transport: _GrpcTransport | _HttpTransport = (
            _GrpcTransport(endpoint, insecure, merged, compression)
            if self.protocol == "grpc" else _HttpTransport(endpoint, merged, compression))
        self.endpoint = self._transport.target
        self._failures = FailureLog(_log, self.endpoint)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        deadline = time.monotonic() + self.timeout
        refused: list[ReadableSpan] = []
        try:
            body = encode_export_request(spans, refused)
        except Exception as error:
            _log.error("failed to encode %d span(s) for OTLP: %r", len(spans), error)
            return SpanExportResult.FAILURE
        if not body:  # every span refused: nothing to send
            self._count_refused(refused)
            return SpanExportResult.SUCCESS
        attempt_no = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._failures.failed(len(spans), "OTLP export of %d span(s) to %s timed "
                                      "out after %.1f s", len(spans), self.endpoint,
                                      self.timeout)
                return SpanExportResult.FAILURE
            attempt = self._transport.send(body, remaining)
            if attempt.ok:
                self._failures.succeeded()
                self._count_refused(refused)
                self._partial_success(attempt.response)
                return SpanExportResult.SUCCESS
            if not attempt.retryable or self._stop.is_set():
                self._failures.failed(len(spans), "OTLP export of %d span(s) to %s failed: %s",
                                      len(spans), self.endpoint, attempt.detail)
                return SpanExportResult.FAILURE
            backoff = attempt.retry_after
            if backoff is None:
                backoff = min(_BACKOFF_MAX_S, _BACKOFF_BASE_S * 2**attempt_no)
                backoff *= random.uniform(0.8, 1.2)
            attempt_no += 1
            if backoff >= deadline - time.monotonic():
                self._failures.failed(len(spans), "OTLP export of %d span(s) to %s failed "
                                      "(%s); no time left to retry within %.1f s", len(spans),
                                      self.endpoint, attempt.detail, self.timeout)
                return SpanExportResult.FAILURE
            _log.debug("OTLP export to %s: %s, retrying in %.2f s", self.endpoint,
                       attempt.detail, backoff)
            if self._stop.wait(backoff):
                return SpanExportResult.FAILURE

    def _count_refused(self, refused: list[ReadableSpan]) -> None:
        # Counted only with a SUCCESS: on FAILURE the processor counts the whole batch
        # as lost (export_failed), these spans included; counting them here too would
        # count them twice.
        if refused:
            count_invalid(refused, self._sink, self._ledger, self._warned_invalid)
            self._warned_invalid = True

    def _partial_success(self, raw: bytes | None) -> None:
        if not raw:
            return
        try:
            partial = ExportTraceServiceResponse.FromString(raw).partial_success
        except Exception:  # a receiver's malformed answer to a delivered request
            return
        if partial.rejected_spans:
            self._ledger.record("spans", self._sink, DropReason.INVALID, partial.rejected_spans)
            _log.warning("OTLP receiver %s rejected %d span(s): %s", self.endpoint,
                         partial.rejected_spans, partial.error_message)
        elif partial.error_message:
            _log.warning("OTLP receiver %s: %s", self.endpoint, partial.error_message)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()  # aborts a backoff wait in progress
        try:
            self._transport.close()
        except Exception as error:
            _log.debug("closing OTLP transport raised %r", error)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
