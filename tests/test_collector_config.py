"""The OpenTelemetry Collector configs in collector-config/, checked by the real binary.

``otelcol validate`` (the Collector that ``scripts/peers`` builds from
collector-config/otelcol-builder.yaml) reads every config as docs/deployment.md runs it,
overlays included: an unknown component, a bad key or a wrong type fails here as it
would at start-up. What the binary does not check stays a structural test: a component
defined but never used (the Collector ignores it), the processors' order, the debug
overlay restating its base, the addresses against the docs' ports table, the span-metric
buckets against ``SECONDS_BUCKETS``, the tiers' routing keys, serve's batch cap.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from peers import collector_config, compose_env, merge, peer, variables

from otel_proofscope.semconv import SECONDS_BUCKETS

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "collector-config"
SINGLE = "otel-collector.yaml"
GATEWAY = "otel-collector-gateway.yaml"
AGENT = "otel-collector-agent.yaml"
DEBUG = "debug.yaml"
LB = "loadbalancing.yaml"
JAEGER = "jaeger.yaml"
KINDS = ("receivers", "processors", "exporters", "connectors", "extensions")
SIGNALS = ("traces", "metrics", "logs")
#: Every way docs/deployment.md runs a config: the files given together.
RUNS = [(SINGLE,), (SINGLE, DEBUG), (GATEWAY,), (GATEWAY, DEBUG), (AGENT,), (LB,)]
def load(name: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    return collector_config(name, env)


CONFIGS: dict[str, dict[str, Any]] = {
    SINGLE: load(SINGLE),
    GATEWAY: load(GATEWAY),
    AGENT: load(AGENT),
    LB: load(LB),
    f"{SINGLE}+{DEBUG}": merge(load(SINGLE), load(DEBUG)),
    f"{GATEWAY}+{DEBUG}": merge(load(GATEWAY), load(DEBUG)),
}


def signal(pipeline: str) -> str:
    return pipeline.split("/", 1)[0]


def comp_type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def problems(cfg: dict[str, Any]) -> list[str]:
    """What the Collector accepts but should not: unused components, processor order."""
    out: list[str] = []
    service = cfg["service"]
    used: dict[str, set[str]] = {kind: set() for kind in KINDS}
    used["extensions"].update(service.get("extensions", []))
    for name, pipe in service["pipelines"].items():
        for role in ("receivers", "processors", "exporters"):
            for cid in pipe.get(role) or []:
                kind = "connectors" if cid in (cfg.get("connectors") or {}) else role
                used[kind].add(cid)
        procs = pipe.get("processors") or []
        if procs and procs[0] != "memory_limiter":
            out.append(f"pipeline {name}: memory_limiter must come first, got {procs}")
        if "batch" in procs and procs[-1] != "batch":
            out.append(f"pipeline {name}: batch should be the last processor")
    for kind in KINDS:
        for cid in sorted(set(cfg.get(kind) or {}) - used[kind]):
            out.append(f"{kind}: {cid} is defined but not used in any pipeline")
    return out


def validate(binary: Path, files: list[Path], env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    argv = [str(binary), "validate"]
    for f in files:
        argv += ["--config", str(f)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("files", RUNS, ids=["+".join(r) for r in RUNS])
def test_the_collector_accepts_every_config_as_documented(files: tuple[str, ...]) -> None:
    proc = validate(peer("otelcol"), [CONF / f for f in files])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_collector_refuses_a_broken_config(tmp_path: Path) -> None:
    """The validation is not vacuous: a typo in a component's key is refused, by name."""
    broken = tmp_path / "broken.yaml"
    broken.write_text((CONF / SINGLE).read_text().replace("send_batch_size:", "send_batchsize:"))
    proc = validate(peer("otelcol"), [broken])
    assert proc.returncode != 0
    assert "send_batchsize" in proc.stdout + proc.stderr


def test_jaeger_accepts_its_config() -> None:
    proc = validate(peer("jaeger"), [CONF / JAEGER])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_manifest_builds_exactly_the_components_the_configs_use() -> None:
    """otelcol-builder.yaml holds every component type a config names, and no other;
    all of them at one release, the one docker-compose.yml pins."""
    manifest = yaml.safe_load((CONF / "otelcol-builder.yaml").read_text())
    listed = subprocess.run([str(peer("otelcol")), "components"], capture_output=True,
                            text=True, timeout=60, check=True).stdout
    built = yaml.safe_load(listed)
    types = {kind: {c["name"] for c in built.get(kind) or []} for kind in KINDS}
    # Component types the configs name (aliases resolved by what the binary reports).
    named: dict[str, set[str]] = {kind: set() for kind in KINDS}
    for cfg in CONFIGS.values():
        for kind in KINDS:
            named[kind] |= {comp_type(cid) for cid in cfg.get(kind) or {}}
    assert named == types, (named, types)
    release = manifest["dist"]["version"]
    versions = {m["gomod"].rsplit(" v", 1)[1] for kind in KINDS for m in manifest.get(kind, [])}
    assert versions == {release}
    compose = (ROOT / "docker-compose.yml").read_text()
    assert f"otel/opentelemetry-collector-contrib:{release}" in compose
    assert "opentelemetry-collector-contrib:" not in compose.replace(
        f"opentelemetry-collector-contrib:{release}", "")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_component_defined_is_used(name: str) -> None:
    assert problems(CONFIGS[name]) == []


def test_the_checker_finds_what_it_looks_for() -> None:
    """The structural check is not vacuous: break a config in each way and it notices."""
    cfg = merge(load(SINGLE), {})
    cfg["exporters"] = {**cfg["exporters"], "otlp_grpc/unused": {"endpoint": "x:4317"}}
    cfg["service"] = merge(cfg["service"], {"pipelines": {"traces": {
        "processors": ["batch", "memory_limiter"]}}})
    found = "\n".join(problems(cfg))
    assert "otlp_grpc/unused is defined but not used" in found
    assert "memory_limiter must come first" in found
    assert "batch should be the last" in found


def test_debug_is_off_by_default_and_on_with_the_overlay() -> None:
    for name in (SINGLE, GATEWAY, AGENT):
        assert "debug" not in CONFIGS[name]["exporters"]
    for name in (f"{SINGLE}+{DEBUG}", f"{GATEWAY}+{DEBUG}"):
        cfg = CONFIGS[name]
        for pname, pipe in cfg["service"]["pipelines"].items():
            assert "debug" in pipe["exporters"], f"{name}: {pname}"
        # The overlay restates the base lists: nothing the base exported is lost.
        base = CONFIGS[name.split("+")[0]]
        for pname, pipe in base["service"]["pipelines"].items():
            merged = cfg["service"]["pipelines"][pname]["exporters"]
            assert set(pipe["exporters"]) <= set(merged), f"{name}: {pname} lost exporters"


# ── where things listen ──────────────────────────────────────────────────────────────


def documented_variables() -> dict[str, tuple[str, set[str]]]:
    """The ports table of docs/deployment.md: variable → (bare-host default, files)."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    section = text.split("### Ports", 1)[1].split("\n## ", 1)[0]
    out: dict[str, tuple[str, set[str]]] = {}
    for m in re.finditer(r"^\| `([A-Z0-9_]+)` \| `([^`]*)` \| [^|]+ \| ([^|]+) \|", section, re.M):
        out[m.group(1)] = (m.group(2), {f.strip() for f in m.group(3).split(",")})
    return out


def test_ports_table_is_parsed() -> None:
    assert {"OTELCOL_OTLP_GRPC_ENDPOINT", "JAEGER_OTLP_ENDPOINT",
            "SERVE_BACKEND_0"} <= set(documented_variables())


@pytest.mark.parametrize("name", [SINGLE, GATEWAY, AGENT, LB, DEBUG, JAEGER])
def test_every_address_is_a_documented_variable(name: str) -> None:
    """Each address a config reads from the environment is in the docs' ports table,
    with the same bare-host default, and the table lists no file that lacks it."""
    doc = documented_variables()
    found = variables(name)
    for var, default in found.items():
        assert var in doc, f"{name}: {var} is not in the ports table of deployment.md"
        assert default == doc[var][0], f"{name}: {var} = {default}, docs say {doc[var][0]}"
        assert name in doc[var][1], f"{name} reads {var}; the docs do not list the file"
    for var, (_, files) in doc.items():
        if name in files:
            assert var in found, f"docs list {var} in {name}; the file does not read it"


@pytest.mark.parametrize("name", [SINGLE, GATEWAY, AGENT, LB, JAEGER])
def test_a_bare_host_listens_on_loopback_only(name: str) -> None:
    for var, default in variables(name).items():
        if var.endswith(("_ENDPOINT", "_HOST")) and not var.startswith("JAEGER_OTLP_ENDPOINT"):
            assert default.startswith("127.0.0.1"), f"{name}: {var} defaults to {default}"


def test_the_tiers_connect_in_compose() -> None:
    """compose.gateway.yml: the agent resolves the gateways by their service name, on the
    port they listen on, traces by trace id and metrics by service."""
    override = "collector-config/compose.gateway.yml"
    agent = load(AGENT, compose_env("otel-collector", override))
    gateway = load(GATEWAY, compose_env("otel-gateway", override))
    gw_port = gateway["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].rsplit(":")[1]
    routing = {}
    for pname, pipe in agent["service"]["pipelines"].items():
        (cid,) = pipe["exporters"]
        lb = agent["exporters"][cid]
        routing[signal(pname)] = lb["routing_key"]
        dns = lb["resolver"]["dns"]
        assert dns["port"] == gw_port
        assert dns["hostname"] == "otel-gateway"  # the service in compose.gateway.yml
        assert lb["protocol"]["otlp"]["tls"]["insecure"] is True
    # One proof's spans meet in one gateway; metrics must never be routed by trace id.
    assert routing == {"traces": "traceID", "metrics": "service"}
    for name, service in ((SINGLE, "otel-collector"), (GATEWAY, "otel-gateway")):
        cfg = load(name, compose_env(service, override))
        assert cfg["exporters"]["otlp_grpc/jaeger"]["endpoint"] == "jaeger:4317"
        assert cfg["exporters"]["prometheus"]["enable_open_metrics"] is True


def parse_go_duration(text: str) -> float:
    units = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    m = re.fullmatch(r"([0-9.]+)(us|µs|ms|s|m|h)", str(text))
    assert m, f"not a Go duration: {text!r}"
    return float(m.group(1)) * units[m.group(2)]


@pytest.mark.parametrize("name", [SINGLE, GATEWAY])
def test_spanmetrics_use_the_seconds_buckets(name: str) -> None:
    sm = CONFIGS[name]["connectors"]["span_metrics"]
    assert sm["histogram"]["unit"] == "s"
    assert sm["namespace"] == "traces.span.metrics"  # docs/deployment.md names it
    assert sm["exemplars"]["enabled"] is True
    got = [parse_go_duration(b) for b in sm["histogram"]["explicit"]["buckets"]]
    assert got == pytest.approx(list(SECONDS_BUCKETS))


def test_single_and_gateway_process_alike() -> None:
    """The gateway is the single collector minus the HTTP receiver: same processing."""
    single, gateway = CONFIGS[SINGLE], CONFIGS[GATEWAY]
    for kind in ("processors", "connectors", "exporters"):
        assert single[kind] == gateway[kind], kind
    assert single["service"]["pipelines"] == gateway["service"]["pipelines"]


# ── the collector in front of N `proofscope serve` processes ───────────────────────────


def test_serve_scale_out_routes_by_trace_and_by_service() -> None:
    """Traces by trace id, metrics by service (one prover's cumulative series stay in one
    serve), both to the same backends, none of them the collector's own ports.
    tests/test_serve_scale_out.py runs it: whole traces, a dead backend counted."""
    cfg = CONFIGS[LB]
    routing, backends = {}, []
    for pname, pipe in cfg["service"]["pipelines"].items():
        (cid,) = pipe["exporters"]
        lb = cfg["exporters"][cid]
        routing[signal(pname)] = lb["routing_key"]
        backends.append(lb["resolver"]["static"]["hostnames"])
    assert routing == {"traces": "traceID", "metrics": "service"}
    assert backends[0] == backends[1]
    own = {v.rsplit(":", 1)[-1] for k, v in variables(LB).items()
           if not k.startswith("SERVE_BACKEND")}
    for h in backends[0]:
        host, port = h.rsplit(":", 1)
        assert host == "127.0.0.1"  # serve listens on loopback unless given a token
        assert port not in own, f"backend {h} is the collector's own port"


def test_serve_scale_out_documented_commands_match_the_backends() -> None:
    """docs/deployment.md starts one serve per backend on exactly the ports listed."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    section = text.split("## Scaling out `serve`", 1)[1].split("\n## ", 1)[0]
    ports = [int(p) for p in re.findall(r"proofscope serve --grpc-port (\d+)", section)]
    hosts = CONFIGS[LB]["exporters"]["load_balancing/traces"]["resolver"]["static"]["hostnames"]
    assert ports == [int(h.rsplit(":", 1)[1]) for h in hosts]
    assert f"collector-config/{LB}" in section


def test_serve_scale_out_batches_fit_serve_s_request_cap() -> None:
    """The batch processor's largest batch of prover-shaped spans stays under serve's
    default --max-message-bytes, or serve would refuse every full batch."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_proofscope.instrumentation import ProofTracer
    from otel_proofscope.integrations.otlp_receiver.core import DEFAULT_MAX_MESSAGE_BYTES

    memory = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(memory))
    pt = ProofTracer(tp)
    poly = ((1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12))
    with pt.proof(system="gkr", backend="cpu", layers=8):
        for i in reversed(range(8)):
            with pt.layer(index=i, kind="MatMul", rounds=16, claim_initial=(i, 2, 3, 4)):
                for r in range(16):
                    pt.sumcheck_round(r, poly, (r * 7919 + i, 1, 2, 3))
    layers = [s for s in memory.get_finished_spans() if s.name == "proof.layer"]
    per_span = max(encode_spans([s]).ByteSize() for s in layers)
    largest = CONFIGS[LB]["processors"]["batch"]["send_batch_max_size"]
    assert largest * per_span < DEFAULT_MAX_MESSAGE_BYTES, (largest, per_span)
