"""Typed proof-stream events → contract spans and events, through ``ProofTracer``.

Events arrive as a flat stream, so a small state machine keeps the open phases on a
stack (proof → layer / weight opening / binding / STARK) and enters and leaves the
``ProofTracer`` context managers as start and end events arrive. Rules that keep the
output honest where the stream itself is not:

* **Timing.** Spans are timed by arrival, which is real only for a live source. What
  the stream itself measured (``duration_ms``) goes to ``proofscope.stream.duration``
  and to the duration histograms, but only when it is non-zero: stwo-ml sends 0 when
  it did not measure. The bridge's ``ProofTracer`` gets a no-op meter so replaying a
  file never records replay time as proof time.
* **Claims.** ``claim_value_approx`` is one limb divided by 2^31−1 (and invented as
  ``initial / 2^round`` for sumcheck rounds), not a field element. The round's
  ``proof.claim`` is instead derived exactly from the round polynomial: p(0) + p(1)
  (= 2·c0 + c1 + c2 [+ c3], limb-wise mod 2^31−1), the claim the round reduces.
* **GpuStatus** ``utilization`` is layer progress and ``free_memory_bytes`` is total
  memory in stwo-ml's stream; they are recorded under names that say so, never as
  ``hw.gpu.utilization``.
* Witness data (activations, attention) only when capture is enabled.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from otel_proofscope import fields
from otel_proofscope.instrumentation import (
    MAX_ATTENTION_SIDE,
    ActivationStats,
    CircuitNode,
    PhaseHandle,
    ProofHandle,
    ProofTracer,
    capture_witness_enabled,
)
from otel_proofscope.integrations.proof_stream import schema as s
from otel_proofscope.integrations.proof_stream.decoder import decode_line
from otel_proofscope.integrations.proof_stream.stats import MAX_KEPT_ERRORS, SIGNAL, StreamStats
from otel_proofscope.ledger import DROPS
from otel_proofscope.semconv import (
    METER_NAME,
    Attr,
    DropReason,
    EventName,
    Metric,
    StreamAttr,
    StreamEvent,
)
from otel_proofscope.version import __version__

_log = logging.getLogger(__name__)
#: Warn/Error logs of the remote prover are re-logged here.
remote_log = logging.getLogger("otel_proofscope.proof_stream.remote")

_LAGGED = re.compile(r"^\s*lagged\s+(\d+)\s+events?\s*$", re.IGNORECASE)
_LOG_LEVELS = {"Trace": logging.DEBUG, "Debug": logging.DEBUG, "Info": logging.INFO,
               "Warn": logging.WARNING, "Error": logging.ERROR}
MAX_LOG_MESSAGE = 4096
#: Witness events waiting for their layer span (forward pass runs before proving).
MAX_PENDING_WITNESS = 1024


NOTE_CLAIM = ("proof.sumcheck.poly holds the round polynomial's evaluations at 0..d, "
              "computed exactly from the streamed coefficients; proof.claim of round r is "
              "the next round's p(0)+p(1) (the claim after round r), absent on the last "
              "round; the stream's claim_value_approx is not a field element")
NOTE_GPU_STATUS = ("from a proof-stream GpuStatus: the producer's 'utilization' is layer "
                   "progress and its 'free_memory_bytes' is the device's total memory; "
                   "neither is a GPU measurement")
NOTE_CIRCUIT = ("emitted when the stream reported the compiled circuit; this span's "
                "duration is not the compile time")

_P = s.M31_P


def evaluations(coefficients: Sequence[s.SecureFieldMirror]) -> list[tuple[int, ...]]:
    """p(0), p(1), …, p(d) of ``c0 + c1·x + …`` over QM31, for small integer points.

    Scaling a QM31 element by an integer is limb-wise, so this is exact.
    """
    limbs = [c.limbs() for c in coefficients]
    out: list[tuple[int, ...]] = []
    for t in range(len(limbs)):
        out.append(tuple(sum(c[i] * t**k for k, c in enumerate(limbs)) % _P
                         for i in range(4)))
    return out


def round_claim(coefficients: Sequence[s.SecureFieldMirror]) -> tuple[int, int, int, int]:
    """p(0) + p(1) of ``c0 + c1·x + …`` over QM31: 2·c0 + c1 + … limb-wise mod 2^31−1.

    QM31 addition is limb-wise, so this is exact with no extension-field multiply.
    """
    sums = [2 * x for x in coefficients[0].limbs()]
    for c in coefficients[1:]:
        for i, x in enumerate(c.limbs()):
            sums[i] += x
    return (sums[0] % _P, sums[1] % _P, sums[2] % _P, sums[3] % _P)


@dataclass
class _Open:
    kind: str
    phase: Any  # the ProofTracer phase (a context manager)
    handle: PhaseHandle
    key: int | None = None
    attached: bool = False
    rounds: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def span(self) -> Span:
        return self.handle.span


class StreamBridge:
    """Feeds decoded proof-stream events into spans. One bridge per stream, one thread.

    Args:
        tracer_provider / meter_provider: where spans and stream-measured durations go
            (default: the global providers).
        system: ``proof.system`` of proofs opened from ``ProofStart``.
        source: name of the stream in reports and the drop ledger.
        root: an already open ``proof`` span (``proofscope run``): the first
            ``ProofStart`` annotates it instead of opening a second root. The bridge
            must then run in a context where that span is current.
        live: events arrive as the prover emits them (a pipe, FIFO, WebSocket), so
            span times are meaningful; False for a recorded file.
    """

    def __init__(self, *, tracer_provider: trace.TracerProvider | None = None,
                 meter_provider: metrics.MeterProvider | None = None,
                 system: str = "stwo-ml", source: str = "stream",
                 root: ProofHandle | None = None, root_backend_known: bool = False,
                 live: bool = False) -> None:
        self.tracer = ProofTracer(tracer_provider, NoOpMeterProvider())
        meter = metrics.get_meter(METER_NAME, __version__, meter_provider)
        self._proof_duration = Metric.PROOF_DURATION.histogram(meter)
        self._layer_duration = Metric.PROOF_LAYER_DURATION.histogram(meter)
        self._round_count = Metric.PROOF_SUMCHECK_ROUND_COUNT.counter(meter)
        self.system = system
        self.timing = "live" if live else "replay"
        self.stats = StreamStats(source)
        self._stack: list[_Open] = []
        self._root_annotated = False
        self._root_backend_known = root_backend_known
        self._backend = "unknown"
        self._pending_circuit: s.CircuitCompiled | None = None
        self._pending_witness: list[s.LayerActivation | s.AttentionHeatmap] = []
        self.witness_skipped = 0
        self.closed = False
        if root is not None:
            self._stack.append(_Open("proof", None, root, attached=True))
        self._dispatch: dict[type[Any], Callable[[Any], None]] = {
            s.ProofStart: self._proof_start, s.ProofComplete: self._proof_complete,
            s.CircuitCompiled: self._circuit, s.LayerStart: self._layer_start,
            s.SumcheckRound: self._sumcheck_round, s.LayerEnd: self._layer_end,
            s.WeightOpeningStart: self._weight_start, s.WeightOpeningEnd: self._weight_end,
            s.AggregatedBindingStart: self._binding_start,
            s.AggregatedBindingEnd: self._binding_end,
            s.StarkProofStart: self._stark_start, s.StarkProofEnd: self._stark_end,
            s.GpuStatus: self._gpu_status, s.Log: self._log,
            s.LayerActivation: self._witness, s.AttentionHeatmap: self._witness,
        }

    # ── input ────────────────────────────────────────────────────────────────────────

    def feed_line(self, raw: str | bytes, line: int) -> None:
        """Decode, account and handle one line; bad lines are counted, never raised."""
        decoded = decode_line(raw, line)
        if decoded.blank:
            return
        self.stats.record(decoded)
        if decoded.error is not None:
            # The first few live, all of them in the report; a flood must not flood logs.
            level = logging.WARNING if self.stats.rejected <= MAX_KEPT_ERRORS else logging.DEBUG
            _log.log(level, "proof-stream %s: %s", self.stats.source, decoded.error.message())
        elif decoded.event is not None:
            self.handle(decoded.event)

    def handle(self, event: s.ProofEvent) -> None:
        try:
            self._dispatch[type(event)](event)
        except ValueError as exc:  # the tracer's validation named the bad field
            self._problem(f"{s.variant_name(event)} rejected by the tracer", exc)
        except Exception as exc:  # a stream must not die on one event
            _log.debug("bridge failed on %r", event, exc_info=True)
            self._problem(f"{s.variant_name(event)} failed in the bridge", exc)

    def close(self) -> StreamStats:
        """End of stream: close what is still open (marked unterminated)."""
        if self.closed:
            return self.stats
        self.closed = True
        if self._pending_circuit is not None:
            self._emit_circuit(self._pending_circuit)
            self._pending_circuit = None
        while self._stack and not self._stack[-1].attached:
            self._pop(unterminated=True)
        if self._pending_witness:
            DROPS.record(SIGNAL, "bridge", DropReason.SHUTDOWN.value, len(self._pending_witness))
            self.stats.record_problem("witness events for layers that never started",
                                      len(self._pending_witness))
            self._pending_witness.clear()
        return self.stats

    def report_lines(self) -> list[str]:
        lines = self.stats.lines_report()
        if self.witness_skipped:
            lines.append(f"  {self.witness_skipped} witness event(s) not recorded: capture is "
                         "off (PROOFSCOPE_CAPTURE_WITNESS=1 to record them)")
        return lines

    # ── stack ────────────────────────────────────────────────────────────────────────

    def _push(self, kind: str, phase: Any, key: int | None = None) -> _Open:
        handle = phase.__enter__()
        handle.span.set_attribute(StreamAttr.TIMING, self.timing)
        entry = _Open(kind, phase, handle, key)
        self._stack.append(entry)
        return entry

    def _pop(self, *, unterminated: bool = False) -> None:
        entry = self._stack.pop()
        pending = entry.extra.pop("pending_round", None)
        if pending is not None:
            self._record_round(pending, None)
        if unterminated:
            entry.span.set_attribute(StreamAttr.UNTERMINATED, True)
            if entry.kind == "proof":
                entry.span.set_status(Status(StatusCode.ERROR,
                                             "proof stream ended before ProofComplete"))
                self.stats.record_problem("proofs without ProofComplete")
        entry.phase.__exit__(None, None, None)

    def _find(self, kind: str, key: int | None = None) -> int | None:
        for i in range(len(self._stack) - 1, -1, -1):
            o = self._stack[i]
            if o.kind == kind and (key is None or o.key == key):
                return i
        return None

    def _close_above(self, index: int) -> None:
        """Close everything opened after ``self._stack[index]`` (their end never came)."""
        while len(self._stack) > index + 1:
            self._pop(unterminated=True)

    def _end(self, kind: str, variant: str, key: int | None = None) -> _Open | None:
        """The open entry an end event refers to, with everything above it closed."""
        i = self._find(kind, key)
        if i is None:
            self.stats.record_problem(f"{variant} without a matching start")
            return None
        self._close_above(i)
        return self._stack[i]

    def _innermost(self) -> _Open | None:
        return self._stack[-1] if self._stack else None

    def _problem(self, what: str, exc: Exception | None = None) -> None:
        self.stats.record_problem(what)
        _log.warning("proof-stream %s: %s%s", self.stats.source, what,
                     f": {exc}" if exc else "")

    # ── proof ────────────────────────────────────────────────────────────────────────

    def _proof_start(self, ev: s.ProofStart) -> None:
        self._backend = ev.backend or "unknown"
        i = self._find("proof")
        if i is not None and self._stack[i].attached and not self._root_annotated:
            self._close_above(i)
            root = self._stack[i]
            self._root_annotated = True
            attrs: dict[str, AttributeValue] = {
                Attr.PROOF_LAYERS: ev.num_layers,
                Attr.PROOF_INPUT_SHAPE: list(ev.input_shape),
                Attr.PROOF_OUTPUT_SHAPE: list(ev.output_shape)}
            if ev.model_name is not None:
                attrs[Attr.PROOF_MODEL_NAME] = ev.model_name
            if not self._root_backend_known and ev.backend:
                attrs[Attr.PROOF_BACKEND] = ev.backend
            root.span.set_attributes(attrs)
        else:
            # A new proof: whatever is still open from the previous one never ended.
            while self._stack and not self._stack[-1].attached:
                self._pop(unterminated=True)
            self._push("proof", self.tracer.proof(
                system=self.system, backend=self._backend, model_name=ev.model_name,
                layers=ev.num_layers, input_shape=ev.input_shape,
                output_shape=ev.output_shape))
        if self._pending_circuit is not None:
            circuit, self._pending_circuit = self._pending_circuit, None
            self._emit_circuit(circuit)

    def _proof_complete(self, ev: s.ProofComplete) -> None:
        entry = self._end("proof", "ProofComplete")
        if entry is None:
            return
        handle = entry.handle
        if isinstance(handle, ProofHandle):
            handle.set_result(layer_proofs=ev.num_layer_proofs,
                              weight_openings=ev.num_weight_openings)
        entry.span.set_attribute(StreamAttr.WEIGHT_BINDING_MODE, ev.weight_binding_mode)
        if ev.duration_ms > 0:
            entry.span.set_attribute(StreamAttr.DURATION, ev.duration_ms / 1000)
            if not entry.attached:  # an attached root measures its own wall time
                self._proof_duration.record(ev.duration_ms / 1000, {
                    Attr.PROOF_SYSTEM: self.system, Attr.PROOF_BACKEND: self._backend})
        if not entry.attached:
            self._pop()

    # ── circuit ──────────────────────────────────────────────────────────────────────

    def _circuit(self, ev: s.CircuitCompiled) -> None:
        if self._find("proof") is None:
            # stwo-ml compiles before ProofStart: hold it so it lands inside the proof.
            if self._pending_circuit is not None:
                self.stats.record_problem("CircuitCompiled superseded before any ProofStart")
            self._pending_circuit = ev
            return
        self._emit_circuit(ev)

    def _emit_circuit(self, ev: s.CircuitCompiled) -> None:
        nodes = [CircuitNode(index=n.layer_idx, kind=n.kind, trace_cost=n.trace_cost,
                             inputs=n.input_layers) for n in ev.nodes]
        try:
            phase = self.tracer.circuit_compile(nodes)
        except ValueError as exc:
            self._problem("CircuitCompiled with an inconsistent DAG (recorded without it)",
                          exc)
            phase = self.tracer.circuit_compile()
        with phase as handle:
            handle.span.set_attributes({
                StreamAttr.CIRCUIT_TOTAL_LAYERS: ev.total_layers,
                StreamAttr.CIRCUIT_NODE_ID: [n.node_id for n in ev.nodes],
                StreamAttr.CIRCUIT_HAS_SIMD: ev.has_simd,
                StreamAttr.CIRCUIT_SIMD_BLOCKS: ev.simd_num_blocks,
                StreamAttr.TIMING: self.timing,
                Attr.PROOFSCOPE_NOTE: NOTE_CIRCUIT,
            })

    # ── layers ───────────────────────────────────────────────────────────────────────

    def _layer_start(self, ev: s.LayerStart) -> None:
        i = self._find("layer")
        if i is not None:
            # stwo-ml sends no LayerEnd for Identity layers: the next start ends them.
            self._close_above(i - 1)
        entry = self._push("layer", self.tracer.layer(
            index=ev.layer_idx, kind=ev.kind, trace_cost=ev.trace_cost,
            input_shape=ev.input_shape, output_shape=ev.output_shape), key=ev.layer_idx)
        entry.extra["kind"] = ev.kind
        attrs: dict[str, AttributeValue] = {}
        if ev.claim_value_approx is not None:
            attrs[StreamAttr.CLAIM_A_NORMALIZED] = ev.claim_value_approx
        if ev.gpu_device is not None:
            attrs[StreamAttr.GPU_DEVICE] = ev.gpu_device
        if attrs:
            entry.span.set_attributes(attrs)
        if self._pending_witness:
            self._flush_witness(ev.layer_idx)

    def _sumcheck_round(self, ev: s.SumcheckRound) -> None:
        top = self._innermost()
        if top is None or top.kind != "layer" or top.key != ev.layer_idx:
            self.stats.record_problem("SumcheckRound outside its layer")
            return
        poly = ev.poly_deg3 if ev.poly_deg3 is not None else ev.poly_deg2
        if poly is None:
            self.stats.record_problem("SumcheckRound without a round polynomial")
            return
        if ev.poly_deg2 is not None and ev.poly_deg3 is not None:
            self.stats.record_problem("SumcheckRound with both polynomials (deg3 used)")
        coeffs = poly.coefficients()
        claim = round_claim(coeffs)
        if top.rounds == 0:
            attrs: dict[str, AttributeValue] = {Attr.SUMCHECK_ROUNDS: ev.total_rounds,
                                                Attr.PROOFSCOPE_NOTE: NOTE_CLAIM}
            if ev.round == 0:
                attrs[Attr.CLAIM_INITIAL] = fields.canonical(claim)
            top.span.set_attributes(attrs)
        top.rounds += 1
        # The claim after round r is only known when round r+1 arrives (its p(0)+p(1)),
        # so each round is recorded one round late; the last one without a claim.
        previous = top.extra.pop("pending_round", None)
        if previous is not None:
            self._record_round(previous, claim)
        challenge = None if ev.challenge is None else ev.challenge.limbs()
        top.extra["pending_round"] = (ev.round, evaluations(coeffs), len(coeffs) - 1,
                                      challenge)

    def _record_round(self, pending: tuple[int, list[tuple[int, ...]], int,
                                           tuple[int, ...] | None],
                      claim: tuple[int, ...] | None) -> None:
        round_index, evals, degree, challenge = pending
        self.tracer.sumcheck_round(round_index, evals, claim, degree=degree,
                                   challenge=challenge)

    def _layer_end(self, ev: s.LayerEnd) -> None:
        entry = self._end("layer", "LayerEnd", ev.layer_idx)
        if entry is None:
            return
        attrs: dict[str, AttributeValue] = {Attr.LAYER_PROOF_KIND: ev.kind}
        if ev.final_claim_value_approx is not None:
            attrs[StreamAttr.FINAL_CLAIM_A_NORMALIZED] = ev.final_claim_value_approx
        if ev.rounds_completed > 0:  # stwo-ml's GKR path always sends 0
            attrs[StreamAttr.ROUNDS_COMPLETED] = ev.rounds_completed
            if entry.rounds == 0:
                attrs[Attr.SUMCHECK_ROUNDS] = ev.rounds_completed
        kind = str(entry.extra.get("kind", "Unknown"))
        if ev.duration_ms > 0:
            attrs[StreamAttr.DURATION] = ev.duration_ms / 1000
            self._layer_duration.record(ev.duration_ms / 1000, {
                Attr.PROOF_SYSTEM: self.system, Attr.PROOF_BACKEND: self._backend,
                Attr.LAYER_KIND: kind})
        if entry.rounds:
            self._round_count.add(entry.rounds, {Attr.PROOF_SYSTEM: self.system,
                                                 Attr.LAYER_KIND: kind})
        entry.span.set_attributes(attrs)
        self._pop()

    # ── weight openings, binding, STARK ──────────────────────────────────────────────

    def _end_open_layer(self) -> None:
        # Openings, binding and the STARK run after the layer walk; a layer still open
        # then is one stwo-ml never ended (Identity / Input layers send no LayerEnd).
        i = self._find("layer")
        if i is not None:
            self._close_above(i - 1)

    def _weight_start(self, ev: s.WeightOpeningStart) -> None:
        self._end_open_layer()
        self._push("weight_opening", self.tracer.weight_opening(
            node_id=ev.weight_node_id, eval_point_length=ev.eval_point_len),
            key=ev.weight_node_id)

    def _weight_end(self, ev: s.WeightOpeningEnd) -> None:
        entry = self._end("weight_opening", "WeightOpeningEnd", ev.weight_node_id)
        if entry is None:
            return
        entry.span.set_attribute(Attr.WEIGHT_COMMITMENT, ev.commitment_hex)
        self._set_duration(entry, ev.duration_ms)
        self._pop()

    def _binding_start(self, ev: s.AggregatedBindingStart) -> None:
        self._end_open_layer()
        self._push("binding", self.tracer.aggregated_binding(
            claims=ev.num_claims, matrices=ev.num_matrices))

    def _binding_end(self, ev: s.AggregatedBindingEnd) -> None:
        entry = self._end("binding", "AggregatedBindingEnd")
        if entry is None:
            return
        entry.span.set_attribute(Attr.BINDING_CALLDATA_FELTS, ev.estimated_calldata_felts)
        self._set_duration(entry, ev.duration_ms)
        self._pop()

    def _stark_start(self, ev: s.StarkProofStart) -> None:
        self._end_open_layer()
        self._push("stark", self.tracer.stark(
            activation_layers=ev.num_activation_layers, add_layers=ev.num_add_layers,
            layernorm_layers=ev.num_layernorm_layers))

    def _stark_end(self, ev: s.StarkProofEnd) -> None:
        entry = self._end("stark", "StarkProofEnd")
        if entry is None:
            return
        self._set_duration(entry, ev.duration_ms)
        self._pop()

    @staticmethod
    def _set_duration(entry: _Open, duration_ms: int) -> None:
        if duration_ms > 0:
            entry.span.set_attribute(StreamAttr.DURATION, duration_ms / 1000)

    # ── status, logs, witness data ───────────────────────────────────────────────────

    def _gpu_status(self, ev: s.GpuStatus) -> None:
        target = self._innermost()
        if target is None:
            self.stats.record_problem("GpuStatus outside any span")
            return
        for d in ev.devices:
            attrs: dict[str, AttributeValue] = {
                StreamAttr.DEVICE_ID: d.device_id,
                StreamAttr.DEVICE_NAME: d.device_name,
                StreamAttr.MATMUL_DONE: ev.matmul_done,
                StreamAttr.MATMUL_TOTAL: ev.matmul_total,
                StreamAttr.LAYERS_DONE: ev.layers_done,
                StreamAttr.LAYERS_TOTAL: ev.layers_total,
                Attr.PROOFSCOPE_NOTE: NOTE_GPU_STATUS,
            }
            if d.utilization is not None:
                attrs[StreamAttr.LAYER_PROGRESS] = d.utilization
            if d.free_memory_bytes is not None:
                attrs[StreamAttr.DEVICE_MEMORY] = d.free_memory_bytes
            target.span.add_event(StreamEvent.GPU_STATUS, attrs)

    def _log(self, ev: s.Log) -> None:
        lagged = _LAGGED.match(ev.message) if ev.level == "Warn" else None
        if lagged:
            self.stats.record_lagged(int(lagged.group(1)))
        message = ev.message[:MAX_LOG_MESSAGE]
        target = self._innermost()
        if target is not None:
            target.span.add_event(EventName.LOG, {StreamAttr.LOG_LEVEL: ev.level,
                                                  StreamAttr.LOG_MESSAGE: message})
        level = _LOG_LEVELS[ev.level]
        if level >= logging.WARNING or target is None:
            remote_log.log(level, "[%s] %s", self.stats.source, message)

    def _witness(self, ev: s.LayerActivation | s.AttentionHeatmap) -> None:
        if not capture_witness_enabled():
            self.witness_skipped += 1
            return
        top = self._innermost()
        if top is not None and top.kind == "layer" and top.key == ev.layer_idx:
            self._emit_witness(ev)
        elif len(self._pending_witness) >= MAX_PENDING_WITNESS:
            DROPS.record(SIGNAL, "bridge", DropReason.QUEUE_FULL.value)
            self.stats.record_problem("witness events dropped: pending buffer full")
        else:
            self._pending_witness.append(ev)

    def _flush_witness(self, layer_idx: int) -> None:
        keep: list[s.LayerActivation | s.AttentionHeatmap] = []
        for ev in self._pending_witness:
            if ev.layer_idx == layer_idx:
                self._emit_witness(ev)
            else:
                keep.append(ev)
        self._pending_witness = keep

    def _emit_witness(self, ev: s.LayerActivation | s.AttentionHeatmap) -> None:
        if isinstance(ev, s.LayerActivation):
            st = ev.stats
            self.tracer.layer_activation(ActivationStats(
                mean=_nan(st.mean), std_dev=_nan(st.std_dev), min=_nan(st.min),
                max=_nan(st.max), sparsity=_nan(st.sparsity),
                sample=[float(v) for v in ev.output_sample]))
            return
        side = min(ev.seq_len, MAX_ATTENTION_SIDE)
        if side == 0 or len(ev.scores) != side * side:
            # The decoder rejects such lines; this catches events handed to handle().
            self.stats.record_problem("AttentionHeatmap.scores", reason="invalid_value")
            return
        rows = [[_nan(v) for v in ev.scores[r * side:(r + 1) * side]] for r in range(side)]
        self.tracer.attention_heatmap(ev.head_idx, ev.num_heads, rows)


def _nan(value: float | None) -> float:
    # None is serde_json's encoding of NaN; the tracer rejects it as non-finite.
    return float("nan") if value is None else value
