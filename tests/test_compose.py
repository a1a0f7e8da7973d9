"""docker-compose.yml and its overrides: valid for Debian's docker-compose 1.29.2.

``docker-compose config`` validates a compose file against its schema and resolves it
without a Docker engine. On top of that: pinned images, every published port on
127.0.0.1, every mounted host path present, and every config file a command names
actually mounted, so the stack does not fail at start-up on a typo.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from peers import collector_config, compose_env

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = shutil.which("docker-compose")
BASE = "docker-compose.yml"
DEBUG = "collector-config/compose.debug.yml"
GATEWAY = "collector-config/compose.gateway.yml"
VARIANTS = {"base": [BASE], "debug": [BASE, DEBUG], "gateway": [BASE, GATEWAY]}

needs_compose = pytest.mark.skipif(
    COMPOSE is None,
    reason="docker-compose binary not installed (Debian package docker-compose; CI installs it)")


def run_compose(files: list[str], *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    assert COMPOSE is not None
    cmd = [COMPOSE, "--project-name", "proofscope"]
    for f in files:
        cmd += ["-f", f]
    # No engine is contacted by `config`; DOCKER_HOST pointing nowhere makes sure of it.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd),
           "DOCKER_HOST": "unix:///nonexistent.sock"}
    return subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env=env)


def resolved(files: list[str]) -> dict[str, Any]:
    return _resolved(tuple(files))


@functools.cache
def _resolved(files: tuple[str, ...]) -> dict[str, Any]:
    done = run_compose(list(files), "config")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = yaml.safe_load(done.stdout)
    return data


@needs_compose
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_config_is_valid(variant: str) -> None:
    done = run_compose(VARIANTS[variant], "config", "-q")
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr  # no deprecation or interpolation warnings


@needs_compose
def test_validation_rejects_a_broken_file(tmp_path: Path) -> None:
    """`config -q` really validates: the same file with an invalid field fails."""
    raw = yaml.safe_load((ROOT / BASE).read_text())
    raw["services"]["grafana"]["ports"] = [{"published": "x", "bogus": 1}]
    (tmp_path / "docker-compose.yml").write_text(yaml.safe_dump(raw))
    done = run_compose(["docker-compose.yml"], "config", "-q", cwd=tmp_path)
    assert done.returncode != 0


@needs_compose
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_images_pinned_and_ports_on_loopback(variant: str) -> None:
    services = resolved(VARIANTS[variant])["services"]
    assert {"otel-collector", "jaeger", "prometheus", "grafana"} <= set(services)
    for name, svc in services.items():
        image = svc["image"]
        repo, _, tag = image.rpartition(":")
        pinned = bool(repo) and tag != "latest" and (tag[:1].isdigit() or tag[:2] == "v2")
        assert pinned, f"{name}: image {image} is not pinned to a version"
        for port in svc.get("ports", []):
            spec = port if isinstance(port, str) else f"{port.get('host_ip')}:"
            assert spec.startswith("127.0.0.1:"), f"{name}: port {port} not bound to 127.0.0.1"


@needs_compose
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_mounts_exist_and_commands_name_mounted_files(variant: str) -> None:
    services = resolved(VARIANTS[variant])["services"]
    for name, svc in services.items():
        mounts: dict[str, Path] = {}
        for vol in svc.get("volumes", []):
            src, target = vol.split(":")[:2]
            if src.startswith("/"):
                assert Path(src).exists(), f"{name}: mounts missing {src}"
                mounts[target] = Path(src)
        for arg in svc.get("command") or []:
            if "=/" not in arg:
                continue
            path = arg.split("=", 1)[1]
            host = next((src / Path(path).relative_to(t) if Path(src).is_dir() else src
                         for t, src in mounts.items()
                         if path == t or path.startswith(t.rstrip("/") + "/")), None)
            if path.startswith("/prometheus"):
                continue  # the data volume
            assert host is not None and host.exists(), f"{name}: {arg} is not a mounted file"


@needs_compose
def test_collector_publishes_what_its_config_listens_on() -> None:
    """The ports compose publishes are those the collector listens on with the
    environment compose gives it, and its traces go where the Jaeger service listens."""
    services = resolved([BASE])["services"]
    published = {p.split(":")[1] for p in services["otel-collector"]["ports"]}
    cfg = collector_config("otel-collector.yaml", compose_env("otel-collector"))
    eps = [conf["endpoint"] for conf in cfg["receivers"]["otlp"]["protocols"].values()]
    eps += [cfg["exporters"]["prometheus"]["endpoint"],
            cfg["extensions"]["health_check"]["endpoint"]]
    assert {ep.rsplit(":", 1)[0] for ep in eps} == {"0.0.0.0"}  # reachable in the network
    assert published == {ep.rsplit(":", 1)[1] for ep in eps}
    jaeger = collector_config("jaeger.yaml", compose_env("jaeger"))
    port = jaeger["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].rsplit(":", 1)[1]
    assert cfg["exporters"]["otlp_grpc/jaeger"]["endpoint"] == f"jaeger:{port}"
    ui = jaeger["extensions"]["jaeger_query"]["http"]["endpoint"].rsplit(":", 1)[1]
    assert {p.split(":")[1] for p in services["jaeger"]["ports"]} == {ui}
    # Prometheus scrapes the collector's exporter port by its service name.
    prom = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    targets = [t for job in prom["scrape_configs"] for sc in job.get("static_configs", [])
               for t in sc["targets"]]
    assert f"otel-collector:{cfg['exporters']['prometheus']['endpoint'].rsplit(':', 1)[1]}" \
        in targets


@needs_compose
def test_gateway_variant() -> None:
    services = resolved([BASE, GATEWAY])["services"]
    assert "otel-collector-agent.yaml" in " ".join(services["otel-collector"]["command"])
    gw = services["otel-gateway"]
    assert "otel-collector-gateway.yaml" in " ".join(gw["command"])
    assert not gw.get("ports"), "gateways are scaled: they must not publish host ports"
    assert any("prometheus-gateway.yml" in a for a in services["prometheus"]["command"])
    debug = resolved([BASE, DEBUG])["services"]["otel-collector"]["command"]
    assert any(a.endswith("/debug.yaml") for a in debug)


def test_grafana_provisioning_points_at_the_mounted_dashboards() -> None:
    """Without docker-compose too: the provider path is where compose mounts them."""
    raw = yaml.safe_load((ROOT / BASE).read_text())
    vols = raw["services"]["grafana"]["volumes"]
    target = next(v.split(":")[1] for v in vols if v.startswith("./deploy/grafana/dashboards"))
    prov = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/dashboards.yaml")
                          .read_text())
    assert [p["options"]["path"] for p in prov["providers"]] == [target]
    home = raw["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(target + "/")
    assert (ROOT / "deploy/grafana/dashboards" / Path(home).name).exists()
    assert raw["version"] == "3.8"
