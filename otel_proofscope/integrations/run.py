"""``proofscope run``: any prover process as one ``proof`` span, in any language.

The child gets the trace context in its environment (``TRACEPARENT`` / ``TRACESTATE``
/ ``BAGGAGE``, the OTel environment-carrier names), so an OTel-instrumented child that
extracts it joins the same trace. It also gets ``PROOFSCOPE_STREAM``: a path it may
write proof-stream JSON lines to (a regular file followed like ``tail -f``, or a
FIFO); those become live spans under the root. GPUs are sampled while it runs, its
exit code is returned, and SIGINT / SIGTERM / SIGHUP are forwarded to it.
"""

from __future__ import annotations

import contextvars
import logging
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.semconv._incubating.attributes import process_attributes as proc_attr
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_proofscope.instrumentation import ProofHandle, ProofTracer
from otel_proofscope.integrations.mapped_output import MappedOutput
from otel_proofscope.integrations.proof_stream.bridge import StreamBridge
from otel_proofscope.integrations.proof_stream.replay import replay
from otel_proofscope.integrations.proof_stream.sources import (
    FollowSource,
    LineSource,
    SourceError,
    WebSocketSource,
)
from otel_proofscope.mapping.lines import LineRules
from otel_proofscope.mapping.rust_console import console_rules

_log = logging.getLogger(__name__)

#: Environment variable naming the proof-stream path the child may write to.
STREAM_ENV = "PROOFSCOPE_STREAM"
#: W3C trace-context carriers in the environment (OTel env-carrier naming).
CONTEXT_ENV = ("TRACEPARENT", "TRACESTATE", "BAGGAGE")
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: How long the stream reader may take to drain after the child exits.
DRAIN_TIMEOUT_S = 5.0


@dataclass
class RunConfig:
    argv: Sequence[str]
    system: str = "unknown"
    backend: str = "unknown"
    model_name: str | None = None
    #: "file" (a temp file followed like tail -f), "fifo", or "off".
    stream: str = "file"
    #: Use this path for the stream instead of a temporary one (kept afterwards).
    stream_path: str | None = None
    #: Also read the child's proof-stream WebSocket (ws://HOST:PORT/ws?token=…).
    stream_url: str | None = None
    sample_gpus: bool = True
    #: After forwarding a signal, SIGKILL the child if it is still running this long.
    kill_after_s: float = 30.0
    #: Record the full command line (may hold secrets) instead of the executable only.
    record_args: bool = False
    extra_env: Mapping[str, str] = field(default_factory=dict)
    #: Log-line rules (``--map``): the child's output is piped, passed on unchanged and
    #: turned into phase spans (integrations/mapped_output.py).
    line_rules: LineRules | None = None
    #: Spans from a Rust prover's tracing close lines (mapping/rust_console.py): "auto"
    #: (the output is piped and read; the summary mentions it only when close lines
    #: came), "on" (``--map rust-tracing``) or "off" (the child keeps our terminal).
    console: str = "auto"


@dataclass
class RunResult:
    exit_code: int
    returncode: int | None
    signals_forwarded: list[int] = field(default_factory=list)
    killed: bool = False
    stream_lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Why the prover could not be started (not found, not executable), else None.
    start_error: str | None = None


def child_environment(base: Mapping[str, str], extra: Mapping[str, str] | None = None,
                      stream_path: str | None = None) -> dict[str, str]:
    """``base`` (OTEL_* included) + ``extra`` + the current trace context + the stream."""
    env = {k: v for k, v in base.items() if k not in CONTEXT_ENV}
    env.update(extra or {})
    carrier: dict[str, str] = {}
    propagate.inject(carrier)  # the configured propagators (OTEL_PROPAGATORS)
    TraceContextTextMapPropagator().inject(carrier)  # W3C always, whatever is configured
    for key, value in carrier.items():
        env[key.upper().replace("-", "_")] = value
    if stream_path is not None:
        env[STREAM_ENV] = stream_path
    return env


def context_from_environment(env: Mapping[str, str]) -> otel_context.Context | None:
    """The trace context an outer process passed us (so ``run`` nests), or None."""
    carrier = {k.lower(): env[k] for k in CONTEXT_ENV if env.get(k)}
    if "traceparent" not in carrier:
        return None
    ctx = TraceContextTextMapPropagator().extract(carrier)
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    return propagate.extract(carrier, context=ctx)


def exit_code_of(returncode: int) -> int:
    """Shell convention: a child killed by signal N exits with 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _sigint_reaches_child_anyway() -> bool:
    # Ctrl-C on a terminal signals the whole foreground process group, child included;
    # forwarding it as well would interrupt the child twice.
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


class _Stream:
    """The child's proof stream: path, reader thread, bridge."""

    def __init__(self, cfg: RunConfig, root: ProofHandle, tracer_provider: Any,
                 meter_provider: Any, notes: list[str]) -> None:
        self.path: str | None = None
        self._tmpdir: str | None = None
        self._threads: list[threading.Thread] = []
        self._sources: list[LineSource] = []
        self.bridges: list[StreamBridge] = []
        self._notes = notes
        if cfg.stream != "off":
            existed = cfg.stream_path is not None and os.path.exists(cfg.stream_path)
            self.path = self._make_path(cfg)
            # A reused --stream-path: only what this run appends belongs to it.
            follow = FollowSource(self.path, from_end=existed).open()
            self._add(follow, cfg, root, tracer_provider, meter_provider)
        if cfg.stream_url:
            ws = WebSocketSource(cfg.stream_url, max_reconnects=1000)
            self._add(ws, cfg, root, tracer_provider, meter_provider)

    def _make_path(self, cfg: RunConfig) -> str:
        if cfg.stream_path:
            path = Path(cfg.stream_path)
            if not path.exists():
                if cfg.stream == "fifo":
                    os.mkfifo(path, 0o600)
                else:
                    path.touch(0o600)
            elif not (path.is_file() or stat.S_ISFIFO(path.stat().st_mode)):
                raise SourceError(f"{path} is neither a regular file nor a FIFO")
            return str(path)
        self._tmpdir = tempfile.mkdtemp(prefix="proofscope-run-")
        path = Path(self._tmpdir) / "proof-stream.jsonl"
        if cfg.stream == "fifo":
            os.mkfifo(path, 0o600)
        else:
            path.touch(0o600)
        return str(path)

    def _add(self, source: LineSource, cfg: RunConfig, root: ProofHandle,
             tracer_provider: Any, meter_provider: Any) -> None:
        bridge = StreamBridge(tracer_provider=tracer_provider, meter_provider=meter_provider,
                              system=cfg.system, source=source.name, root=root,
                              root_backend_known=cfg.backend != "unknown", live=True)
        # A copy of the current context: the bridge's spans are children of the root.
        ctx = contextvars.copy_context()
        thread = threading.Thread(target=ctx.run, args=(self._read, source, bridge),
                                  name=f"proofscope-stream-{source.name}", daemon=True)
        self._sources.append(source)
        self.bridges.append(bridge)
        self._threads.append(thread)

    def _read(self, source: LineSource, bridge: StreamBridge) -> None:
        try:
            replay(source, bridge)
        except SourceError as exc:
            self._notes.append(f"proof stream {source.name}: {exc}")
        except Exception as exc:  # the reader must never take the run down
            _log.warning("proof-stream reader %s failed: %r", source.name, exc)
            self._notes.append(f"proof stream {source.name} failed: {exc!r}")

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def finish(self) -> list[str]:
        """Stop following, let the readers drain (bounded), clean up."""
        for s in self._sources:
            s.stop()
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        for t, s in zip(self._threads, self._sources, strict=True):
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                self._notes.append(f"proof stream {s.name}: reader still busy after "
                                   f"{DRAIN_TIMEOUT_S:g} s; later events may be lost")
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        lines: list[str] = []
        for b in self.bridges:
            if b.stats.lines or b.stats.rejected:
                lines += b.report_lines()
        return lines


def _start_gpu_sampler(meter_provider: metrics.MeterProvider | None,
                       notes: list[str]) -> Any:
    try:
        from otel_proofscope.gpu import start_sampler
    except ImportError as exc:  # GPU telemetry is optional
        notes.append(f"GPU sampling unavailable: {exc}")
        return None
    try:
        # We cannot see the child's dispatches, so identity and capability gaps are
        # reported at once, on the root span (the current span here).
        sampler = start_sampler(meter_provider, evidence="immediately")
    except Exception as exc:  # a broken driver must not stop the prover from running
        notes.append(f"GPU sampling failed to start: {exc}")
        return None
    if sampler is None:
        notes.append("GPU sampling: no NVIDIA device visible to NVML")
    return sampler


def run_process(cfg: RunConfig, *, tracer: ProofTracer,
                tracer_provider: trace.TracerProvider | None = None,
                meter_provider: metrics.MeterProvider | None = None,
                env: Mapping[str, str] | None = None) -> RunResult:
    """Run ``cfg.argv`` under a ``proof`` span; returns when the child has exited.

    Signal handlers are installed only when called from the main thread.
    """
    if not cfg.argv:
        raise ValueError("argv: no command to run")
    base_env = dict(os.environ if env is None else env)
    outer = context_from_environment(base_env)
    token = otel_context.attach(outer) if outer is not None else None
    try:
        with tracer.proof(system=cfg.system, backend=cfg.backend,
                          model_name=cfg.model_name) as root:
            return _run_under(root, cfg, base_env, tracer_provider, meter_provider)
    finally:
        if token is not None:
            otel_context.detach(token)


def _run_under(root: ProofHandle, cfg: RunConfig, base_env: Mapping[str, str],
               tracer_provider: Any, meter_provider: Any) -> RunResult:
    span = root.span
    argv = list(cfg.argv)
    span.set_attribute(proc_attr.PROCESS_EXECUTABLE_NAME, os.path.basename(argv[0]))
    if cfg.record_args:
        span.set_attribute(proc_attr.PROCESS_COMMAND_ARGS, argv)
    notes: list[str] = []
    stream = _Stream(cfg, root, tracer_provider, meter_provider, notes)
    child_env = child_environment(base_env, cfg.extra_env, stream.path)
    sampler = _start_gpu_sampler(meter_provider, notes) if cfg.sample_gpus else None
    result = RunResult(exit_code=0, returncode=None)
    mapped = None if cfg.line_rules is None and cfg.console == "off" else MappedOutput(
        cfg.line_rules or console_rules(), argv, span, tracer_provider=tracer_provider,
        meter_provider=meter_provider, system=cfg.system, backend=cfg.backend,
        console=cfg.console)
    stream.start()
    try:
        with _SignalForwarder(cfg, result) as forwarder:
            try:
                child = subprocess.Popen(argv, env=child_env,
                                         **(mapped.popen_kwargs() if mapped else {}))
            except OSError as exc:
                # 127 / 126: the shell's codes for "not found" / "not executable".
                code = 127 if isinstance(exc, FileNotFoundError) else 126
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR,
                                       f"cannot start {argv[0]}: {exc.strerror}"))
                span.set_attribute(proc_attr.PROCESS_EXIT_CODE, code)
                result.exit_code = code
                result.start_error = f"cannot start {argv[0]}: {exc.strerror}"
                return result
            span.set_attribute(proc_attr.PROCESS_PID, child.pid)
            forwarder.attach(child)
            if mapped is not None:
                mapped.started(child)
            if sampler is not None and getattr(sampler, "watch", None) is not None:
                # Per-process GPU usage: the child and its descendants are the prover.
                sampler.watch.add_root(child.pid)
            returncode = child.wait()
        result.returncode = returncode
        result.exit_code = exit_code_of(returncode)
        span.set_attribute(proc_attr.PROCESS_EXIT_CODE, result.exit_code)
        if returncode < 0:
            name = signal.Signals(-returncode).name
            span.set_status(Status(StatusCode.ERROR, f"prover killed by {name}"))
        elif returncode != 0:
            span.set_status(Status(StatusCode.ERROR, f"prover exited with code {returncode}"))
        return result
    finally:
        if sampler is not None:
            sampler.stop()
        result.stream_lines = stream.finish()
        if mapped is not None:
            result.stream_lines += mapped.finish(DRAIN_TIMEOUT_S)
        result.notes = notes


class _SignalForwarder:
    """Forwards SIGINT, SIGTERM and SIGHUP to the prover, and after the first one starts
    the ``--kill-after`` timer.

    Installed before the prover is started: a signal that came while it was starting (on
    a loaded machine the prover can be up and signalled before we are back from
    ``Popen``) would otherwise take the default action, ending proofscope without a
    summary and leaving the prover running. Such a signal is held and forwarded once the
    prover exists. Off the main thread (no handlers can be set there) it does nothing.
    """

    def __init__(self, cfg: RunConfig, result: RunResult) -> None:
        self._cfg, self._result = cfg, result
        self._child: subprocess.Popen[bytes] | None = None
        self._early: list[int] = []
        self._timer: threading.Timer | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> _SignalForwarder:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._on_signal) for s in FORWARDED_SIGNALS}
        return self

    def __exit__(self, *_exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        if self._timer is not None:
            self._timer.cancel()

    def attach(self, child: subprocess.Popen[bytes]) -> None:
        self._child = child
        early, self._early = self._early, []
        for signum in early:  # it did not exist when they came: no terminal reached it
            self._forward(signum)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self._child is None:
            self._early.append(signum)
        elif not (signum == signal.SIGINT and _sigint_reaches_child_anyway()):
            self._forward(signum)  # else the terminal delivered it to the child already
        else:
            self._start_kill_timer()

    def _forward(self, signum: int) -> None:
        child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signum)
            self._result.signals_forwarded.append(signum)
        self._start_kill_timer()

    def _start_kill_timer(self) -> None:
        if self._timer is None and self._cfg.kill_after_s > 0:
            self._timer = threading.Timer(self._cfg.kill_after_s, self._kill_if_running)
            self._timer.daemon = True
            self._timer.start()

    def _kill_if_running(self) -> None:
        child = self._child
        if child is not None and child.poll() is None:
            self._result.killed = True
            child.kill()
