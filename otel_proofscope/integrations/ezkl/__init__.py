"""OpenTelemetry instrumentation for EZKL, the zkML prover (``ezkl >= 23``).

    from otel_proofscope.integrations.ezkl import EzklInstrumentor
    EzklInstrumentor().instrument()          # or: opentelemetry-instrument python prove.py

EZKL's Python API is a set of synchronous, path-based functions. Each call of
``gen_settings``, ``calibrate_settings``, ``compile_circuit``, ``gen_srs``, ``gen_witness``,
``mock``, ``setup``, ``prove`` and ``verify`` becomes a span: ``compile_circuit`` is the
contract's ``proof.circuit.compile``, ``verify`` is ``proof.verify``, the others are
``ezkl.<function>`` (:class:`EzklSpanName`).

A proof spans several calls, so the ``proof`` root is opened by ``gen_witness`` (or by
``prove`` when no witness call came first) and closed when ``verify`` returns. Every EZKL
call made while it is open (``setup``, ``mock`` …) is its child. If no ``verify`` follows,
the root closes at the next ``gen_witness`` / ``prove`` that starts a new proof, at
:meth:`EzklInstrumentor.end_proof`, at ``uninstrument()`` or at interpreter exit, with the
end time of its last phase (idle time afterwards is not counted). When the caller already
has a ``proof`` span open (``ProofTracer.proof``), no root is made: the phases become its
children and ``proof.size`` / ``proof.verified`` are set on it.

Attributes come from EZKL's files: the settings JSON (logrows, scales, visibility, rows,
columns …; :class:`~otel_proofscope.integrations.ezkl.files.EzklAttr`) and the proof
(``proof.size`` in bytes of the proof itself). EZKL's log lines become ``proof.log`` events
on the running phase span (see :mod:`.logs`). During ``prove`` the GPU sampler runs when
``otel_proofscope.gpu.start_sampler`` finds a device.

``instrument()`` keyword arguments: ``tracer_provider``, ``meter_provider``, ``backend``
(``proof.backend``, default ``cpu``), ``log_level`` (lowest EZKL log level captured as
events, default ``INFO``; ``None`` turns capture off), ``gpu_sampler`` (default True).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Collection
from contextvars import ContextVar
from types import ModuleType
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from otel_proofscope.integrations.ezkl import files
from otel_proofscope.integrations.ezkl.logs import LogBridge
from otel_proofscope.integrations.ezkl.package import _instruments
from otel_proofscope.integrations.ezkl.phases import (
    PROOF_SYSTEM,
    SETTINGS_WRITTEN,
    SPAN_NAMES,
    OpenProof,
    abs_path,
    environment_context,
    is_proof_span,
)
from otel_proofscope.integrations.ezkl.version import __version__
from otel_proofscope.semconv import (
    METER_NAME,
    TRACER_NAME,
    Attr,
    EzklAttr,
    EzklSpanName,
    Metric,
    SpanName,
)

__all__ = ["SPAN_NAMES", "EzklAttr", "EzklInstrumentor", "EzklSpanName"]

_log = logging.getLogger("otel_proofscope.ezkl")

def _span_seconds(run: OpenProof) -> float:
    """The root span's own duration (it ends at the last phase, not at close), so the
    metric and the span are one measurement; the monotonic clock only for a span that
    does not record times (no SDK)."""
    start, end = getattr(run.span, "start_time", None), getattr(run.span, "end_time", None)
    if isinstance(start, int) and isinstance(end, int):
        return (end - start) / 1e9
    return (time.perf_counter_ns() - run.start_perf_ns) / 1e9


class EzklInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Wraps EZKL's proving functions into contract spans (see the module docstring)."""

    def __init__(self) -> None:
        # BaseInstrumentor is a per-class singleton; initialise state only once.
        if getattr(self, "_initialised", False):
            return
        self._initialised = True
        self._originals: list[tuple[ModuleType, str, Any]] = []
        self._open: ContextVar[OpenProof | None] = ContextVar("proofscope_ezkl_proof",
                                                               default=None)
        self._registry: dict[int, OpenProof] = {}
        self._registry_lock = threading.Lock()
        self._phase_stack: list[Span] = []
        self._compiled_settings: dict[str, str] = {}
        self._log_bridge: LogBridge | None = None
        self._atexit_registered = False
        self._tracer: trace.Tracer = trace.NoOpTracer()
        self._backend = "cpu"
        self._gpu_sampler = True
        self._meter_provider: metrics.MeterProvider | None = None
        self._proof_duration: metrics.Histogram | None = None
        self._verify_count: metrics.Counter | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    # ── install / uninstall ─────────────────────────────────────────────────────────

    def _instrument(self, **kwargs: Any) -> None:
        import ezkl

        self._tracer = trace.get_tracer(TRACER_NAME, __version__,
                                        kwargs.get("tracer_provider"))
        self._meter_provider = kwargs.get("meter_provider")
        meter = metrics.get_meter(METER_NAME, __version__, self._meter_provider)
        self._proof_duration = Metric.PROOF_DURATION.histogram(meter)
        self._verify_count = Metric.PROOF_VERIFY_COUNT.counter(meter)
        self._backend = str(kwargs.get("backend") or "cpu")
        self._gpu_sampler = bool(kwargs.get("gpu_sampler", True))
        log_level = kwargs.get("log_level", logging.INFO)
        if log_level is not None:
            self._log_bridge = LogBridge(
                logging.getLevelName(log_level) if isinstance(log_level, str) else log_level,
                fallback_span=self._innermost_phase)
            self._log_bridge.install()

        modules = [ezkl]
        inner = getattr(ezkl, "ezkl", None)
        if isinstance(inner, ModuleType):
            modules.append(inner)
        for name in SPAN_NAMES:
            original = getattr(ezkl, name, None)
            if original is None:
                _log.warning("ezkl has no %s(); not instrumented", name)
                continue
            wrapper = self._wrap(name, original)
            for module in modules:
                if getattr(module, name, None) is original:
                    self._originals.append((module, name, original))
                    setattr(module, name, wrapper)
        if not self._atexit_registered:
            atexit.register(self.end_all_proofs)
            self._atexit_registered = True

    def _uninstrument(self, **kwargs: Any) -> None:
        self.end_all_proofs()
        for module, name, original in reversed(self._originals):
            setattr(module, name, original)
        self._originals.clear()
        if self._log_bridge is not None:
            self._log_bridge.uninstall()
            self._log_bridge = None
        self._compiled_settings.clear()

    # ── proof root lifecycle ────────────────────────────────────────────────────────

    def end_proof(self) -> None:
        """Close this context's open ``proof`` root now (e.g. a proof without verify)."""
        run = self._open.get()
        if run is not None:
            self._end(run)

    def end_all_proofs(self) -> None:
        """Close every open ``proof`` root (at uninstrument and interpreter exit)."""
        with self._registry_lock:
            runs = list(self._registry.values())
        for run in runs:
            self._end(run)

    def _start_proof(self, model: str | None) -> OpenProof:
        attrs: dict[str, AttributeValue] = {Attr.PROOF_SYSTEM: PROOF_SYSTEM,
                                            Attr.PROOF_BACKEND: self._backend}
        if model:
            attrs[Attr.PROOF_MODEL_NAME] = os.path.splitext(os.path.basename(model))[0]
        # Nest under the caller's span if there is one; otherwise join the trace a parent
        # process handed down in TRACEPARENT (``proofscope run``), if any.
        parent = None if trace.get_current_span().get_span_context().is_valid \
            else environment_context()
        span = self._tracer.start_span(SpanName.PROOF, context=parent, attributes=attrs)
        run = OpenProof(span, trace.set_span_in_context(span), time.perf_counter_ns())
        self._open.set(run)
        with self._registry_lock:
            self._registry[id(run)] = run
        return run

    def _end(self, run: OpenProof) -> None:
        with run.lock:
            if run.ended:
                return
            run.ended = True
        with self._registry_lock:
            self._registry.pop(id(run), None)
        if self._open.get() is run:
            self._open.set(None)
        if run.failed and run.verified is None:
            run.span.set_status(Status(StatusCode.ERROR, "proof failed"))
        run.span.end(end_time=run.last_end_ns)
        if self._proof_duration is not None:
            m_attrs: dict[str, AttributeValue] = {Attr.PROOF_SYSTEM: PROOF_SYSTEM,
                                                  Attr.PROOF_BACKEND: self._backend}
            verified = run.verified if run.verified is not None else (
                False if run.failed else None)
            if verified is not None:
                m_attrs[Attr.PROOF_VERIFIED] = verified
            self._proof_duration.record(_span_seconds(run), m_attrs)

    def _proof_for(self, function: str, model: str | None) -> OpenProof | None:
        """The proof root this call belongs to, opening or closing roots as needed."""
        run = self._open.get()
        if run is not None and run.ended:
            run = None
        if function == "gen_witness":
            if run is not None:
                self._end(run)  # a new witness starts a new proof
            return self._start_proof(model)
        if function == "prove":
            if run is not None and run.proved:
                self._end(run)
                run = None
            return run if run is not None else self._start_proof(model)
        return run

    def _innermost_phase(self) -> Span | None:
        stack = self._phase_stack
        return stack[-1] if stack else None

    # ── the wrapper ─────────────────────────────────────────────────────────────────

    def _wrap(self, function: str, original: Callable[..., Any]) -> Callable[..., Any]:
        try:
            signature: inspect.Signature | None = inspect.signature(original)
        except (TypeError, ValueError):
            signature = None

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not is_instrumentation_enabled():
                return original(*args, **kwargs)
            params: dict[str, Any] = {}
            if signature is not None:
                # A call that does not bind fails inside EZKL with EZKL's own error.
                with contextlib.suppress(TypeError):
                    params = dict(signature.bind_partial(*args, **kwargs).arguments)
            return self._call(function, original, args, kwargs, params)

        return wrapper

    def _call(self, function: str, original: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any], params: dict[str, Any]) -> Any:
        model = abs_path(params.get("model"))
        current = trace.get_current_span()
        user_root = current if is_proof_span(current) else None
        run = None if user_root is not None else self._proof_for(function, model)
        root = user_root if user_root is not None else (run.span if run else None)
        parent = run.context if run is not None else None

        attrs: dict[str, AttributeValue] = {EzklAttr.FUNCTION: function}
        if function == "gen_srs" and isinstance(params.get("logrows"), int):
            attrs[EzklAttr.LOGROWS] = params["logrows"]
        if function == "calibrate_settings" and isinstance(params.get("target"), str):
            attrs[EzklAttr.CALIBRATION_TARGET] = params["target"]

        span = self._tracer.start_span(SPAN_NAMES[function], context=parent, attributes=attrs)
        self._phase_stack.append(span)
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False,
                                set_status_on_exception=False):
                sampler = self._start_gpu_sampler() if function == "prove" else None
                try:
                    result = original(*args, **kwargs)
                except BaseException as exc:
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                    self._after_failure(function, span, root, run)
                    raise
                finally:
                    if sampler is not None:
                        _stop_sampler(sampler)
                self._after_success(function, params, result, span, root, run)
                return result
        finally:
            if self._phase_stack and self._phase_stack[-1] is span:
                self._phase_stack.pop()
            elif span in self._phase_stack:
                self._phase_stack.remove(span)
            span.end()
            if run is not None:
                end = getattr(span, "end_time", None)
                run.last_end_ns = end if isinstance(end, int) else time.time_ns()
                if function == "verify" or run.failed:
                    self._end(run)

    # ── attributes after a call ─────────────────────────────────────────────────────

    def _after_success(self, function: str, params: dict[str, Any], result: Any, span: Span,
                       root: Span | None, run: OpenProof | None) -> None:
        settings_path = self._settings_path(function, params)
        if settings_path is not None:
            settings = files.load_json(settings_path)
            if settings is not None:
                span.set_attributes(files.settings_attributes(settings))
                if root is not None and (run is None or not run.settings_known):
                    root.set_attributes({**files.settings_attributes(settings),
                                         **files.io_shapes(settings)})
                    if run is not None:
                        run.settings_known = True
        if function == "mock" and isinstance(result, bool):
            span.set_attribute(EzklAttr.RESULT, result)
        elif function == "prove":
            self._after_prove(params, result, span, root, run)
        elif function == "verify":
            self._record_verified(result is True, span, root, run)

    def _after_prove(self, params: dict[str, Any], result: Any, span: Span,
                     root: Span | None, run: OpenProof | None) -> None:
        proof_path = abs_path(params.get("proof_path"))
        doc = result if isinstance(result, dict) else files.load_json(proof_path)
        size = files.proof_size(doc) if doc is not None else None
        if size is not None:
            span.set_attribute(Attr.PROOF_SIZE, size)
            if root is not None:
                root.set_attribute(Attr.PROOF_SIZE, size)
        file_size = files.file_size(proof_path)
        if file_size is not None:
            span.set_attribute(EzklAttr.PROOF_FILE_SIZE, file_size)
        if run is not None:
            run.proved = True

    def _after_failure(self, function: str, span: Span, root: Span | None,
                       run: OpenProof | None) -> None:
        if function == "verify":
            self._record_verified(False, span, root, run)
        elif function in ("gen_witness", "prove") and run is not None:
            run.failed = True

    def _record_verified(self, ok: bool, span: Span, root: Span | None,
                         run: OpenProof | None) -> None:
        span.set_attribute(Attr.PROOF_VERIFIED, ok)
        if not ok:
            span.set_status(Status(StatusCode.ERROR, "proof rejected"))
        if root is not None:
            root.set_attribute(Attr.PROOF_VERIFIED, ok)
            if not ok:
                root.set_status(Status(StatusCode.ERROR, "proof rejected"))
        if run is not None:
            run.verified = ok
        if self._verify_count is not None:
            self._verify_count.add(1, {Attr.PROOF_SYSTEM: PROOF_SYSTEM,
                                       Attr.PROOF_VERIFIED: ok})

    def _settings_path(self, function: str, params: dict[str, Any]) -> str | None:
        if function in SETTINGS_WRITTEN:
            path = abs_path(params.get(SETTINGS_WRITTEN[function]))
            compiled = abs_path(params.get("compiled_circuit"))
            if function == "compile_circuit" and compiled and path:
                self._compiled_settings[compiled] = path
            return path
        if function == "verify":
            return abs_path(params.get("settings_path"))
        model = abs_path(params.get("model"))
        return self._compiled_settings.get(model) if model else None

    # ── GPU sampling during prove ───────────────────────────────────────────────────

    def _start_gpu_sampler(self) -> Any:
        if not self._gpu_sampler:
            return None
        from otel_proofscope.gpu import start_sampler

        try:
            return start_sampler(meter_provider=self._meter_provider)
        except Exception:
            _log.warning("GPU sampler failed to start; proving without it", exc_info=True)
            return None


def _stop_sampler(sampler: Any) -> None:
    try:
        sampler.stop()
    except Exception:
        _log.warning("GPU sampler failed to stop", exc_info=True)
