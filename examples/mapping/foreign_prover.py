"""A prover that knows nothing of otel_proofscope: plain OpenTelemetry, its own names.

It stands for a Rust/Go/C++ prover instrumented with its language's OpenTelemetry (or
tracing-opentelemetry): spans ``prove`` → ``setup``, ``layer`` × N (with a ``round
done`` event per sumcheck round), ``open``, ``check``. ``myprover.toml`` next to it maps
those names onto the proof view (docs/mapping.md).

Run it against ``proofscope serve``:

    proofscope serve --map examples/mapping/myprover.toml --rerun file:walk.rrd &
    python examples/mapping/foreign_prover.py http://127.0.0.1:4317
"""

from __future__ import annotations

import sys
import time

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Tracer

KINDS = ("MatMul", "Activation", "MatMul", "Add")


def prove(tracer: Tracer, layers: int = 4, vars_per_layer: int = 5) -> int:
    """One proof; returns its trace id."""
    with tracer.start_as_current_span("prove", attributes={"layers": layers}) as root:
        with tracer.start_as_current_span("setup"):
            time.sleep(0.002)
        claim = 12345
        for i in range(layers):
            with tracer.start_as_current_span("layer", attributes={
                    "layer": i, "op": KINDS[i % len(KINDS)], "vars": vars_per_layer}) as span:
                for r in range(vars_per_layer):
                    time.sleep(0.0005)
                    claim = (claim * 31 + r) % (2**31 - 1)
                    span.add_event("round done", {"round": r, "claim": str(claim)})
        with tracer.start_as_current_span("open", attributes={"node": 0}):
            time.sleep(0.001)
        with tracer.start_as_current_span("check", attributes={"ok": True}):
            time.sleep(0.001)
        trace_id: int = root.get_span_context().trace_id
    return trace_id


def main(endpoint: str) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(resource=Resource({"service.name": "myprover"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint,
                                                                    insecure=True)))
    prove(provider.get_tracer("myprover"))
    provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:4317")
