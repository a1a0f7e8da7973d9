"""OTLP/gRPC front end: TraceService and MetricsService on a grpcio server.

The servicers subclass the generated ones from ``opentelemetry-proto`` but are registered
with raw-bytes request deserializers: when grpcio's own deserializer fails it answers
INTERNAL and the request never reaches us, whereas a malformed OTLP request must get
INVALID_ARGUMENT and be counted. The same holds for the size cap: gRPC core is allowed a
transport ceiling above the cap (:data:`CEILING_FACTOR` × cap) so that oversized requests
reach the core here, are counted and get RESOURCE_EXHAUSTED; only a request above the
ceiling is refused by gRPC core itself (same code, not counted: it never arrives).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from otel_proofscope.integrations.otlp_receiver import codec, limits
from otel_proofscope.integrations.otlp_receiver.core import Ingest, Outcome

#: gRPC core's receive limit, as a multiple of the receiver's own cap.
CEILING_FACTOR = 4
#: Seconds in-flight calls get to finish when the server stops.
STOP_GRACE_S = 2.0
#: The longest a request is held for room, whatever deadline it sets: a hostile client
#: with an hour's deadline must not keep a worker thread (there are 16) for most of it.
#: The OTLP exporters' default timeout is 10 s, which this leaves untouched.
MAX_HOLD_S = 10.0

GRPC_CODE: dict[Outcome, grpc.StatusCode] = {
    Outcome.OK: grpc.StatusCode.OK,
    Outcome.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    Outcome.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Outcome.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Outcome.UNSUPPORTED_MEDIA_TYPE: grpc.StatusCode.INVALID_ARGUMENT,
    Outcome.BUSY: grpc.StatusCode.UNAVAILABLE,
    Outcome.OVER_BUDGET: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Outcome.TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
}

#: Trailing metadata key of google.rpc.RetryInfo, which OTLP exporters honour.
RETRY_INFO_KEY = "google.rpc.retryinfo-bin"


def _retry_info(seconds: int) -> bytes:
    from google.rpc.error_details_pb2 import RetryInfo  # type: ignore[import-untyped]

    info = RetryInfo()
    info.retry_delay.seconds = seconds
    return bytes(info.SerializeToString())

_TRACE_SERVICE = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name
_METRICS_SERVICE = metrics_service_pb2.DESCRIPTOR.services_by_name["MetricsService"].full_name


def _reply_by(context: grpc.ServicerContext) -> float | None:
    """When the client needs its answer: its deadline less a margin for the reply to
    travel, and never more than :data:`MAX_HOLD_S` from now (None: no deadline given)."""
    remaining: float | None = context.time_remaining()
    if remaining is None or remaining > 1e9:  # grpcio's "no deadline" is huge, not None
        return None
    # The margin covers the chunk in hand, the answer's trip and a full collection on a
    # loaded machine (measured: 4 of 4 answers late with 10 %): an
    # answer past the deadline is a failure to the client, which resends what we took.
    return time.monotonic() + min(MAX_HOLD_S,
                                  max(0.0, remaining - max(2.0, 0.3 * remaining)))


def _export(ingest: Ingest, signal: codec.Signal, body: bytes,
            context: grpc.ServicerContext) -> bytes:
    reply_by = _reply_by(context)
    auth = [v for k, v in context.invocation_metadata()
            if k.lower() == "authorization" and isinstance(v, str)]
    if not ingest.authorized_all(auth):
        result = ingest.reject(signal, Outcome.UNAUTHENTICATED,
                               "missing or wrong bearer token (metadata 'authorization')")
    elif (too_large := ingest.too_large(signal, len(body))) is not None:
        result = too_large
    elif not ingest.budget.reserve(len(body), wait_until=reply_by):
        # grpc core already holds the body: waiting for room (until the client's
        # deadline, see Ingest.handle) costs no new memory, and decode and export (the
        # amplification) start only within the budget.
        result = ingest.reject(signal, Outcome.OVER_BUDGET,
                               f"receiver over its in-flight byte budget "
                               f"({ingest.budget.limit} bytes), retry later")
    else:
        try:
            if not ingest.admit(wait_until=reply_by):
                result = ingest.reject(signal, Outcome.BUSY, "receiver busy, retry later")
            else:
                try:
                    result = ingest.handle(signal, body, codec.Encoding.PROTOBUF,
                                           reply_by=reply_by)
                finally:
                    ingest.release()
        finally:
            ingest.budget.release(len(body))
    if result.outcome is Outcome.OK and result.response is not None:
        return codec.encode(result.response, codec.Encoding.PROTOBUF)
    if result.outcome in (Outcome.OVER_BUDGET, Outcome.BUSY):
        context.set_trailing_metadata(((RETRY_INFO_KEY, _retry_info(limits.RETRY_AFTER_S)),))
    context.abort(GRPC_CODE[result.outcome], result.message)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


class TraceServicer(trace_service_pb2_grpc.TraceServiceServicer):
    """``TraceService/Export`` taking the serialized request (see module doc)."""

    def __init__(self, ingest: Ingest) -> None:
        self._ingest = ingest

    def Export(self, request: Any, context: Any) -> Any:
        return _export(self._ingest, codec.Signal.TRACES, request, context)


class MetricsServicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    """``MetricsService/Export`` taking the serialized request (see module doc)."""

    def __init__(self, ingest: Ingest) -> None:
        self._ingest = ingest

    def Export(self, request: Any, context: Any) -> Any:
        return _export(self._ingest, codec.Signal.METRICS, request, context)


def _raw_handler(service: str, export: Callable[[Any, Any], Any]) -> grpc.GenericRpcHandler:
    # Same shape as the generated add_*Servicer_to_server, minus the deserializer.
    method = grpc.unary_unary_rpc_method_handler(
        export, request_deserializer=None, response_serializer=None)
    return grpc.method_handlers_generic_handler(service, {"Export": method})


class GrpcReceiver:
    """An OTLP/gRPC server bound to ``host:port`` (port 0 picks a free one)."""

    def __init__(self, ingest: Ingest, host: str = "127.0.0.1", port: int = 4317) -> None:
        ceiling = CEILING_FACTOR * ingest.max_message_bytes
        self._server = grpc.server(
            # Twice the admission slots: requests past the slots reach Ingest.admit and are
            # turned away (and counted) instead of queueing silently in the executor.
            futures.ThreadPoolExecutor(max_workers=2 * ingest.max_concurrent,
                                       thread_name_prefix="proofscope-otlp-grpc"),
            options=[("grpc.max_receive_message_length", ceiling),
                     ("grpc.so_reuseport", 0)])
        self._server.add_generic_rpc_handlers((
            _raw_handler(_TRACE_SERVICE, TraceServicer(ingest).Export),
            _raw_handler(_METRICS_SERVICE, MetricsServicer(ingest).Export),
        ))
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            self.port: int = self._server.add_insecure_port(address)
        except RuntimeError as exc:  # grpcio reports a failed bind this way
            self._server.stop(0)
            raise OSError(f"cannot bind OTLP/gRPC to {address}: {exc}") from None
        self.host = host

    @property
    def endpoint(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def start(self) -> None:
        self._server.start()

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        self._server.stop(grace_s).wait(grace_s + 1.0)
