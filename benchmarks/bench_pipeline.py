"""Pipeline cost on the prover thread and OTLP end-to-end delivery, vs the stock SDK.

Run: python benchmarks/bench_pipeline.py [--spans N]
Starts a real OTLP gRPC receiver on 127.0.0.1 (the official proto services, answering
success) and measures, side by side in one process:

* per-span cost on the prover thread: discarding exporter, stock SDK
  BatchSpanProcessor + OTLP, otel_proofscope's bounded pipeline + the official OTLP
  exporter, and the bounded pipeline + FastOTLPSpanExporter (direct wire encoder);
* a burst of N spans: how many the receiver got, and how many were lost (and, for
  otel_proofscope, whether the loss was counted exactly);
* the encoders alone: µs per prover span, official ``encode_spans`` +
  ``SerializeToString`` vs ``encode_export_request``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Sequence
from concurrent import futures

import grpc
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from otel_proofscope.pipeline.drops import DropLedger
from otel_proofscope.pipeline.fast_otlp import FastOTLPSpanExporter, encode_export_request
from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.spans = 0
        self.lock = threading.Lock()

    def Export(self, request, context):  # type: ignore[no-untyped-def]
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with self.lock:
            self.spans += n
        return trace_service_pb2.ExportTraceServiceResponse()


def start_receiver() -> tuple[grpc.Server, Receiver, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2),
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    receiver = Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, receiver, port


class Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def workload(provider: TracerProvider, n: int) -> float:
    """A prover-like span: a layer with 8 attributes and 4 round events."""
    tracer = provider.get_tracer("bench")
    attrs = {"proof.layer.index": 1, "proof.layer.kind": "MatMul",
             "proof.layer.proof_kind": "Sumcheck", "proof.sumcheck.rounds": 4,
             "proof.layer.trace_cost": 4096, "proof.claim.initial": "(1,2,3,4)",
             "proof.layer.input.shape": [1, 64], "proof.layer.output.shape": [1, 64]}
    ev = {"proof.sumcheck.round": 0, "proof.sumcheck.degree": 2,
          "proof.sumcheck.poly": ["(1,2,3,4)", "(5,6,7,8)", "(9,10,11,12)"],
          "proof.claim": "(1,2,3,4)"}
    start = time.perf_counter()
    for _ in range(n):
        with tracer.start_as_current_span("proof.layer", attributes=attrs) as span:
            for _r in range(4):
                span.add_event("proof.sumcheck.round", ev)
    return time.perf_counter() - start


def encoder_costs(n: int = 512, reps: int = 7) -> list[tuple[str, float, float]]:
    """Best-of-reps µs/span of both encoders on a batch of n workload spans, for
    identical spans (the benchmark's) and for spans whose round values all differ."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    def batch(varied: bool) -> Sequence[ReadableSpan]:
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        if not varied:
            workload(provider, n)
            return memory.get_finished_spans()
        tracer = provider.get_tracer("bench")
        for i in range(n):
            with tracer.start_as_current_span("proof.layer", attributes={
                    "proof.layer.index": i, "proof.layer.kind": "MatMul",
                    "proof.layer.proof_kind": "Sumcheck", "proof.sumcheck.rounds": 4,
                    "proof.layer.trace_cost": 4096 + i, "proof.claim.initial": f"({i},2,3,4)",
                    "proof.layer.input.shape": [1, 64], "proof.layer.output.shape": [1, 64]},
                    ) as span:
                for r in range(4):
                    span.add_event("proof.sumcheck.round", {
                        "proof.sumcheck.round": r, "proof.sumcheck.degree": 2,
                        "proof.sumcheck.poly": [f"({i},{r},1)", f"({i},{r},2)", f"({i},{r},3)"],
                        "proof.claim": f"({i},{r},3,4)"})
        return memory.get_finished_spans()

    def best(fn, spans: Sequence[ReadableSpan]) -> float:  # type: ignore[no-untyped-def]
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn(spans)
            times.append(time.perf_counter() - start)
        return min(times) / len(spans) * 1e6

    rows = []
    for label, varied in (("identical spans", False), ("every value distinct", True)):
        spans = batch(varied)
        assert encode_export_request(spans) == encode_spans(spans).SerializeToString()
        official = best(lambda s: encode_spans(s).SerializeToString(), spans)
        ours = best(encode_export_request, spans)
        rows.append((label, official, ours))
    return rows


def run(label: str, processor_factory, n: int, receiver: Receiver | None,  # type: ignore[no-untyped-def]
        ledger: DropLedger | None = None) -> dict[str, object]:
    provider = TracerProvider()
    provider.add_span_processor(processor_factory())
    before = receiver.spans if receiver else 0
    elapsed = workload(provider, n)
    flush_start = time.perf_counter()
    provider.shutdown()
    flush = time.perf_counter() - flush_start
    delivered = (receiver.spans - before) if receiver else n
    counted = ledger.total(signal="spans") if ledger else None
    return {"label": label, "per_span_us": elapsed / n * 1e6, "delivered": delivered,
            "lost": n - delivered, "counted": counted, "shutdown_s": flush}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=20_000)
    args = parser.parse_args()
    n = args.spans
    server, receiver, port = start_receiver()
    endpoint = f"127.0.0.1:{port}"
    ledger = DropLedger(log_interval_s=3600)
    fast_ledger = DropLedger(log_interval_s=3600)
    rows = [
        run("discarding exporter (baseline)",
            lambda: BoundedBatchSpanProcessor(Discard(), sink="discard"), n, None),
        run("stock SDK BatchSpanProcessor + OTLP gRPC",
            lambda: BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)),
            n, receiver),
        run("otel_proofscope bounded processor + OTLP gRPC",
            lambda: BoundedBatchSpanProcessor(
                OTLPSpanExporter(endpoint=endpoint, insecure=True), sink="otlp",
                ledger=ledger), n, receiver, ledger),
        run("otel_proofscope bounded processor + fast OTLP gRPC",
            lambda: BoundedBatchSpanProcessor(
                FastOTLPSpanExporter(endpoint, protocol="grpc", insecure=True),
                sink="otlp", ledger=fast_ledger), n, receiver, fast_ledger),
    ]
    server.stop(0)
    base = float(rows[0]["per_span_us"])  # type: ignore[arg-type]
    print(f"\nburst of {n} spans (4 events each) against a live OTLP gRPC receiver on "
          "loopback\n")
    print("| pipeline | prover-thread µs/span | vs discard | delivered | lost | lost & counted "
          "| shutdown s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        counted = "n/a (uncounted)" if r["counted"] is None else r["counted"]
        if r["label"].startswith("discard"):  # type: ignore[union-attr]
            counted = "—"
        print(f"| {r['label']} | {r['per_span_us']:.1f} | "
              f"{float(r['per_span_us']) / base:.2f}x | {r['delivered']} | {r['lost']} | "  # type: ignore[arg-type]
              f"{counted} | {r['shutdown_s']:.2f} |")
    print("\nOTLP encoding alone, prover span (8 attributes incl. 2 int arrays, 4 events of "
          "4 attributes incl. a 3-string array), batch of 512\n")
    print("| spans | official encode_spans + SerializeToString µs/span | "
          "encode_export_request µs/span | speed-up |")
    print("|---|---|---|---|")
    for label, official, ours in encoder_costs():
        print(f"| {label} | {official:.1f} | {ours:.1f} | {official / ours:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
