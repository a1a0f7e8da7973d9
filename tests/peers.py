"""The real peers the tests run against: found through ``scripts/peers`` (Collector, Jaeger,
provers) or installed by ``scripts/test`` (Debian's ``prometheus``), started on free
127.0.0.1 ports, stopped with their whole process group.

``scripts/test`` runs ``scripts/peers`` once and names its output file in
``PROOFSCOPE_PEERS_FILE``; without it (pytest run by hand) the first test that needs a
peer runs ``scripts/peers NAME`` itself (cached: instant when built). A peer that was not
built fails the test that needs it, naming the peer and quoting the build's error: it is
never skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "peers"
CONFIG_DIR = ROOT / "collector-config"
PEERS = ("otelcol", "jaeger", "plonky3-prover", "arkworks-prover")


def _parse(text: str) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for line in text.splitlines():
        name, sep, path = line.partition("=")
        if sep and name in PEERS:
            found[name] = Path(path)
    return found


@cache
def _built(name: str) -> tuple[Path | None, str]:
    listed = os.environ.get("PROOFSCOPE_PEERS_FILE")
    if listed and Path(listed).is_file():
        path = _parse(Path(listed).read_text()).get(name)
        if path is not None:
            return path, ""
    proc = subprocess.run([str(SCRIPT), name], capture_output=True, text=True, timeout=3600)
    return _parse(proc.stdout).get(name), proc.stderr


def peer(name: str) -> Path:
    """The built binary of a peer, or the test fails naming it."""
    path, log = _built(name)
    if path is None or not path.is_file():
        pytest.fail(f"peer {name} was not built (scripts/peers {name}):\n{log[-3000:]}",
                    pytrace=False)
    return path


# ── the configs of collector-config/ as a collector reads them ─────────────────────────

_ENV = re.compile(r"\$\{env:([A-Z0-9_]+):-([^}]*)\}")


def resolve(value: Any, env: Mapping[str, str] | None = None) -> Any:
    """A config value with ``${env:VAR:-default}`` expanded from ``env``: by default the
    bare host's view (every default)."""
    env = env or {}
    if isinstance(value, dict):
        return {k: resolve(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, env) for v in value]
    if isinstance(value, str):
        return _ENV.sub(lambda m: env.get(m.group(1), m.group(2)), value)
    return value


def variables(name: str) -> dict[str, str]:
    """VAR → its default, for every ``${env:…}`` of a config file."""
    return dict(_ENV.findall((CONFIG_DIR / name).read_text()))


def collector_config(name: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A config file of collector-config/, its variables expanded from ``env``."""
    data: dict[str, Any] = resolve(yaml.safe_load((CONFIG_DIR / name).read_text()), env)
    return data


def compose_env(service: str, *files: str) -> dict[str, str]:
    """The environment docker-compose gives a service (override files merged)."""
    env: dict[str, str] = {}
    for f in ("docker-compose.yml", *files):
        doc = yaml.safe_load((ROOT / f).read_text())
        env.update({k: str(v) for k, v in
                    (doc["services"].get(service, {}).get("environment") or {}).items()})
    return env


def merge(base: Any, overlay: Any) -> Any:
    """The collector's merge of several --config files: maps merge, lists are replaced."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        out = dict(base)
        for k, v in overlay.items():
            out[k] = merge(base[k], v) if k in base else v
        return out
    return overlay


# ── processes ────────────────────────────────────────────────────────────────────────


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(what: str, ok: Any, timeout_s: float, proc: subprocess.Popen[Any] | None = None,
             log: Path | None = None, every_s: float = 0.2) -> Any:
    """Poll ``ok()`` until it returns something truthy; fail with the process's log."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise AssertionError(f"{what}: the process exited ({proc.returncode}):\n{tail}")
        value = ok()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise AssertionError(f"{what}: not within {timeout_s} s\n{tail}")
        time.sleep(every_s)


def http_json(url: str, timeout_s: float = 5.0) -> Any:
    """GET a JSON document; None when the server is not answering (yet)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
        return None


def http_text(url: str, timeout_s: float = 5.0) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            text: str = r.read().decode()
            return text
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


class Process:
    """A peer process in its own session, its output in a log file."""

    def __init__(self, argv: Sequence[str | Path], log: Path,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        self.log = log
        self.argv = [str(a) for a in argv]
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                env={**os.environ, **(env or {})}, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, what: str, ok: Any, timeout_s: float) -> None:
        """Until ``ok()``; a peer that never gets there is stopped, not left running."""
        try:
            wait_for(what, ok, timeout_s, self.proc, self.log)
        except BaseException:
            self.stop()
            raise

    def kill(self) -> None:
        """SIGKILL, as a crash: no shutdown, no flush."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 15.0) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        return self.proc.returncode


class Collector(Process):
    """The real OpenTelemetry Collector on one or more config files of collector-config/,
    every listening address moved to a free 127.0.0.1 port through the variables the
    configs read (docs/deployment.md, "Ports")."""

    def __init__(self, configs: Sequence[str], workdir: Path,
                 env: Mapping[str, str] | None = None) -> None:
        self.otlp_grpc = free_port()
        self.otlp_http = free_port()
        self.prometheus = free_port()
        self.health = free_port()
        self.telemetry = free_port()
        ports = {
            "OTELCOL_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{self.otlp_grpc}",
            "OTELCOL_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{self.otlp_http}",
            "OTELCOL_PROMETHEUS_ENDPOINT": f"127.0.0.1:{self.prometheus}",
            "OTELCOL_HEALTH_ENDPOINT": f"127.0.0.1:{self.health}",
            "OTELCOL_TELEMETRY_PORT": str(self.telemetry),
        }
        argv: list[str | Path] = [peer("otelcol")]
        for name in configs:
            argv += ["--config", CONFIG_DIR / name]
        super().__init__(argv, workdir / "otelcol.log", {**ports, **(env or {})})
        self.wait_ready("the collector's health check", lambda: http_text(
            f"http://127.0.0.1:{self.health}/"), 30)

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.otlp_grpc}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.otlp_http}"

    def own_metrics(self) -> dict[str, float]:
        """The collector's own telemetry, summed per metric name over its labels."""
        text = http_text(f"http://127.0.0.1:{self.telemetry}/metrics") or ""
        sums: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return sums


class Jaeger(Process):
    """Jaeger v2 with collector-config/jaeger.yaml: in-memory storage, OTLP gRPC in."""

    def __init__(self, workdir: Path) -> None:
        self.otlp_grpc = free_port()
        self.query = free_port()
        env = {
            "JAEGER_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{self.otlp_grpc}",
            "JAEGER_QUERY_HTTP_ENDPOINT": f"127.0.0.1:{self.query}",
            "JAEGER_QUERY_GRPC_ENDPOINT": f"127.0.0.1:{free_port()}",
            "JAEGER_TELEMETRY_PORT": str(free_port()),
        }
        super().__init__([peer("jaeger"), "--config", CONFIG_DIR / "jaeger.yaml"],
                         workdir / "jaeger.log", env)
        self.wait_ready("Jaeger's query API", lambda: http_json(self.api("services")), 30)

    @property
    def otlp_endpoint(self) -> str:
        """What otel-collector.yaml's JAEGER_OTLP_ENDPOINT takes."""
        return f"127.0.0.1:{self.otlp_grpc}"

    def api(self, path: str, **params: str | int) -> str:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        return f"http://127.0.0.1:{self.query}/api/{path}{query}"

    def traces(self, service: str) -> list[dict[str, Any]]:
        body = http_json(self.api("traces", service=service, limit=1000, lookback="1h"))
        return list(body["data"]) if body and body.get("data") else []


class Prometheus(Process):
    """The Debian prometheus binary (``scripts/test`` installs it) on a free 127.0.0.1
    port, its config and storage in ``workdir``; ``name`` keeps two apart in one workdir.
    Missing, it fails the test that needs it, as a peer that was not built does."""

    def __init__(self, config: Mapping[str, Any], workdir: Path, name: str = "prometheus",
                 flags: Sequence[str] = ()) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is not installed (Debian package prometheus; scripts/test "
                        "installs it)", pytrace=False)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = workdir / f"{name}.yml"
        cfg.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        super().__init__(
            [binary, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / (name + '-data')}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
             "--storage.tsdb.retention.time=1h", *flags], workdir / f"{name}.log")
        try:
            wait_for(f"{name} ready", lambda: http_text(f"{self.url}/-/ready", 1.0), 30,
                     self.proc, self.log)
        except BaseException:  # its own session: nobody else would stop it
            self.stop()
            raise

    def api(self, path: str, **params: str | float) -> Any:
        """``/api/v1/<path>``'s data; a refused query fails with Prometheus's error."""
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

    def query_range(self, expr: str, start: float, end: float,
                    step_s: float = 1.0) -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=start, end=end, step=step_s)
        result: list[dict[str, Any]] = data["result"]
        return result


def scrape_config(file: str, job: str, targets: Sequence[str], interval_s: float,
                  ) -> dict[str, Any]:
    """A shipped Prometheus config of deploy/ reduced to one of its jobs, that job's
    targets replaced (its relabelling kept as shipped) and every interval set."""
    shipped = yaml.safe_load((ROOT / "deploy" / file).read_text())
    (scrape,) = [j for j in shipped["scrape_configs"] if j["job_name"] == job]
    scrape["static_configs"] = [{"targets": list(targets)}]
    every = f"{interval_s:g}s"
    return {"global": {"scrape_interval": every, "evaluation_interval": every},
            "scrape_configs": [scrape]}
