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

from otel_proofscope.demo.circuit import HASH_QUERIES_LOG2, Network, build_network
from otel_proofscope.demo.field import MatmulFn, m31_matmul
from otel_proofscope.demo.prover import Progress, ProveResult, prove
from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.ledger import DROPS
from otel_proofscope.semconv import SINK_RERUN

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
    #: Items the Rerun sink of this run counted as lost (any reason).
    rerun_lost: int = 0
    #: The shutdown hit its bound: what was still in flight is unconfirmed.
    timed_out: bool = False
    hw_id: str | None = None
    #: Verification outcome of every proof when ``repeat`` > 1 (``prove`` is the last).
    all_verified: list[bool] = field(default_factory=list)
    #: Where the wall time went (seconds): building the network and starting telemetry,
    #: proving and verifying every proof (with its telemetry), holding, and the
    #: telemetry shutdown (flushing every exporter: files, OTLP, the Rerun recording).
    setup_s: float = 0.0
    #: Of ``setup_s``: building the network (the rest is starting the telemetry
    #: pipeline: importing the SDK, exporters and Rerun, opening the sinks).
    network_s: float = 0.0
    proving_s: float = 0.0
    hold_s: float = 0.0
    shutdown_s: float = 0.0
    #: Points of metrics each sink exported, and witness events each sink withheld.
    metric_points_exported: dict[str, int] = field(default_factory=dict)
    witness_by_sink: dict[str, int] = field(default_factory=dict)

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
            f"{p.proof.weight_openings} weight openings, {p.rounds} sumcheck rounds",
            f"soundness: {p.soundness_bits:.1f} bits interactive, "
            f"{net.fiat_shamir_bits():.1f} bits non-interactive (Fiat–Shamir, against "
            f"2^{HASH_QUERIES_LOG2} hash queries)",
            f"time: prove {p.prove_s * 1e3:.1f} ms, verify {p.verify_s * 1e3:.1f} ms"
            + ("" if len(self.all_verified) <= 1 else " (the last proof)"),
            self.wall_line(),
            "time per layer kind: " + ", ".join(
                f"{kind} {secs * 1e3:.1f} ms ({self._count(kind)}×)"
                for kind, secs in sorted(p.layer_seconds.items(), key=lambda kv: -kv[1])),
        ]
        if o.telemetry:
            lines.append(self.gpu_line())
        if not o.telemetry:
            lines.append("telemetry: off")
            return lines
        lines += [f"telemetry: {line}" for line in self.export_lines()]
        for name, path in self.files.items():
            lines.append(f"wrote {name}: {path}")
        if self.rerun_note:
            lines.append(f"rerun: {self.rerun_note}")
        target = self.rerun_target
        if target.startswith("file:"):
            lines.append(f"open the recording: rerun {target[len('file:'):]}")
        elif target not in ("off", "") and (self.rerun_lost or self.timed_out):
            # Never claim a delivery the sink counted as lost or could not confirm in
            # time; say what works instead.
            rrd = self.options.out_dir / RRD_FILE
            what = (f"did not get the recording ({self.rerun_lost} item(s) lost, counted "
                    "above)" if self.rerun_lost else
                    "may not have the recording (shutdown hit its bound before delivery "
                    "was confirmed)")
            lines.append(f"the Rerun viewer at {target} {what}; record to a file instead: "
                         f"--rerun file:{rrd}, then open it with: rerun {rrd}")
        elif target == "spawn":
            lines.append("sent to the spawned Rerun viewer (it still accepted connections "
                         "at shutdown)")
        elif target not in ("off", ""):
            lines.append(f"streamed to the Rerun viewer at {target}")
        return lines

    def wall_line(self) -> str:
        """The wall time and what it consists of, measured (a bare "wall 3.9 s" beside
        a 0.8 s proof left the rest unexplained)."""
        parts = [f"set-up {self.setup_s:.2f} s" + (
                     f" (network {self.network_s:.2f} s, telemetry pipeline "
                     f"{self.setup_s - self.network_s:.2f} s)" if self.options.telemetry
                     else " (network)"),
                 f"proving {self.proving_s:.2f} s"
                 + (f" ({len(self.all_verified)} proofs)" if len(self.all_verified) > 1
                    else "")]
        if self.options.hold_s > 0:
            parts.append(f"hold {self.hold_s:.2f} s")
        if self.options.telemetry:
            parts.append(f"shutdown {self.shutdown_s:.2f} s (draining the exporters)")
        return f"wall {self.wall_s:.2f} s = " + " + ".join(parts)

    def export_lines(self) -> list[str]:
        """The pipeline's report, each sink's span events explained where witness events
        (activation statistics, attention scores) make them differ: those reach the
        local Rerun view only, never OTLP or the files (unless exported on purpose)."""
        withheld = {k: n for k, n in self.witness_by_sink.items() if n}
        out = []
        for line in self.telemetry_lines:
            if line.startswith("witness events kept out of OTLP") and withheld:
                continue  # said on each sink's own line below
            for sink, n in withheld.items():
                if line.startswith(f"exported to {sink}: "):
                    line += f" (+{n} witness events kept out of OTLP and files: local view only)"
            if withheld and line.startswith(f"exported to {SINK_RERUN}: "):
                line += f" (incl. {max(withheld.values())} witness events, local view only)"
            out.append(line)
        return out

    def gpu_line(self) -> str:
        """GPU kernel time, bytes moved and energy of the (last) proof, or why not."""
        cost = self.prove.gpu_cost
        if self.options.backend == "cpu":
            return "GPU: not used (backend cpu)"
        if cost is None:
            return "GPU: not measured (the proof span was not recorded)"
        if not cost.dispatches:
            return "GPU: no dispatch reached the device"
        kernel = (f"kernel {cost.kernel_s * 1e3:.2f} ms "
                  f"({cost.timed_dispatches}/{cost.dispatches} dispatches timed)"
                  if cost.timed_dispatches else
                  f"kernel time not measured ({cost.dispatches} dispatches, no timestamps)")
        moved = (f"{_bytes(cost.upload_bytes)} up, {_bytes(cost.readback_bytes)} down")
        if cost.energy is not None:
            energy = (f"energy {cost.energy.joules:.3f} J ({cost.energy.source}, device-wide "
                      f"on {', '.join(cost.energy.hw_ids)})")
        elif cost.energy_gap is not None:
            energy = (f"energy unavailable: {cost.energy_gap.reason.value} — "
                      f"{cost.energy_gap.detail}")
        else:
            energy = "energy unavailable"
        return f"GPU: {kernel}, {moved}, {energy}"

    def _count(self, kind: str) -> int:
        return sum(1 for layer in self.network.layers if layer.kind.value == kind)


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


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
    network_s = time.perf_counter() - start
    if not options.telemetry:
        matmul, hw_id = load_matmul(options.backend, metrics.NoOpMeterProvider())
        off = ProofTracer(trace.NoOpTracerProvider(), metrics.NoOpMeterProvider())
        proving = time.perf_counter()
        result = prove(network, tracer=off, backend=options.backend, matmul=matmul,
                       hw_id=hw_id, progress=options.progress)
        holding = time.perf_counter()
        _hold(options)
        end = time.perf_counter()
        return DemoResult(options, network, result, end - start, hw_id=hw_id,
                          setup_s=proving - start, proving_s=holding - proving,
                          hold_s=end - holding)

    from otel_proofscope.setup import configure

    target = options.rerun_target()
    # Witness data shows in the local Rerun view, or in the files when the user asked
    # for it there (PROOFSCOPE_EXPORT_WITNESS=1): with neither, capturing it would cost
    # the prover and show nothing.
    from otel_proofscope.setup.options import env_bool

    witness = options.witness and (target.lower() not in ("off", "none", "")
                                   or bool(env_bool("PROOFSCOPE_EXPORT_WITNESS")))
    note = ""
    if target.lower() not in ("off", "none", ""):
        problem = rerun_available()
        if problem is not None:
            # Said once, in the summary ("rerun: disabled: …"), not also as a warning.
            _log.debug("Rerun output disabled: %s", problem)
            note, target = f"disabled: {problem}", "off"
        elif target.startswith("file:"):
            Path(target[len("file:"):]).parent.mkdir(parents=True, exist_ok=True)
    rerun_lost_before = DROPS.total(sink=SINK_RERUN)
    telemetry = configure(service_name="proofscope-demo", out_dir=options.out_dir,
                          rerun=target, prometheus_port=options.prometheus_port,
                          capture_witness=witness, set_global=options.set_global,
                          span_exporters=options.span_exporters,
                          metric_readers=options.metric_readers)
    try:
        # After configure(), so GPU dispatch metrics reach the same pipeline.
        matmul, hw_id = load_matmul(options.backend, telemetry.meter_provider)
        if options.backend != "cpu":
            telemetry.start_gpu_sampler()  # NVML devices, if any; silent otherwise
        outcomes: list[bool] = []
        repeat = max(1, options.repeat)
        proving = time.perf_counter()
        setup_s = proving - start
        for k in range(repeat):
            result = prove(network, tracer=telemetry.tracer, backend=options.backend,
                           matmul=matmul, hw_id=hw_id,
                           progress=_of_many(options.progress, k, repeat))
            outcomes.append(result.verified)
        holding = time.perf_counter()
        proving_s = holding - proving
        if options.hold_s > 0:
            telemetry.force_flush()  # so files and scrapers see the proof while we hold
            _hold(options)
    finally:
        stopping = time.perf_counter()
        report = telemetry.shutdown(log_drops=False)  # printed in the summary
        shutdown_s = time.perf_counter() - stopping
    files: dict[str, Path] = {}
    out_dir = telemetry.out_dir
    if out_dir is not None:
        for name in (TRACES_FILE, METRICS_FILE):
            if (out_dir / name).exists():
                files[name] = out_dir / name
    if target.startswith("file:") and Path(target[len("file:"):]).exists():
        files[RRD_FILE] = Path(target[len("file:"):])
    return DemoResult(options, network, result, time.perf_counter() - start,
                      setup_s=setup_s, proving_s=proving_s, hold_s=stopping - holding,
                      network_s=network_s,
                      shutdown_s=shutdown_s,
                      metric_points_exported=dict(report.metric_points_exported),
                      witness_by_sink=dict(report.witness_by_sink),
                      rerun_target=target, rerun_note=note, files=files,
                      telemetry_lines=report.lines(), spans_exported=report.spans_exported,
                      events_exported=report.events_exported, dropped=report.dropped,
                      rerun_lost=DROPS.total(sink=SINK_RERUN) - rerun_lost_before,
                      timed_out=report.timed_out,
                      hw_id=hw_id, all_verified=outcomes)


def _of_many(progress: Progress | None, k: int, repeat: int) -> Progress | None:
    """Progress of proof ``k`` of ``repeat`` as one count over all of them (one bar for
    ``--repeat 20``, not twenty)."""
    if progress is None or repeat == 1:
        return progress

    def report(done: int, total: int, what: str) -> None:
        progress(k * total + done, repeat * total, f"proof {k + 1}/{repeat}: {what}")

    return report


def _hold(options: DemoOptions) -> None:
    """Keep the process (and its Prometheus endpoint) up so a scraper can collect."""
    if options.hold_s > 0:
        if options.progress is not None:
            options.progress(options.layers, options.layers,
                             f"holding {options.hold_s:g} s for scrapers")
        time.sleep(options.hold_s)
