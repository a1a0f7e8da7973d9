"""``run_demo``: set up telemetry, prove and verify the demo network, shut down, report.

The in-process core of ``proofscope demo``; tests, dashboards and benchmarks call it
directly. With ``telemetry=False`` the prover runs on no-op providers (the baseline
the overhead benchmark compares against).
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace

from otel_proofscope.demo.circuit import Network, build_network
from otel_proofscope.demo.field import MatmulFn, m31_matmul
from otel_proofscope.demo.prover import Progress, ProveResult, prove
from otel_proofscope.instrumentation import ProofTracer

_log = logging.getLogger(__name__)

BACKENDS = ("cpu", "wgpu")
DEFAULT_OUT_DIR = Path("proofscope-out")
TRACES_FILE = "traces.jsonl"
METRICS_FILE = "metrics.jsonl"
RRD_FILE = "proofscope.rrd"


@dataclass
class DemoOptions:
    out_dir: Path = DEFAULT_OUT_DIR
    layers: int = 8
    width: int = 32
    rows: int | None = None  # default min(width, 64)
    backend: str = "cpu"
    #: ``spawn``, ``file:PATH``, ``rerun+http://HOST:PORT/proxy`` or ``off``;
    #: None means ``file:OUT_DIR/proofscope.rrd``.
    rerun: str | None = None
    telemetry: bool = True
    seed: int = 0
    prometheus_port: int | None = None
    hold_s: float = 0.0
    #: Prove the same network this many times under one pipeline (feeds rate panels).
    repeat: int = 1
    witness: bool = True
    progress: Progress | None = None
    set_global: bool = True
    #: Extra sinks passed to configure() (tests, dashboards): (name, SpanExporter) pairs
    #: and MetricReaders.
    span_exporters: Sequence[tuple[str, Any]] = ()
    metric_readers: Sequence[Any] = ()

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)

    def rerun_target(self) -> str:
        if self.rerun is None:
            return f"file:{self.out_dir / RRD_FILE}"
        return self.rerun.strip()


@dataclass
class DemoResult:
    options: DemoOptions
    network: Network
    prove: ProveResult
    wall_s: float
    rerun_target: str = "off"
    rerun_note: str = ""
    files: dict[str, Path] = field(default_factory=dict)
    telemetry_lines: list[str] = field(default_factory=list)
    spans_exported: dict[str, int] = field(default_factory=dict)
    events_exported: dict[str, int] = field(default_factory=dict)
    dropped: int = 0
    hw_id: str | None = None
    #: Verification outcome of every proof when ``repeat`` > 1 (``prove`` is the last).
    all_verified: list[bool] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        return self.prove.verified and all(self.all_verified)

    def summary_lines(self) -> list[str]:
        p = self.prove
        net = self.network
        o = self.options
        lines = [
            f"verified: {'yes' if p.verified else 'NO — ' + p.verify.reason}",
        ]
        if len(self.all_verified) > 1:
            lines.append(f"proofs: {len(self.all_verified)}, "
                         f"{sum(self.all_verified)} verified (figures below: the last)")
        lines += [
            f"network: {net.name}, {len(net.layers)} layers, {net.rows}×{net.width} "
            f"activations, backend {o.backend}" + (f" ({self.hw_id})" if self.hw_id else ""),
            f"proof: {p.size:,} bytes, {len(p.proof.layers)} layer proofs, "
            f"{p.proof.weight_openings} weight openings, {p.rounds} sumcheck rounds, "
            f"soundness {p.soundness_bits:.1f} bits",
            f"time: prove {p.prove_s * 1e3:.1f} ms, verify {p.verify_s * 1e3:.1f} ms, "
            f"wall {self.wall_s:.2f} s",
            "time per layer kind: " + ", ".join(
                f"{kind} {secs * 1e3:.1f} ms ({self._count(kind)}×)"
                for kind, secs in sorted(p.layer_seconds.items(), key=lambda kv: -kv[1])),
        ]
        if not o.telemetry:
            lines.append("telemetry: off")
            return lines
        lines += [f"telemetry: {line}" for line in self.telemetry_lines]
        for name, path in self.files.items():
            lines.append(f"wrote {name}: {path}")
        if self.rerun_note:
            lines.append(f"rerun: {self.rerun_note}")
        target = self.rerun_target
        from otel_proofscope.pipeline.drops import DROPS

        # Claim delivery only when nothing sent to Rerun was lost (a frozen viewer or a
        # full disk used to read as "received the recording").
        lost = DROPS.total(sink="rerun")
        if target not in ("off", "") and lost:
            lines.append(f"Rerun ({target}) did not get {lost} item(s): see dropped above")
        if target.startswith("file:"):
            lines.append(f"open the recording: rerun {target[len('file:'):]}")
        elif target == "spawn" and not lost:
            lines.append("the Rerun viewer was spawned and received the recording")
        elif target not in ("off", "", "spawn") and not lost:
            lines.append(f"streamed to the Rerun viewer at {target}")
        return lines

    def _count(self, kind: str) -> int:
        return sum(1 for layer in self.network.layers if layer.kind.value == kind)


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run here (module, driver or adapter missing)."""


def load_matmul(backend: str, meter_provider: metrics.MeterProvider | None = None
                ) -> tuple[MatmulFn, str | None]:
    """The forward/folding matmul for ``backend``; wgpu is imported only when asked for.

    Returns the function and the device's ``hw.id`` (None on the CPU).
    """
    if backend == "cpu":
        return m31_matmul, None
    if backend != "wgpu":
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    try:
        from otel_proofscope.demo.gpu_kernels import WgpuMatmul

        mm = WgpuMatmul(meter_provider=meter_provider)
    except ImportError as exc:
        raise BackendUnavailableError(f"wgpu backend needs 'otel-proofscope[wgpu]': {exc}"
                                      ) from exc
    except Exception as exc:  # BackendUnavailable: no adapter / driver
        if type(exc).__name__ != "BackendUnavailable":
            raise
        raise BackendUnavailableError(str(exc)) from exc
    identity = getattr(getattr(mm, "device", None), "identity", None)
    hw_id = getattr(identity, "hw_id", None)
    fn: MatmulFn = mm.matmul_m31
    return fn, hw_id if isinstance(hw_id, str) else None


def rerun_available() -> str | None:
    """None if the Rerun exporter can be used, else why not."""
    if importlib.util.find_spec("rerun") is None:
        return "rerun-sdk is not installed (pip install 'otel-proofscope[rerun]')"
    try:
        found = importlib.util.find_spec("otel_proofscope.rerun.exporter")
    except ModuleNotFoundError:
        found = None
    if found is None:
        return "the otel_proofscope Rerun exporter is not available in this build"
    return None


def run_demo(options: DemoOptions) -> DemoResult:
    """Prove the demo network with the requested telemetry; never leaves sinks open."""
    start = time.perf_counter()
    network = build_network(options.layers, options.width, options.rows, options.seed)
    if not options.telemetry:
        matmul, hw_id = load_matmul(options.backend, metrics.NoOpMeterProvider())
        off = ProofTracer(trace.NoOpTracerProvider(), metrics.NoOpMeterProvider())
        result = prove(network, tracer=off, backend=options.backend, matmul=matmul,
                       hw_id=hw_id, progress=options.progress)
        _hold(options)
        return DemoResult(options, network, result, time.perf_counter() - start,
                          hw_id=hw_id)

    from otel_proofscope.setup import configure

    target = options.rerun_target()
    note = ""
    if target.lower() not in ("off", "none", ""):
        problem = rerun_available()
        if problem is not None:
            _log.warning("Rerun output disabled: %s", problem)
            note, target = f"disabled: {problem}", "off"
        elif target.startswith("file:"):
            Path(target[len("file:"):]).parent.mkdir(parents=True, exist_ok=True)
    telemetry = configure(service_name="proofscope-demo", out_dir=options.out_dir,
                          rerun=target, prometheus_port=options.prometheus_port,
                          capture_witness=options.witness, set_global=options.set_global,
                          span_exporters=options.span_exporters,
                          metric_readers=options.metric_readers)
    try:
        # After configure(), so GPU dispatch metrics reach the same pipeline.
        matmul, hw_id = load_matmul(options.backend, telemetry.meter_provider)
        if options.backend != "cpu":
            telemetry.start_gpu_sampler()  # NVML devices, if any; silent otherwise
        outcomes: list[bool] = []
        for _ in range(max(1, options.repeat)):
            result = prove(network, tracer=telemetry.tracer, backend=options.backend,
                           matmul=matmul, hw_id=hw_id, progress=options.progress)
            outcomes.append(result.verified)
        if options.hold_s > 0:
            telemetry.force_flush()  # so files and scrapers see the proof while we hold
            _hold(options)
    finally:
        report = telemetry.shutdown()
    files: dict[str, Path] = {}
    out_dir = telemetry.out_dir
    if out_dir is not None:
        for name in (TRACES_FILE, METRICS_FILE):
            if (out_dir / name).exists():
                files[name] = out_dir / name
    if target.startswith("file:") and Path(target[len("file:"):]).exists():
        files[RRD_FILE] = Path(target[len("file:"):])
    return DemoResult(options, network, result, time.perf_counter() - start,
                      rerun_target=target, rerun_note=note, files=files,
                      telemetry_lines=report.lines(), spans_exported=report.spans_exported,
                      events_exported=report.events_exported, dropped=report.dropped,
                      hw_id=hw_id, all_verified=outcomes)


def _hold(options: DemoOptions) -> None:
    """Keep the process (and its Prometheus endpoint) up so a scraper can collect."""
    if options.hold_s > 0:
        if options.progress is not None:
            options.progress(options.layers, options.layers,
                             f"holding {options.hold_s:g} s for scrapers")
        time.sleep(options.hold_s)
