// One non-Python "prover" for benchmarks/bench_node_fleet.py: the official OpenTelemetry
// JS SDK (TracerProvider + BatchSpanProcessor, default settings) and the official
// OTLP exporter (gRPC or HTTP/protobuf, default retries), sending one proof: a `proof`
// root, LAYERS `proof.layer` spans of ROUNDS `proof.sumcheck.round` events each, and a
// `proof.verify` span. Prints one JSON line: spans handed to the exporter, spans whose
// export succeeded (after the exporter's own retries), and every failure's message.
//
// Usage: node prover.mjs grpc|http ENDPOINT NAME [LAYERS] [ROUNDS] [LAYER_MS]
// LAYER_MS: the time one layer's proof takes (a timer: the work is elsewhere, on a GPU,
// and leaves the machine's CPUs to serve), so that the batch processor exports on its
// 5 s schedule as under a real prover, not the whole proof at its final flush.

import { SpanStatusCode } from "@opentelemetry/api";
import { OTLPTraceExporter as GrpcExporter } from "@opentelemetry/exporter-trace-otlp-grpc";
import { OTLPTraceExporter as HttpExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BatchSpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";

const [protocol, endpoint, name, layersArg, roundsArg] = process.argv.slice(2);
const LAYERS = Number(layersArg ?? 250);
const ROUNDS = Number(roundsArg ?? 128);
const LAYER_MS = Number(process.argv[7] ?? 0);

const inner = protocol === "grpc"
  ? new GrpcExporter({ url: endpoint })
  : new HttpExporter({ url: `${endpoint}/v1/traces` });

// Counts what the exporter reports back for each batch, after its retries.
const result = { name, protocol, handed: 0, ok: 0, failed: 0, errors: [] };
const counting = {
  export(spans, done) {
    result.handed += spans.length;
    inner.export(spans, (r) => {
      if (r.code === 0) {
        result.ok += spans.length;
      } else {
        result.failed += spans.length;
        const why = String(r.error?.message ?? r.error ?? "failed");
        if (!result.errors.includes(why) && result.errors.length < 5) result.errors.push(why);
      }
      done(r);
    });
  },
  shutdown: () => inner.shutdown(),
  forceFlush: () => inner.forceFlush?.() ?? Promise.resolve(),
};

const provider = new TracerProvider({
  resource: resourceFromAttributes({ "service.name": name }),
  spanProcessors: [new BatchSpanProcessor({ exporter: counting })],
});
const tracer = provider.getTracer("otel_proofscope");

const poly = ["(1,2,3,4)", "(5,6,7,8)", "(9,10,11,12)"];
const root = tracer.startSpan("proof", { attributes: {
  "proof.system": "gkr", "proof.backend": "cpu", "proof.layers": LAYERS } });
const { context, trace } = await import("@opentelemetry/api");
const rootCtx = trace.setSpan(context.active(), root);
for (let i = LAYERS - 1; i >= 0; i--) {
  const layer = tracer.startSpan("proof.layer", { attributes: {
    "proof.layer.index": i, "proof.layer.kind": "MatMul", "proof.sumcheck.rounds": ROUNDS,
    "proof.claim.initial": `(${i},2,3,4)` } }, rootCtx);
  for (let r = 0; r < ROUNDS; r++) {
    layer.addEvent("proof.sumcheck.round", {
      "proof.sumcheck.round": r, "proof.sumcheck.degree": 2, "proof.sumcheck.poly": poly,
      "proof.claim": `(${r * 7919 + i},1,2,3)` });
  }
  if (LAYER_MS > 0) {
    // The batch processor's timer and the exporter's sockets run meanwhile.
    await new Promise((resolve) => setTimeout(resolve, LAYER_MS));
    layer.end();
  } else {
    layer.end();
    if (i % 8 === 0) await new Promise((resolve) => setImmediate(resolve));
  }
}
const verify = tracer.startSpan("proof.verify", { attributes: { "proof.verified": true } },
  rootCtx);
verify.end();
root.setStatus({ code: SpanStatusCode.OK });
root.end();
// A failed export rejects the flush; its spans are already counted as failed above.
try { await provider.forceFlush(); } catch (e) { result.flush_error = String(e?.message ?? e); }
try { await provider.shutdown(); } catch (e) { result.flush_error ??= String(e?.message ?? e); }
process.stdout.write(JSON.stringify(result) + "\n");
