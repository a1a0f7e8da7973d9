"""`proofscope run`: trace context into the child, exit codes, signals, the child's
proof stream and the GPU sampler."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from otel_proofscope.integrations import run as run_mod
from otel_proofscope.integrations.run import (
    RunConfig,
    child_environment,
    context_from_environment,
    exit_code_of,
    run_process,
)
from otel_proofscope.semconv import Attr, SpanName

FIXTURE = Path(__file__).parent / "fixtures" / "proof_stream_tiny_mlp.jsonl"

OTEL_CHILD = textwrap.dedent("""\
    import os, sys
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    out = open(sys.argv[1], "w")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
        out=out, formatter=lambda span: span.to_json(indent=None) + "\\n")))
    tracer = provider.get_tracer("child-prover")
    # The OTel environment carrier: the context proofscope run passed us.
    ctx = TraceContextTextMapPropagator().extract({"traceparent": os.environ["TRACEPARENT"]})
    with tracer.start_as_current_span("child.prove", context=ctx):
        with tracer.start_as_current_span("child.commit"):
            pass
    provider.shutdown()
    out.close()
    sys.exit(int(sys.argv[2]))
""")

SIGNAL_CHILD = textwrap.dedent("""\
    import pathlib, signal, sys, time
    marker, ready, mode = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
    def on_signal(sig, frame):
        marker.write_text(str(sig))
        sys.exit(42)
    if mode == "handle":
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    elif mode == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.write_text("ready")
    time.sleep(60)
""")

STREAM_CHILD = textwrap.dedent("""\
    import os, sys, time
    lines = open(sys.argv[1]).read().splitlines(keepends=True)
    with open(os.environ["PROOFSCOPE_STREAM"], "a") as f:
        for i, line in enumerate(lines):
            f.write(line)
            f.flush()
            if i == len(lines) // 2:
                time.sleep(0.2)  # the rest arrives later: the reader follows
""")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "PROOFSCOPE_")) and k not in run_mod.CONTEXT_ENV}
    env.update(extra)
    return env


def proofscope(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
               **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "otel_proofscope", "run", "--out", str(tmp_path / "out"),
         "--rerun", "off", "--no-gpu", *args], env=env or clean_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **kw)


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        _out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate()
        pytest.fail(f"proofscope run did not finish: {err}")
    return proc.returncode, err


def parent_spans(tmp_path: Path) -> list[dict[str, Any]]:
    spans = []
    for raw in (tmp_path / "out" / "traces.jsonl").read_text().splitlines():
        for rs in json.loads(raw)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                spans += ss["spans"]
    return spans


def root_of(tmp_path: Path) -> dict[str, Any]:
    (root,) = [s for s in parent_spans(tmp_path) if s["name"] == SpanName.PROOF]
    return root


def attrs(span: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}


def test_child_spans_join_the_parent_trace_and_exit_code_propagates(tmp_path: Path) -> None:
    child = tmp_path / "child.py"
    child.write_text(OTEL_CHILD)
    spans_file = tmp_path / "child-spans.jsonl"
    rc, err = finish(proofscope(tmp_path, "--system", "halo2", "--", sys.executable,
                                str(child), str(spans_file), "7"))
    assert rc == 7, err
    root = root_of(tmp_path)
    child_spans = {s["name"]: s for s in map(json.loads, spans_file.read_text().splitlines())}
    prove, commit = child_spans["child.prove"], child_spans["child.commit"]
    assert prove["context"]["trace_id"] == "0x" + root["traceId"]
    assert prove["parent_id"] == "0x" + root["spanId"]
    assert commit["context"]["trace_id"] == "0x" + root["traceId"]
    assert commit["parent_id"] == prove["context"]["span_id"]
    a = attrs(root)
    assert a[Attr.PROOF_SYSTEM] == "halo2"
    assert int(a["process.exit.code"]) == 7
    assert a["process.executable.name"] == os.path.basename(sys.executable)
    assert "process.command_args" not in a  # may hold secrets: opt-in only
    assert root["status"]["code"] == 2  # ERROR
    assert "exited with code 7" in err


def test_outer_traceparent_makes_run_a_child_span(tmp_path: Path) -> None:
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    env = clean_env(TRACEPARENT=f"00-{trace_id}-{span_id}-01")
    rc, err = finish(proofscope(tmp_path, "--", sys.executable, "-c", "pass", env=env))
    assert rc == 0, err
    root = root_of(tmp_path)
    assert (root["traceId"], root["parentSpanId"]) == (trace_id, span_id)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_are_forwarded_to_the_prover(tmp_path: Path, sig: signal.Signals) -> None:
    child = tmp_path / "child.py"
    child.write_text(SIGNAL_CHILD)
    marker, ready = tmp_path / "marker", tmp_path / "ready"
    proc = proofscope(tmp_path, "--", sys.executable, str(child), str(marker), str(ready),
                      "handle")
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert ready.exists(), proc.stderr.read() if proc.stderr else ""
    proc.send_signal(sig)
    rc, err = finish(proc)
    assert marker.read_text() == str(int(sig))
    assert rc == 42, err
    assert int(attrs(root_of(tmp_path))["process.exit.code"]) == 42


def test_a_signal_while_the_prover_starts_is_held_then_forwarded(tmp_path: Path) -> None:
    """Beside two CPU hogs the prover was up and signalled before `proofscope run` was
    back from starting it: the signal took its default action, proofscope died without
    a summary and the prover slept on. The handlers are now set before the start, and a
    signal that comes first is forwarded once the prover exists."""
    marker, ready = tmp_path / "marker", tmp_path / "ready"
    result = run_mod.RunResult(exit_code=0, returncode=None)
    with run_mod._SignalForwarder(run_mod.RunConfig(argv=["x"]), result) as forwarder:
        os.kill(os.getpid(), signal.SIGTERM)  # before the prover exists: held, not fatal
        time.sleep(0.05)  # (the handler runs between bytecodes; make sure it has)
        child = subprocess.Popen([sys.executable, "-c", SIGNAL_CHILD, str(marker), str(ready),
                                  "handle"])
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.02)
        assert ready.exists()
        forwarder.attach(child)
        assert child.wait(timeout=60) == 42
    assert marker.read_text() == str(int(signal.SIGTERM))
    assert result.signals_forwarded == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is not forwarder._on_signal  # restored


def test_prover_killed_by_a_signal_exits_128_plus_n(tmp_path: Path) -> None:
    child = tmp_path / "child.py"
    child.write_text(SIGNAL_CHILD)
    ready = tmp_path / "ready"
    proc = proofscope(tmp_path, "--", sys.executable, str(child), str(tmp_path / "m"),
                      str(ready), "default")
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    rc, err = finish(proc)
    assert rc == 128 + signal.SIGTERM, err
    assert "SIGTERM" in root_of(tmp_path)["status"]["message"]


def test_a_prover_ignoring_sigterm_is_killed_after_the_bound(tmp_path: Path) -> None:
    child = tmp_path / "child.py"
    child.write_text(SIGNAL_CHILD)
    ready = tmp_path / "ready"
    proc = proofscope(tmp_path, "--kill-after", "0.3", "--", sys.executable, str(child),
                      str(tmp_path / "m"), str(ready), "ignore")
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    rc, err = finish(proc)
    assert rc == 128 + signal.SIGKILL, err
    assert "killed after --kill-after" in err


def test_missing_command_exits_127(tmp_path: Path) -> None:
    rc, err = finish(proofscope(tmp_path, "--", str(tmp_path / "no-such-prover")))
    assert rc == 127 and "cannot start" in err
    assert root_of(tmp_path)["status"]["code"] == 2


def test_no_command_is_a_usage_error(tmp_path: Path) -> None:
    rc, err = finish(proofscope(tmp_path))
    assert rc == 2 and "no command" in err


@pytest.mark.parametrize("mode", ["file", "fifo"])
def test_child_proof_stream_becomes_live_spans_under_the_root(tmp_path: Path, mode: str) -> None:
    child = tmp_path / "child.py"
    child.write_text(STREAM_CHILD)
    rc, err = finish(proofscope(tmp_path, "--stream", mode, "--system", "stwo-ml", "--",
                                sys.executable, str(child), str(FIXTURE)))
    assert rc == 0, err
    spans = parent_spans(tmp_path)
    root = root_of(tmp_path)
    layers = [s for s in spans if s["name"] == SpanName.LAYER]
    assert len(layers) == 6
    assert {s["traceId"] for s in spans} == {root["traceId"]}
    assert all(s["parentSpanId"] == root["spanId"] for s in spans
               if s["spanId"] != root["spanId"])
    assert {attrs(s)["proofscope.stream.timing"] for s in layers} == {"live"}
    a = attrs(root)
    assert a[Attr.PROOF_MODEL_NAME] == "tiny-residual-mlp"  # ProofStart annotated the root
    assert int(a[Attr.PROOF_LAYER_PROOFS]) == 5
    assert "line 13: malformed JSON" in err and "42 event(s)" in err


# ── in process ───────────────────────────────────────────────────────────────────────


def test_child_environment_carries_context_stream_and_otel_settings() -> None:
    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("root") as span:
        env = child_environment({"TRACEPARENT": "00-stale", "OTEL_SERVICE_NAME": "prover",
                                 "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"},
                                {"EXTRA": "1"}, "/tmp/stream")
        ctx = span.get_span_context()
    assert env["TRACEPARENT"] == (f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-"
                                  f"{int(ctx.trace_flags):02x}")
    assert env["OTEL_SERVICE_NAME"] == "prover"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4317"
    assert (env["EXTRA"], env[run_mod.STREAM_ENV]) == ("1", "/tmp/stream")
    outer = context_from_environment(env)
    assert outer is not None
    assert trace.get_current_span(outer).get_span_context().trace_id == ctx.trace_id
    assert context_from_environment({"TRACEPARENT": "garbage"}) is None
    assert (exit_code_of(0), exit_code_of(3), exit_code_of(-15)) == (0, 3, 143)


def test_gpu_sampler_runs_while_the_prover_runs(pipeline: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import otel_proofscope.gpu as gpu

    events: list[str] = []

    class FakeSampler:
        def stop(self, timeout_s: float = 2.0) -> bool:
            events.append("stop")
            return True

    def fake_start(meter_provider: Any = None, **kw: Any) -> FakeSampler:
        assert meter_provider is pipeline.telemetry.meter_provider
        assert kw.get("evidence") == "immediately"  # the child's dispatches are invisible
        events.append("start")
        return FakeSampler()

    monkeypatch.setattr(gpu, "start_sampler", fake_start)
    result = run_process(
        RunConfig(argv=[sys.executable, "-c", "print('proving')"], stream="off"),
        tracer=pipeline.tracer, tracer_provider=pipeline.telemetry.tracer_provider,
        meter_provider=pipeline.telemetry.meter_provider)
    assert result.exit_code == 0 and events == ["start", "stop"]
    (root,) = pipeline.finished()
    assert root.name == SpanName.PROOF and root.attributes["process.exit.code"] == 0


def test_stream_path_is_kept_for_a_later_replay(pipeline: Any, tmp_path: Path) -> None:
    child = tmp_path / "child.py"
    child.write_text(STREAM_CHILD)
    path = tmp_path / "kept.jsonl"
    path.write_text('{"Log":{"level":"Info","message":"from an earlier run"}}\n')
    result = run_process(
        RunConfig(argv=[sys.executable, str(child), str(FIXTURE)], stream_path=str(path),
                  sample_gpus=False),
        tracer=pipeline.tracer, tracer_provider=pipeline.telemetry.tracer_provider,
        meter_provider=pipeline.telemetry.meter_provider)
    assert result.exit_code == 0
    assert path.read_bytes().endswith(FIXTURE.read_bytes())
    spans = pipeline.finished()
    assert sum(s.name == SpanName.LAYER for s in spans) == 6
    logs = [e.attributes["proof.log.message"] for s in spans for e in s.events
            if e.name == "proof.log"]
    assert "from an earlier run" not in logs  # only what this run appended
    assert any("44 line(s)" in line for line in result.stream_lines)
    assert any("line 13" in line for line in result.stream_lines)


def test_wrapped_child_is_the_prover_for_per_process_gpu_usage(
        pipeline: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real sampler over the pynvml stand-in: once `proofscope run` has started its
    child, the child's pid is watched, so its device memory is reported per process."""
    import threading

    from fake_pynvml import FakeGpu, FakeNvml

    import otel_proofscope.gpu as gpu
    from otel_proofscope.gpu import sampler as sampler_mod

    device = FakeGpu(processes=[(1, 1 << 30)])  # init: on the device, never ours
    started: list[Any] = []

    def start(meter_provider: Any = None, **kw: Any) -> Any:
        s = sampler_mod.start_sampler(meter_provider, interval_s=0.02,
                                      nvml=FakeNvml([device]), **kw)
        started.append(s)
        return s

    def put_child_on_the_device() -> None:
        # What NVML would show once the child creates its CUDA context.
        for _ in range(500):
            roots = started[0].watch.roots - {os.getpid()} if started else set()
            if roots:
                (pid,) = roots
                device.processes.append((pid, 3 << 30))
                return
            time.sleep(0.01)

    monkeypatch.setattr(gpu, "start_sampler", start)
    helper = threading.Thread(target=put_child_on_the_device)
    helper.start()
    result = run_process(
        RunConfig(argv=[sys.executable, "-c", "import time; time.sleep(0.6)"], stream="off"),
        tracer=pipeline.tracer, tracer_provider=pipeline.telemetry.tracer_provider,
        meter_provider=pipeline.telemetry.meter_provider)
    helper.join(10)
    assert result.exit_code == 0
    (root,) = pipeline.finished()
    child_pid = root.attributes["process.pid"]
    (sample,) = started[0].latest().values()
    assert [(p.pid, p.memory_used) for p in sample.processes] == [(child_pid, 3 << 30)]
