"""`proofscope serve --map sp1`: a foreign (SP1-named) trace over real OTLP/gRPC becomes
the proof walk in the recording; a bad rule file stops serve before it listens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from test_mapping_apply import _sp1_like_proof

pytest.importorskip("rerun", reason="rerun-sdk (the [rerun] extra) is not installed")

from serve_helpers import read_until

from otel_proofscope.rerun.readback import read

PROCESS_TIMEOUT_S = 60


def test_serve_map_sp1_over_grpc_draws_the_walk(tmp_path: Path) -> None:
    rrd = tmp_path / "serve.rrd"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    env.pop("PROOFSCOPE_MAP", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "0",
         "--http-port", "off", "--rerun", f"file:{rrd}", "--map", "sp1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    killer = threading.Timer(PROCESS_TIMEOUT_S, proc.kill)
    killer.start()
    lines: list[str] = []
    try:
        endpoint = read_until(proc, "OTLP/gRPC listening on", lines)
        provider = TracerProvider(resource=Resource({"service.name": "sp1-prover"}))
        provider.add_span_processor(SimpleSpanProcessor(
            GrpcSpanExporter(endpoint=endpoint, insecure=True, timeout=5)))
        trace_id = _sp1_like_proof(provider.get_tracer("sp1"))
        provider.shutdown()
        proc.send_signal(signal.SIGTERM)
        # Read on through the same file object: iterating it above buffered ahead, and
        # communicate() would skip what that buffer holds.
        assert proc.stdout is not None and proc.stderr is not None
        out = proc.stdout.read()
        err = proc.stderr.read()
        proc.wait(PROCESS_TIMEOUT_S)
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    summary = "".join(lines) + out
    assert "mapping: sp1" in summary
    assert "spans_accepted=13" in summary
    assert ("mapped with sp1: 12 of 13 spans (proof=1, proof.circuit.compile=1, "
            "proof.layer=4, proof.stark=1, proof.verify=1, proof.weight_opening=4)") in summary

    rec = read(rrd)
    p = f"{trace_id:032x}"[:8]
    entities = {e.lstrip("/") for e in rec.entities}
    assert len(rec.rows("gkr/walk/nodes")) == 8
    assert {f"gkr/walk/{p}/cursor", f"proof/layer_seconds/{p}/Unknown",
            f"proof/progress/{p}", f"logs/stark/{p}"} <= entities


def test_serve_refuses_a_bad_rule_file(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from otel_proofscope.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text("[[span]]\nmatch = 'prove'\nto = 'proof'\nkind = 'MatMul'\n")
    rc = main(["serve", "--grpc-port", "0", "--http-port", "off", "--rerun", "off",
               "--map", str(bad)])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"{bad}: [[span]] #1: key 'kind' only applies to to = \"layer\"" in err
