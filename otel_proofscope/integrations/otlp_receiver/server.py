"""``OtlpReceiver``: the gRPC and HTTP front ends around one :class:`Ingest`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import TracebackType

from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import SpanExporter

from otel_proofscope.integrations.otlp_receiver import limits
from otel_proofscope.integrations.otlp_receiver.core import (
    ADMISSION_TIMEOUT_S,
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_MAX_MESSAGE_BYTES,
    Ingest,
)
from otel_proofscope.integrations.otlp_receiver.grpc_server import GrpcReceiver
from otel_proofscope.integrations.otlp_receiver.http_server import HttpReceiver

_log = logging.getLogger("otel_proofscope.serve")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_GRPC_PORT = 4317
DEFAULT_HTTP_PORT = 4318


class OtlpReceiver:
    """Receives OTLP traces and metrics over gRPC and/or HTTP and feeds SDK exporters.

    ``grpc_port`` / ``http_port``: ``None`` turns that transport off, ``0`` picks a free
    port (read it back from ``grpc_port`` / ``http_port`` after construction). Exporters
    are shut down by :meth:`stop`.
    """

    def __init__(self, span_exporters: Sequence[SpanExporter] = (),
                 metric_exporters: Sequence[MetricExporter] = (), *,
                 host: str = DEFAULT_HOST, grpc_port: int | None = DEFAULT_GRPC_PORT,
                 http_port: int | None = DEFAULT_HTTP_PORT, token: str | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 max_concurrent: int = DEFAULT_MAX_CONCURRENT,
                 admission_timeout_s: float = ADMISSION_TIMEOUT_S,
                 max_inflight_bytes: int | None = None,
                 request_deadline_s: float = limits.DEFAULT_REQUEST_DEADLINE_S) -> None:
        if grpc_port is None and http_port is None:
            raise ValueError("at least one of grpc_port and http_port must be given")
        self.ingest = Ingest(span_exporters, metric_exporters, token=token,
                             max_message_bytes=max_message_bytes,
                             max_concurrent=max_concurrent,
                             admission_timeout_s=admission_timeout_s,
                             # at least one message at the cap, with its inflated copy
                             max_inflight_bytes=max_inflight_bytes or max(
                                 limits.DEFAULT_MAX_INFLIGHT_BYTES, 2 * max_message_bytes),
                             request_deadline_s=request_deadline_s)
        self.host = host
        self._grpc = GrpcReceiver(self.ingest, host, grpc_port) if grpc_port is not None \
            else None
        try:
            self._http = HttpReceiver(self.ingest, host, http_port) if http_port is not None \
                else None
        except BaseException:
            if self._grpc is not None:
                self._grpc.stop(0)
            raise
        self._started = False

    @property
    def grpc_port(self) -> int | None:
        return self._grpc.port if self._grpc else None

    @property
    def http_port(self) -> int | None:
        return self._http.port if self._http else None

    @property
    def grpc_endpoint(self) -> str | None:
        """``host:port`` for an OTLP/gRPC exporter (insecure)."""
        return self._grpc.endpoint if self._grpc else None

    @property
    def http_endpoint(self) -> str | None:
        """Base URL for an OTLP/HTTP exporter (append ``/v1/traces`` or ``/v1/metrics``)."""
        return self._http.endpoint if self._http else None

    def start(self) -> OtlpReceiver:
        if self._grpc:
            self._grpc.start()
        if self._http:
            self._http.start()
        self._started = True
        _log.info("OTLP receiver listening: gRPC %s, HTTP %s", self.grpc_endpoint,
                  self.http_endpoint)
        return self

    def stop(self, grace_s: float = 2.0) -> None:
        """Stop accepting, let in-flight requests finish (bounded), shut exporters down.
        Requests still waiting for room are refused (and counted) at once."""
        self.ingest.stop_waiting()
        if self._http:
            self._http.stop(grace_s)
        if self._grpc:
            self._grpc.stop(grace_s)
        if self._started:
            self._started = False
            self.ingest.shutdown()

    def stats(self) -> dict[str, int]:
        return self.ingest.stats()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
