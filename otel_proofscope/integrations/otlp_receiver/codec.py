"""Wire formats of OTLP: protobuf and OTLP/JSON request bodies, responses and errors.

OTLP/JSON is the protobuf JSON mapping with two differences that ``json_format`` does not
know: trace and span ids are hex strings (not base64), and unknown fields must be
ignored. :func:`decode` turns the ids into base64 before parsing so one message type and
one conversion path serve both encodings.
"""

from __future__ import annotations

import base64
import json
from enum import StrEnum
from typing import Any

from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError, Message  # type: ignore[import-untyped]
from google.rpc.status_pb2 import Status  # type: ignore[import-untyped]
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1 import trace_pb2


class Signal(StrEnum):
    TRACES = "traces"
    METRICS = "metrics"


class Encoding(StrEnum):
    PROTOBUF = "application/x-protobuf"
    JSON = "application/json"


#: HTTP paths of the OTLP/HTTP endpoints.
PATHS: dict[str, Signal] = {"/v1/traces": Signal.TRACES, "/v1/metrics": Signal.METRICS}

_REQUEST: dict[Signal, type[Message]] = {
    Signal.TRACES: ExportTraceServiceRequest,
    Signal.METRICS: ExportMetricsServiceRequest,
}
_RESPONSE: dict[Signal, type[Message]] = {
    Signal.TRACES: ExportTraceServiceResponse,
    Signal.METRICS: ExportMetricsServiceResponse,
}

# Fields that carry ids as hex in OTLP/JSON (camelCase as written, snake_case as accepted).
_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id",
                      "parent_span_id"})

#: Deepest JSON nesting walked when fixing ids (protobuf's own recursion limit is 100).
MAX_JSON_DEPTH = 128


class BadRequest(ValueError):
    """The body is not a valid OTLP request of the expected kind."""


def media_type(content_type: str | None) -> Encoding | None:
    """The OTLP encoding named by a Content-Type header (parameters ignored)."""
    if not content_type:
        return None
    base = content_type.split(";", 1)[0].strip().lower()
    for enc in Encoding:
        if base == enc.value:
            return enc
    return None


def decode(signal: Signal, body: bytes, encoding: Encoding) -> Message:
    """Parse a request body; raises :class:`BadRequest` with a reason."""
    msg = _REQUEST[signal]()
    if encoding is Encoding.PROTOBUF:
        try:
            msg.ParseFromString(body)
        except (DecodeError, RecursionError, ValueError) as exc:
            raise BadRequest(f"not a valid protobuf {msg.DESCRIPTOR.name}: {exc}") from None
        return msg
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadRequest(f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadRequest(f"OTLP/JSON body must be an object, got {type(obj).__name__}")
    _hex_ids_to_base64(obj, 0)
    try:
        json_format.ParseDict(obj, msg, ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError, TypeError, ValueError) as exc:
        raise BadRequest(f"not a valid OTLP/JSON {msg.DESCRIPTOR.name}: {exc}") from None
    return msg


#: Stand-ins the converter refuses item by item (a partial success, not a refused
#: request): a 1-byte id (ids are 8 or 16 bytes) and a span kind no enum value has.
_BAD_ID = base64.b64encode(b"\x00").decode("ascii")
_BAD_KIND = 0x7FFF
_SPAN_KINDS = frozenset(trace_pb2.Span.SpanKind.keys())


def _hex_ids_to_base64(node: Any, depth: int) -> None:
    if depth > MAX_JSON_DEPTH:
        raise BadRequest("OTLP/JSON nested too deeply")
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                try:
                    node[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
                except ValueError:
                    # One odd-length id costs only its span (it used to refuse the
                    # whole request).
                    node[key] = _BAD_ID
            elif key == "kind" and isinstance(value, str) and value not in _SPAN_KINDS:
                # protobuf's parser would quietly drop an unknown enum name (-> INTERNAL).
                node[key] = _BAD_KIND
            else:
                _hex_ids_to_base64(value, depth + 1)
    elif isinstance(node, list):
        for item in node:
            _hex_ids_to_base64(item, depth + 1)


def response(signal: Signal, rejected: int = 0, error_message: str = "") -> Message:
    """An export response, with partial success when something was rejected."""
    msg = _RESPONSE[signal]()
    if rejected or error_message:
        ps = msg.partial_success  # type: ignore[attr-defined]
        if signal is Signal.TRACES:
            ps.rejected_spans = rejected
        else:
            ps.rejected_data_points = rejected
        ps.error_message = error_message
    return msg


def encode(msg: Message, encoding: Encoding) -> bytes:
    if encoding is Encoding.JSON:
        text: str = json_format.MessageToJson(msg, indent=None)
        return text.encode("utf-8")
    data: bytes = msg.SerializeToString()
    return data


def status_body(grpc_code: int, message: str, encoding: Encoding) -> bytes:
    """An OTLP/HTTP error body: a google.rpc.Status in the request's encoding."""
    return encode(Status(code=grpc_code, message=message), encoding)
