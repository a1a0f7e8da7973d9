"""The Grafana dashboards against a real Prometheus.

Fast checks (no server): the dashboard JSON is well formed, every metric a panel
queries is a name the real OpenTelemetry Prometheus exporter renders for a metric of
``otel_proofscope.semconv`` (or a collector spanmetrics name), label matchers only use
that metric's attributes, and the layer-kind colours are the contract's.

End to end (~20 s): three processes run the demo's reference prover repeatedly behind
``configure(prometheus_port=…)`` — on the CPU, on wgpu (Mesa lavapipe), and on the CPU of
an "NVML machine" whose two NVIDIA GPUs the real NVML sampler watches through the
pynvml stand-in of ``tests/nvml_machine.py`` (no NVIDIA driver exists here; readings
move with a workload, NVML's counters stay monotone). The Debian ``prometheus`` binary
scrapes all three every second on 127.0.0.1 with the shipped
``deploy/prometheus-direct.yml`` (targets and interval replaced), and then every PromQL
expression of every panel and every template variable is executed over the HTTP API and
must return finite data. Panels that only the collector's spanmetrics connector can feed
are skipped with the reason. A GPU panel may be empty only if NO scraped process
measures its metric and a backend reported the capability gap
(``gpu.capability.unsupported``), or wgpu found no adapter at all; lavapipe's gaps
excuse nothing the NVML machine measures.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from nvml_machine import MACHINE as NVML_MACHINE

from otel_proofscope.semconv import LAYER_KIND_COLOURS, GpuCapability, Metric

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD_DIR = ROOT / "deploy" / "grafana" / "dashboards"
DASHBOARD_FILES = sorted(DASHBOARD_DIR.glob("*.json"))
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")

#: Scrape interval of the test's Prometheus; Grafana's $__rate_interval is at least 4×.
SCRAPE_S = 1
RATE_INTERVAL = f"{4 * SCRAPE_S}s"
#: Proofs each prover runs; spread over several scrapes so rates see increases.
PROOFS = 5
#: Hard bound on the whole end-to-end setup (start, prove, scrape).
SETUP_DEADLINE_S = 75.0

SPANMETRICS_PREFIX = "traces_span_metrics_"
SPANMETRICS_REASON = (
    "fed only by the collector's spanmetrics connector (traces_span_metrics_*): this test "
    "scrapes provers directly, there is no OpenTelemetry Collector binary here")

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

    @property
    def id(self) -> str:
        return f"{self.dashboard}/{self.panel}/{self.ref}"

    @property
    def collector_only(self) -> bool:
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
                                          bool(t.get("instant")), t.get("legendFormat", "")))
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Prometheus:
    """The Debian prometheus binary on 127.0.0.1 with a temp config and storage."""

    def __init__(self, config: dict[str, Any], workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log = workdir / "prometheus.log"
        assert PROMETHEUS is not None
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
                 "--storage.tsdb.retention.time=1h"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready in {timeout_s} s")

    def api(self, path: str, **params: str | float) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{path} {params}: {exc.read().decode()[:500]}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        data = self.api("query", query=expr, time=at if at is not None else time.time())
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=start, end=end, step=SCRAPE_S)
        result: list[dict[str, Any]] = data["result"]
        return result

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


def values(result: list[dict[str, Any]]) -> list[float]:
    out = []
    for series in result:
        points = series.get("values") or [series["value"]]
        out += [float(v) for _, v in points]
    return out


# A hand-written sample of what the collector's prometheus exporter serves (its
# `_ratio` suffix for unit-1 gauges, job/instance from service.name/.instance.id), to
# run deploy/prometheus.yml's relabelling through the real Prometheus.
COLLECTOR_STYLE_EXPOSITION = b"""\
# TYPE hw_gpu_utilization_ratio gauge
hw_gpu_utilization_ratio{job="svc-through-collector",instance="i-1",hw_id="gpu-0"} 0.25
# TYPE target_info gauge
target_info{job="svc-through-collector",instance="i-1",host_name="h"} 1
"""


class _Exposition(BaseHTTPRequestHandler):
    #: Served until the relabelling has been observed, then withdrawn (Prometheus marks
    #: the series stale), so the sample never reaches the dashboard queries.
    body = COLLECTOR_STYLE_EXPOSITION

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(type(self).body)

    def log_message(self, *_: Any) -> None:
        pass


# ── provers ──────────────────────────────────────────────────────────────────────────

# The reference prover of `proofscope demo` (its network, prover and GPU kernels, and
# configure(prometheus_port=…) exactly as run_demo uses them), proving several times in
# one process: `proofscope demo` proves once, and a counter's first sample is never an
# increase, so one proof per process leaves every rate() panel at zero.
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


#: The scraped processes. The CPU prover exports OTLP to a port where nothing listens (a
#: collector that is down), so the telemetry-drop panels show real, counted losses; the
#: others write files. The NVML machine proves on its CPU while its GPUs are sampled.
PROVERS = {
    "cpu": ProverSpec("cpu", 0.5),
    "wgpu": ProverSpec("wgpu", 0.2),
    "nvml": ProverSpec("cpu", 0.3, service="proofscope-nvml-machine", machine="nvml"),
}
#: The NVML machine's sampling period (a real deployment samples every 1 s).
NVML_SAMPLE_S = 0.5


@dataclass
class Prover:
    name: str
    backend: str
    port: int
    proc: subprocess.Popen[str]
    log: Path

    def unavailable(self) -> str | None:
        for line in self.log.read_text().splitlines():
            if line.startswith("BACKEND-UNAVAILABLE"):
                return line.split(" ", 1)[1]
        return None


@dataclass
class Stack:
    prometheus: Prometheus
    provers: list[Prover]
    start: float
    sample_at: float
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


def _start_prover(name: str, port: int, workdir: Path) -> Prover:
    spec = PROVERS[name]
    log = workdir / f"prover-{name}.log"
    hold = str(int(SETUP_DEADLINE_S + 60))  # killed at teardown long before
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    env["PYTHONUNBUFFERED"] = "1"
    if name == "cpu":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"
    if spec.machine == "nvml":  # tests/nvml_machine.py and the fake_pynvml it builds on
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "tests"), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-c", _DEMO_PROVER, str(port), spec.backend, str(PROOFS),
           str(spec.pause_s), hold, str(workdir / f"out-{name}"), spec.service,
           spec.machine, str(NVML_SAMPLE_S)]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=workdir, start_new_session=True)
    return Prover(name, spec.backend, port, proc, log)


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    if PROMETHEUS is None:
        pytest.skip("the prometheus binary (Debian package prometheus) is not installed")
    workdir = Path(tempfile.mkdtemp(prefix="proofscope-prom-"))
    deadline = time.monotonic() + SETUP_DEADLINE_S
    ports = {name: free_port() for name in PROVERS}
    _Exposition.body = COLLECTOR_STYLE_EXPOSITION
    exposition = ThreadingHTTPServer(("127.0.0.1", 0), _Exposition)
    threading.Thread(target=exposition.serve_forever, daemon=True).start()

    direct = yaml.safe_load((ROOT / "deploy/prometheus-direct.yml").read_text())
    shipped = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    job = next(j for j in direct["scrape_configs"] if j["job_name"] == "proofscope")
    job["static_configs"] = [{"targets": [f"127.0.0.1:{p}" for p in ports.values()]}]
    collector_job = next(j for j in shipped["scrape_configs"]
                         if j["job_name"] == "otel-collector")
    collector_job["static_configs"] = [
        {"targets": [f"127.0.0.1:{exposition.server_address[1]}"]}]
    config = {"global": {"scrape_interval": f"{SCRAPE_S}s",
                         "evaluation_interval": f"{SCRAPE_S}s"},
              "scrape_configs": [job, collector_job]}
    prom = Prometheus(config, workdir)
    provers: list[Prover] = []
    try:
        prom.wait_ready(min(20.0, deadline - time.monotonic()))
        # Provers start once Prometheus scrapes (its scrape manager applies targets on a
        # 5 s tick): a counter's first sample is never an increase, so proofs finished
        # before the first scrape would be invisible to rate().
        sample_at = _wait_for_sample(prom, deadline)
        _Exposition.body = b""
        time.sleep(1.5 * SCRAPE_S)  # one more scrape: the sample's series go stale
        start = time.time()
        provers += [_start_prover(name, port, workdir) for name, port in ports.items()]
        st = Stack(prom, provers, start, sample_at)
        _wait_for_proofs(st, deadline)
        yield st
    finally:
        for p in provers:  # all at once: each may spend its flush bound on the dead collector
            if p.proc.poll() is None:
                p.proc.terminate()
        for p in provers:
            _stop(p.proc)
        prom.stop()
        exposition.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_for_sample(prom: Prometheus, deadline: float) -> float:
    """Until the collector-style sample has been scraped; returns a time it is live at."""
    while not prom.query('target_info{exported_job="svc-through-collector"}'):
        if time.monotonic() > deadline:
            raise AssertionError(f"prometheus never scraped: {prom.log.read_text()[-2000:]}")
        time.sleep(0.2)
    return time.time()


#: Every NVML device counter series of the machine (2 GPUs × transmit/receive) rising.
_NVML_RISING = f"count(rate(hw_gpu_io_bytes_total[{RATE_INTERVAL}]) > 0)"
NVML_IO_SERIES = 2 * len(NVML_MACHINE)


def _wait_for_proofs(st: Stack, deadline: float) -> None:
    """Until every prover's proofs (and the CPU prover's export failures) are in
    Prometheus and the NVML machine's counters are seen rising, then two more scrapes
    so the last increase is inside every rate window; bounded by ``deadline``."""
    while True:
        for p in st.provers:
            if p.proc.poll() is not None:
                raise AssertionError(f"prover {p.name} exited {p.proc.returncode}: "
                                     f"{p.log.read_text()[-3000:]}")
        running = [p for p in st.provers if p.unavailable() is None]
        want = PROOFS * len(running)
        got = sum(values(st.prometheus.query("sum(proof_duration_seconds_count)")))
        dropped = st.prometheus.query("sum(proofscope_dropped_total) > 0")
        rising = sum(values(st.prometheus.query(_NVML_RISING)))
        if got >= want and dropped and rising >= NVML_IO_SERIES:
            break
        if time.monotonic() > deadline:
            logs = "\n".join(p.log.read_text()[-1500:] for p in st.provers)
            raise AssertionError(f"in time: {got}/{want} proofs scraped, drops seen: "
                                 f"{bool(dropped)}, NVML io series rising: {rising}/"
                                 f"{NVML_IO_SERIES}\n{logs}")
        time.sleep(0.5)
    time.sleep(2.5 * SCRAPE_S)
    st.end = time.time()
    st.backends = {s["metric"]["proof_backend"] for s in st.prometheus.query(
        "group by (proof_backend) (proof_duration_seconds_count)")}


def _family(name: str) -> str:
    return name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")


def _gap_reason(st: Stack, expr: str) -> str | None:
    """Why an empty GPU query is legitimately empty, or None when nothing excuses it.

    Only a metric that NO scraped process measures may be excused (by the capability
    gap a backend reported for it, or by wgpu finding no adapter here): once any process
    has a series of it, an empty panel is the dashboard's fault.
    """
    names = {n for n, _ in selectors(expr)}
    measured = sorted(n for n in names if st.measures(n))
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


@pytest.mark.parametrize("q", QUERIES, ids=[q.id for q in QUERIES])
def test_panel_query_returns_data(stack: Stack, q: PanelQuery) -> None:
    if q.collector_only:
        print(f"SKIP {q.id}: {SPANMETRICS_REASON}")
        pytest.skip(f"{q.id}: {SPANMETRICS_REASON}")
    expr = substitute(q.expr, stack.range_s)
    if q.instant:
        result = stack.prometheus.query(expr, at=stack.end)
    else:
        result = stack.prometheus.query_range(expr, stack.start, stack.end)
    if not result:
        reason = _gap_reason(stack, q.expr)
        if reason is not None:
            print(f"SKIP {q.id}: {reason}")
            pytest.skip(f"{q.id}: {reason}")
    assert result, f"{q.id}: no data for {expr}"
    finite = [v for v in values(result) if math.isfinite(v)]
    assert finite, f"{q.id}: only NaN/Inf for {expr}: {result[:3]}"


@pytest.mark.parametrize("v", variable_queries(),
                         ids=[f"{v.dashboard}/${v.name}" for v in variable_queries()])
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


def test_rates_see_the_proofs(stack: Stack) -> None:
    """Not just series: the throughput panels show the proofs that ran."""
    per_min = stack.prometheus.query_range(
        substitute(f"sum(rate(proof_duration_seconds_count[{RATE_INTERVAL}])) * 60", 0),
        stack.start, stack.end)
    assert max(values(per_min)) > 0
    rounds = stack.prometheus.query_range(
        f"sum(rate(proof_sumcheck_round_count_total[{RATE_INTERVAL}]))",
        stack.start, stack.end)
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


def test_both_backends_proved(stack: Stack) -> None:
    want = {"cpu"} if stack.gpu_unavailable() else {"cpu", "wgpu"}
    assert stack.backends == want


def test_drops_are_shown(stack: Stack) -> None:
    """The CPU prover's collector is down: its losses, counted exactly, reach the panels."""
    (total,) = values(_instant(stack, "Proof overview", "Telemetry dropped"))
    assert total > 0
    by_reason = stack.prometheus.query_range(
        substitute(_panel_expr("Proof overview", "Telemetry dropped and rejected, by reason"),
                   stack.range_s),
        stack.start, stack.end)
    reasons = {s["metric"].get("reason") for s in by_reason}
    assert "export_failed" in reasons


def test_gpu_panels_show_the_wgpu_run(stack: Stack) -> None:
    if stack.gpu_unavailable():
        pytest.skip(f"no GPU here ({stack.gpu_unavailable()})")
    dispatches = stack.prometheus.query_range(
        substitute(_panel_expr("GPU", "Dispatches / s"), stack.range_s), stack.start, stack.end)
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


def test_collector_names_are_relabelled_to_the_dashboards(stack: Stack) -> None:
    """deploy/prometheus.yml gives collector-scraped series the dashboards' names."""
    at = stack.sample_at
    util = stack.prometheus.query('hw_gpu_utilization{exported_job="svc-through-collector"}',
                                  at=at)
    assert values(util) == [0.25]
    assert not stack.prometheus.query("hw_gpu_utilization_ratio", at=at)
    info = stack.prometheus.query('target_info{service_name="svc-through-collector"}', at=at)
    assert len(info) == 1
    # … and the sample is gone before the provers start: it feeds no dashboard query.
    assert not stack.prometheus.query('{exported_job="svc-through-collector"}', at=stack.start)


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
    return stack.prometheus.query_range(substitute(_panel_expr("GPU", panel, ref),
                                                   stack.range_s), stack.start, stack.end)


def test_nvml_devices_are_listed(stack: Stack) -> None:
    """The Devices table names both sampled GPUs with the identity NVML gave."""
    rows = {d["metric"]["hw_id"]: d["metric"] for d in _instant(stack, "GPU", "Devices")}
    for uuid, w in NVML_IDS.items():
        assert rows[uuid]["hw_name"] == w.gpu.name
        assert rows[uuid]["hw_vendor"] == "NVIDIA"  # from the PCI vendor id 0x10DE
        assert rows[uuid]["hw_driver_version"]
        assert rows[uuid]["hw_state"] == "ok"


def test_hw_id_variable_lists_sampled_devices(stack: Stack) -> None:
    """$hw_id offers the NVML devices too, not only devices a prover dispatched to."""
    var = next(v for v in variable_queries() if v.dashboard == "GPU" and v.name == "hw_id")
    m = _LABEL_VALUES.match(var.query)
    assert m and m.group(1)
    found = stack.prometheus.api("label/hw_id/values", start=stack.start, end=stack.end,
                                 **{"match[]": substitute(m.group(1), stack.range_s)})
    assert set(NVML_IDS) <= set(found)


def test_nvml_utilization_follows_the_workload(stack: Stack) -> None:
    util = _nvml_series(_range(stack, "GPU utilization"))
    assert {k[0] for k in util} == set(NVML_IDS)
    for (uuid, *_), vs in util.items():
        assert all(0.0 <= v <= 1.0 for v in vs), vs
        assert max(vs) > min(vs), f"{uuid}: utilization never moved: {vs}"


def test_nvml_memory_used_is_within_the_limit(stack: Stack) -> None:
    used = _nvml_series(_range(stack, "GPU memory used / limit", "A"))
    limit = _nvml_series(_range(stack, "GPU memory used / limit", "B"))
    for uuid, w in NVML_IDS.items():
        assert set(limit[(uuid,)]) == {float(w.gpu.memory_total)}
        assert all(0 < u <= w.gpu.memory_total for u in used[(uuid,)])
        assert len(set(used[(uuid,)])) > 1, f"{uuid}: memory use never moved"


def test_nvml_pcie_traffic_in_both_directions(stack: Stack) -> None:
    io = _nvml_series(_range(stack, "Effective transfer bandwidth", "C"))
    assert set(io) == {(u, d) for u in NVML_IDS for d in ("receive", "transmit")}
    for key, rates in io.items():
        assert max(rates) > 0, key


def test_nvml_ecc_errors_are_rated(stack: Stack) -> None:
    errors = _nvml_series(_range(stack, "Faults / retries / recoveries per second", "D"))
    assert set(errors) == {(u, e) for u in NVML_IDS
                           for e in ("ecc_corrected", "ecc_uncorrected")}
    for (uuid, kind), rates in errors.items():
        rising = bool(NVML_IDS[uuid].ecc_corrected_every_s) and kind == "ecc_corrected"
        # Only the device with a failing cell counts corrected errors; none uncorrected.
        assert (max(rates) > 0) is rising, (uuid, kind, rates)


def test_nvml_gaps_are_in_the_table(stack: Stack) -> None:
    """NVML cannot give profiler counters: the gap table says so next to wgpu's."""
    gaps = {(g["metric"]["gpu_backend"], g["metric"]["gpu_capability"])
            for g in _instant(stack, "GPU", "Capability gaps")}
    assert {("nvml", "occupancy"), ("nvml", "stall_counters")} <= gaps


DEVICE_QUERIES = [q for q in QUERIES if q.dashboard == "GPU" and "{{" in q.legend
                  and all(n.startswith("hw_") for n, _ in selectors(q.expr))]


@pytest.mark.parametrize("q", DEVICE_QUERIES, ids=[q.id for q in DEVICE_QUERIES])
def test_device_legends_name_real_labels(stack: Stack, q: PanelQuery) -> None:
    """Every {{label}} of a device panel's legend is on every series it returns (a label
    the sampler does not emit would leave the legend blank)."""
    result = stack.prometheus.query(substitute(q.expr, stack.range_s), at=stack.end)
    assert result, q.id
    wanted = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", q.legend))
    for series in result:
        assert wanted <= set(series["metric"]), (q.id, series["metric"])
