"""The EZKL functions the instrumentor wraps and the state of one open proof.

``SPAN_NAMES`` maps each wrapped EZKL function to its span; :class:`OpenProof` is the
``proof`` root the instrumentor keeps open across several EZKL calls (see the package
docstring for when it opens and closes).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_proofscope.semconv import EzklSpanName, SpanName

PROOF_SYSTEM = "ezkl"


#: Wrapped EZKL function → span name.
SPAN_NAMES: dict[str, str] = {
    "gen_settings": EzklSpanName.GEN_SETTINGS,
    "calibrate_settings": EzklSpanName.CALIBRATE_SETTINGS,
    "compile_circuit": SpanName.CIRCUIT_COMPILE,
    "gen_srs": EzklSpanName.GEN_SRS,
    "gen_witness": EzklSpanName.GEN_WITNESS,
    "mock": EzklSpanName.MOCK,
    "setup": EzklSpanName.SETUP,
    "prove": EzklSpanName.PROVE,
    "verify": SpanName.VERIFY,
}

# Which argument names the settings file / compiled circuit, per function.
SETTINGS_WRITTEN = {"gen_settings": "output", "calibrate_settings": "settings",
                    "compile_circuit": "settings_path"}


def abs_path(value: Any) -> str | None:
    """An EZKL path argument as an absolute path; None for anything that is not a path."""
    if isinstance(value, str | os.PathLike):
        return os.path.abspath(os.fspath(value))
    return None


@dataclass
class OpenProof:
    """The ``proof`` root span kept open across EZKL calls, and what is known so far."""

    span: Span
    context: Context
    start_perf_ns: int
    proved: bool = False
    verified: bool | None = None
    failed: bool = False
    last_end_ns: int | None = None
    settings_known: bool = False
    ended: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def environment_context() -> Context | None:
    """The parent from ``TRACEPARENT`` / ``TRACESTATE`` (as ``opentelemetry-instrument``
    or a CI job passes it), if it names a valid span."""
    traceparent = os.environ.get("TRACEPARENT")
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if os.environ.get("TRACESTATE"):
        carrier["tracestate"] = os.environ["TRACESTATE"]
    ctx = TraceContextTextMapPropagator().extract(carrier)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def is_proof_span(span: Span) -> bool:
    return span.is_recording() and getattr(span, "name", None) == SpanName.PROOF
