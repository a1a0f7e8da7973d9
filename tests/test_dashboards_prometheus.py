"""The Grafana dashboards against a real Prometheus that scraped the real Collector.

Fast checks (no server): the dashboard JSON is well formed, every metric a panel
queries is a name the real OpenTelemetry Prometheus exporter renders for a metric of
``otel_proofscope.semconv`` (or a collector spanmetrics name), label matchers only use
that metric's attributes, and the layer-kind colours are the contract's.

End to end (~40 s): three processes run the demo's reference prover repeatedly — on the
CPU, on wgpu (Mesa lavapipe), and on the CPU of an "NVML machine" whose two NVIDIA GPUs
the real NVML sampler watches through the pynvml stand-in of ``tests/nvml_machine.py``
(no NVIDIA driver exists here; readings move with a workload, NVML's counters stay
monotone). They export OTLP/gRPC (traces, and metrics every second) to the real
OpenTelemetry Collector of ``scripts/peers`` running ``collector-config/otel-collector.yaml``,
which sends traces to a real Jaeger and through its spanmetrics connector, and serves
all metrics on its prometheus exporter. The CPU prover's traces go to a port where
nothing listens (its metrics still reach the Collector), so the drop panels show real,
counted losses. Two Debian ``prometheus`` binaries scrape every second on 127.0.0.1:

* route "collector": the Collector's exporter, with the ``otel-collector`` job of the
  shipped ``deploy/prometheus.yml`` (targets replaced, its relabelling as shipped);
* route "direct": the provers' own ``configure(prometheus_port=…)`` endpoints, with the
  shipped ``deploy/prometheus-direct.yml``. The same processes feed both routes.

Every PromQL expression of every panel and every template variable is executed over
each route's HTTP API and must return finite data; on the collector route that includes
the spanmetrics panels (``traces_span_metrics_*``), which the direct route cannot feed and
does not run. A GPU panel may be empty only if NO scraped process measures its metric
and a backend reported the capability gap (``gpu.capability.unsupported``), or wgpu found
no adapter at all; lavapipe's gaps excuse nothing the NVML machine measures.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from nvml_machine import MACHINE as NVML_MACHINE
from peers import (
    Collector,
    Jaeger,
    Prometheus,
    collector_config,
    free_port,
    http_text,
    scrape_config,
    wait_for,
)

from otel_proofscope.semconv import LAYER_KIND_COLOURS, GpuCapability, Metric

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD_DIR = ROOT / "deploy" / "grafana" / "dashboards"
DASHBOARD_FILES = sorted(DASHBOARD_DIR.glob("*.json"))
PROMTOOL = shutil.which("promtool")

#: Scrape interval of the test's Prometheus; Grafana's $__rate_interval is at least 4×.
SCRAPE_S = 1
RATE_INTERVAL = f"{4 * SCRAPE_S}s"
#: The provers' OTLP metric export period (OTEL_METRIC_EXPORT_INTERVAL, ms).
METRIC_EXPORT_MS = 1000
#: Proofs each prover runs; spread over several scrapes so rates see increases.
PROOFS = 5
#: Hard bound on the whole end-to-end setup (start, prove, two spanmetrics flushes, scrape).
SETUP_DEADLINE_S = 90.0

SPANMETRICS_PREFIX = "traces_span_metrics_"

#: Device / kernel metrics a backend may be unable to give → the capability it reports.
GAP_OF_METRIC: dict[str, GpuCapability] = {
    "hw_gpu_utilization": GpuCapability.UTILIZATION,
    "hw_gpu_memory_usage_bytes": GpuCapability.MEMORY_USAGE,
    "hw_gpu_memory_limit_bytes": GpuCapability.MEMORY_LIMIT,
    "hw_gpu_io_bytes_total": GpuCapability.PCIE_IO,
    "hw_errors_total": GpuCapability.ERRORS,
    "hw_power_watts": GpuCapability.POWER,
    "hw_energy_joules_total": GpuCapability.ENERGY,
    "hw_gpu_temperature_celsius": GpuCapability.TEMPERATURE,
    "gpu_kernel_duration_seconds": GpuCapability.KERNEL_TIMESTAMPS,
    "gpu_queue_wait_duration_seconds": GpuCapability.KERNEL_TIMESTAMPS,
}

#: Labels every series may carry besides the metric's own attributes.
COMMON_LABELS = frozenset({"job", "instance", "otel_scope_name", "otel_scope_version",
                           "otel_scope_schema_url", "exported_job", "exported_instance",
                           "__name__"})
SPANMETRICS_LABELS = frozenset({"service_name", "span_name", "span_kind", "status_code",
                                "proof_system", "proof_backend", "proof_layer_kind",
                                "proof_layer_proof_kind", "le"})




# ── dashboards as data ───────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref: str
    expr: str
    instant: bool
    legend: str = ""
    exemplar: bool = False

    @property
    def id(self) -> str:
        return f"{self.dashboard}/{self.panel}/{self.ref}"

    @property
    def spanmetrics(self) -> bool:
        """Fed by the Collector's spanmetrics connector: only the collector route has it."""
        return SPANMETRICS_PREFIX in self.expr


@dataclass(frozen=True)
class VariableQuery:
    dashboard: str
    name: str
    query: str


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])


def _is_prometheus(ds: dict[str, Any] | None) -> bool:
    return bool(ds) and ds is not None and ds.get("type") == "prometheus"


def panel_queries() -> list[PanelQuery]:
    out = []
    for path in DASHBOARD_FILES:
        d = _load(path)
        for p in _panels(d):
            for t in p.get("targets", []):
                if _is_prometheus(t.get("datasource") or p.get("datasource")):
                    out.append(PanelQuery(d["title"], p["title"], t["refId"], t["expr"],
                                          bool(t.get("instant")), t.get("legendFormat", ""),
                                          bool(t.get("exemplar"))))
    return out


def variable_queries() -> list[VariableQuery]:
    out = []
    for path in DASHBOARD_FILES:
        d = _load(path)
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
                out.append(VariableQuery(d["title"], v["name"], q))
    return out


def non_prometheus_panels() -> list[tuple[str, str, str]]:
    out = []
    for path in DASHBOARD_FILES:
        d = _load(path)
        for p in _panels(d):
            if p["type"] == "row":
                continue
            for t in p.get("targets", []):
                ds = t.get("datasource") or p.get("datasource") or {}
                if not _is_prometheus(ds):
                    out.append((d["title"], p["title"], str(ds.get("type"))))
    return out


_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\}|\[)")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)")
_LABEL_VALUES = re.compile(r"^label_values\((?:(.+),\s*)?([a-zA-Z_][a-zA-Z0-9_]*)\)$")


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names matched) of every vector selector in ``expr``."""
    out = []
    for name, rest in _SELECTOR.findall(expr):
        labels = set(_MATCHER.findall(rest)) if rest.startswith("{") else set()
        out.append((name, {label for label, _ in labels}))
    return out


def substitute(expr: str, range_s: int) -> str:
    """Grafana's variables as Grafana would expand them for 'All' over the test window."""
    values = {"__rate_interval": RATE_INTERVAL, "__interval": f"{SCRAPE_S}s",
              "__range": f"{range_s}s", "system": ".*", "backend": ".*", "service": ".*",
              "gpu_backend": ".*", "hw_id": ".*"}

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise AssertionError(f"the test does not know dashboard variable ${name}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


# ── fast checks ──────────────────────────────────────────────────────────────────────


def _exporter_names() -> dict[str, set[str]]:
    """Prometheus names → label names, as the real OTel Prometheus exporter renders every
    semconv metric. In a subprocess: the exporter registers with prometheus_client's
    process-wide registry."""
    script = textwrap.dedent("""
        import json
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.metrics import Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from prometheus_client import REGISTRY
        from otel_proofscope.semconv import InstrumentKind as K, Metric

        mp = MeterProvider(metric_readers=[PrometheusMetricReader()])
        m = mp.get_meter("otel_proofscope")
        for d in Metric.all():
            a = {k: "x" for k in d.attributes}
            cb = [lambda o, a=a: [Observation(1, a)]]
            if d.kind is K.COUNTER:
                m.create_counter(d.name, d.unit).add(1, a)
            elif d.kind is K.UP_DOWN_COUNTER:
                m.create_up_down_counter(d.name, d.unit).add(1, a)
            elif d.kind is K.HISTOGRAM:
                m.create_histogram(d.name, d.unit).record(1.0, a)
            elif d.kind is K.OBSERVABLE_GAUGE:
                m.create_observable_gauge(d.name, cb, d.unit)
            elif d.kind is K.OBSERVABLE_COUNTER:
                m.create_observable_counter(d.name, cb, d.unit)
            else:
                m.create_observable_up_down_counter(d.name, cb, d.unit)
        out = {}
        for fam in REGISTRY.collect():
            for s in fam.samples:
                out.setdefault(s.name, set()).update(s.labels)
        print(json.dumps({k: sorted(v) for k, v in out.items()}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    return {k: set(v) for k, v in json.loads(done.stdout).items()}


@pytest.fixture(scope="module")
def exporter_names() -> dict[str, set[str]]:
    return _exporter_names()


def test_dashboards_are_well_formed() -> None:
    assert {p.name for p in DASHBOARD_FILES} >= {"proof-overview.json", "gpu.json"}
    uids = set()
    for path in DASHBOARD_FILES:
        d = _load(path)
        assert d["uid"] not in uids, f"{path.name}: duplicate uid"
        uids.add(d["uid"])
        ids = [p["id"] for p in _panels(d)]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
        titles = [p["title"] for p in _panels(d)]
        assert len(titles) == len(set(titles)), f"{path.name}: duplicate panel titles"
        for p in _panels(d):
            gp = p["gridPos"]
            assert gp["x"] + gp["w"] <= 24, f"{path.name}: {p['title']} is wider than the grid"
            if p["type"] == "row":
                continue
            assert p.get("description"), f"{path.name}: {p['title']} has no description"
            refs = [t["refId"] for t in p["targets"]]
            assert refs and len(refs) == len(set(refs)), f"{path.name}: {p['title']} refIds"


def test_dashboards_cover_the_issue() -> None:
    titles = {(q.dashboard, q.panel) for q in panel_queries()}
    exprs = " ".join(q.expr for q in panel_queries())
    for name in ("proof_duration_seconds_bucket", "proof_layer_duration_seconds_sum",
                 "proof_sumcheck_round_count_total", "proof_verify_count_total",
                 "proofscope_dropped_total", "hw_gpu_utilization", "hw_gpu_memory_usage_bytes",
                 "hw_gpu_memory_limit_bytes", "gpu_kernel_duration_seconds_sum",
                 "gpu_queue_wait_duration_seconds_sum", "gpu_upload_size_bytes_total",
                 "gpu_readback_size_bytes_total", "gpu_fault_count_total",
                 "gpu_retry_count_total", "gpu_recovery_count_total",
                 "gpu_capability_unsupported_total", "gpu_phase_kernel_time_seconds_total",
                 "gpu_phase_energy_joules_total"):
        assert name in exprs, f"no panel queries {name}"
    assert ("GPU", "Capability gaps") in titles
    assert ("GPU", "GPU time / energy per phase") in titles
    assert ("Proof overview", "Recent proofs (Jaeger)") in {
        (d, p) for d, p, _ in non_prometheus_panels()}


def test_proofs_link_to_their_traces() -> None:
    d = _load(DASHBOARD_DIR / "proof-overview.json")
    p95 = next(p for p in _panels(d) if p["title"].startswith("Proof duration p50"))
    assert all(t.get("exemplar") for t in p95["targets"]), "exemplars carry trace_id"
    links = p95["fieldConfig"]["defaults"]["links"]
    assert any("/search?service=${service}&operation=proof" in link["url"] for link in links)
    ds = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/datasources.yaml")
                        .read_text())["datasources"]
    uids = {x["uid"]: x for x in ds}
    dest = uids["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert [(x["name"], x["datasourceUid"]) for x in dest] == [("trace_id", "jaeger")]
    assert uids["jaeger"]["type"] == "jaeger"


def test_metric_names_are_what_the_exporter_renders(
        exporter_names: dict[str, set[str]]) -> None:
    # Proof the fixture is the real exporter, with the names DESIGN.md §4 lists.
    assert {"hw_gpu_utilization", "gpu_kernel_duration_seconds_bucket",
            "proof_sumcheck_round_count_total"} <= set(exporter_names)
    queries = [q.expr for q in panel_queries()] + [v.query for v in variable_queries()]
    for expr in queries:
        for name, labels in selectors(expr):
            if name.startswith(SPANMETRICS_PREFIX):
                unknown = labels - SPANMETRICS_LABELS - COMMON_LABELS
            elif name == "target_info":
                continue
            else:
                assert name in exporter_names, f"{name} (in {expr!r}) is not an exporter name"
                unknown = labels - exporter_names[name] - COMMON_LABELS
            assert not unknown, f"{name} has no label(s) {sorted(unknown)} (in {expr!r})"


def test_every_semconv_metric_name_renders(exporter_names: dict[str, set[str]]) -> None:
    # The gap map above must name real series, or an empty panel could hide behind it.
    rendered = {n.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
                for n in exporter_names}
    assert set(GAP_OF_METRIC) <= rendered
    assert len(Metric.all()) >= 30


def test_layer_kind_colours_are_the_contract() -> None:
    d = _load(DASHBOARD_DIR / "proof-overview.json")
    by_kind = {k.value: f"#{c:06x}" for k, c in LAYER_KIND_COLOURS.items()}
    seen = 0
    for p in _panels(d):
        for o in p.get("fieldConfig", {}).get("overrides", []):
            kind = o["matcher"]["options"]
            if kind in by_kind:
                (prop,) = o["properties"]
                assert prop["value"]["fixedColor"] == by_kind[kind]
                seen += 1
    assert seen >= len(by_kind)


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) missing")
@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus-gateway.yml",
                                  "prometheus-direct.yml"])
def test_prometheus_configs_are_valid(name: str) -> None:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "check", "config", str(ROOT / "deploy" / name)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr


# ── a real Prometheus ────────────────────────────────────────────────────────────────


def values(result: list[dict[str, Any]]) -> list[float]:
    out = []
    for series in result:
        points = series.get("values") or [series["value"]]
        out += [float(v) for _, v in points]
    return out


#: The scrape job of each route, as shipped, and the Prometheus flags docker-compose.yml
#: gives the collector route (exemplars carry trace_id from the Collector to Grafana).
ROUTES = ("collector", "direct")
ROUTE_JOB = {"collector": ("prometheus.yml", "otel-collector"),
             "direct": ("prometheus-direct.yml", "proofscope")}
ROUTE_FLAGS = {"collector": ("--enable-feature=exemplar-storage",), "direct": ()}


# ── provers ──────────────────────────────────────────────────────────────────────────

# The reference prover of `proofscope demo` (its network, prover and GPU kernels, and
# configure() as run_demo uses it: OTLP from the OTEL_* environment, plus
# prometheus_port), proving several times in one process: `proofscope demo` proves
# once, and a counter's first sample is never an increase, so one proof per process
# leaves every rate() panel at zero.
#
# With machine "nvml" the process is an NVIDIA machine: the real NVML sampler
# (otel_proofscope.gpu.start_sampler, evidence as `proofscope run` reports it) samples
# two GPUs through the pynvml stand-in of tests/nvml_machine.py while it proves. No
# NVIDIA driver exists here; that boundary is the only thing replaced.
_DEMO_PROVER = textwrap.dedent("""
    import sys, time
    from otel_proofscope.demo.circuit import build_network
    from otel_proofscope.demo.prover import prove
    from otel_proofscope.demo_runner import BackendUnavailableError, load_matmul
    from otel_proofscope.setup import configure

    port, backend, proofs = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    pause, hold, out = float(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
    service, machine, sample_s = sys.argv[7], sys.argv[8], float(sys.argv[9])
    tel = configure(service_name=service, out_dir=out, rerun="off", prometheus_port=port)
    sampler = None
    if machine == "nvml":
        from nvml_machine import MovingNvml
        from otel_proofscope.gpu import start_sampler
        sampler = start_sampler(meter_provider=tel.meter_provider, interval_s=sample_s,
                                nvml=MovingNvml(), evidence="immediately")
        assert sampler is not None, "the NVML sampler found no device"
        print("sampling", sorted(sampler.latest()), flush=True)
    try:
        try:
            matmul, hw_id = load_matmul(backend, tel.meter_provider)
        except BackendUnavailableError as exc:
            print("BACKEND-UNAVAILABLE", exc, flush=True)
            time.sleep(hold)
            sys.exit(0)
        network = build_network(8, 32, None, 0)
        for i in range(proofs):
            result = prove(network, tracer=tel.tracer, backend=backend, matmul=matmul,
                           hw_id=hw_id)
            assert result.verified, result.verify.reason
            print("proof", i, flush=True)
            time.sleep(pause)
        print("holding", flush=True)
        time.sleep(hold)
    finally:  # SIGTERM unwinds here (configure's handler): sampler first, then telemetry
        if sampler is not None:
            print("sampler stopped:", sampler.stop(), flush=True)
        tel.shutdown()
""")


@dataclass(frozen=True)
class ProverSpec:
    backend: str
    #: pause between proofs, so the proofs spread over several scrapes
    pause_s: float
    service: str = "proofscope-demo"
    #: "nvml": the process also samples the two-GPU machine of tests/nvml_machine.py
    machine: str = "none"
    #: its traces go to a port where nothing listens (a collector that is down) while
    #: its metrics reach the Collector: the drop panels' real, counted losses
    traces_lost: bool = False


#: The processes. All export OTLP to the Collector and serve /metrics for the direct
#: route; the NVML machine proves on its CPU while its GPUs are sampled.
PROVERS = {
    "cpu": ProverSpec("cpu", 0.5, traces_lost=True),
    "wgpu": ProverSpec("wgpu", 0.2),
    "nvml": ProverSpec("cpu", 0.3, service="proofscope-nvml-machine", machine="nvml"),
}
#: The NVML machine's sampling period (a real deployment samples every 1 s).
NVML_SAMPLE_S = 0.5


@dataclass
class Prover:
    name: str
    spec: ProverSpec
    port: int
    proc: subprocess.Popen[str]
    log: Path

    @property
    def backend(self) -> str:
        return self.spec.backend

    def unavailable(self) -> str | None:
        for line in self.log.read_text().splitlines():
            if line.startswith("BACKEND-UNAVAILABLE"):
                return line.split(" ", 1)[1]
        return None

    @property
    def traced(self) -> bool:
        """Whether its proofs reach the Collector as traces (and so its spanmetrics)."""
        return not self.spec.traces_lost and self.unavailable() is None


@dataclass
class Stack:
    """One route's view of the shared processes: what its Prometheus scraped."""

    route: str
    prometheus: Prometheus
    provers: list[Prover]
    start: float = 0.0
    end: float = 0.0
    backends: set[str] = field(default_factory=set)

    @property
    def range_s(self) -> int:
        return math.ceil(self.end - self.start) + 1

    def measures(self, series_name: str) -> bool:
        """Whether any scraped process exported a series of this name in the window."""
        params: dict[str, str | float] = {"match[]": f'{{__name__="{series_name}"}}',
                                          "start": self.start, "end": self.end}
        found = self.prometheus.api("series", **params)
        return bool(found)

    def gpu_unavailable(self) -> str | None:
        reasons = [f"{p.name}: {r}" for p in self.provers
                   if p.backend != "cpu" and (r := p.unavailable())]
        return "; ".join(reasons) or None


@dataclass
class World:
    """Everything the module started: the Collector, Jaeger, provers and both routes."""

    collector: Collector
    jaeger: Jaeger
    provers: list[Prover]
    routes: dict[str, Stack]


def _start_prover(name: str, port: int, workdir: Path, collector: Collector) -> Prover:
    spec = PROVERS[name]
    log = workdir / f"prover-{name}.log"
    hold = str(int(SETUP_DEADLINE_S + 60))  # killed at teardown long before
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env["OTEL_METRIC_EXPORT_INTERVAL"] = str(METRIC_EXPORT_MS)
    if spec.traces_lost:  # per-signal endpoints, which configure() reads one by one
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"
        env["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"] = collector.grpc_endpoint
    else:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.grpc_endpoint
    if spec.machine == "nvml":  # tests/nvml_machine.py and the fake_pynvml it builds on
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "tests"), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-c", _DEMO_PROVER, str(port), spec.backend, str(PROOFS),
           str(spec.pause_s), hold, str(workdir / f"out-{name}"), spec.service,
           spec.machine, str(NVML_SAMPLE_S)]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=workdir, start_new_session=True)
    return Prover(name, spec, port, proc, log)


def _stop_provers(provers: list[Prover]) -> None:
    # All at once: each may spend its flush bound on the dead trace endpoint.
    for p in provers:
        if p.proc.poll() is None:
            p.proc.terminate()
    for p in provers:
        try:
            p.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.proc.wait(timeout=5)


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    workdir = tmp_path_factory.mktemp("dashboards")
    deadline = time.monotonic() + SETUP_DEADLINE_S
    ports = {name: free_port() for name in PROVERS}
    with contextlib.ExitStack() as started:  # stops exactly what was started, in reverse
        jaeger = Jaeger(workdir)
        started.callback(jaeger.stop)
        collector = Collector(["otel-collector.yaml"], workdir,
                              env={"JAEGER_OTLP_ENDPOINT": jaeger.otlp_endpoint})
        started.callback(collector.stop)
        targets = {"collector": [f"127.0.0.1:{collector.prometheus}"],
                   "direct": [f"127.0.0.1:{p}" for p in ports.values()]}
        proms = {}
        for route in ROUTES:
            file, job = ROUTE_JOB[route]
            proms[route] = Prometheus(scrape_config(file, job, targets[route], SCRAPE_S),
                                      workdir, f"prometheus-{route}", ROUTE_FLAGS[route])
            started.callback(proms[route].stop)
        # Provers start once both scrape (the scrape manager applies targets on a 5 s
        # tick): proofs finished before a route's first scrape would be invisible to rate().
        for route in ROUTES:
            want = len(targets[route])
            wait_for(f"the {route} route's first scrapes",
                     lambda p=proms[route], n=want: sum(values(p.query("count(up)"))) >= n,
                     _left(deadline), proms[route].proc, proms[route].log)
        provers: list[Prover] = []
        started.callback(_stop_provers, provers)
        start = time.time()
        provers += [_start_prover(name, port, workdir, collector)
                    for name, port in ports.items()]
        w = World(collector, jaeger, provers,
                  {r: Stack(r, proms[r], provers, start) for r in ROUTES})
        _wait_for_proofs(w, deadline)
        yield w


@pytest.fixture
def stack(request: pytest.FixtureRequest, world: World) -> Stack:
    """The route a test is parametrized with (indirectly), else the collector's."""
    route: str = getattr(request, "param", "collector")
    return world.routes[route]


#: Runs a test once per route.
on_both_routes = pytest.mark.parametrize("stack", ROUTES, indirect=True)

#: Every NVML device counter series of the machine (2 GPUs × transmit/receive) rising.
_NVML_RISING = f"count(rate(hw_gpu_io_bytes_total[{RATE_INTERVAL}]) > 0)"
NVML_IO_SERIES = 2 * len(NVML_MACHINE)
_PROOF_SPANS = f'sum({SPANMETRICS_PREFIX}calls_total{{span_name="proof"}})'
#: The connector publishes every metrics_flush_interval, a new series first at 0: two
#: flushes after the last span, twice over for a loaded machine.
_FLUSH_S = float(collector_config("otel-collector.yaml")["connectors"]["span_metrics"]
                 ["metrics_flush_interval"].removesuffix("s"))
SPANMETRICS_WAIT_S = 4 * _FLUSH_S


def _missing(st: Stack) -> list[str]:
    """What a route does not show yet: every prover's proofs, the CPU prover's losses and
    the NVML machine's counters rising."""
    running = [p for p in st.provers if p.unavailable() is None]
    prom = st.prometheus
    checks = [("proofs", sum(values(prom.query("sum(proof_duration_seconds_count)"))),
               PROOFS * len(running)),
              ("drops", len(prom.query("sum(proofscope_dropped_total) > 0")), 1),
              ("NVML io series rising", sum(values(prom.query(_NVML_RISING))),
               NVML_IO_SERIES)]
    return [f"{st.route}: {what} {got:g}/{want:g}" for what, got, want in checks
            if got < want]


def _spans_missing(st: Stack) -> bool:
    """Whether the Collector's spanmetrics lack a `proof` call of a traced proof."""
    running = [p for p in st.provers if p.unavailable() is None]
    got = sum(values(st.prometheus.query(_PROOF_SPANS)))
    return got < PROOFS * sum(p.traced for p in running)


def _wait_for_proofs(w: World, deadline: float) -> None:
    """Until both routes show everything :func:`_missing` names (bounded by ``deadline``)
    and the spanmetrics count every traced proof (bounded by SPANMETRICS_WAIT_S more),
    then two more scrapes so the last increase is inside every rate window."""
    spans_until: float | None = None
    while True:
        for p in w.provers:
            if p.proc.poll() is not None:
                raise AssertionError(f"prover {p.name} exited {p.proc.returncode}: "
                                     f"{p.log.read_text()[-3000:]}")
        missing = [m for st in w.routes.values() for m in _missing(st)]
        if not missing:
            if not _spans_missing(w.routes["collector"]):
                break
            spans_until = spans_until or time.monotonic() + SPANMETRICS_WAIT_S
            # Not a setup error: the spanmetrics tests and panels then fail, by name.
            if time.monotonic() > min(spans_until, deadline):
                break
        elif time.monotonic() > deadline:
            logs = "\n".join(p.log.read_text()[-1500:] for p in w.provers)
            raise AssertionError(f"not within {SETUP_DEADLINE_S} s: {'; '.join(missing)}\n"
                                 f"{logs}\n{w.collector.output()[-1500:]}")
        time.sleep(0.5)
    time.sleep(2.5 * SCRAPE_S)
    end = time.time()
    for st in w.routes.values():
        st.end = end
        st.backends = {s["metric"]["proof_backend"] for s in st.prometheus.query(
            "group by (proof_backend) (proof_duration_seconds_count)", at=end)}


def _family(name: str) -> str:
    return name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")


def _gap_reason(st: Stack, expr: str, routes: Iterable[Stack]) -> str | None:
    """Why an empty GPU query is legitimately empty, or None when nothing excuses it.

    Only a metric that NO scraped process measures may be excused (by the capability
    gap a backend reported for it, or by wgpu finding no adapter here): once any process
    has a series of it, on either route (the same processes feed both, so a name one
    route lacks is a renaming fault, not a gap), an empty panel is the dashboard's fault.
    """
    names = {n for n, _ in selectors(expr)}
    measured = sorted(n for n in names if any(r.measures(n) for r in routes))
    if measured:
        return None
    if st.gpu_unavailable():
        return f"no GPU here ({st.gpu_unavailable()}) and no process measures {sorted(names)}"
    caps = {GAP_OF_METRIC[_family(n)] for n in names if _family(n) in GAP_OF_METRIC}
    if not caps:
        return None
    reasons = []
    for cap in sorted(caps):
        gaps = st.prometheus.query(
            f'group by (gpu_backend, gpu_capability_reason) '
            f'(gpu_capability_unsupported_total{{gpu_capability="{cap.value}"}})')
        if not gaps:
            return None
        reasons += [f"{g['metric']['gpu_backend']} reports {cap.value} unsupported "
                    f"({g['metric'].get('gpu_capability_reason', '?')})" for g in gaps]
    return ("capability gap, no scraped process measures it: " + "; ".join(reasons))


# ── end to end ───────────────────────────────────────────────────────────────────────

QUERIES = panel_queries()
#: Every panel on the collector route; the direct route has no spanmetrics to feed them.
ROUTE_QUERIES = [pytest.param(route, q, id=f"{route}:{q.id}") for route in ROUTES
                 for q in QUERIES if route == "collector" or not q.spanmetrics]


@pytest.mark.parametrize(("stack", "q"), ROUTE_QUERIES, indirect=["stack"])
def test_panel_query_returns_data(world: World, stack: Stack, q: PanelQuery) -> None:
    expr = substitute(q.expr, stack.range_s)
    if q.instant:
        result = stack.prometheus.query(expr, at=stack.end)
    else:
        result = stack.prometheus.query_range(expr, stack.start, stack.end, SCRAPE_S)
    if not result:
        reason = _gap_reason(stack, q.expr, world.routes.values())
        if reason is not None:
            print(f"SKIP {stack.route}:{q.id}: {reason}")
            pytest.skip(f"{stack.route}:{q.id}: {reason}")
    assert result, f"{stack.route}:{q.id}: no data for {expr}"
    finite = [v for v in values(result) if math.isfinite(v)]
    assert finite, f"{stack.route}:{q.id}: only NaN/Inf for {expr}: {result[:3]}"


@pytest.mark.parametrize(("stack", "v"), [
    pytest.param(route, v, id=f"{route}:{v.dashboard}/${v.name}")
    for route in ROUTES for v in variable_queries()], indirect=["stack"])
def test_template_variable_has_values(stack: Stack, v: VariableQuery) -> None:
    m = _LABEL_VALUES.match(v.query)
    assert m, f"unsupported variable query {v.query!r}"
    selector, label = m.group(1), m.group(2)
    params: dict[str, str | float] = {"start": stack.start, "end": stack.end}
    if selector:
        params["match[]"] = substitute(selector, stack.range_s)
    found = stack.prometheus.api(f"label/{label}/values", **params)
    if not found and "gpu" in v.query and stack.gpu_unavailable():
        pytest.skip(f"no GPU here ({stack.gpu_unavailable()})")
    assert found, f"${v.name}: {v.query} has no values"


@on_both_routes
def test_service_variable_names_every_service(stack: Stack) -> None:
    """$service offers each prover's service.name, whichever route fed target_info."""
    found = stack.prometheus.api("label/service_name/values", start=stack.start,
                                 end=stack.end, **{"match[]": "target_info"})
    assert set(found) == {p.spec.service for p in stack.provers}


@on_both_routes
def test_rates_see_the_proofs(stack: Stack) -> None:
    """Not just series: the throughput panels show the proofs that ran."""
    per_min = stack.prometheus.query_range(
        substitute(f"sum(rate(proof_duration_seconds_count[{RATE_INTERVAL}])) * 60", 0),
        stack.start, stack.end, SCRAPE_S)
    assert max(values(per_min)) > 0
    rounds = stack.prometheus.query_range(
        f"sum(rate(proof_sumcheck_round_count_total[{RATE_INTERVAL}]))",
        stack.start, stack.end, SCRAPE_S)
    assert max(values(rounds)) > 0
    kinds = {s["metric"]["proof_layer_kind"] for s in stack.prometheus.query(
        "group by (proof_layer_kind) (proof_layer_duration_seconds_count)", at=stack.end)}
    assert kinds and kinds <= set(k.value for k in LAYER_KIND_COLOURS)


def _panel_expr(dashboard: str, panel: str, ref: str = "A") -> str:
    return next(q.expr for q in QUERIES
                if (q.dashboard, q.panel, q.ref) == (dashboard, panel, ref))


def _instant(stack: Stack, dashboard: str, panel: str, ref: str = "A") -> list[dict[str, Any]]:
    return stack.prometheus.query(substitute(_panel_expr(dashboard, panel, ref),
                                             stack.range_s), at=stack.end)


def _over_range(stack: Stack, dashboard: str, panel: str,
                ref: str = "A") -> list[dict[str, Any]]:
    return stack.prometheus.query_range(
        substitute(_panel_expr(dashboard, panel, ref), stack.range_s), stack.start,
        stack.end, SCRAPE_S)


@on_both_routes
def test_both_backends_proved(stack: Stack) -> None:
    want = {"cpu"} if stack.gpu_unavailable() else {"cpu", "wgpu"}
    assert stack.backends == want


@on_both_routes
def test_drops_are_shown(stack: Stack) -> None:
    """The CPU prover's trace endpoint is down: its losses, counted, reach the panels."""
    (total,) = values(_instant(stack, "Proof overview", "Telemetry dropped"))
    assert total > 0
    by_reason = _over_range(stack, "Proof overview", "Telemetry dropped and rejected, by reason")
    lost = {(s["metric"].get("proofscope_signal"), s["metric"].get("reason"))
            for s in by_reason if max(values([s])) > 0}
    assert ("spans", "export_failed") in lost
    # Only the traces are lost: the metrics went to a live endpoint on both routes.
    assert "metric_points" not in {signal for signal, _ in lost}


@on_both_routes
def test_gpu_panels_show_the_wgpu_run(stack: Stack) -> None:
    if stack.gpu_unavailable():
        pytest.skip(f"no GPU here ({stack.gpu_unavailable()})")
    dispatches = _over_range(stack, "GPU", "Dispatches / s")
    assert max(values(dispatches)) > 0
    (wgpu_id,) = {s["metric"]["hw_id"] for s in dispatches}
    devices = _instant(stack, "GPU", "Devices")
    assert [d["metric"]["hw_state"] for d in devices if d["metric"]["hw_id"] == wgpu_id] == [
        "ok"]
    gaps = {(g["metric"]["gpu_capability"], g["metric"]["gpu_capability_reason"])
            for g in _instant(stack, "GPU", "Capability gaps")}
    # lavapipe has no utilization counter: the gap is reported, with its reason.
    assert ("utilization", "unsupported") in gaps
    for name in ("Faults", "Retries", "Recoveries"):
        assert values(_instant(stack, "GPU", name)) == [0.0], name


# ── the Collector's own output ───────────────────────────────────────────────────────

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _exposition(text: str) -> dict[str, list[dict[str, str]]]:
    """Prometheus text exposition → series name → the label sets of its samples."""
    out: dict[str, list[dict[str, str]]] = {}
    for line in text.splitlines():
        if m := _SAMPLE.match(line):
            out.setdefault(m.group(1), []).append(dict(_LABEL.findall(m.group(2) or "")))
    return out


#: prometheus_client's default collectors (its process and interpreter), which the SDK
#: exporter's endpoint serves beside the OTel metrics; no OTLP path carries them.
CLIENT_DEFAULTS = ("process_", "python_")


def _names(stack: Stack) -> set[str]:
    """Every series name the route's Prometheus holds from its scrape job in the window,
    less Prometheus's own per-target series."""
    job = ROUTE_JOB[stack.route][1]
    found = stack.prometheus.api("label/__name__/values", start=stack.start, end=stack.end,
                                 **{"match[]": f'{{job="{job}"}}'})
    return {n for n in found if n != "up" and not n.startswith(("scrape_", *CLIENT_DEFAULTS))}


def test_collector_output_is_relabelled_to_the_dashboards(world: World) -> None:
    """deploy/prometheus.yml renames what the real Collector serves to the dashboards'
    names: its `_ratio` gauges to the SDK's, its `job` on target_info to service_name."""
    served = _exposition(http_text(f"http://127.0.0.1:{world.collector.prometheus}/metrics")
                         or "")
    nvml = {w.gpu.uuid for w in NVML_MACHINE}
    assert {s["hw_id"] for s in served.get("hw_gpu_utilization_ratio", [])} == nvml
    assert "hw_gpu_utilization" not in served
    services = {p.spec.service for p in world.provers}
    assert {s["job"] for s in served["target_info"]} == services
    assert not [s for s in served["target_info"] if "service_name" in s]

    st = world.routes["collector"]
    held = st.prometheus.query("hw_gpu_utilization", at=st.end)
    assert {s["metric"]["hw_id"] for s in held} >= nvml
    assert not st.prometheus.query('{__name__=~".+_ratio"}', at=st.end)
    info = st.prometheus.query("target_info", at=st.end)
    assert sorted(s["metric"]["service_name"] for s in info) == sorted(
        p.spec.service for p in world.provers)
    for s in info:
        assert s["metric"]["service_name"] == s["metric"]["exported_job"]
        assert s["metric"]["instance"] == f"127.0.0.1:{world.collector.prometheus}"


def test_both_routes_give_the_dashboards_the_same_names(world: World) -> None:
    """After relabelling, the Collector route holds exactly the direct scrape's series
    names (plus spanmetrics): a dashboard query cannot tell the two deployments apart."""
    through = _names(world.routes["collector"])
    direct = _names(world.routes["direct"])
    spanmetrics = {n for n in through if n.startswith(SPANMETRICS_PREFIX)}
    assert spanmetrics
    assert through - spanmetrics == direct


def _by(result: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(s["metric"].get(k, "") for k in labels): float(s["value"][1])
            for s in result}


def test_span_metrics_count_the_traced_proofs(world: World) -> None:
    """The spanmetrics connector's `proof` series, built from the traces, agree with the
    provers' own proof.duration histogram, built from metrics: one call per proof of
    every prover whose traces reach the Collector, none of the one whose traces are lost."""
    st = world.routes["collector"]
    keys = ("service_name", "proof_system", "proof_backend")
    span = '{span_name="proof"}'

    def q(expr: str) -> dict[tuple[str, ...], float]:
        return _by(st.prometheus.query(expr, at=st.end), *keys)

    calls = q(f"sum by ({', '.join(keys)}) ({SPANMETRICS_PREFIX}calls_total{span})")
    count = q(f"sum by ({', '.join(keys)}) ({SPANMETRICS_PREFIX}duration_seconds_count{span})")
    seconds = q(f"sum by ({', '.join(keys)}) ({SPANMETRICS_PREFIX}duration_seconds_sum{span})")
    proved = _by(st.prometheus.query(
        'label_replace(sum by (exported_job, proof_system, proof_backend) '
        '(proof_duration_seconds_count), "service_name", "$1", "exported_job", "(.*)")',
        at=st.end), *keys)
    proved_s = _by(st.prometheus.query(
        'label_replace(sum by (exported_job, proof_system, proof_backend) '
        '(proof_duration_seconds_sum), "service_name", "$1", "exported_job", "(.*)")',
        at=st.end), *keys)
    traced = {(p.spec.service, p.backend) for p in world.provers if p.traced}
    lost = {(p.spec.service, p.backend) for p in world.provers if p.spec.traces_lost}
    assert traced and lost
    assert {(svc, backend) for svc, _, backend in proved} == traced | lost
    want = {k: v for k, v in proved.items() if (k[0], k[2]) in traced}
    assert set(want.values()) == {float(PROOFS)}
    assert calls == want
    assert count == want
    # The same spans timed twice: the SDK records proof.duration from the proof span.
    assert seconds.keys() == want.keys()
    for k, s in seconds.items():
        assert math.isclose(s, proved_s[k], rel_tol=1e-6), (k, s, proved_s[k])


def test_span_metrics_name_the_layer_kinds(world: World) -> None:
    """The connector's dimensions carry the layer kinds, and the span panels move."""
    st = world.routes["collector"]
    layers = st.prometheus.query(
        f'sum by (proof_layer_kind, proof_layer_proof_kind) '
        f'({SPANMETRICS_PREFIX}calls_total{{span_name="proof.layer"}})', at=st.end)
    kinds = {s["metric"].get("proof_layer_kind") for s in layers}
    assert kinds and kinds <= {k.value for k in LAYER_KIND_COLOURS}
    assert all(s["metric"].get("proof_layer_proof_kind") for s in layers)
    rate = _over_range(st, "Proof overview", "Span rate by span name")
    rising = {s["metric"]["span_name"] for s in rate if max(values([s])) > 0}
    assert {"proof", "proof.layer", "proof.verify"} <= rising
    errors = _over_range(st, "Proof overview", "Span errors by span name")
    assert values(errors) and max(values(errors)) == 0.0  # every proof verified


EXEMPLAR_QUERIES = [pytest.param(q, id=q.id) for q in QUERIES if q.exemplar]


@pytest.mark.parametrize("q", EXEMPLAR_QUERIES)
def test_exemplars_open_a_trace_jaeger_holds(world: World, q: PanelQuery) -> None:
    """A panel with exemplars on gets them from Prometheus (as compose runs it), and each
    trace_id is a trace that Jaeger, behind the same Collector, holds."""
    st = world.routes["collector"]
    found = st.prometheus.api("query_exemplars", query=substitute(q.expr, st.range_s),
                              start=st.start, end=st.end)
    # The prover whose traces go to a dead endpoint has exemplars too, of traces no
    # one holds: only the traced provers' series (by service and backend) count.
    traced = {(p.spec.service, p.spec.backend) for p in world.provers if p.traced}
    lost = {(p.spec.service, p.spec.backend) for p in world.provers if not p.traced}
    ids = set()
    for s in found:
        labels = s["seriesLabels"]
        key = (labels.get("exported_job") or labels.get("service_name"),
               labels.get("proof_backend"))
        if key in lost and key not in traced:
            continue
        ids |= {e["labels"]["trace_id"] for e in s["exemplars"] if "trace_id" in e["labels"]}
    assert ids, f"{q.id}: no exemplar with a trace_id"
    held = {t["traceID"] for p in world.provers if p.traced for t in
            world.jaeger.traces(p.spec.service)}
    assert ids <= held, f"{q.id}: exemplar traces {sorted(ids - held)[:3]} not in Jaeger"


# ── the NVML machine ─────────────────────────────────────────────────────────────────

NVML_IDS = {w.gpu.uuid: w for w in NVML_MACHINE}


def _nvml_series(result: list[dict[str, Any]]) -> dict[tuple[str, ...], list[float]]:
    """NVML devices' series of a result, keyed by their label values (hw_id first)."""
    out = {}
    for series in result:
        m = series["metric"]
        if m.get("hw_id") in NVML_IDS:
            key = (m["hw_id"], *(v for k, v in sorted(m.items()) if k != "hw_id"))
            out[key] = values([series])
    return out


def _range(stack: Stack, panel: str, ref: str = "A") -> list[dict[str, Any]]:
    return _over_range(stack, "GPU", panel, ref)


@on_both_routes
def test_nvml_devices_are_listed(stack: Stack) -> None:
    """The Devices table names both sampled GPUs with the identity NVML gave."""
    rows = {d["metric"]["hw_id"]: d["metric"] for d in _instant(stack, "GPU", "Devices")}
    for uuid, w in NVML_IDS.items():
        assert rows[uuid]["hw_name"] == w.gpu.name
        assert rows[uuid]["hw_vendor"] == "NVIDIA"  # from the PCI vendor id 0x10DE
        assert rows[uuid]["hw_driver_version"]
        assert rows[uuid]["hw_state"] == "ok"


@on_both_routes
def test_hw_id_variable_lists_sampled_devices(stack: Stack) -> None:
    """$hw_id offers the NVML devices too, not only devices a prover dispatched to."""
    var = next(v for v in variable_queries() if v.dashboard == "GPU" and v.name == "hw_id")
    m = _LABEL_VALUES.match(var.query)
    assert m and m.group(1)
    found = stack.prometheus.api("label/hw_id/values", start=stack.start, end=stack.end,
                                 **{"match[]": substitute(m.group(1), stack.range_s)})
    assert set(NVML_IDS) <= set(found)


@on_both_routes
def test_nvml_utilization_follows_the_workload(stack: Stack) -> None:
    util = _nvml_series(_range(stack, "GPU utilization"))
    assert {k[0] for k in util} == set(NVML_IDS)
    for (uuid, *_), vs in util.items():
        assert all(0.0 <= v <= 1.0 for v in vs), vs
        assert max(vs) > min(vs), f"{uuid}: utilization never moved: {vs}"


@on_both_routes
def test_nvml_memory_used_is_within_the_limit(stack: Stack) -> None:
    used = _nvml_series(_range(stack, "GPU memory used / limit", "A"))
    limit = _nvml_series(_range(stack, "GPU memory used / limit", "B"))
    for uuid, w in NVML_IDS.items():
        assert set(limit[(uuid,)]) == {float(w.gpu.memory_total)}
        assert all(0 < u <= w.gpu.memory_total for u in used[(uuid,)])
        assert len(set(used[(uuid,)])) > 1, f"{uuid}: memory use never moved"


@on_both_routes
def test_nvml_pcie_traffic_in_both_directions(stack: Stack) -> None:
    io = _nvml_series(_range(stack, "Effective transfer bandwidth", "C"))
    assert set(io) == {(u, d) for u in NVML_IDS for d in ("receive", "transmit")}
    for key, rates in io.items():
        assert max(rates) > 0, key


@on_both_routes
def test_nvml_ecc_errors_are_rated(stack: Stack) -> None:
    errors = _nvml_series(_range(stack, "Faults / retries / recoveries per second", "D"))
    assert set(errors) == {(u, e) for u in NVML_IDS
                           for e in ("ecc_corrected", "ecc_uncorrected")}
    for (uuid, kind), rates in errors.items():
        rising = bool(NVML_IDS[uuid].ecc_corrected_every_s) and kind == "ecc_corrected"
        # Only the device with a failing cell counts corrected errors; none uncorrected.
        assert (max(rates) > 0) is rising, (uuid, kind, rates)


@on_both_routes
def test_nvml_gaps_are_in_the_table(stack: Stack) -> None:
    """NVML cannot give profiler counters: the gap table says so next to wgpu's."""
    gaps = {(g["metric"]["gpu_backend"], g["metric"]["gpu_capability"])
            for g in _instant(stack, "GPU", "Capability gaps")}
    assert {("nvml", "occupancy"), ("nvml", "stall_counters")} <= gaps


DEVICE_QUERIES = [q for q in QUERIES if q.dashboard == "GPU" and "{{" in q.legend
                  and all(n.startswith("hw_") for n, _ in selectors(q.expr))]


@pytest.mark.parametrize(("stack", "q"), [
    pytest.param(route, q, id=f"{route}:{q.id}") for route in ROUTES for q in DEVICE_QUERIES],
    indirect=["stack"])
def test_device_legends_name_real_labels(stack: Stack, q: PanelQuery) -> None:
    """Every {{label}} of a device panel's legend is on every series it returns (a label
    the sampler does not emit would leave the legend blank)."""
    result = stack.prometheus.query(substitute(q.expr, stack.range_s), at=stack.end)
    assert result, q.id
    wanted = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", q.legend))
    for series in result:
        assert wanted <= set(series["metric"]), (q.id, series["metric"])
