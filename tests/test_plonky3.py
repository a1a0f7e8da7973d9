"""A real Plonky3 prover (tests/plonky3_prover: p3-uni-stark 0.8.0 from crates.io, the
Keccak AIR of Plonky3's own example) seen three ways:

* its console: ``proofscope run --map rust-tracing`` reads the tracing-forest tree it
  prints and must rebuild the span tree its own OTLP export gives in the same run: the
  same names, the same nesting, durations within the console's rounding;
* its OTLP spans, live into ``proofscope serve --map plonky3`` at a real size (2^16
  rows): every span drawn, the phases as layers of the walk, the opening, the STARK and
  the verification mapped;
* (tests/test_stack_jaeger.py) through the real Collector into Jaeger.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from peers import peer
from serve_helpers import ProtobufReplies, read_until

from otel_proofscope.mapping.rust_forest import parse_forest_line
from otel_proofscope.mapping.rust_tracing import strip_ansi

pytest.importorskip("rerun", reason="rerun-sdk (the [rerun] extra) is not installed")

from otel_proofscope.rerun.readback import read

ROOT = Path(__file__).resolve().parent.parent
#: Plonky3's INFO spans of one proof, and the program's root around them.
PHASES = {"plonky3-prover", "generate Keccak trace", "prove", "prove_with_preprocessed",
          "commit to trace data", "commit to quotient poly chunks", "open",
          "compute_inverse_denominators", "FRI prover", "commit phase", "query phase",
          "verify", "verify_with_preprocessed"}


@dataclass
class Node:
    name: str
    duration_ns: int
    start_ns: int = 0
    children: list[Node] = field(default_factory=list)

    def paths(self, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Node]]:
        path = (*prefix, self.name)
        yield path, self
        for c in sorted(self.children, key=lambda n: n.start_ns):
            yield from c.paths(path)


def _tree(spans: list[tuple[str, str, str, int, int]], root_name: str) -> Node:
    """(name, span id, parent id, start, end) → the tree under the span named root_name."""
    nodes = {sid: Node(name, end - start, start) for name, sid, _, start, end in spans}
    for _, sid, parent, _, _ in spans:
        if parent in nodes:
            nodes[parent].children.append(nodes[sid])
    (root,) = [nodes[sid] for name, sid, _, _, _ in spans if name == root_name]
    return root


class _Receiver:
    """An OTLP/HTTP trace endpoint that keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, str, int, int]] = []
        self.services: set[str] = set()
        receiver = self

        class Handler(ProtobufReplies):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                req = ExportTraceServiceRequest.FromString(body)
                for rs in req.resource_spans:
                    for kv in rs.resource.attributes:
                        if kv.key == "service.name":
                            receiver.services.add(kv.value.string_value)
                    for ss in rs.scope_spans:
                        receiver.spans += [(s.name, s.span_id.hex(), s.parent_span_id.hex(),
                                            s.start_time_unix_nano, s.end_time_unix_nano)
                                           for s in ss.spans]
                self.reply(200, ExportTraceServiceResponse().SerializeToString())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _otlp_json_spans(path: Path) -> list[tuple[str, str, str, int, int]]:
    import json
    out = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                out += [(s["name"], s["spanId"], s.get("parentSpanId", ""),
                         int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]))
                        for s in ss["spans"]]
    return out


def _clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    env["XDG_RUNTIME_DIR"] = str(tmp_path)
    return env


def test_the_console_tree_is_the_otlp_tree(tmp_path: Path) -> None:
    """One run, two outputs: the forest it prints (read by run) and its OTLP export."""
    receiver = _Receiver()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "otel_proofscope", "run", "--map", "rust-tracing",
             "--rerun", "off", "--out", str(tmp_path / "out"), "--",
             "env", f"OTEL_EXPORTER_OTLP_ENDPOINT={receiver.endpoint}",
             "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
             str(peer("plonky3-prover")), "--forest", "--log-rows", "14"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path,
            env=_clean_env(tmp_path))
    finally:
        receiver.close()
    assert proc.returncode == 0, proc.stderr
    assert "rust-tracing: 13 spans from 1 tracing-forest tree" in proc.stderr, proc.stderr
    assert receiver.services == {"plonky3-prover"}
    console = _tree(_otlp_json_spans(tmp_path / "out" / "traces.jsonl"), "plonky3-prover")
    otlp = _tree(receiver.spans, "plonky3-prover")
    c_paths, o_paths = dict(console.paths()), dict(otlp.paths())
    assert {n for path in o_paths for n in path} == PHASES
    assert list(c_paths) == list(o_paths)  # same names, nesting and order
    for path, node in o_paths.items():
        printed, exported = c_paths[path].duration_ns, node.duration_ns
        # The console prints 3 significant digits (1.27s, 795ms, 448µs): half a unit of
        # the last digit, and a span's idle time before it is entered (none here).
        assert abs(printed - exported) <= 0.0051 * exported + 1_000, (path, printed, exported)


def test_serve_map_plonky3_draws_a_real_proof_live(tmp_path: Path) -> None:
    """2^16 rows, OTLP/gRPC into serve: every span drawn, the walk made of its phases."""
    rrd = tmp_path / "serve.rrd"
    serve = subprocess.Popen(
        [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "0",
         "--http-port", "off", "--rerun", f"file:{rrd}", "--map", "plonky3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_clean_env(tmp_path))
    killer = threading.Timer(300, serve.kill)
    killer.start()
    lines: list[str] = []
    try:
        endpoint = read_until(serve, "OTLP/gRPC listening on", lines)
        env = {**_clean_env(tmp_path), "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{endpoint}",
               "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
        prover = subprocess.run([str(peer("plonky3-prover")), "--forest", "--log-rows", "16"],
                                capture_output=True, text=True, timeout=240, env=env)
        assert prover.returncode == 0, prover.stderr
        serve.send_signal(signal.SIGTERM)
        assert serve.stdout is not None and serve.stderr is not None
        out = serve.stdout.read()
        err = serve.stderr.read()
        serve.wait(60)
    finally:
        killer.cancel()
        if serve.poll() is None:
            serve.kill()
            serve.wait(10)
    assert serve.returncode == 0, err
    printed = [n for line in (prover.stdout + prover.stderr).splitlines()
               if (n := parse_forest_line(strip_ansi(line))) is not None and not n.event]
    sent = len(printed)
    assert {n.name for n in printed} == PHASES
    summary = "".join(lines) + out + err
    assert f"spans_accepted={sent}" in summary, summary
    assert (f"mapped with plonky3: 9 of {sent} spans (proof=1, proof.layer=5, proof.stark=1, "
            "proof.verify=1, proof.weight_opening=1)") in summary, summary
    assert f"rerun: drawn {sent} spans; not drawn 0" in summary, summary

    rec = read(rrd)
    # The walk's nodes, labelled "<their name> [<layer index>] · <trace>": the phases in
    # the order they finish, one node each.
    labels = {label.split(" · ")[0] for row in rec.rows("gkr/walk/nodes")
              for label in row.values["Points3D:labels"]}
    assert labels == {"generate Keccak trace [0]", "commit to trace data [1]",
                      "commit to quotient poly chunks [2]", "commit phase [3]",
                      "query phase [4]"}
    entities = {e.lstrip("/") for e in rec.entities}
    assert any(e.startswith("logs/stark/") for e in entities), sorted(entities)
    assert any(e.startswith("logs/weights/") for e in entities), sorted(entities)
