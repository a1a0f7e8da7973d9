"""`proofscope import` end to end on files written by a real producer (viztracer), to
OTLP/JSON files and a real .rrd read back; mapping rules turn it into the proof walk."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from otel_proofscope.cli import main
from otel_proofscope.semconv import Attr, EventName, ImportAttr, SpanName

pytest.importorskip("viztracer", reason="viztracer (dev extra) is not installed")

#: A small "prover" traced by viztracer's own API: function spans, instant events (one
#: per round) and a counter, as a user of viztracer would record them.
PROVER = '''
import sys
from viztracer import VizTracer

tracer = VizTracer(output_file=sys.argv[1], verbose=0)
tracer.start()

def layer(i):
    for r in range(2):
        tracer.log_instant("round done", args={"round": r, "claim": str(7 * r + i)})
    tracer.add_counter("memory", {"rss": 1000 + i})
    return i

def prove():
    return [layer(i) for i in range(3)]

prove()
tracer.stop()
tracer.save()
'''

RULES = '''
[meta]
name = "viztracer-demo"
system = "demo"
sources = ["this test: tests/test_import_cmd.py (PROVER)"]

[[span]]
match_regex = "^prove \\\\("
to = "proof"

[[span]]
match_regex = "^layer \\\\("
to = "layer"
kind = "MatMul"

[[event]]
match = "round done"
to = "round"
round_from = "round"
copy = { "proof.claim" = "claim" }
'''


@pytest.fixture(scope="module")
def viztrace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("viz")
    script, out = d / "prover.py", d / "result.json"
    script.write_text(PROVER)
    subprocess.run([sys.executable, str(script), str(out)], check=True, timeout=120,
                   cwd=d, capture_output=True)
    return out


def _spans(path: Path) -> list[dict[str, Any]]:
    return [s for line in path.read_text().splitlines()
            for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]
            for s in ss["spans"]]


def _attrs(item: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in item.get("attributes", [])}


def test_import_a_viztracer_file_exactly(viztrace: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    rc = main(["import", str(viztrace), "--out", str(out), "--rerun", "off",
               "--rebase", "keep"])
    err = capsys.readouterr().err
    assert rc == 0, err
    source = json.loads(viztrace.read_text(), parse_float=Decimal)["traceEvents"]
    complete = [e for e in source if e["ph"] == "X"]
    spans = _spans(out / "traces.jsonl")
    assert len(spans) == len(complete)
    # µs × 1000, exactly (viztracer writes 3 decimals for ts and ~15 for dur)
    starts = sorted(int(s["startTimeUnixNano"]) for s in spans)
    assert starts == sorted(int(e["ts"] * 1000) for e in complete)
    ends = sorted(int(s["endTimeUnixNano"]) for s in spans)
    assert ends == sorted(int(e["ts"] * 1000)
                          + int((e["dur"] * 1000).to_integral_value()) for e in complete)
    layers = [s for s in spans if s["name"].startswith("layer (")]
    assert len(layers) == 3
    assert all(len(s.get("events", [])) == 2 for s in layers)  # the instants, on their span
    pid = source[0]["pid"]
    first = _attrs(layers[0])
    assert first[ImportAttr.THREAD_NAME] == "MainThread" and first[ImportAttr.PHASE] == "X"
    resource = json.loads((out / "traces.jsonl").read_text().splitlines()[0])[
        "resourceSpans"][0]["resource"]
    assert _attrs(resource)[ImportAttr.PROCESS_PID] == str(pid)  # intValue is a string
    assert _attrs(resource)[ImportAttr.PROCESS_NAME] == "MainProcess"
    assert len({s["traceId"] for s in spans}) == 1
    # the counter: three points with the file's own timestamps
    counters = [e for e in source if e["ph"] == "C"]
    points = [p for line in (out / "metrics.jsonl").read_text().splitlines()
              for rm in json.loads(line)["resourceMetrics"] for sm in rm["scopeMetrics"]
              for m in sm["metrics"] if m["name"] == "memory"
              for p in m["gauge"]["dataPoints"]]
    assert sorted((int(p["timeUnixNano"]), int(p["asInt"])) for p in points) == sorted(
        (int(e["ts"] * 1000), e["args"]["rss"]) for e in counters)
    assert f"read {len(source)} entries: {len(source)} used, 0 ignored, 0 skipped" in err
    assert "imported 5 spans in 1 trace, 6 span events, 3 counter points" in err


def test_import_with_rules_draws_the_walk(viztrace: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("rerun", reason="rerun-sdk is not installed")
    from otel_proofscope.rerun.readback import read

    rules = tmp_path / "viz.toml"
    rules.write_text(RULES)
    out, rrd = tmp_path / "out", tmp_path / "viz.rrd"
    rc = main(["import", str(viztrace), "--map", str(rules), "--out", str(out),
               "--rerun", f"file:{rrd}"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert (f"mapped with {rules}: 4 of 5 spans (proof=1, proof.layer=3), 6 round events"
            in err)
    spans = _spans(out / "traces.jsonl")
    layers = sorted((s for s in spans if s["name"] == SpanName.LAYER),
                    key=lambda s: int(s["startTimeUnixNano"]))
    assert [int(_attrs(s)[Attr.LAYER_INDEX]) for s in layers] == [0, 1, 2]
    rounds = [e for e in layers[1]["events"]]
    assert [e["name"] for e in rounds] == [EventName.SUMCHECK_ROUND] * 2
    assert [int(_attrs(e)[Attr.SUMCHECK_ROUND]) for e in rounds] == [0, 1]
    assert [_attrs(e)[Attr.CLAIM] for e in rounds] == ["1", "8"]
    root = next(s for s in spans if s["name"] == SpanName.PROOF)
    assert _attrs(root)[Attr.MAPPING_SOURCE_NAME].startswith("prove (")

    rec = read(rrd)
    entities = {e.lstrip("/") for e in rec.entities}
    p = root["traceId"][:8]
    assert len(rec.rows("gkr/walk/nodes")) == 6
    assert len(rec.rows("gkr/walk/rounds")) >= 1
    assert {f"gkr/walk/{p}/cursor", f"proof/layer_seconds/{p}/MatMul",
            f"gkr/round_ms/{p}", "metrics/memory/rss"} <= entities


def test_malformed_file_reports_positions_and_strict_fails(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str],
                                                           ) -> None:
    path = tmp_path / "t.json"
    text = ('[{"ph":"X","name":"a","ts":1,"dur":2,"pid":1,"tid":1},\n'
            '{"ph":"X","name":"b","ts":"x","dur":2},\n{oops},\n'
            '{"ph":"X","name":"c","ts":5,"dur":1,"pid":1,"tid":1}')
    path.write_text(text)
    args = ["import", str(path), "--out", str(tmp_path / "o"), "--rerun", "off"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "read 4 entries: 2 used, 0 ignored, 2 skipped" in err
    second = text.index('{"ph":"X","name":"b"')
    assert f"event #1 (byte {second}): invalid ts: 'x'" in err
    assert f"event #2 (byte {text.index('{oops}')}): malformed JSON" in err
    assert "not closed" in err
    assert len(_spans(tmp_path / "o" / "traces.jsonl")) == 2
    assert main([*args, "--strict"]) == 1
    capsys.readouterr()


def test_unrecognised_input_is_refused(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.csv"
    path.write_text("name,ts\n")
    assert main(["import", str(path), "--rerun", "off", "--out", str(tmp_path)]) == 2
    assert "format not recognised" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "missing.json"), "--rerun", "off"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_import_to_an_otlp_endpoint(viztrace: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT set: the spans go over real OTLP/gRPC, exactly."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_proofscope.integrations.otlp_receiver import OtlpReceiver

    received = InMemorySpanExporter()
    with OtlpReceiver([received], grpc_port=0, http_port=None) as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://{receiver.grpc_endpoint}")
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
        rc = main(["import", str(viztrace), "--out", str(tmp_path / "o"), "--rerun", "off",
                   "--rebase", "keep"])
        err = capsys.readouterr().err
    assert rc == 0, err
    assert "exported to otlp: 5 spans, 6 span events" in err
    source = json.loads(viztrace.read_text(), parse_float=Decimal)["traceEvents"]
    spans = received.get_finished_spans()
    assert sorted(s.start_time for s in spans) == sorted(
        int(e["ts"] * 1000) for e in source if e["ph"] == "X")
    assert not (tmp_path / "o" / "traces.jsonl").exists()


def test_rebase_now_shifts_every_timestamp_by_one_constant(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    path = tmp_path / "t.json"
    path.write_text('[{"ph":"X","name":"a","ts":10.001,"dur":5.5,"pid":1,"tid":1},'
                    '{"ph":"X","name":"b","ts":12,"dur":1,"pid":1,"tid":1}]')
    before = time.time_ns()
    assert main(["import", str(path), "--rebase", "now", "--out", str(tmp_path / "o"),
                 "--rerun", "off"]) == 0
    capsys.readouterr()
    spans = {s["name"]: s for s in _spans(tmp_path / "o" / "traces.jsonl")}
    a0, a1 = int(spans["a"]["startTimeUnixNano"]), int(spans["a"]["endTimeUnixNano"])
    b0 = int(spans["b"]["startTimeUnixNano"])
    assert before <= a0 <= time.time_ns()
    assert (a1 - a0, b0 - a0) == (5_500, 1_999)


def _jolt_like_chrome_trace() -> list[dict[str, Any]]:
    """A tracing-chrome-shaped file with the jolt preset's span names: B/E pairs on one
    thread, round spans as complete events (what tracing-chrome writes for spans)."""
    ev: list[dict[str, Any]] = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1,
                                 "args": {"name": "main"}}]

    def span(name: str, b: float, e: float) -> None:
        ev.append({"ph": "B", "name": name, "ts": b, "pid": 1, "tid": 1, "cat": "jolt"})
        ev.append({"ph": "E", "name": name, "ts": e, "pid": 1, "tid": 1, "cat": "jolt"})

    span("Jolt::preprocess", 0.5, 9.5)
    span("Jolt::prove", 10.0, 200.0)
    span("Spartan2::sumcheck::prove_spartan_cubic", 20.0, 60.0)
    span("BatchedCubicSumcheck::prove_sumcheck", 61.0, 100.0)
    span("ProverOpeningAccumulator::reduce_and_prove", 110.0, 190.0)
    span("prove_batch_opening_reduction", 111.0, 170.0)
    for r in range(4):
        ev.append({"ph": "X", "name": "compute_quadratic", "ts": 112.0 + 10 * r,
                   "dur": 8.25, "pid": 1, "tid": 1, "cat": "jolt"})
    span("verify", 201.0, 230.0)
    return ev


def test_import_with_the_jolt_preset_draws_layers_and_round_bars(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("rerun", reason="rerun-sdk is not installed")
    from otel_proofscope.rerun.readback import read

    path, rrd = tmp_path / "trace-jolt.json", tmp_path / "jolt.rrd"
    path.write_text(json.dumps(_jolt_like_chrome_trace()))
    rc = main(["import", str(path), "--map", "jolt", "--out", str(tmp_path / "o"),
               "--rerun", f"file:{rrd}", "--rebase", "keep"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert ("mapped with jolt: 7 of 11 spans (proof=1, proof.circuit.compile=1, "
            "proof.layer=3, proof.verify=1, proof.weight_opening=1), 0 round events, "
            "4 round spans as events of their layer") in err
    spans = _spans(tmp_path / "o" / "traces.jsonl")
    layers = {_attrs(s)[Attr.LAYER_KIND]: s for s in spans if s["name"] == SpanName.LAYER}
    assert set(layers) == {"Spartan", "GrandProduct", "OpeningReduction"}
    rounds = layers["OpeningReduction"]["events"]
    assert [int(_attrs(e)[Attr.SUMCHECK_ROUND]) for e in rounds] == [0, 1, 2, 3]
    assert [int(e["timeUnixNano"]) for e in rounds] == [120_250, 130_250, 140_250, 150_250]
    rec = read(rrd)
    p = next(s for s in spans if s["name"] == SpanName.PROOF)["traceId"][:8]
    entities = {e.lstrip("/") for e in rec.entities}
    assert len(rec.rows("gkr/walk/nodes")) == 6
    assert [r.times["proof_time"] for r in rec.rows("gkr/walk/rounds")] == [
        120_250, 130_250, 140_250, 150_250]  # one bar per round, at its end
    assert {f"gkr/round_ms/{p}", f"proof/layer_seconds/{p}/Unknown"} <= entities


def test_import_a_node_trace_events_file(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Node's --trace-events-enabled writes Chrome trace events too: X, B/E, async b/e,
    instants and metadata from a real producer."""
    import collections
    import shutil

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    script = tmp_path / "t.js"
    script.write_text('let s = 0; for (let i = 0; i < 1e5; i++) s += i; '
                      'setTimeout(() => console.log(s), 5);')
    subprocess.run([node, "--trace-event-categories", "v8,node", "--trace-events-enabled",
                    str(script)], cwd=tmp_path, check=True, timeout=60, capture_output=True)
    trace = tmp_path / "node_trace.1.log"
    source = json.loads(trace.read_text())["traceEvents"]
    phases = collections.Counter(e["ph"] for e in source)
    assert phases["X"] and phases["B"] and phases["b"]  # what this test is about
    out = tmp_path / "out"
    assert main(["import", str(trace), "--out", str(out), "--rerun", "off", "--strict"]) == 0
    err = capsys.readouterr().err
    assert f"read {len(source)} entries:" in err and " 0 skipped" in err
    spans = _spans(out / "traces.jsonl")
    instants = phases["I"] + phases["i"] + phases["n"]
    events = sum(len(s.get("events", [])) for s in spans)
    # every span event pair and instant is there: as an event or a zero-length span
    assert len(spans) + events == phases["X"] + phases["B"] + phases["b"] + instants
    assert phases["B"] == phases["E"] and phases["b"] == phases["e"]


# ── times OTLP cannot hold (issue 28 item 5), the default timeline, backpressure ─────

_BAD_TIMES = [
    {"ph": "X", "name": "ok", "ts": 10, "dur": 1, "pid": 1, "tid": 1},
    {"ph": "X", "name": "huge", "ts": 1e308, "dur": 1, "pid": 1, "tid": 1},
    {"ph": "X", "name": "quoted", "ts": "1e30", "dur": 1, "pid": 1, "tid": 1},
    {"ph": "X", "name": "past_2_64", "ts": 2e16, "dur": 1, "pid": 1, "tid": 1},
    {"ph": "X", "name": "long", "ts": 20, "dur": 1e308, "pid": 1, "tid": 1},
    {"ph": "X", "name": "negative", "ts": -5, "dur": 1, "pid": 1, "tid": 2},
    {"ph": "C", "name": "mem", "ts": -7, "pid": 1, "args": {"rss": 1}},
]


def test_times_otlp_cannot_hold_are_refused_one_by_one_and_counted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_BAD_TIMES))
    out = tmp_path / "o"
    args = ["import", str(path), "--out", str(out), "--rerun", "off", "--rebase", "keep"]
    assert main(args) == 0
    err = capsys.readouterr().err
    spans = _spans(out / "traces.jsonl")
    assert [s["name"] for s in spans] == ["ok"]  # the good span costs nothing
    for s in spans:
        assert 0 <= int(s["startTimeUnixNano"]) <= int(s["endTimeUnixNano"]) < 2 ** 64
    assert "read 7 entries: 3 used, 0 ignored, 4 skipped" in err
    assert "ts outside ±2**63 ns (what OTLP and Rerun can hold) ×3" in err
    assert "ts + dur ends past 2**63 ns (what OTLP and Rerun can hold) ×1" in err
    assert ("refused 1 span (with 0 events) and 1 counter point: times outside [0, 2**63) "
            "ns") in err
    assert "span 'negative' at -5000 ns: before 1970" in err
    # in the ledger too: the exit summary's dropped lines and proofscope.dropped
    assert "1 spans → import (invalid)" in err
    assert "1 metric_points → import (invalid)" in err
    assert "4 trace_events → import (invalid)" in err
    assert "dropped: nothing" not in err
    assert main([*args, "--strict"]) == 1
    capsys.readouterr()


def test_the_default_timeline_starts_at_the_import_and_keeps_the_files_times(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from otel_proofscope.integrations.trace_import.convert import (
        SOURCE_START_NS,
        TIME_OFFSET_NS,
    )

    path = tmp_path / "t.json"
    path.write_text(json.dumps(_BAD_TIMES[:1] + _BAD_TIMES[5:6]))  # ts 10 and ts -5 µs
    before = time.time_ns()
    assert main(["import", str(path), "--out", str(tmp_path / "o"), "--rerun", "off"]) == 0
    err = capsys.readouterr().err
    spans = {s["name"]: s for s in _spans(tmp_path / "o" / "traces.jsonl")}
    neg, ok = spans["negative"], spans["ok"]  # -5 µs is the first event: now
    assert before <= int(neg["startTimeUnixNano"]) <= time.time_ns()
    assert int(ok["startTimeUnixNano"]) - int(neg["startTimeUnixNano"]) == 15_000
    assert int(_attrs(ok)[SOURCE_START_NS]) == 10_000
    assert int(_attrs(neg)[SOURCE_START_NS]) == -5_000
    resource = json.loads((tmp_path / "o" / "traces.jsonl").read_text().splitlines()[0])[
        "resourceSpans"][0]["resource"]
    assert int(_attrs(resource)[TIME_OFFSET_NS]) == int(neg["startTimeUnixNano"]) + 5_000
    assert "times shifted by" in err and "dropped: nothing" in err
    # a file already in wall-clock time keeps it
    wall = time.time_ns() // 1000 - 3_600_000_000  # an hour ago, in µs
    path.write_text(json.dumps([{"ph": "X", "name": "a", "ts": wall, "dur": 1}]))
    assert main(["import", str(path), "--out", str(tmp_path / "w"), "--rerun", "off"]) == 0
    capsys.readouterr()
    (span,) = _spans(tmp_path / "w" / "traces.jsonl")
    assert int(span["startTimeUnixNano"]) == wall * 1000
    assert SOURCE_START_NS not in _attrs(span)


def test_an_offline_import_waits_for_a_small_sink_instead_of_dropping(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The Rerun view is drawn by the export process (configure()'s one Rerun route,
    whose start alone can outlast the shutdown bound on a loaded machine): its queue is
    not visible here, so the wait is a flush that travels to the child."""
    pytest.importorskip("rerun", reason="rerun-sdk is not installed")
    monkeypatch.setenv("PROOFSCOPE_RERUN_QUEUE", "64")
    monkeypatch.setenv("PROOFSCOPE_MAX_QUEUE", "128")
    # 3,000 spans: one root holding 20 layers of 149 leaves each (a trace as deep as a
    # prover's), so end order would make everything wait for the root
    events: list[dict[str, Any]] = [{"ph": "X", "name": "root", "ts": 0, "dur": 10 ** 6,
                                     "pid": 1, "tid": 1}]
    for layer in range(20):
        base = 1 + layer * 40_000
        events.append({"ph": "X", "name": f"layer{layer}", "ts": base, "dur": 39_000,
                       "pid": 1, "tid": 1})
        events += [{"ph": "X", "name": "leaf", "ts": base + 1 + 200 * k, "dur": 100,
                    "pid": 1, "tid": 1, "args": {"k": k}} for k in range(149)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(events))
    rrd = tmp_path / "t.rrd"
    rc = main(["import", str(path), "--out", str(tmp_path / "o"), "--rerun", f"file:{rrd}"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "imported 3001 spans in 1 trace" in err
    assert "dropped: nothing" in err, err
    # (the drawn count is process-wide: earlier tests in this process add to it)
    assert "rerun: drawn" in err and "orphan" not in err, err
    assert len(_spans(tmp_path / "o" / "traces.jsonl")) == 3001


def test_the_summary_counts_and_plurals(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 30: "1 spans", and span events miscounted under --map jolt."""
    path = tmp_path / "t.json"
    events = [{"ph": "X", "name": "only", "ts": 1, "dur": 10, "pid": 1, "tid": 1}]
    events += [{"ph": "i", "name": f"e{k}", "ts": 2 + k, "pid": 1, "tid": 1}
               for k in range(7)]
    path.write_text(json.dumps(events))
    assert main(["import", str(path), "--out", str(tmp_path / "o"), "--rerun", "off",
                 "--map", "jolt"]) == 0
    err = capsys.readouterr().err
    assert "imported 1 span in 1 trace, 7 span events, 0 counter points" in err
    mine = [line for line in err.splitlines() if line.startswith("proofscope import: read")
            or line.startswith("proofscope import: imported")
            or line.startswith("proofscope import: exported")]
    assert not any("1 spans" in line or "1 traces" in line for line in mine)
    assert "exported to file: 1 span, 7 span events, 0 metric points" in err
