"""Structure of the OpenTelemetry Collector configs in collector-config/.

No collector binary exists here, so this checks what the collector itself would refuse
or silently ignore: a pipeline naming a component that is not defined, a component
defined but never used, a connector not wired on both sides, receivers bound elsewhere
than docs/deployment.md says, the debug overlay merging into something broken.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_proofscope.semconv import SECONDS_BUCKETS

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "collector-config"
SINGLE = "otel-collector.yaml"
GATEWAY = "otel-collector-gateway.yaml"
AGENT = "otel-collector-agent.yaml"
DEBUG = "debug.yaml"
LB = "loadbalancing.yaml"
KINDS = ("receivers", "processors", "exporters", "connectors", "extensions")
SIGNALS = ("traces", "metrics", "logs")


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CONF / name).read_text())
    return data


def merge(base: Any, overlay: Any) -> Any:
    """The collector's merge of several --config files: maps merge, lists are replaced."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        out = dict(base)
        for k, v in overlay.items():
            out[k] = merge(base[k], v) if k in base else v
        return out
    return overlay


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
    """Everything structurally wrong with one (merged) collector config."""
    out: list[str] = []
    defined = {kind: set(cfg.get(kind) or {}) for kind in KINDS}
    used: dict[str, set[str]] = {kind: set() for kind in KINDS}
    service = cfg["service"]
    for ext in service.get("extensions", []):
        used["extensions"].add(ext)
        if ext not in defined["extensions"]:
            out.append(f"service.extensions: {ext} is not defined")
    connector_sides: dict[str, dict[str, set[str]]] = {}
    for name, pipe in service["pipelines"].items():
        if signal(name) not in SIGNALS:
            out.append(f"pipeline {name}: unknown signal")
        if not pipe.get("receivers") or not pipe.get("exporters"):
            out.append(f"pipeline {name}: needs receivers and exporters")
        for role in ("receivers", "processors", "exporters"):
            ids = pipe.get(role) or []
            if len(ids) != len(set(ids)):
                out.append(f"pipeline {name}: duplicate {role}")
            for cid in ids:
                if role != "processors" and cid in defined["connectors"]:
                    used["connectors"].add(cid)
                    side = "exporter" if role == "exporters" else "receiver"
                    connector_sides.setdefault(cid, {}).setdefault(side, set()).add(
                        signal(name))
                elif cid in defined[role]:
                    used[role].add(cid)
                else:
                    out.append(f"pipeline {name}: {role[:-1]} {cid} is not defined")
        procs = pipe.get("processors") or []
        if procs and procs[0] != "memory_limiter":
            out.append(f"pipeline {name}: memory_limiter must come first, got {procs}")
        if "batch" in procs and procs[-1] != "batch":
            out.append(f"pipeline {name}: batch should be the last processor")
    for kind in KINDS:
        for cid in sorted(defined[kind] - used[kind]):
            out.append(f"{kind}: {cid} is defined but not used in any pipeline")
    for cid, sides in connector_sides.items():
        if comp_type(cid) == "spanmetrics" and (sides.get("exporter") != {"traces"}
                                                or sides.get("receiver") != {"metrics"}):
            out.append(f"connector {cid}: must export from traces into metrics, got {sides}")
        elif set(sides) != {"exporter", "receiver"}:
            out.append(f"connector {cid}: used on one side only ({sides})")
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_component_defined_and_used(name: str) -> None:
    assert problems(CONFIGS[name]) == []


def test_the_checker_finds_what_it_looks_for() -> None:
    """The structural check is not vacuous: break a config in each way and it notices."""
    cfg = merge(load(SINGLE), {})
    cfg["exporters"] = {**cfg["exporters"], "otlp/unused": {"endpoint": "x:4317"}}
    cfg["service"] = merge(cfg["service"], {"pipelines": {"traces": {
        "exporters": ["otlp/jaeger", "spanmetrics", "otlp/missing"]}}})
    found = "\n".join(problems(cfg))
    assert "otlp/missing is not defined" in found
    assert "otlp/unused is defined but not used" in found
    cfg2 = merge(load(SINGLE), {"service": {"pipelines": {"metrics": {
        "receivers": ["otlp"]}}}})
    assert any("spanmetrics" in p for p in problems(cfg2))


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


def endpoints(cfg: dict[str, Any]) -> dict[str, str]:
    """component label (as in the docs' ports table) → host:port it listens on."""
    out: dict[str, str] = {}
    for proto, conf in (cfg["receivers"]["otlp"]["protocols"] or {}).items():
        out[f"otlp/{proto}"] = conf["endpoint"]
    if "prometheus" in cfg["exporters"]:
        out["prometheus"] = cfg["exporters"]["prometheus"]["endpoint"]
    if "health_check" in cfg.get("extensions", {}):
        out["health_check"] = cfg["extensions"]["health_check"]["endpoint"]
    return out


def documented_ports() -> dict[str, tuple[int, set[str]]]:
    """The ports table of docs/deployment.md: component → (port, config files)."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    out: dict[str, tuple[int, set[str]]] = {}
    labels = {"`otlp` receiver, gRPC": "otlp/grpc", "`otlp` receiver, HTTP": "otlp/http",
              "`prometheus` exporter": "prometheus", "`health_check` extension": "health_check"}
    for m in re.finditer(r"^\| (\d+) \| ([^|]+) \| ([^|]+) \|", text, re.M):
        label = labels.get(m.group(2).strip())
        if label:
            files = {f.strip() for f in m.group(3).split(",")}
            out[label] = (int(m.group(1)), files)
    return out


def test_ports_table_is_parsed() -> None:
    assert set(documented_ports()) == {"otlp/grpc", "otlp/http", "prometheus", "health_check"}


@pytest.mark.parametrize("name", [SINGLE, GATEWAY, AGENT])
def test_receivers_bind_where_documented(name: str) -> None:
    doc = documented_ports()
    eps = endpoints(CONFIGS[name])
    for label, ep in eps.items():
        host, port = ep.rsplit(":", 1)
        # Inside a container: reachable from the compose network, published on 127.0.0.1.
        assert host == "0.0.0.0", f"{name}: {label} binds {host}"
        assert label in doc, f"{name}: {label} is not in the ports table of deployment.md"
        assert int(port) == doc[label][0], f"{name}: {label} on {port}, docs say {doc[label][0]}"
        assert name in doc[label][1], f"{name}: {label} listens but the docs do not list it"
    for label, (_, files) in doc.items():
        if name in files:
            assert label in eps, f"docs list {label} in {name}, the config has none"


def test_the_tiers_connect() -> None:
    agent, gateway, single = CONFIGS[AGENT], CONFIGS[GATEWAY], CONFIGS[SINGLE]
    lb = {cid: c for cid, c in agent["exporters"].items() if comp_type(cid) == "loadbalancing"}
    pipes = agent["service"]["pipelines"]
    gw_port = int(gateway["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].rsplit(":")[1])
    routing = {}
    for pname, pipe in pipes.items():
        (cid,) = pipe["exporters"]
        routing[signal(pname)] = lb[cid]["routing_key"]
        dns = lb[cid]["resolver"]["dns"]
        assert dns["port"] == gw_port
        assert dns["hostname"] == "otel-gateway"  # the service in compose.gateway.yml
        assert lb[cid]["protocol"]["otlp"]["tls"]["insecure"] is True
    # One proof's spans meet in one gateway; metrics must never be routed by trace id.
    assert routing == {"traces": "traceID", "metrics": "service"}
    for cfg in (single, gateway):
        assert cfg["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"
        assert cfg["exporters"]["prometheus"]["enable_open_metrics"] is True


def parse_go_duration(text: str) -> float:
    units = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    m = re.fullmatch(r"([0-9.]+)(us|µs|ms|s|m|h)", str(text))
    assert m, f"not a Go duration: {text!r}"
    return float(m.group(1)) * units[m.group(2)]


@pytest.mark.parametrize("name", [SINGLE, GATEWAY])
def test_spanmetrics_use_the_seconds_buckets(name: str) -> None:
    sm = CONFIGS[name]["connectors"]["spanmetrics"]
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


def test_serve_scale_out_routes_traces_by_trace_id() -> None:
    cfg = CONFIGS[LB]
    pipes = cfg["service"]["pipelines"]
    routing = {}
    backends = []
    for pname, pipe in pipes.items():
        (cid,) = pipe["exporters"]
        assert comp_type(cid) == "loadbalancing", f"{pname} exports through {cid}"
        lb = cfg["exporters"][cid]
        routing[signal(pname)] = lb["routing_key"]
        otlp = lb["protocol"]["otlp"]
        assert "endpoint" not in otlp  # the exporter sets it per backend
        assert otlp["tls"]["insecure"] is True  # serve speaks plain gRPC
        # A dead backend: retried, queued, then dropped and counted by the collector.
        assert otlp["retry_on_failure"]["enabled"] is True
        assert otlp["sending_queue"]["enabled"] is True
        (resolver,) = lb["resolver"]
        assert resolver == "static"
        backends.append(lb["resolver"]["static"]["hostnames"])
    # A trace's spans meet in one serve process; metrics never routed by trace id.
    assert routing == {"traces": "traceID", "metrics": "service"}
    assert backends[0] == backends[1]
    hosts = backends[0]
    assert len(hosts) >= 2 and len(set(hosts)) == len(hosts)
    own = {int(ep.rsplit(":", 1)[1]) for ep in endpoints(cfg).values()}
    for h in hosts:
        host, port = h.rsplit(":", 1)
        assert host == "127.0.0.1"  # serve listens on loopback unless given a token
        assert int(port) not in own, f"backend {h} is the collector's own port"
    # On the host next to serve, not in a container: loopback only.
    assert {ep.rsplit(":", 1)[0] for ep in endpoints(cfg).values()} == {"127.0.0.1"}


def test_serve_scale_out_documented_commands_match_the_backends() -> None:
    """docs/deployment.md starts one serve per backend on exactly the ports listed."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    section = text.split("## Scaling out `serve`", 1)[1].split("\n## ", 1)[0]
    ports = [int(p) for p in re.findall(r"proofscope serve --grpc-port (\d+)", section)]
    hosts = CONFIGS[LB]["exporters"]["loadbalancing/traces"]["resolver"]["static"]["hostnames"]
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
