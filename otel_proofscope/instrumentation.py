"""The instrumentation API for prover authors.

``ProofTracer`` wraps an OpenTelemetry tracer and meter with one context manager per
proof phase and a hot-path ``sumcheck_round`` call. Design points:

* **Near-zero cost when off.** ``sumcheck_round`` first reads one module global
  (the number of recording layers in the process); when nothing records it returns
  before touching its arguments, so a payload callable is never invoked.
* **contextvars**, not thread-locals: threads and asyncio tasks each keep their own
  current proof and layer.
* **Validation.** Phase context managers raise ``ValueError`` naming the field (bad
  input is a programming error there). The hot path never raises: a bad round is
  recorded with an ``error.type`` attribute and counted in ``proofscope.rejected``.
* **Metrics by the API itself**: ``proof.duration``, ``proof.layer.duration`` and
  ``proof.sumcheck.round.count`` (the latter added once per layer, not per round, to
  keep the round cheap).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any, ParamSpec, TypeVar

import numpy as np
from opentelemetry import metrics, trace
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from otel_proofscope import fields, phase_cost
from otel_proofscope.ledger import DROPS, REJECTIONS
from otel_proofscope.otlp import round_records
from otel_proofscope.otlp.deferred_events import DeferredEvents
from otel_proofscope.otlp.sdk_fields import deferred_events
from otel_proofscope.semconv import (
    METER_NAME,
    TRACER_NAME,
    Attr,
    DropReason,
    EventName,
    LayerKind,
    LayerProofKind,
    Metric,
    SpanName,
)
from otel_proofscope.version import __version__

P = ParamSpec("P")
R = TypeVar("R")

_LAYER_KINDS = frozenset(k.value for k in LayerKind)
_PROOF_KINDS = frozenset(k.value for k in LayerProofKind)

#: Payload that may be given directly or as a zero-argument callable (built lazily).
Lazy = Any

# Number of layers currently recording anywhere in the process. Read without a lock on
# the hot path (a stale read costs at most one skipped or one extra context lookup).
_active_layers = 0
_active_lock = threading.Lock()

# Local capture of witness data (activation stats, attention scores). Export over OTLP
# is decided separately by the pipeline (see pipeline.privacy).
_capture_witness = False


# Round events kept per layer span (None: no cap of ours). The SDK's event limit drops
# the *oldest* events, which would lose round 0, the anchor of the claim chain; with this
# cap the newest rounds are the ones dropped (and counted) and ROUND_EVENT_RESERVE
# places are left for the exception, GPU and witness events.
_round_event_cap: int | None = None
ROUND_EVENT_RESERVE = 64


def set_max_events_per_span(max_events: int | None) -> None:
    """Keep the first rounds of a layer when its span would exceed ``max_events``."""
    global _round_event_cap
    _round_event_cap = _round_cap(max_events)


def release_max_events_per_span(max_events: int | None) -> None:
    """Undo :func:`set_max_events_per_span` (``configure()``'s shutdown), unless a later
    call set another limit since: a pipeline shut down must not leave its cap on every
    tracer of the process (a later ``configure()`` without one, or a user's own
    provider, kept dropping rounds past it)."""
    global _round_event_cap
    if _round_event_cap == _round_cap(max_events):
        _round_event_cap = None


def _round_cap(max_events: int | None) -> int | None:
    if max_events is None:
        return None
    # A small limit keeps a proportionate reserve (an eighth), so that it still holds rounds.
    return max(1, max_events - min(ROUND_EVENT_RESERVE, max_events // 8))


def set_capture_witness(enabled: bool) -> None:
    global _capture_witness
    _capture_witness = enabled


def capture_witness_enabled() -> bool:
    return _capture_witness


@dataclass
class CircuitNode:
    """One node of the circuit DAG (``proof.circuit.compile``)."""

    index: int
    kind: str
    trace_cost: int
    inputs: Sequence[int] = ()


@dataclass
class ActivationStats:
    mean: float
    std_dev: float
    min: float
    max: float
    sparsity: float
    sample: Sequence[float] = ()


@dataclass
class _ProofState:
    span: Span
    system: str
    backend: str
    start_ns: int


@dataclass
class _LayerState:
    span: Span
    proof: _ProofState | None
    index: int
    kind: str
    total_rounds: int
    start_ns: int
    rounds_done: int = 0
    round_events: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    recording: bool = False
    # Where rounds go as records (None: through span.add_event), see _round_event.
    rounds: DeferredEvents | None = None


def span_seconds(span: Span, start_perf_ns: int) -> float:
    """Duration of an ended span from its own timestamps, so a metric, a summary and a
    trace viewer show one measurement; the monotonic clock since ``start_perf_ns`` for a
    span that keeps no times (a non-SDK or no-op span)."""
    start, end = getattr(span, "start_time", None), getattr(span, "end_time", None)
    if isinstance(start, int) and isinstance(end, int):
        return (end - start) / 1e9
    return (time.perf_counter_ns() - start_perf_ns) / 1e9


_current_proof: ContextVar[_ProofState | None] = ContextVar("proofscope_proof", default=None)
_current_layer: ContextVar[_LayerState | None] = ContextVar("proofscope_layer", default=None)


def _resolve(value: Lazy) -> Any:
    return value() if callable(value) else value


def _field_element(value: Any, name: str) -> str:
    """``fields.canonical`` with the argument's name in the error (README: a bad claim
    raises ``ValueError`` naming the field)."""
    try:
        return fields.canonical(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _check_kind(kind: object) -> str:
    value = kind.value if isinstance(kind, LayerKind) else kind
    if not isinstance(value, str) or value not in _LAYER_KINDS:
        raise ValueError(
            f"kind: unknown layer kind {kind!r}; expected one of {sorted(_LAYER_KINDS)} "
            "(use 'Unknown' for anything else)"
        )
    return value


def _check_proof_kind(kind: object) -> str:
    value = kind.value if isinstance(kind, LayerProofKind) else kind
    if not isinstance(value, str) or value not in _PROOF_KINDS:
        raise ValueError(
            f"proof_kind: unknown layer proof kind {kind!r}; expected one of "
            f"{sorted(_PROOF_KINDS)}"
        )
    return value


class PhaseHandle:
    """Returned by every phase context manager: the span plus setters for end attributes."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def set(self, key: str, value: AttributeValue) -> None:
        self.span.set_attribute(key, value)


class ProofHandle(PhaseHandle):
    __slots__ = ("_cost", "_state")

    def __init__(self, span: Span, state: _ProofState) -> None:
        super().__init__(span)
        self._state = state
        self._cost: phase_cost.Frame | None = None

    @property
    def gpu_cost(self) -> phase_cost.PhaseCostResult | None:
        """The proof's GPU cost (totals over its phases), once the proof span has ended;
        None while it runs or when the span was not recorded."""
        return self._cost.result if self._cost is not None else None

    def set_result(self, *, layer_proofs: int | None = None, weight_openings: int | None = None,
                   size: int | None = None, verified: bool | None = None) -> None:
        # Never raises: each bad value is refused and counted (proofscope.rejected), the
        # good ones are still recorded.
        checks: list[tuple[str, object, Callable[[object, str], object]]] = [
            (Attr.PROOF_LAYER_PROOFS, layer_proofs, fields.non_negative_int),
            (Attr.PROOF_WEIGHT_OPENINGS, weight_openings, fields.non_negative_int),
            (Attr.PROOF_SIZE, size, fields.non_negative_int),
            (Attr.PROOF_VERIFIED, verified, fields.strict_bool),
        ]
        for attr, value, check in checks:
            if value is None:
                continue
            try:
                self.span.set_attribute(attr, check(value, attr))  # type: ignore[arg-type]
            except Exception:
                REJECTIONS.record(attr, "invalid")


class LayerHandle(PhaseHandle):
    __slots__ = ()

    def set_final_claim(self, claim: Any) -> None:
        try:
            self.span.set_attribute(Attr.CLAIM_FINAL, fields.canonical(claim))
        except Exception:  # a field type whose __proofscope_field__ raises, say
            REJECTIONS.record(Attr.CLAIM_FINAL, "not_a_field_element")


class _Phase:
    """A phase context manager that is also a (sync or async) decorator."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._cm: Any = None

    def __enter__(self) -> Any:
        self._cm = self._factory()
        return self._cm.__enter__()

    def __exit__(self, *exc: Any) -> bool | None:
        cm, self._cm = self._cm, None
        return bool(cm.__exit__(*exc))

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        factory = self._factory
        if asyncio.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                with factory():
                    return await fn(*args, **kwargs)  # type: ignore[misc]

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with factory():
                return fn(*args, **kwargs)

        return wrapper


class ProofTracer:
    """Proof-phase spans and metrics on top of an OpenTelemetry tracer and meter."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None,
                 meter_provider: metrics.MeterProvider | None = None) -> None:
        self._tracer = trace.get_tracer(TRACER_NAME, __version__, tracer_provider)
        meter = metrics.get_meter(METER_NAME, __version__, meter_provider)
        self._proof_duration = Metric.PROOF_DURATION.histogram(meter)
        self._layer_duration = Metric.PROOF_LAYER_DURATION.histogram(meter)
        self._round_count = Metric.PROOF_SUMCHECK_ROUND_COUNT.counter(meter)
        self._verify_count = Metric.PROOF_VERIFY_COUNT.counter(meter)
        self._cost = phase_cost.Recorder(meter)

    # ── phases ───────────────────────────────────────────────────────────────────────

    def proof(self, *, system: str, backend: str = "cpu", model_name: str | None = None,
              layers: int | None = None, input_shape: Sequence[int] | None = None,
              output_shape: Sequence[int] | None = None) -> _Phase:
        """Root span of one proof. Yields a :class:`ProofHandle`."""
        if not isinstance(system, str) or not system:
            raise ValueError(f"system must be a non-empty string, got {system!r}")
        if not isinstance(backend, str) or not backend:
            raise ValueError(f"backend must be a non-empty string, got {backend!r}")
        attrs: dict[str, AttributeValue] = {Attr.PROOF_SYSTEM: system,
                                            Attr.PROOF_BACKEND: backend}
        if model_name is not None:
            attrs[Attr.PROOF_MODEL_NAME] = str(model_name)
        if layers is not None:
            attrs[Attr.PROOF_LAYERS] = fields.non_negative_int(layers, "layers")
        if input_shape is not None:
            attrs[Attr.PROOF_INPUT_SHAPE] = fields.shape(input_shape, "input_shape")
        if output_shape is not None:
            attrs[Attr.PROOF_OUTPUT_SHAPE] = fields.shape(output_shape, "output_shape")
        return _Phase(functools.partial(self._proof_cm, attrs, system, backend))

    @contextmanager
    def _proof_cm(self, attrs: dict[str, AttributeValue], system: str,
                  backend: str) -> Iterator[ProofHandle]:
        start = time.perf_counter_ns()
        m_attrs: dict[str, AttributeValue] | None = None
        try:
            with self._span(SpanName.PROOF, attrs) as span:
                state = _ProofState(span, system, backend, start)
                token = _current_proof.set(state)
                handle = ProofHandle(span, state)
                handle._cost = phase_cost.current() if span.is_recording() else None
                failed = True
                try:
                    yield handle
                    failed = False
                finally:
                    _current_proof.reset(token)
                    if span.is_recording():
                        verified = getattr(span, "attributes", {}).get(Attr.PROOF_VERIFIED)
                        m_attrs = {Attr.PROOF_SYSTEM: system, Attr.PROOF_BACKEND: backend}
                        if isinstance(verified, bool):
                            m_attrs[Attr.PROOF_VERIFIED] = verified
                        elif failed:
                            m_attrs[Attr.PROOF_VERIFIED] = False
        finally:
            # After the span has ended, from its own times: one measurement (as layers),
            # in the span's context so that the sample's exemplar names its trace.
            if m_attrs is not None:
                self._proof_duration.record(span_seconds(span, start), m_attrs,
                                            context=trace.set_span_in_context(span))

    def circuit_compile(self, nodes: Sequence[CircuitNode] | None = None) -> _Phase:
        """Circuit compilation; ``nodes`` (or ``handle.set_circuit``) records the DAG."""
        attrs = circuit_attributes(nodes) if nodes is not None else {}
        return _Phase(functools.partial(self._simple_cm, SpanName.CIRCUIT_COMPILE, attrs,
                                        CircuitHandle))

    def layer(self, *, index: int, kind: str | LayerKind,
              proof_kind: str | LayerProofKind = LayerProofKind.SUMCHECK,
              trace_cost: int | None = None, input_shape: Sequence[int] | None = None,
              output_shape: Sequence[int] | None = None, rounds: int = 0,
              claim_initial: Any = None, hw_id: str | None = None) -> _Phase:
        """One layer's proof. Yields a :class:`LayerHandle`; rounds go to ``sumcheck_round``."""
        index = fields.non_negative_int(index, "index")
        kind_s = _check_kind(kind)
        attrs: dict[str, AttributeValue] = {
            Attr.LAYER_INDEX: index,
            Attr.LAYER_KIND: kind_s,
            Attr.LAYER_PROOF_KIND: _check_proof_kind(proof_kind),
            Attr.SUMCHECK_ROUNDS: fields.non_negative_int(rounds, "rounds"),
        }
        if trace_cost is not None:
            attrs[Attr.LAYER_TRACE_COST] = fields.non_negative_int(trace_cost, "trace_cost")
        if input_shape is not None:
            attrs[Attr.LAYER_INPUT_SHAPE] = fields.shape(input_shape, "input_shape")
        if output_shape is not None:
            attrs[Attr.LAYER_OUTPUT_SHAPE] = fields.shape(output_shape, "output_shape")
        if claim_initial is not None:
            attrs[Attr.CLAIM_INITIAL] = _field_element(claim_initial, "claim_initial")
        if hw_id is not None:
            attrs[Attr.HW_ID] = str(hw_id)
        return _Phase(functools.partial(self._layer_cm, attrs, index, kind_s, int(rounds)))

    @contextmanager
    def _layer_cm(self, attrs: dict[str, AttributeValue], index: int, kind: str,
                  rounds: int) -> Iterator[LayerHandle]:
        global _active_layers
        start = time.perf_counter_ns()
        state: _LayerState | None = None
        try:
            with self._span(SpanName.LAYER, attrs) as span:
                recording = span.is_recording()
                state = _LayerState(span, _current_proof.get(), index, kind, rounds, start,
                                    recording=recording)
                if recording:
                    state.rounds = deferred_events(span, _round_event, _ROUND_EVENT)
                token = _current_layer.set(state)
                if recording:
                    with _active_lock:
                        _active_layers += 1
                try:
                    yield LayerHandle(span)
                finally:
                    _current_layer.reset(token)
                    if recording:
                        with _active_lock:
                            _active_layers -= 1
        finally:
            # After the span has ended: the metric is the span's own duration (one
            # measurement, the same number a trace viewer shows).
            if state is not None and state.recording:
                proof = state.proof
                system = proof.system if proof else "unknown"
                m_attrs: dict[str, AttributeValue] = {Attr.PROOF_SYSTEM: system,
                                                      Attr.LAYER_KIND: kind}
                self._layer_duration.record(
                    span_seconds(state.span, start),
                    {**m_attrs, Attr.PROOF_BACKEND: proof.backend if proof else "unknown"})
                if state.rounds_done:
                    self._round_count.add(state.rounds_done, m_attrs)

    def weight_opening(self, *, node_id: int | str, eval_point_length: int) -> _Phase:
        attrs: dict[str, AttributeValue] = {
            Attr.WEIGHT_NODE_ID: node_id if isinstance(node_id, str)
            else fields.non_negative_int(node_id, "node_id"),
            Attr.WEIGHT_EVAL_POINT_LENGTH: fields.non_negative_int(eval_point_length,
                                                                   "eval_point_length"),
        }
        return _Phase(functools.partial(self._simple_cm, SpanName.WEIGHT_OPENING, attrs,
                                        WeightOpeningHandle))

    def aggregated_binding(self, *, claims: int, matrices: int) -> _Phase:
        attrs: dict[str, AttributeValue] = {
            Attr.BINDING_CLAIMS: fields.non_negative_int(claims, "claims"),
            Attr.BINDING_MATRICES: fields.non_negative_int(matrices, "matrices"),
        }
        return _Phase(functools.partial(self._simple_cm, SpanName.AGGREGATED_BINDING, attrs,
                                        BindingHandle))

    def stark(self, *, activation_layers: int = 0, add_layers: int = 0,
              layernorm_layers: int = 0) -> _Phase:
        attrs: dict[str, AttributeValue] = {
            Attr.STARK_ACTIVATION_LAYERS: fields.non_negative_int(activation_layers,
                                                                  "activation_layers"),
            Attr.STARK_ADD_LAYERS: fields.non_negative_int(add_layers, "add_layers"),
            Attr.STARK_LAYERNORM_LAYERS: fields.non_negative_int(layernorm_layers,
                                                                 "layernorm_layers"),
        }
        return _Phase(functools.partial(self._simple_cm, SpanName.STARK, attrs, PhaseHandle))

    def witness(self) -> _Phase:
        """Witness generation (the forward pass whose result the proof is about)."""
        return _Phase(functools.partial(self._simple_cm, SpanName.WITNESS, {}, PhaseHandle))

    def verify(self) -> _Phase:
        """Verification. Call ``handle.set_verified(ok)``; also sets it on the proof span."""
        return _Phase(functools.partial(self._simple_cm, SpanName.VERIFY, {}, VerifyHandle,
                                        self))

    @contextmanager
    def _simple_cm(self, name: str, attrs: dict[str, AttributeValue], handle_cls: type[Any],
                   *extra: Any) -> Iterator[Any]:
        with self._span(name, attrs) as span:
            yield handle_cls(span, *extra)

    @contextmanager
    def _span(self, name: str, attrs: dict[str, AttributeValue]) -> Iterator[Span]:
        with self._tracer.start_as_current_span(name, attributes=attrs) as span:
            frame = None
            if span.is_recording():
                # GPU cost of this phase: dispatches inside add to the frame; its figures
                # become attributes just before the span ends (phase_cost).
                labels: dict[str, AttributeValue] = {Attr.PROOF_PHASE: name}
                kind = attrs.get(Attr.LAYER_KIND)
                if kind is not None:
                    labels[Attr.LAYER_KIND] = kind
                proof = _current_proof.get()
                backend = attrs.get(Attr.PROOF_BACKEND) or (proof.backend if proof else None)
                if backend is not None:
                    labels[Attr.PROOF_BACKEND] = backend
                frame = self._cost.open(labels)
            try:
                yield span
            except (SystemExit, KeyboardInterrupt) as exc:
                # The OTel API records only Exception subclasses; a proof cut short by
                # SIGTERM or Ctrl-C did not complete, so its spans must say so.
                if span.is_recording():
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, f"interrupted: "
                                                              f"{type(exc).__name__}"))
                raise
            finally:
                if frame is not None:
                    self._cost.close(frame, span)

    def _record_verified(self, ok: bool) -> None:
        proof = _current_proof.get()
        system = proof.system if proof else "unknown"
        if proof is not None:
            proof.span.set_attribute(Attr.PROOF_VERIFIED, ok)
        self._verify_count.add(1, {Attr.PROOF_SYSTEM: system, Attr.PROOF_VERIFIED: ok})

    # ── hot path ─────────────────────────────────────────────────────────────────────

    def sumcheck_round(self, round: int, poly: Lazy, claim: Lazy,
                       degree: int | None = None, challenge: Lazy = None) -> None:
        """Record one finished sumcheck round on the current layer span, live.

        ``poly`` is the round polynomial g as its evaluations g(0), g(1), …, g(d) (field
        elements), so a reader can check g(0) + g(1) against the previous claim without
        knowing the basis. ``claim`` is the claim after this round, g(r) at the round's
        challenge r (``None`` when the producer does not know it). ``challenge`` is
        that r, the round's Fiat–Shamir challenge (``None``: not recorded); with it a
        reader can redo g(r) = claim. All three may be zero-argument callables, only
        called when something records. Never raises: bad input becomes an event with
        ``error.type`` and a ``proofscope.rejected`` count.
        """
        if not _active_layers:
            return
        layer = _current_layer.get()
        if layer is None:
            return
        _record_round(layer, round, poly, claim, degree, challenge)

    def layer_activation(self, stats: ActivationStats | Callable[[], ActivationStats]) -> None:
        """Activation statistics of the current layer (witness data; off by default)."""
        if not _capture_witness:
            return
        layer = _current_layer.get()
        if layer is None or not layer.span.is_recording():
            return
        try:
            s = _resolve(stats)
            attrs: dict[str, AttributeValue] = {
                Attr.LAYER_INDEX: layer.index,
                Attr.ACTIVATION_MEAN: fields.finite_number(s.mean, "mean"),
                Attr.ACTIVATION_STD_DEV: fields.finite_number(s.std_dev, "std_dev"),
                Attr.ACTIVATION_MIN: fields.finite_number(s.min, "min"),
                Attr.ACTIVATION_MAX: fields.finite_number(s.max, "max"),
                Attr.ACTIVATION_SPARSITY: fields.finite_number(s.sparsity, "sparsity"),
            }
            sample = fields.number_list(s.sample, "sample") if s.sample is not None else []
            if sample:
                attrs[Attr.ACTIVATION_SAMPLE] = sample
        except Exception as exc:  # not stats at all, a raising callable, bad values
            _reject(layer.span, EventName.LAYER_ACTIVATION, "activation", exc)
            return
        layer.span.add_event(EventName.LAYER_ACTIVATION, attrs)

    def attention_heatmap(self, head: int, num_heads: int,
                          scores: Any | Callable[[], Any]) -> None:
        """One head's attention scores, a square seq_len × seq_len matrix (witness data)."""
        if not _capture_witness:
            return
        layer = _current_layer.get()
        if layer is None or not layer.span.is_recording():
            return
        try:
            flat, seq_len = _square_matrix(_resolve(scores))
            attrs: dict[str, AttributeValue] = {
                Attr.LAYER_INDEX: layer.index,
                Attr.ATTENTION_HEAD: fields.non_negative_int(head, "head"),
                Attr.ATTENTION_HEADS: fields.non_negative_int(num_heads, "num_heads"),
                Attr.ATTENTION_SEQ_LEN: seq_len,
                Attr.ATTENTION_SCORES: flat,
            }
        except Exception as exc:  # bad matrices, and callables or tolist() that raise
            _reject(layer.span, EventName.ATTENTION_HEATMAP, "scores", exc)
            return
        layer.span.add_event(EventName.ATTENTION_HEATMAP, attrs)


#: Largest attention matrix side we accept (stwo-ml's proof stream caps heatmaps at 64×64).
MAX_ATTENTION_SIDE = 64


def _square_matrix(scores: Any) -> tuple[list[float], int]:
    # Vectorized: a 64×64 check per head must not cost 4096 Python-level calls.
    try:
        matrix = np.asarray(scores.tolist() if hasattr(scores, "tolist") else scores,
                            dtype=np.float64)
    except Exception as exc:
        raise ValueError(f"scores must be a square numeric matrix ({exc})") from None
    if matrix.ndim != 2 or matrix.size == 0:
        raise ValueError(f"scores must be a non-empty 2-D matrix, got shape {matrix.shape}")
    n, m = matrix.shape
    if n != m:
        raise ValueError(f"scores must be square, got {n}×{m}")
    if n > MAX_ATTENTION_SIDE:
        raise ValueError(f"scores side {n} exceeds the cap of {MAX_ATTENTION_SIDE}")
    if not np.isfinite(matrix).all():
        raise ValueError("scores must be finite numbers (NaN or infinity found)")
    flat: list[float] = matrix.ravel().tolist()
    return flat, n


class CircuitHandle(PhaseHandle):
    __slots__ = ()

    def set_circuit(self, nodes: Sequence[CircuitNode]) -> None:
        self.span.set_attributes(circuit_attributes(nodes))


class WeightOpeningHandle(PhaseHandle):
    __slots__ = ()

    def set_commitment(self, commitment_hex: str) -> None:
        self.span.set_attribute(Attr.WEIGHT_COMMITMENT, str(commitment_hex))


class BindingHandle(PhaseHandle):
    __slots__ = ()

    def set_calldata_felts(self, felts: int) -> None:
        self.span.set_attribute(Attr.BINDING_CALLDATA_FELTS,
                                fields.non_negative_int(felts, "calldata_felts"))


class VerifyHandle(PhaseHandle):
    __slots__ = ("_tracer",)

    def __init__(self, span: Span, tracer: ProofTracer) -> None:
        super().__init__(span)
        self._tracer = tracer

    def set_verified(self, ok: bool) -> None:
        try:
            ok = fields.strict_bool(ok, "verified")
        except Exception:
            REJECTIONS.record(Attr.PROOF_VERIFIED, "invalid")
            return
        self.span.set_attribute(Attr.PROOF_VERIFIED, ok)
        if not ok:
            self.span.set_status(Status(StatusCode.ERROR, "proof rejected"))
        self._tracer._record_verified(bool(ok))


def circuit_attributes(nodes: Sequence[CircuitNode]) -> dict[str, AttributeValue]:
    """The circuit DAG as parallel arrays (validated)."""
    idx: list[int] = []
    kinds: list[str] = []
    costs: list[int] = []
    e_from: list[int] = []
    e_to: list[int] = []
    for i, n in enumerate(nodes):
        idx.append(fields.non_negative_int(n.index, f"nodes[{i}].index"))
        try:
            kinds.append(_check_kind(n.kind))
        except ValueError as exc:
            raise ValueError(f"nodes[{i}].{exc}") from None
        costs.append(fields.non_negative_int(n.trace_cost, f"nodes[{i}].trace_cost"))
        for src in n.inputs:
            e_from.append(fields.non_negative_int(src, f"nodes[{i}].inputs"))
            e_to.append(n.index)
    known = set(idx)
    missing = sorted(set(e_from) - known)
    if missing:
        raise ValueError(f"nodes: edges refer to unknown node indices {missing}")
    return {
        Attr.CIRCUIT_NODE_INDEX: idx,
        Attr.CIRCUIT_NODE_KIND: kinds,
        Attr.CIRCUIT_NODE_TRACE_COST: costs,
        Attr.CIRCUIT_EDGE_FROM: e_from,
        Attr.CIRCUIT_EDGE_TO: e_to,
    }


def _message(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"[:200]
    except Exception:  # an exception whose __str__ raises
        return type(exc).__name__


def _round_index(round: object) -> int | None:
    if type(round) is int:  # the common case, cheaply
        return round if round >= 0 else None
    if isinstance(round, bool) or not isinstance(round, Integral) or int(round) < 0:
        return None
    return int(round)


#: Element types whose canonical string can wait for the export thread: deeply
#: immutable (the caller cannot change them after the call) and always valid.
_INT_ONLY = frozenset((int,))
_TUPLE_ONLY = frozenset((tuple,))
_LIST_ONLY = frozenset((list,))
_ints = _INT_ONLY.issuperset
_from_each = itertools.chain.from_iterable
#: Larger ints are canonicalised at the call: ``str()`` of an int with more digits than
#: ``sys.get_int_max_str_digits()`` (never below 640 unless 0, unlimited) raises, and that
#: rejection must happen on the prover thread, as it always did.
_BOUND = 10**600


def _frozen_poly(coeffs: Any, owned: bool) -> tuple[Any, ...] | None:
    """The coefficients as a tuple when every one is an ``int`` or a non-empty tuple of
    ``int`` limbs (or, when ``owned``, a list of them: ``tolist()`` output, frozen here
    because an object array hands back the caller's own lists), all below
    :data:`_BOUND`; else ``None``.

    Exactly the values ``fields.canonical`` takes on its fast path, and formats without
    error, so deferring the call cannot change its result; anything else is
    canonicalised at once."""
    kinds: Any = set(map(type, coeffs))
    if kinds <= _INT_ONLY:
        return tuple(coeffs) if sum(map(abs, coeffs)) < _BOUND else None
    if owned and kinds == _LIST_ONLY:
        coeffs, kinds = tuple(map(tuple, coeffs)), _TUPLE_ONLY
    # Two passes over the limbs rather than one over a flattened copy: building that
    # tuple slowed every later round by ~1 µs once the heap was large (measured).
    if (kinds == _TUPLE_ONLY and all(coeffs) and _ints(map(type, _from_each(coeffs)))
            # The sum of the magnitudes bounds each one, at half the cost of min + max.
            and sum(map(abs, _from_each(coeffs))) < _BOUND):
        return tuple(coeffs)
    return None


def _deferrable(value: Any) -> bool:
    """The same check for one claim or challenge."""
    if type(value) is int:
        return -_BOUND < value < _BOUND
    return (type(value) is tuple and bool(value) and _ints(map(type, value))
            and sum(map(abs, value)) < _BOUND)


def _record_round(layer: _LayerState, round: object, poly: Lazy, claim: Lazy,
                  degree: object, challenge: Lazy = None) -> None:
    try:
        span = layer.span
        cap = _round_event_cap
        if cap is not None:
            if layer.round_events >= cap:
                DROPS.record("span_events", "sdk", DropReason.SPAN_LIMIT)
                return
            layer.round_events += 1
        error: str | None = None
        index = round if type(round) is int and round >= 0 else _round_index(round)
        sink = layer.rounds
        try:
            coeffs = poly() if callable(poly) else poly
            kind = type(coeffs)
            owned = False
            if (kind is not tuple and kind is not list and hasattr(coeffs, "tolist")
                    and not isinstance(coeffs, Integral)):
                coeffs = coeffs.tolist()  # a numpy array of coefficients or limbs
                kind, owned = type(coeffs), True
            poly_v: Any = None
            if sink is not None and (kind is tuple or kind is list) and coeffs:
                poly_v = _frozen_poly(coeffs, owned)
            deferred = poly_v is not None
            if not deferred:
                poly_v = [fields.canonical(c) for c in coeffs]
            if not poly_v:
                raise ValueError("poly: a round polynomial needs at least one coefficient")
            claim_v = claim() if callable(claim) else claim  # after poly, before challenge
            if deferred and claim_v is not None and not _deferrable(claim_v):
                deferred, poly_v = False, [fields.canonical(c) for c in poly_v]
            if not deferred and claim_v is not None:
                claim_v = fields.canonical(claim_v)
            chal_v = challenge() if callable(challenge) else challenge
            if deferred and chal_v is not None and not _deferrable(chal_v):
                deferred = False
                poly_v = [fields.canonical(c) for c in poly_v]
                claim_v = None if claim_v is None else fields.canonical(claim_v)
            if not deferred and chal_v is not None:
                chal_v = fields.canonical(chal_v)
        except Exception as exc:  # bad values, and callables or field types that raise
            REJECTIONS.record("poly/claim/challenge", "not_a_field_element")
            span.add_event(EventName.SUMCHECK_ROUND, {
                Attr.SUMCHECK_ROUND: index if index is not None else -1,
                Attr.ERROR_TYPE: "invalid_field_element", "exception.message": _message(exc)})
            return
        if degree is not None:
            try:
                degree = fields.non_negative_int(degree, "degree")
            except Exception:
                REJECTIONS.record("degree", "invalid")  # recorded as len(poly) - 1 instead
                degree = None
        if index is None:
            error = "invalid_round"
            REJECTIONS.record("round", error)
            round = -1
        else:
            round = index
            if layer.total_rounds and index >= layer.total_rounds:
                error = "round_out_of_range"
                REJECTIONS.record("round", error)
        if error is None:
            layer.rounds_done += 1
        record = (time.time_ns(), round, degree, poly_v, claim_v, chal_v, error, deferred)
        if sink is None or not sink.add(record, span):
            name, attrs = _round_event(record)
            span.add_event(name, attrs, timestamp=record[0])
    except Exception as exc:  # the hot path never raises into the prover
        REJECTIONS.record("sumcheck_round", "raised")
        with contextlib.suppress(Exception):
            layer.span.add_event(EventName.SUMCHECK_ROUND, {
                Attr.SUMCHECK_ROUND: -1, Attr.ERROR_TYPE: "invalid",
                "exception.message": _message(exc)})


_round_event = round_records.round_event
_ROUND_EVENT = round_records.NAME


def _reject(span: Span, event: str, field_name: str, exc: Exception) -> None:
    REJECTIONS.record(field_name, "invalid")
    with contextlib.suppress(Exception):
        span.add_event(event, {Attr.ERROR_TYPE: "invalid", "exception.message": _message(exc)})


_default: ProofTracer | None = None


def get_tracer() -> ProofTracer:
    """The process-wide tracer on the global providers (set by ``configure``)."""
    global _default
    if _default is None:
        _default = ProofTracer()
    return _default


def sumcheck_round(round: int, poly: Lazy, claim: Lazy, degree: int | None = None,
                   challenge: Lazy = None) -> None:
    """Module-level hot-path shortcut for :meth:`ProofTracer.sumcheck_round`."""
    if not _active_layers:
        return
    layer = _current_layer.get()
    if layer is None:
        return
    _record_round(layer, round, poly, claim, degree, challenge)


def current_span() -> Span | None:
    """The innermost proof-phase span of this context (for GPU evidence events)."""
    layer = _current_layer.get()
    if layer is not None:
        return layer.span
    proof = _current_proof.get()
    return proof.span if proof is not None else None
