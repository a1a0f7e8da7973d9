"""A prover that knows nothing of otel_proofscope: plain OpenTelemetry, its own span names.

The spans are shaped like a Rust zkVM prover's (SP1's ``prove`` → ``execute``,
``shard_record``, ``prove_shards`` → 4 × ``prove_shard`` → ``generate_traces``,
``commit_main``, ``open``; ``compress``, ``verify``), with plain attributes (``shard``,
``cycles``), one span event and one ``open`` that fails. ``proofscope serve`` draws them
in its trace view without any mapping::

    proofscope serve --rerun file:sp1.rrd &
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 python examples/foreign_prover.py
    kill -INT %1        # serve prints: rerun: drawn 22 spans; not drawn 0
    rerun sp1.rrd

For OTLP/HTTP: ``OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf`` and port 4318. The service
name is ``OTEL_SERVICE_NAME`` (default ``sp1-prover``).
"""

from __future__ import annotations

import os
import time

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode

#: prove, execute, shard_record, prove_shards, 4 × (prove_shard + 3 phases), compress, verify
SPANS = 22


def prove(tracer_provider: TracerProvider, shards: int = 4) -> int:
    """One proof's spans; returns the trace id."""
    tracer = tracer_provider.get_tracer("sp1_prover")
    with tracer.start_as_current_span("prove") as root:
        with tracer.start_as_current_span("execute", attributes={"cycles": 1_234_567}):
            time.sleep(0.002)
        with tracer.start_as_current_span("shard_record"):
            pass
        with tracer.start_as_current_span("prove_shards"):
            for shard in range(shards):
                with tracer.start_as_current_span("prove_shard", attributes={
                        "shard": shard, "cycles": 300_000 + shard}) as s:
                    for phase in ("generate_traces", "commit_main", "open"):
                        with tracer.start_as_current_span(phase) as p:
                            time.sleep(0.001)
                            if phase == "open" and shard == 2:
                                p.set_status(Status(StatusCode.ERROR, "opening proof failed"))
                    if shard == 1:
                        s.add_event("shard.checkpoint", {"rows": 4096})
        with tracer.start_as_current_span("compress"):
            pass
        with tracer.start_as_current_span("verify"):
            pass
        trace_id: int = root.get_span_context().trace_id
    return trace_id


def main() -> None:
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    if protocol.startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[assignment]
            OTLPSpanExporter,
        )
    service = os.environ.get("OTEL_SERVICE_NAME", "sp1-prover")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace_id = prove(provider)
    provider.shutdown()
    print(f"sent {SPANS} spans of trace {trace_id:032x} as {service!r}")


if __name__ == "__main__":
    main()
