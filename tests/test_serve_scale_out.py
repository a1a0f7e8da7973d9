"""The real Collector running ``collector-config/loadbalancing.yaml`` in front of two
real ``proofscope serve`` processes, fed at once by real senders: Node provers (the
official OpenTelemetry JS SDK and OTLP exporters, ``benchmarks/node_fleet``) over gRPC
and HTTP, and the real Plonky3 prover (tests/plonky3_prover) over gRPC and
http/protobuf.

* Both serves up: every trace is drawn whole in exactly one of the two recordings, and
  the spans the serves accepted add up to what the senders sent, as the Collector's own
  metrics say.
* One serve SIGKILLed while the fleet runs: the spans routed to it afterwards are lost,
  and the Collector alone counts them, per backend, exactly; the senders all succeed and
  the surviving serve loses nothing. The Collector counts them in its log ("Exporting
  failed. Dropping data.", ``dropped_items``), not in ``otelcol_exporter_*``: the
  ``load_balancing`` exporter gives its per-backend exporters a no-op meter. The shipped
  retry (120 s) is shortened by a second ``--config`` file merged over the shipped one.

A Plonky3 run joins a chosen trace through ``TRACEPARENT``: its trace ID is picked with
the exporter's hash ring (:func:`backend_of`) so that each backend gets traces and the
dead one gets some after its death, and the Collector must route it where the ring
says. The other senders start their own traces.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from peers import Collector, Process, free_port, peer, wait_for

pytest.importorskip("rerun", reason="rerun-sdk (the [rerun] extra) is not installed")

from otel_proofscope.rerun.readback import read

ROOT = Path(__file__).resolve().parent.parent
FLEET = ROOT / "benchmarks" / "node_fleet"
#: Plonky3's INFO spans of one proof (tests/test_plonky3.py lists them).
PLONKY3_SPANS = 13
#: 2^10 rows: a real proof in well under a second, so several fit the time budget.
LOG_ROWS = "10"
NODE_LAYERS, NODE_ROUNDS = 40, 16
#: The kill test's retry: a dead backend's batches are given up after ~2 s, not 120 s.
SHORT_RETRY = """\
exporters:
  load_balancing/traces:
    protocol:
      otlp:
        retry_on_failure: {initial_interval: 250ms, max_interval: 500ms, max_elapsed_time: 2s}
  load_balancing/metrics:
    protocol:
      otlp:
        retry_on_failure: {initial_interval: 250ms, max_interval: 500ms, max_elapsed_time: 2s}
"""
pytestmark = pytest.mark.filterwarnings("ignore:RRD file has no footer")
_FLAME = re.compile(r"^/trace/flame/([^/]+)/([0-9a-f]{8,32})$")

# ── the load_balancing exporter's ring (contrib v0.161.0, consistent_hashing.go) ────────

_POSITIONS, _WEIGHT, _PROBES = 131071, 200, 10


@cache
def _ring(endpoints: tuple[str, ...]) -> list[tuple[int, str]]:
    """(position, endpoint), sorted: 200 crc32 points per endpoint, collisions probed."""
    hashes = [(zlib.crc32(e.encode() + i.to_bytes(4, "little")), e)
              for e in endpoints for i in range(_WEIGHT)]
    candidates = sorted((h % _POSITIONS, h, e) for h, e in hashes)
    used: set[int] = set()
    items = []
    for pos, _, endpoint in candidates:
        probed = 0
        while pos in used and probed < _PROBES:
            pos, probed = (pos + 1) % _POSITIONS, probed + 1
        if probed < _PROBES:
            used.add(pos)
            items.append((pos, endpoint))
    return sorted(items)


def backend_of(trace_id: bytes, endpoints: Sequence[str]) -> str:
    """The backend ``routing_key: traceID`` sends a trace to: the first ring point at or
    after crc32(trace id), wrapping around."""
    key = zlib.crc32(trace_id) % _POSITIONS
    ring = _ring(tuple(endpoints))
    return next((e for pos, e in ring if pos >= key), ring[0][1])


def trace_for(endpoint: str, endpoints: Sequence[str]) -> str:
    """A random trace ID (32 hex digits) that the ring sends to ``endpoint``."""
    while True:
        tid = secrets.token_bytes(16)
        if backend_of(tid, endpoints) == endpoint:
            return tid.hex()


# ── the processes ──────────────────────────────────────────────────────────────────────


def _clean_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    env["XDG_RUNTIME_DIR"] = str(tmp)
    return env


class Serve(Process):
    """``proofscope serve`` on a fixed gRPC port (the Collector's config names it)."""

    def __init__(self, i: int, tmp: Path) -> None:
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.rrd = tmp / f"serve-{i}.rrd"
        super().__init__([sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port",
                          str(self.port), "--http-port", "off", "--rerun", f"file:{self.rrd}"],
                         tmp / f"serve-{i}.log", _clean_env(tmp), cwd=ROOT)

    def summary(self, orphans: int) -> int:
        """spans_accepted of its exit report, once that report says every one was drawn
        (``orphans`` of them as orphans) and nothing dropped."""
        out = self.output()
        accepted = re.search(r"\bspans_accepted=(\d+)", out)
        assert accepted, out
        n = int(accepted.group(1))
        why = f" ({orphans} as orphans: parent never received)" if orphans else ""
        assert f"rerun: drawn {n} spans{why}; not drawn 0\n" in out, out[-2000:]
        assert "dropped: nothing" in out, out[-2000:]
        return n


def flame_rows(rrd: Path) -> dict[tuple[str, str], int]:
    """(service, trace key) → flame rows: one per span drawn (the trace view)."""
    if not rrd.exists() or rrd.stat().st_size == 0:
        return {}
    rows = {}
    for path, entity in read(rrd).entities.items():
        if m := _FLAME.match(path):
            rows[(m.group(1), m.group(2)[:8])] = len(entity)
    return rows


def live_rows(rrd: Path) -> dict[tuple[str, str], int] | None:
    """flame_rows of a file serve is still writing; None while its last frame is torn."""
    try:
        return flame_rows(rrd)
    except RuntimeError as exc:
        if "exceeds file size" in str(exc):
            return None
        raise


@dataclass
class Sender:
    """A Node prover or a Plonky3 run; ``spans`` is what it says it sent."""

    name: str
    proc: subprocess.Popen[str]
    trace: str | None = None  # the pinned trace ID, if any
    spans: int = 0

    def finish(self, timeout_s: float = 120) -> None:
        try:
            out, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise
        if self.name.startswith("node"):
            line = next((x for x in out.splitlines() if x.startswith("{")), "")
            assert line, f"{self.name}: exit {self.proc.returncode}: {err[-500:]}"
            result = json.loads(line)
            # Its exporter's own report: every batch accepted, after its retries.
            assert result["failed"] == 0 and not result["errors"], result
            assert result["ok"] == result["handed"] == NODE_LAYERS + 2, result
            self.spans = result["ok"]
        else:
            # The prover exits 1 and names the lost spans when its export failed.
            assert self.proc.returncode == 0, f"{self.name}: {out[-500:]}{err[-1500:]}"
            self.spans = PLONKY3_SPANS


def node(protocol: str, endpoint: str, name: str, layer_ms: float = 0) -> Sender:
    return Sender(name, subprocess.Popen(
        ["node", str(FLEET / "prover.mjs"), protocol, endpoint, name, str(NODE_LAYERS),
         str(NODE_ROUNDS), str(layer_ms)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=FLEET))


def plonky3(protocol: str, endpoint: str, name: str, tmp: Path,
            trace: str | None = None) -> Sender:
    env = {**_clean_env(tmp), "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
           "OTEL_EXPORTER_OTLP_PROTOCOL": protocol, "OTEL_SERVICE_NAME": name}
    if trace:
        env["TRACEPARENT"] = f"00-{trace}-{secrets.token_hex(8)}-01"
    return Sender(name, subprocess.Popen(
        [str(peer("plonky3-prover")), "--log-rows", LOG_ROWS], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env), trace)


def dropped_by_endpoint(collector: Collector) -> dict[str, int]:
    """Spans the Collector gave up on, per backend, from its "Dropping data." log lines
    (the per-backend exporters' telemetry is not in its metrics: see the kill test)."""
    out: dict[str, int] = {}
    for line in collector.output().splitlines():
        if "Dropping data" not in line:
            continue
        fields = json.loads(line[line.index("{"):])
        assert fields["otelcol.signal"] == "traces", line
        out[fields["endpoint"]] = out.get(fields["endpoint"], 0) + fields["dropped_items"]
    return out


@dataclass
class Stack:
    tmp: Path
    serves: list[Serve]
    collector: Collector

    @property
    def endpoints(self) -> list[str]:
        return [s.endpoint for s in self.serves]

    def drawn(self) -> dict[str, dict[tuple[str, str], int]]:
        """Backend → its recording's flame rows, read back."""
        return {s.endpoint: flame_rows(s.rrd) for s in self.serves}

    def drawn_at_least(self, spans: int) -> dict[str, dict[tuple[str, str], int]] | None:
        """The recordings of running serves, once they hold ``spans`` flame rows."""
        drawn = {s.endpoint: live_rows(s.rrd) for s in self.serves}
        if any(rows is None for rows in drawn.values()):
            return None
        done = {k: v for k, v in drawn.items() if v is not None}
        return done if sum(sum(rows.values()) for rows in done.values()) >= spans else None


@pytest.fixture
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    if not (FLEET / "node_modules" / "@opentelemetry" / "sdk-trace").is_dir():
        pytest.fail("the OpenTelemetry JS packages are missing: "
                    "npm ci --prefix benchmarks/node_fleet (scripts/test runs it)")
    serves = [Serve(i, tmp_path) for i in range(2)]
    try:
        for s in serves:
            s.wait_ready("serve listening", lambda s=s: "OTLP/gRPC listening" in s.output(),
                         60)
        configs = ["loadbalancing.yaml"]
        if getattr(request, "param", None) == "short-retry":
            # A second --config merged over the shipped one (absolute, so Collector takes
            # it as is): only the retry is changed.
            (tmp_path / "short-retry.yaml").write_text(SHORT_RETRY)
            configs.append(str(tmp_path / "short-retry.yaml"))
        collector = Collector(configs, tmp_path, {"SERVE_BACKEND_0": serves[0].endpoint,
                                                  "SERVE_BACKEND_1": serves[1].endpoint})
        try:
            yield Stack(tmp_path, serves, collector)
        finally:
            collector.stop()
    finally:
        for s in serves:
            s.stop()


def _traces(drawn: dict[str, dict[tuple[str, str], int]]) -> dict[tuple[str, str], list[str]]:
    """(service, trace key) → the backends whose recording holds it."""
    where: dict[tuple[str, str], list[str]] = {}
    for endpoint, rows in drawn.items():
        for key in rows:
            where.setdefault(key, []).append(endpoint)
    return where


def _pinned(senders: Sequence[Sender], rows: dict[tuple[str, str], int]) -> int:
    """Pinned traces in a recording: each one's root has a parent that was never sent
    (TRACEPARENT's), so serve draws it as an orphan."""
    return sum(1 for s in senders if s.trace is not None and any(k[0] == s.name for k in rows))


def _check_whole(senders: Sequence[Sender], drawn: dict[str, dict[tuple[str, str], int]],
                 endpoints: Sequence[str]) -> None:
    """Each sender's one trace in exactly one recording, one flame row per span sent, and
    a pinned trace in the recording of the backend the ring gives it."""
    where = _traces(drawn)
    for s in senders:
        keys = [k for k in where if k[0] == s.name]
        assert len(keys) == 1, (s.name, keys)
        (holder,) = where[keys[0]]  # never in both recordings
        assert drawn[holder][keys[0]] == s.spans, (s.name, drawn[holder][keys[0]], s.spans)
        if s.trace is not None:
            assert keys[0][1] == s.trace[:8]
            assert holder == backend_of(bytes.fromhex(s.trace), endpoints), (
                f"{s.name}: not routed as the ring of _ring says (a new Collector version?)")


def test_each_trace_is_drawn_whole_by_one_serve_and_nothing_is_lost(stack: Stack) -> None:
    c, e = stack.collector, stack.endpoints
    senders = [
        node("grpc", c.grpc_endpoint, "node-grpc-0"), node("grpc", c.grpc_endpoint, "node-grpc-1"),
        node("http", c.http_endpoint, "node-http-0"), node("http", c.http_endpoint, "node-http-1"),
        # One pinned to each backend, so both recordings have traces to check.
        plonky3("grpc", c.grpc_endpoint, "plonky3-grpc-0", stack.tmp, trace_for(e[0], e)),
        plonky3("http/protobuf", c.http_endpoint, "plonky3-http-0", stack.tmp,
                trace_for(e[1], e)),
        plonky3("grpc", c.grpc_endpoint, "plonky3-grpc-1", stack.tmp),
        plonky3("http/protobuf", c.http_endpoint, "plonky3-http-1", stack.tmp),
    ]
    for sender in senders:
        sender.finish()
    sent = sum(s.spans for s in senders)
    wait_for("every span drawn", lambda: stack.drawn_at_least(sent), 60, every_s=0.5)
    metrics = c.own_metrics()
    assert c.stop() == 0
    for serve in stack.serves:
        assert serve.stop() == 0, serve.output()[-2000:]
    drawn = stack.drawn()
    _check_whole(senders, drawn, e)
    accepted = [s.summary(_pinned(senders, drawn[s.endpoint])) for s in stack.serves]
    assert accepted == [sum(drawn[s.endpoint].values()) for s in stack.serves]
    assert sum(accepted) == sent
    # The Collector took every span, handed each to one backend, and gave up on none.
    assert metrics["otelcol_receiver_accepted_spans"] == sent
    assert metrics.get("otelcol_receiver_refused_spans", 0) == 0
    assert metrics.get("otelcol_receiver_failed_spans", 0) == 0
    assert metrics["otelcol_exporter_sent_spans"] == sent
    assert metrics.get("otelcol_exporter_send_failed_spans", 0) == 0
    assert metrics.get("otelcol_exporter_enqueue_failed_spans", 0) == 0
    assert dropped_by_endpoint(c) == {}


@pytest.mark.parametrize("stack", ["short-retry"], indirect=True)
def test_a_killed_serve_s_loss_is_counted_by_the_collector_alone(stack: Stack) -> None:
    c, e = stack.collector, stack.endpoints
    survivor, victim = stack.serves
    # Wave 1, both serves up; one run pinned to each backend, so the victim has work.
    wave1 = [
        node("grpc", c.grpc_endpoint, "node-grpc-0"), node("http", c.http_endpoint, "node-http-0"),
        plonky3("grpc", c.grpc_endpoint, "plonky3-grpc-0", stack.tmp, trace_for(e[1], e)),
        plonky3("http/protobuf", c.http_endpoint, "plonky3-http-0", stack.tmp,
                trace_for(e[0], e)),
    ]
    for sender in wave1:
        sender.finish()
    sent1 = sum(s.spans for s in wave1)
    # Until everything of wave 1 is drawn (so on disk): the victim then holds nothing
    # unanswered, and what it acknowledged is exactly what its recording holds.
    before = wait_for("wave 1 drawn", lambda: stack.drawn_at_least(sent1), 60, every_s=0.5)
    # Wave 2 starts, then the victim dies: Node provers mid-proof (a layer every 100 ms;
    # their batch processor's first export is 5 s after their first span ends, so none
    # has sent anything yet), then Plonky3 runs, one pinned to the dead backend.
    launched = time.monotonic()
    wave2 = [node("grpc", c.grpc_endpoint, f"node-grpc-{i}", 100) for i in (1, 2)] + [
        node("http", c.http_endpoint, f"node-http-{i}", 100) for i in (1, 2)]
    victim.kill()
    assert time.monotonic() - launched < 4, "killed too late: a Node prover may have sent"
    wave2 += [
        plonky3("grpc", c.grpc_endpoint, "plonky3-grpc-1", stack.tmp, trace_for(e[1], e)),
        plonky3("http/protobuf", c.http_endpoint, "plonky3-http-1", stack.tmp,
                trace_for(e[0], e)),
        plonky3("grpc", c.grpc_endpoint, "plonky3-grpc-2", stack.tmp),
    ]
    for sender in wave2:
        sender.finish()  # every sender succeeds: the Collector queued their spans
    sent = sent1 + sum(s.spans for s in wave2)
    acknowledged = sum(before[victim.endpoint].values())
    assert acknowledged > 0 and flame_rows(victim.rrd) == before[victim.endpoint]

    def settled() -> dict[str, int] | None:
        dropped = dropped_by_endpoint(c)
        on_survivor = live_rows(survivor.rrd)
        if on_survivor is None:
            return None
        done = sum(on_survivor.values()) + acknowledged + sum(dropped.values())
        return dropped if done >= sent else None
    # Batches for the dead backend: retried for 2 s each (the overlay), then dropped.
    dropped = wait_for("the dead backend's batches given up", settled, 60, every_s=0.5)
    metrics = c.own_metrics()
    assert c.stop() == 0
    assert survivor.stop() == 0, survivor.output()[-2000:]
    assert dropped_by_endpoint(c) == dropped  # nothing more on the Collector's shutdown

    # The survivor lost nothing: it accepted and drew every span routed to it, each of
    # its traces whole.
    drawn = {survivor.endpoint: flame_rows(survivor.rrd), victim.endpoint: before[victim.endpoint]}
    accepted = survivor.summary(_pinned(wave1 + wave2, drawn[survivor.endpoint]))
    assert accepted == sum(drawn[survivor.endpoint].values())
    where = _traces(drawn)
    assert all(len(holders) == 1 for holders in where.values()), where
    lost = [s for s in wave2 if not any(k[0] == s.name for k in where)]
    _check_whole([s for s in wave1 + wave2 if s not in lost], drawn, e)
    # A pinned run of wave 2 is lost (whole) exactly when the ring sends it to the dead one.
    assert [s.name for s in wave2 if s.trace and s in lost] == ["plonky3-grpc-1"]

    # The loss, counted by the Collector alone, per backend: only for the dead one, and
    # exactly the spans routed there that it never acknowledged. Routed there: everything
    # the senders sent less what the survivor accepted (it lost nothing). Acknowledged:
    # its recording, since it was killed with nothing unanswered (wave 1 fully drawn,
    # wave 2 not yet sent). A serve killed in the middle of a request leaves that batch
    # counted as dropped though it may have drawn it, and a batch acknowledged but not
    # yet drawn lost uncounted: the equality holds because the kill avoids both.
    assert set(dropped) == {victim.endpoint}, dropped
    assert dropped[victim.endpoint] == sent - accepted - acknowledged
    assert dropped[victim.endpoint] == sum(s.spans for s in lost)
    # The Collector's metrics do not see it: load_balancing gives each backend's otlp
    # exporter a no-op meter (contrib factory.go, buildExporterSettings), so its retries
    # and drops never reach otelcol_exporter_*; the load_balancing exporter itself
    # counts as sent every span a backend's queue took, the lost ones included.
    assert metrics["otelcol_receiver_accepted_spans"] == sent
    assert metrics["otelcol_exporter_sent_spans"] == sent
    assert metrics.get("otelcol_exporter_send_failed_spans", 0) == 0
    assert metrics.get("otelcol_exporter_enqueue_failed_spans", 0) == 0
