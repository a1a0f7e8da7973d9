"""A Rerun endpoint that accepts TCP and never answers (a frozen viewer, a wrong port):
every route exits within the shutdown bound and counts what Rerun did not get."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from chaos.faults import child_env, drop_count, run_python, silent_listener

pytestmark = pytest.mark.chaos

BOUND_S = 2.0
#: Interpreter start-up and imports are not part of the bound; this is what we allow.
SLACK_S = 2.5

PROVER = textwrap.dedent("""
    import sys, time
    import otel_proofscope as ps
    t = ps.configure(out_dir=sys.argv[1], rerun=sys.argv[2],
                     shutdown_timeout_s=float(sys.argv[3]), metric_interval_s=60)
    for p in range(3):
        with t.tracer.proof(system="gkr"):
            with t.tracer.layer(index=0, kind="MatMul", rounds=2):
                t.tracer.sumcheck_round(0, poly=[1, 2], claim=3)
                t.tracer.sumcheck_round(1, poly=[1, 2], claim=4)
    print("END", time.monotonic(), flush=True)
""")


def test_prover_exits_within_the_bound_and_counts_rerun_losses(tmp_path: Path) -> None:
    # Drawn by the export process: configure()'s one Rerun route (issue 29).
    with silent_listener() as silent:
        url = f"rerun+http://127.0.0.1:{silent.port}/proxy"
        start = time.monotonic()
        res = run_python(PROVER, str(tmp_path), url, str(BOUND_S), env=child_env(),
                         timeout=60)
        end = time.monotonic()
    assert res.returncode == 0, res.stderr
    out = res.stdout + res.stderr
    ended = float(res.stdout.split("END ")[1].split()[0])
    assert end - ended < BOUND_S + SLACK_S, (end - ended, out)
    assert end - start < 60
    # ground truth: 3 proofs x (proof + layer) = 6 spans with 6 round events, none drawn
    lost = sum(drop_count(out, "spans", "rerun", r)
               for r in ("sink_unavailable", "shutdown", "unconfirmed", "export_failed"))
    assert lost == 6, out
    assert sum(drop_count(out, "span_events", "rerun", r)
               for r in ("sink_unavailable", "shutdown", "unconfirmed", "export_failed")) == 6, out
    assert "dropped: nothing" not in out


def test_serve_with_a_frozen_rerun_viewer_stops_on_sigterm(tmp_path: Path) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    with silent_listener() as silent:
        proc = subprocess.Popen(
            [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "off",
             "--http-port", "0", "--rerun", f"rerun+http://127.0.0.1:{silent.port}/proxy"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=child_env(XDG_RUNTIME_DIR=str(tmp_path)))
        try:
            assert proc.stdout is not None
            endpoint = ""
            while not endpoint:
                line = proc.stdout.readline()
                assert line, "serve exited early"
                if "OTLP/HTTP listening on" in line:
                    endpoint = line.split("listening on")[1].strip()
            tp = TracerProvider()
            tp.add_span_processor(SimpleSpanProcessor(
                OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces", timeout=5)))
            tracer = tp.get_tracer("t")
            for i in range(4):
                with tracer.start_as_current_span(f"s{i}"):
                    pass
            tp.shutdown()
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            start = time.monotonic()
            out, _ = proc.communicate(timeout=30)
            took = time.monotonic() - start
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
    assert proc.returncode == 0, out
    assert took < 3.0 + SLACK_S, (took, out)
    assert "spans_accepted=4" in out
    lost = sum(drop_count(out, "spans", "rerun", r)
               for r in ("sink_unavailable", "shutdown", "unconfirmed", "export_failed"))
    assert lost == 4, out


FREEZE = textwrap.dedent("""
    import sys, time
    import otel_proofscope as ps
    t = ps.configure(out_dir=sys.argv[1], rerun=sys.argv[2],
                     shutdown_timeout_s=float(sys.argv[3]), metric_interval_s=60,
                     span_exporters=())
    def proof():
        with t.tracer.proof(system="gkr"):
            with t.tracer.layer(index=0, kind="MatMul", rounds=1):
                t.tracer.sumcheck_round(0, poly=[1, 2], claim=3)
    proof()
    assert t.force_flush(10)
    print("FIRST", flush=True)
    sys.stdin.readline()  # the viewer is frozen now
    proof(); proof()
    print("END", time.monotonic(), flush=True)
""")


def test_viewer_frozen_mid_run_counts_what_it_did_not_confirm(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from test_rerun_sink import Server, free_port

    server = Server(free_port())
    server.start()
    assert server.proc is not None
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", FREEZE, str(tmp_path),
             f"rerun+http://127.0.0.1:{server.port}/proxy", str(BOUND_S)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=child_env())
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline().strip() == "FIRST"
        server.proc.send_signal(signal.SIGSTOP)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        start = time.monotonic()
        out, _ = proc.communicate(timeout=40)
        end = time.monotonic()
    finally:
        if server.proc is not None:
            server.proc.send_signal(signal.SIGCONT)
        server.kill()
    assert proc.returncode == 0, out
    assert "END" in out, out
    # the first proof (2 spans) was drawn and confirmed before the freeze; the two after
    # it (4 spans) reached a frozen viewer
    lost = sum(drop_count(out, "spans", "rerun", r)
               for r in ("sink_unavailable", "shutdown", "unconfirmed", "export_failed"))
    assert lost == 4, out
    assert "exported to rerun" not in out or "exported to rerun: 2 spans" in out, out
    assert end - start < BOUND_S + SLACK_S, (end - start, out)


@pytest.mark.parametrize("command", [
    ["demo", "--layers", "2", "--width", "8"],
    ["run", "--no-gpu", "--", sys.executable, "-c", "pass"],
], ids=["demo", "run"])
def test_cli_commands_exit_with_a_frozen_viewer(tmp_path: Path, command: list[str]) -> None:
    with silent_listener() as silent:
        url = f"rerun+http://127.0.0.1:{silent.port}/proxy"
        args = [command[0], "--out", str(tmp_path), "--rerun", url, *command[1:]]
        start = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "otel_proofscope", *args], cwd=tmp_path,
                             env=child_env(PROOFSCOPE_SHUTDOWN_TIMEOUT=str(BOUND_S)),
                             capture_output=True, text=True, timeout=60)
        took = time.monotonic() - start
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert took < 20, (took, out)  # it used to hang until killed
    assert "does not answer gRPC" in out, out
    assert drop_count(out, "spans", "rerun", "sink_unavailable") > 0, out
    assert "streamed to the Rerun viewer" not in out
