"""The presets against today's provers: a trace shaped from the span names and fields
each preset cites (sp1 v6.4.0 node and sp1-cluster, jolt-prover and jolt-prover-legacy,
stwo-cairo) maps onto the proof walk, through the entry points ``serve --map`` and
``import --map`` use (``mapper_for`` + ``wrap``, one ``serve --map sp1`` end to end over
real OTLP/gRPC); and ``scripts/preset-names`` on a small source tree and a git dir."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, Tracer

from otel_proofscope.mapping.wiring import mapper_for, summary, wrap
from otel_proofscope.semconv import Attr, EventName, SpanName

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "preset-names"


class Mapped:
    """A preset's mapper in front of an in-memory sink, the way serve wires its sinks."""

    def __init__(self, preset: str) -> None:
        mapper = mapper_for(preset, use_env=False)
        assert mapper is not None
        self.mapper = mapper
        self.sink = InMemorySpanExporter()
        self.provider = TracerProvider(resource=Resource({"service.name": preset}))
        self.provider.add_span_processor(SimpleSpanProcessor(wrap(self.sink, mapper)))
        self.tracer: Tracer = self.provider.get_tracer(preset)

    def spans(self) -> list[ReadableSpan]:
        self.provider.force_flush()
        return list(self.sink.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def summary(self) -> str:
        return summary(self.mapper)


@contextmanager
def span(tracer: Tracer, name: str, **attrs: Any) -> Iterator[trace.Span]:
    with tracer.start_as_current_span(name, attributes=attrs or None) as s:
        yield s


def _source(s: ReadableSpan) -> str:
    return str((s.attributes or {})[Attr.MAPPING_SOURCE_NAME])


def _layers_of(spans: list[ReadableSpan], trace_id: int) -> list[ReadableSpan]:
    layers = [s for s in spans if s.name == SpanName.LAYER and s.context is not None
              and s.context.trace_id == trace_id]
    return sorted(layers, key=lambda s: int((s.attributes or {})[Attr.LAYER_INDEX]))


# ── sp1 ──────────────────────────────────────────────────────────────────────────────


def _sp1_shard(tracer: Tracer) -> None:
    """One shard, as crates/prover/src/worker/prover/core.rs and crates/hypercube/src/
    prover/shard.rs open it (v6.4.0)."""
    with span(tracer, "core prove with pk"), span(tracer, "prove shard with data"):
        for child in ("commit traces", "logup gkr proof", "zerocheck",
                      "prove evaluation claims"):
            with span(tracer, child):
                pass


def test_sp1_v6_node_shape_maps_onto_the_walk() -> None:
    m = Mapped("sp1")
    t = m.tracer
    with span(t, "prove", mode="Groth16") as root:
        with span(t, "execute_program"):
            pass
        for _ in range(3):
            _sp1_shard(t)
        for name in ("prove shrink", "prove wrap", "prove groth16"):
            with span(t, name):
                pass
        for i in range(3):
            with span(t, "verify shard", i=i):
                pass
    trace_id = root.get_span_context().trace_id

    [proof] = m.named(SpanName.PROOF)
    assert _source(proof) == "prove" and proof.attributes is not None
    assert proof.attributes[Attr.PROOF_SYSTEM] == "sp1"
    assert proof.attributes["mode"] == "Groth16"  # the span's own field, kept
    layers = _layers_of(m.spans(), trace_id)
    assert [(_source(s), (s.attributes or {})[Attr.LAYER_INDEX],
             (s.attributes or {})[Attr.LAYER_KIND]) for s in layers] == [
        ("prove shard with data", i, "Shard") for i in range(3)]
    assert len(m.named(SpanName.WEIGHT_OPENING)) == 3
    assert sorted(_source(s) for s in m.named(SpanName.STARK)) == [
        "prove groth16", "prove shrink", "prove wrap"]
    assert len(m.named(SpanName.VERIFY)) == 3
    # the shard's other phases and the execution pass through, under their own names
    names = {s.name for s in m.spans()}
    assert {"execute_program", "core prove with pk", "commit traces", "logup gkr proof",
            "zerocheck"} <= names
    assert "mapped with sp1: 13 of 26 spans" in m.summary()


def test_sp1_cluster_shape_maps_the_task_spans_in_the_proof_trace() -> None:
    """sp1-cluster's worker (crates/worker/src/lib.rs): the root `Prove <proof_id>`, a
    span per task named by its type in the proof's trace, and a linked twin of the same
    name that starts the task's own trace, where the prover's spans are."""
    m = Mapped("sp1")
    t = m.tracer
    proof_id = "proof_01k2q9f3v7c8x"
    twins: list[trace.SpanContext] = []
    with span(t, "Prove", **{"proof.id": proof_id}) as root:
        root.update_name(f"Prove {proof_id}")  # otel.name = format!("Prove {}", proof_id)
        tasks = ["CONTROLLER", "SETUP_VKEY", "PROVE_SHARD", "PROVE_SHARD", "PROVE_SHARD",
                 "RECURSION_REDUCE", "RECURSION_REDUCE", "SHRINK_WRAP", "GROTH16_WRAP"]
        for n, task_type in enumerate(tasks):
            with span(t, task_type, task_id=f"task_{n}", proof_id=proof_id) as outer:
                # the twin: no parent (a new trace), linked to the task span
                token = otel_context.attach(otel_context.Context())
                try:
                    with t.start_as_current_span(
                            task_type, links=[Link(outer.get_span_context())],
                            attributes={"task_id": f"task_{n}", "proof_id": proof_id}) as twin:
                        twins.append(twin.get_span_context())
                        if task_type == "PROVE_SHARD":
                            _sp1_shard(t)
                        elif task_type == "SHRINK_WRAP":
                            for name in ("prove shrink", "prove wrap"):
                                with span(t, name):
                                    pass
                finally:
                    otel_context.detach(token)
    trace_id = root.get_span_context().trace_id

    [proof] = [s for s in m.named(SpanName.PROOF) if s.context.trace_id == trace_id]
    assert _source(proof) == f"Prove {proof_id}"
    layers = _layers_of(m.spans(), trace_id)
    assert [(_source(s), (s.attributes or {})[Attr.LAYER_INDEX]) for s in layers] == [
        ("PROVE_SHARD", 0), ("PROVE_SHARD", 1), ("PROVE_SHARD", 2)]
    in_proof = [s for s in m.spans() if s.context is not None
                and s.context.trace_id == trace_id]
    assert sorted(_source(s) for s in in_proof if s.name == SpanName.STARK) == [
        "GROTH16_WRAP", "RECURSION_REDUCE", "RECURSION_REDUCE", "SHRINK_WRAP"]
    assert [_source(s) for s in in_proof if s.name == SpanName.CIRCUIT_COMPILE] == [
        "SETUP_VKEY"]
    assert [s.name for s in in_proof if s.name == "CONTROLLER"] == ["CONTROLLER"]
    # the twins (roots of their own traces) keep their names; the shard inside each is
    # that trace's layer
    twin_ids = {c.span_id for c in twins}
    assert {s.name for s in m.spans() if s.context.span_id in twin_ids} == set(tasks)
    shard_traces = {c.trace_id for c, name in zip(twins, tasks, strict=True)
                    if name == "PROVE_SHARD"}
    for tid in shard_traces:
        assert [_source(s) for s in _layers_of(m.spans(), tid)] == ["prove shard with data"]


def test_sp1_v5_names_still_map() -> None:
    m = Mapped("sp1")
    t = m.tracer
    with span(t, "prove_core"):
        with span(t, "setup"):
            pass
        with span(t, "prove_shard"), span(t, "open multi batches"):
            pass
        with span(t, "compress"):
            pass
        with span(t, "verify"):
            pass
    assert {s.name for s in m.spans()} == {
        SpanName.PROOF, SpanName.CIRCUIT_COMPILE, SpanName.LAYER, SpanName.WEIGHT_OPENING,
        SpanName.STARK, SpanName.VERIFY}


# ── jolt ─────────────────────────────────────────────────────────────────────────────


def _jolt_batch(tracer: Tracer, rounds: int) -> None:
    """jolt-sumcheck's prove_batch with one `sumcheck_round` span per round."""
    with span(tracer, "prove_batch", num_rounds=rounds, members=2):
        for r in range(rounds):
            with span(tracer, "sumcheck_round", round=r):
                pass


def test_jolt_prover_stages_are_layers_and_sumcheck_rounds_their_rounds() -> None:
    m = Mapped("jolt")
    t = m.tracer
    stages = ["prove_stage1", "prove_stage2", "prove_stage3", "prove_stage4",
              "prove_stage5", "prove_stage6a", "prove_stage6b", "prove_stage7"]
    with span(t, "jolt_prover::prove", trace_length=1 << 16) as root:
        with span(t, "prove_stage0"), span(t, "commit_witness"):
            pass
        for n, stage in enumerate(stages):
            with span(t, stage):
                _jolt_batch(t, rounds=3 + n)
        with span(t, "prove_stage8"), span(t, "JointOpeningPolynomials::prepare"):
            pass
    trace_id = root.get_span_context().trace_id

    [proof] = m.named(SpanName.PROOF)
    assert _source(proof) == "jolt_prover::prove"
    assert proof.attributes is not None and proof.attributes["trace_length"] == 1 << 16
    layers = _layers_of(m.spans(), trace_id)
    assert [_source(s) for s in layers] == stages
    assert [(s.attributes or {})[Attr.LAYER_KIND] for s in layers] == [
        "Stage1", "Stage2", "Stage3", "Stage4", "Stage5", "Stage6a", "Stage6b", "Stage7"]
    for n, layer in enumerate(layers):
        rounds = [e for e in layer.events if e.name == EventName.SUMCHECK_ROUND]
        assert [(e.attributes or {})[Attr.SUMCHECK_ROUND] for e in rounds] == \
            list(range(3 + n)), layer
        assert {(e.attributes or {})[Attr.MAPPING_SOURCE_NAME] for e in rounds} == \
            {"sumcheck_round"}
    [opening] = m.named(SpanName.WEIGHT_OPENING)
    assert _source(opening) == "prove_stage8"
    # the round spans themselves stay, as Jaeger would show them
    assert len(m.named("sumcheck_round")) == sum(3 + n for n in range(len(stages)))
    assert ", 0 round events, 52 round spans as events of their layer" in m.summary()


def test_jolt_prover_legacy_shape() -> None:
    m = Mapped("jolt")
    t = m.tracer
    with span(t, "JoltProverPreprocessing::new"):
        pass
    with span(t, "prove_parts") as root:
        with span(t, "generate_and_commit_witness_polynomials"):
            pass
        for stage in ("prove_stage1", "prove_stage2", "prove_stage3", "prove_stage4",
                      "prove_stage5", "prove_stage6a", "prove_stage6b", "prove_stage7"):
            with span(t, stage):
                with span(t, "InstructionReadRafSumcheckProver::initialize"):
                    pass
                for _ in range(2):
                    with span(t, "InstructionReadRafSumcheckProver::compute_message"):
                        pass
        with span(t, "prove_stage8"):
            pass
    trace_id = root.get_span_context().trace_id
    assert _source(m.named(SpanName.PROOF)[0]) == "prove_parts"
    assert len(_layers_of(m.spans(), trace_id)) == 8
    assert len(m.named(SpanName.CIRCUIT_COMPILE)) == 1
    assert len(m.named(SpanName.WEIGHT_OPENING)) == 1


# ── stwo ─────────────────────────────────────────────────────────────────────────────


def test_stwo_cairo_commitments_are_the_layers() -> None:
    m = Mapped("stwo")
    t = m.tracer
    with span(t, "prove_cairo") as root:
        for name in ("Write Preprocessed trace", "Write Base trace", "Precompute Twiddles",
                     "Compute preprocessed trace commitment", "Compute base trace commitment",
                     "Write interaction trace", "Compute interaction trace commitment"):
            with span(t, name):
                pass
        with span(t, "Prove STARKs"), span(t, "prove"):
            with span(t, "Composition", **{"class": "Composition"}), \
                    span(t, "Generation", **{"class": "CompositionPolynomialGeneration"}):
                pass
            with span(t, "Evaluate columns out of domain"):
                pass
    with span(t, "verify_cairo"):
        pass
    trace_id = root.get_span_context().trace_id

    [proof] = m.named(SpanName.PROOF)
    assert _source(proof) == "prove_cairo"
    assert (proof.attributes or {})[Attr.PROOF_SYSTEM] == "stwo"
    layers = _layers_of(m.spans(), trace_id)
    assert [(s.attributes or {})[Attr.LAYER_KIND] for s in layers] == [
        "PreprocessedTrace", "BaseTrace", "InteractionTrace", "Composition"]
    assert [_source(s) for s in m.named(SpanName.CIRCUIT_COMPILE)] == [
        "Write Preprocessed trace"]
    assert [_source(s) for s in m.named(SpanName.WEIGHT_OPENING)] == [
        "Evaluate columns out of domain"]
    assert [_source(s) for s in m.named(SpanName.STARK)] == ["Prove STARKs"]
    assert [_source(s) for s in m.named(SpanName.VERIFY)] == ["verify_cairo"]
    # stwo's own `prove` inside a Cairo proof is not a second proof
    assert [s.name for s in m.spans()].count("prove") == 1


# ── serve --map, end to end ──────────────────────────────────────────────────────────


def test_serve_map_sp1_v6_over_grpc(tmp_path: Path) -> None:
    """The issue's failure: `serve --map sp1` mapped 0 spans of an SP1 v6 trace."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcSpanExporter,
    )
    from serve_helpers import read_until

    pytest.importorskip("rerun", reason="rerun-sdk (the [rerun] extra) is not installed")
    from otel_proofscope.rerun.readback import read

    rrd = tmp_path / "serve.rrd"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    env.pop("PROOFSCOPE_MAP", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "0",
         "--http-port", "off", "--rerun", f"file:{rrd}", "--map", "sp1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    killer = threading.Timer(60, proc.kill)
    killer.start()
    lines: list[str] = []
    try:
        endpoint = read_until(proc, "OTLP/gRPC listening on", lines)
        provider = TracerProvider(resource=Resource({"service.name": "sp1-node"}))
        provider.add_span_processor(SimpleSpanProcessor(
            GrpcSpanExporter(endpoint=endpoint, insecure=True, timeout=5)))
        t = provider.get_tracer("sp1")
        with span(t, "prove", mode="Compressed"):
            for _ in range(4):
                _sp1_shard(t)
            with span(t, "prove shrink"):
                pass
        provider.shutdown()
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()
        proc.wait(60)
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    text = "".join(lines) + out + err
    assert ("mapped with sp1: 10 of 26 spans (proof=1, proof.layer=4, proof.stark=1, "
            "proof.weight_opening=4)") in text, text
    assert len(read(rrd).rows("gkr/walk/nodes")) == 8  # 4 shards: a row as each starts, ends


# ── scripts/preset-names ─────────────────────────────────────────────────────────────

_FIXTURE_RS = {
    "src/prover.rs": '''
use tracing::{debug_span, info_span, instrument, span, Level};

#[tracing::instrument(skip_all, name = "my_prove", fields(n = 3))]
pub fn prove() {
    let _a = info_span!("commit rows").entered();
    let _b = tracing::debug_span!(parent: None, "open").entered();
    let _c = span!(Level::INFO, "fold layer", i = 1).entered();
    let _d = tracing::span!(tracing::Level::DEBUG, "unmapped helper");
}

#[instrument(
    skip_all,
    level = "debug"
)]
fn verify_all() {}
''',
    "crates/worker/src/lib.rs": '''
fn run() {
    let s = info_span!("task", otel.name = format!("Job {}", id), id = 3);
}
''',
    "target/debug/build/generated.rs": 'fn x() { info_span!("ignored in target"); }',
}

_FIXTURE_RULES = '''
[meta]
name = "fixture"
system = "fx"
sources = ["me/fx: src/prover.rs (my_prove)"]

[[span]]
match = "my_prove"
to = "proof"

[[span]]
match_regex = "^fold layer$"
to = "layer"

[[span]]
match_regex = "^Job \\\\d+$"
to = "stark"

[[span]]
match = "verify_all"
to = "verify"

[[span]]
match = "renamed upstream"
to = "weight_opening"
'''


def _fixture(tmp_path: Path) -> tuple[Path, Path]:
    tree = tmp_path / "checkout"
    for rel, text in _FIXTURE_RS.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    rules = tmp_path / "fixture.toml"
    rules.write_text(_FIXTURE_RULES)
    return tree, rules


def _run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args, "--all"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _check_listing(out: str) -> None:
    matched = out.split("matched (rule", 1)[1].split("rules that match no name", 1)[0]
    assert "#1 (match = 'my_prove' → proof): 'my_prove'  src/prover.rs:4 (instrument)" \
        in matched
    assert "'fold layer'  src/prover.rs:8 (span!)" in matched
    assert "'Job {}'  crates/worker/src/lib.rs:3 (otel.name)" in matched
    assert "'verify_all'" in matched  # #[instrument] without a name: the fn's own
    stale = re.split(r"rules that match no name defined here[^\n]*\(1\):", out)[1].split(
        "names no rule", 1)[0]
    assert "#5 (match = 'renamed upstream' → weight_opening)" in stale
    unmatched = out.split("names no rule matches (", 1)[1]
    for name in ("'commit rows'", "'open'", "'unmapped helper'", "'task'"):
        assert name in unmatched
    assert "ignored in target" not in out


def test_preset_names_on_a_checkout(tmp_path: Path) -> None:
    tree, rules = _fixture(tmp_path)
    proc = _run_script(str(tree), str(rules))
    assert proc.returncode == 1, proc.stderr  # one rule matches nothing
    assert "span names defined" in proc.stdout
    _check_listing(proc.stdout)


def test_preset_names_on_a_bare_git_dir(tmp_path: Path) -> None:
    tree, rules = _fixture(tmp_path)
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", str(tree)], check=True)
    subprocess.run([*git, "-C", str(tree), "add", "src", "crates"], check=True)
    subprocess.run([*git, "-C", str(tree), "commit", "-qm", "fixture"], check=True)
    (tree / "src" / "prover.rs").write_text("// emptied after the commit\n")
    proc = _run_script(str(tree / ".git"), str(rules), "--rev", "HEAD")
    assert proc.returncode == 1, proc.stderr
    _check_listing(proc.stdout)  # read from the commit, not from the work tree


def test_preset_names_says_what_is_wrong() -> None:
    proc = _run_script("/nonexistent/dir", "sp1")
    assert proc.returncode == 2 and "not a directory" in proc.stderr
    proc = _run_script(str(ROOT), "no-such-preset")
    assert proc.returncode == 2 and "no preset or rule file named" in proc.stderr


@pytest.mark.parametrize("preset", ["sp1", "jolt", "stwo"])
def test_every_preset_cites_a_commit_for_its_current_names(preset: str) -> None:
    from otel_proofscope.mapping.rules import load_rules

    rules = load_rules(preset)
    assert any(" @ " in s for s in rules.meta.sources), rules.meta.sources
    text = (ROOT / "docs" / "mapping.md").read_text()
    for source in rules.meta.sources:
        if " @ " in source:
            commit = source.rsplit(" @ ", 1)[1].split()[0]
            assert commit in text, f"docs/mapping.md does not give {preset}'s commit {commit}"
    for rule in rules.spans:  # the refresh checks each rule against its own repository
        assert rule.upstream, f"{preset} [[span]] #{rule.number} names no upstream"


_UPSTREAM_RULES = _FIXTURE_RULES.replace(
    'match = "my_prove"\n', 'match = "my_prove"\nupstream = "me/fx"\n').replace(
    'match = "renamed upstream"\n', 'match = "renamed upstream"\nupstream = "me/fx"\n') + \
    '''
[[span]]
match = "old_root"
upstream = "me/fx"
legacy = "fx before 2.0"
to = "proof"

[[span]]
match = "TASK_KIND"
upstream = "me/fx"
named_at_run_time = "otel.name = kind.as_str()"
to = "layer"

[[span]]
match = "cluster_only"
upstream = "me/fx-cluster"
to = "stark"
'''


def test_preset_names_checks_only_what_this_repository_should_define(tmp_path: Path) -> None:
    """A preset drawn from several repositories, with rules kept for older versions and
    names built at run time: only this repository's current rules can be stale."""
    tree, rules = _fixture(tmp_path)
    rules.write_text(_UPSTREAM_RULES)
    git = ["git", "-C", str(tree)]
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    subprocess.run([*git, "remote", "add", "origin", "https://github.com/me/fx.git"],
                   check=True)
    proc = _run_script(str(tree), str(rules))  # the upstream read from origin
    assert proc.returncode == 1, proc.stderr  # "renamed upstream" is still stale
    stale, apart = proc.stdout.split("not checked here (3):", 1)
    stale = stale.split("rules that match no name defined here (rules from me/fx) (1):")[1]
    assert "'renamed upstream'" in stale and "old_root" not in stale
    assert "'old_root' → proof): kept for fx before 2.0" in apart
    assert "'TASK_KIND' → layer): named at run time: otel.name = kind.as_str()" in apart
    assert "'cluster_only' → stark): from me/fx-cluster" in apart
    # The other repository of the preset: none of its rules is defined here.
    proc = _run_script(str(tree), str(rules), "--upstream", "me/fx-cluster")
    assert proc.returncode == 1
    assert "rules from me/fx-cluster) (1):\n  [[span]] #8 (match = 'cluster_only'" \
        in proc.stdout
    # Every current rule of this repository found: exit 0.
    rules.write_text(_UPSTREAM_RULES.replace('match = "renamed upstream"', 'match = "open"'))
    proc = _run_script(str(tree), str(rules))
    assert proc.returncode == 0, proc.stdout
