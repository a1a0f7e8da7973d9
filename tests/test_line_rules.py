"""Log-line rules (mapping/lines.py) and the output pump (integrations/mapped_output.py).

The engine is fed the real output of snarkjs 0.7.6 and circom2 0.2.23 (recorded under
tests/fixtures/snarkjs/, colours included); tests/test_snarkjs.py runs the tools live.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.integrations.mapped_output import (
    DROP_SIGNAL,
    MAX_LINE_BYTES,
    LinePump,
    Matcher,
)
from otel_proofscope.ledger import DROPS
from otel_proofscope.mapping.files import PRESETS_DIR, resolve_rule_file
from otel_proofscope.mapping.lines import (
    LineEngine,
    LineRules,
    RuleFileError,
    detect_preset,
    load_line_rules,
    parse_line_rules,
)
from otel_proofscope.rerun.translate import is_layer
from otel_proofscope.semconv import (
    Attr,
    CliProverAttr,
    CliProverEvent,
    CliProverSpanName,
    LayerKind,
    LineAttr,
    SpanName,
    Timing,
)

FIXTURES = Path(__file__).parent / "fixtures" / "snarkjs"
PROVE = "npx snarkjs groth16 prove c.zkey w.wtns proof.json public.json -v"


class Run:
    """An SDK provider with an in-memory sink, a root span and an engine under it."""

    def __init__(self, rules: LineRules, command: str) -> None:
        self.memory = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.memory))
        self.root = self.provider.get_tracer("t").start_span(SpanName.PROOF)
        self.engine = LineEngine(rules, command, self.root, tracer_provider=self.provider)
        self.t = 1_000_000_000

    def feed(self, lines: list[bytes], step_ns: int = 1_000_000) -> None:
        self.engine.begin(self.t)
        for line in lines:
            self.t += step_ns
            self.engine.feed(line, self.t)

    def finish(self) -> list[ReadableSpan]:
        self.t += 1_000_000
        self.engine.finish(self.t)
        self.root.end()
        return list(self.memory.get_finished_spans())


def fixture_lines(name: str) -> list[bytes]:
    return [ln for ln in (FIXTURES / name).read_bytes().split(b"\n") if ln]


def phase(span: ReadableSpan) -> str:
    return span.name  # log-line phases keep their own names (nothing is renamed)


def by_phase(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if phase(s) == name]


@pytest.fixture(scope="module")
def snarkjs() -> LineRules:
    return load_line_rules("snarkjs")


# ── the snarkjs preset on recorded output ────────────────────────────────────────────


def test_groth16_prove_output_becomes_nested_phases(snarkjs: LineRules) -> None:
    run = Run(snarkjs, PROVE)
    run.feed(fixture_lines("groth16_prove_v.out"))
    spans = run.finish()
    root = next(s for s in spans if s.name == SpanName.PROOF)
    assert root.context is not None
    ffts = by_phase(spans, CliProverSpanName.GROTH16_FFT)
    assert sorted((s.attributes or {})[CliProverAttr.GROTH16_POLY] for s in ffts) == \
        ["A", "A", "B", "B", "C", "C"]
    assert sorted(bool((s.attributes or {})[CliProverAttr.GROTH16_INVERSE]) for s in ffts) == \
        [False] * 3 + [True] * 3
    msms = by_phase(spans, CliProverSpanName.GROTH16_MSM)
    assert [(s.attributes or {})[CliProverAttr.GROTH16_MSM_GROUP] for s in msms] == \
        ["A", "B1", "B2", "C", "H"]
    # Drawn on the walk as layers under their own names: the layer attributes do it.
    for s, kind in [(s, LayerKind.FFT) for s in ffts] + [(s, LayerKind.MSM) for s in msms]:
        a = s.attributes or {}
        assert isinstance(a[Attr.LAYER_INDEX], int)
        assert a[Attr.LAYER_KIND] == kind.value
        assert Attr.MAPPING_SOURCE_NAME not in a
        assert is_layer(s)
    assert not any(s.name == SpanName.LAYER for s in spans)
    assert not any(is_layer(s) for s in spans if s not in (*ffts, *msms))
    assert sorted((s.attributes or {})[Attr.LAYER_INDEX] for s in (*ffts, *msms)) == \
        list(range(11))
    for name in (CliProverSpanName.GROTH16_READ, CliProverSpanName.GROTH16_QAP,
                 CliProverSpanName.GROTH16_JOIN):
        assert len(by_phase(spans, name)) == 1, name
    phases = [s for s in spans if s is not root]
    assert len(phases) == 14
    for s in phases:
        a = s.attributes or {}
        assert s.parent is not None and s.parent.span_id == root.context.span_id
        assert a[Attr.PROOFSCOPE_TIMING] == Timing.LOG_ARRIVAL
        assert a[Attr.MAPPING_RULES] == "snarkjs"
        assert s.start_time is not None and s.end_time is not None
        assert s.end_time > s.start_time, phase(s)
        assert LineAttr.UNTERMINATED not in a
    # Chunk progress as events, section reads as events on their MSM.
    qap = by_phase(spans, CliProverSpanName.GROTH16_QAP)[0]
    progress = [e for e in qap.events if e.name == CliProverEvent.GROTH16_PROGRESS]
    assert [(e.attributes or {})[CliProverAttr.GROTH16_QAP_PART] for e in progress] == \
        ["AB", "C"]
    assert (progress[0].attributes or {})[LineAttr.PROGRESS_CHUNKS] == 130
    msm_a = msms[0]
    assert [e.name for e in msm_a.events] == [CliProverSpanName.GROTH16_READ,
                                              CliProverEvent.GROTH16_PROGRESS,
                                              CliProverEvent.GROTH16_PROGRESS]
    stats = run.engine.stats
    assert stats.lines == 58 and stats.matched == 58 and stats.unmatched == 0
    assert (root.attributes or {})[LineAttr.LINES] == 58


def test_msm_chunks_end_when_every_started_chunk_has_ended(snarkjs: LineRules) -> None:
    # Chunks run concurrently: the first end line does not end the MSM.
    lines = [b"[DEBUG] snarkJS: Reading A Points",
             b"[DEBUG] snarkJS: Multiexp start: multiexp A: 0/2048",
             b"[DEBUG] snarkJS: Multiexp start: multiexp A: 1024/2048",
             b"[DEBUG] snarkJS: Multiexp end: multiexp A: 1024/2048",
             b"[DEBUG] snarkJS: Multiexp end: multiexp A: 0/2048",
             b"[DEBUG] snarkJS: Reading B1 Points"]
    run = Run(snarkjs, PROVE)
    run.feed(lines)
    spans = run.finish()
    a, b1 = by_phase(spans, CliProverSpanName.GROTH16_MSM)
    assert a.start_time is not None and a.end_time is not None
    assert a.end_time - a.start_time == 4_000_000  # from "Reading" to the second end line
    assert LineAttr.UNTERMINATED not in (a.attributes or {})
    assert (b1.attributes or {})[LineAttr.UNTERMINATED] is True  # never ended: at exit
    assert run.engine.stats.unterminated == 1


def test_plonk_rounds_steps_ffts_and_msms(snarkjs: LineRules) -> None:
    run = Run(snarkjs, "snarkjs plonk prove c.zkey w.wtns proof.json public.json -v")
    assert snarkjs.root_attributes(run.engine.command)[Attr.PROOF_SYSTEM] == "plonk"
    run.feed(fixture_lines("plonk_prove_v.out"))
    spans = run.finish()
    rounds = by_phase(spans, CliProverSpanName.PLONK_ROUND)
    assert [(s.attributes or {})[CliProverAttr.PLONK_ROUND] for s in rounds] == [1, 2, 3, 4, 5]
    msms = by_phase(spans, CliProverSpanName.PLONK_MSM)
    assert [(s.attributes or {})[CliProverAttr.PLONK_MSM_GROUP] for s in msms] == \
        ["A", "B", "C", "Z", "T1", "T2", "T3", "Wxi", "Wxiw"]
    ffts = by_phase(spans, CliProverSpanName.PLONK_FFT)
    assert len(ffts) == 10
    assert [(s.attributes or {})[Attr.LAYER_KIND] for s in (*msms, *ffts)] == \
        [LayerKind.MSM.value] * 9 + [LayerKind.FFT.value] * 10
    assert sorted((s.attributes or {})[Attr.LAYER_INDEX] for s in (*msms, *ffts)) == \
        list(range(19))
    ids = {s.context.span_id: s for s in spans if s.context is not None}
    for s in (*msms, *ffts):  # MSM/FFT → step → round → proof
        assert s.parent is not None
        step = ids[s.parent.span_id]
        assert phase(step) == CliProverSpanName.PLONK_STEP
        assert step.parent is not None
        assert phase(ids[step.parent.span_id]) == CliProverSpanName.PLONK_ROUND
        assert s.start_time is not None and step.start_time is not None
        assert step.start_time <= s.start_time
        assert s.end_time is not None and step.end_time is not None
        assert s.end_time <= step.end_time
    assert run.engine.stats.unterminated == 0


def test_circom_compile_counts(snarkjs: LineRules) -> None:
    run = Run(snarkjs, "circom2 circuit.circom --r1cs --wasm -o out")
    run.feed(fixture_lines("circom2_compile.out"))
    spans = run.finish()
    (compile_,) = [s for s in spans if s.name == SpanName.CIRCUIT_COMPILE]
    a = compile_.attributes or {}
    assert a[CliProverAttr.CIRCOM_CONSTRAINTS_NONLINEAR] == 64
    assert a[CliProverAttr.CIRCOM_CONSTRAINTS_LINEAR] == 0
    assert a[CliProverAttr.CIRCOM_WIRES] == 193
    assert a[CliProverAttr.CIRCOM_INPUTS_PRIVATE] == 128
    assert LineAttr.UNTERMINATED not in a  # a whole-run span ends with the run


def test_verify_ok_and_invalid_set_proof_verified(snarkjs: LineRules) -> None:
    for line, expected in ((b"\x1b[32;22m[INFO]  \x1b[39;1msnarkJS\x1b[0m: OK!", True),
                           (b"\x1b[31;22m[ERROR] \x1b[39;1msnarkJS\x1b[0m: Invalid proof",
                            False)):
        run = Run(snarkjs, "snarkjs groth16 verify vk.json public.json proof.json")
        run.feed([line])
        spans = run.finish()
        (verify,) = [s for s in spans if s.name == SpanName.VERIFY]
        root = next(s for s in spans if s.name == SpanName.PROOF)
        assert (verify.attributes or {})[Attr.PROOF_VERIFIED] is expected
        assert (root.attributes or {})[Attr.PROOF_VERIFIED] is expected


def test_rules_that_do_not_apply_to_the_command_are_inactive(snarkjs: LineRules) -> None:
    run = Run(snarkjs, "snarkjs groth16 verify vk.json public.json proof.json")
    run.feed(fixture_lines("groth16_prove_v.out"))
    spans = run.finish()
    assert [s.name for s in spans if s.name != SpanName.PROOF] == [SpanName.VERIFY]
    assert run.engine.stats.unmatched == 58


# ── counting, never failing ──────────────────────────────────────────────────────────

RULES = """
[meta]
name = "t"
[[span]]
match = "prove"  # read by the span-rule reader (checked, not applied, here)
to = "proof"
[[line]]
name = "step"
start = '^begin (?P<k>\\w+)$'
end = '^done (?P<k>\\w+)$'
key = ["k"]
[[line]]
name = "tick"
event = '^tick (?P<n>\\S+)$'
capture = { n = "tick.n" }
types = { "tick.n" = "int" }
"""


def rules_from(text: str, tmp_path: Path) -> LineRules:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    return load_line_rules(str(path))


def test_malformed_and_unknown_lines_are_counted_not_fatal(tmp_path: Path) -> None:
    rules = rules_from(RULES, tmp_path)
    run = Run(rules, "prover")
    run.feed([b"begin x", b"tick 3", b"tick three", b"what is this", b"\xff\xfe\x00",
              b"x" * 20000, b"done x"])
    run.engine.malformed_line("stdout: over-long")
    spans = run.finish()
    s = run.engine.stats
    assert (s.lines, s.matched, s.unmatched, s.malformed) == (8, 3, 2, 3)
    assert s.lines == s.matched + s.unmatched + s.malformed
    (step,) = [x for x in spans if x.name == "step"]
    assert [(e.attributes or {})["tick.n"] for e in step.events] == [3]
    assert any("three" in e for e in s.errors)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(
    st.binary(max_size=80), st.text(max_size=80).map(str.encode),
    st.sampled_from([b"begin a", b"begin b", b"done a", b"done b", b"done", b"tick 1",
                     b"tick -x", b"tick 99999999999999999999999"])), max_size=40))
def test_arbitrary_lines_never_raise_and_counts_add_up(tmp_path: Path,
                                                       lines: list[bytes]) -> None:
    run = Run(rules_from(RULES, tmp_path), "prover")
    run.feed(lines)
    spans = run.finish()
    s = run.engine.stats
    assert s.lines == len(lines) == s.matched + s.unmatched + s.malformed
    assert all(x.end_time is not None for x in spans)  # everything open was closed
    assert len([x for x in spans if x.name == "step"]) == s.phases


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=30))
def test_snarkjs_preset_never_raises_on_arbitrary_output(lines: list[bytes]) -> None:
    run = Run(load_line_rules("snarkjs"), PROVE)
    run.feed(lines + fixture_lines("groth16_prove_v.out")[:10] + lines)
    run.finish()
    s = run.engine.stats
    assert s.lines == s.matched + s.unmatched + s.malformed


# ── the rule file ────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(("text", "message"), [
    ("[bogus]\n", "unknown top-level key 'bogus'"),
    ("[[line]]\nname='a'\nstart='x'\nend='y'\ncolour='red'\n", "[[line]] #1: unknown key 'colour'"),
    ("[[line]]\nname='a'\nstart='('\nend='y'\n", "[[line]] #1.start: bad regex"),
    ("[[line]]\nname='a'\nstart='x'\n", "needs end or until_next"),
    ("[[line]]\nname='a'\nstart='x'\nend='y'\ncapture={g='a.g'}\n", "capture group 'g'"),
    ("[[line]]\nname='a'\nstart='x'\nend='y'\nlayer=true\nlayer_kind='Msm'\n",
     "'Msm' is not a layer kind"),
    ("[[line]]\nevent='x'\n", "needs a name"),
    ("[[line]]\nname='a'\nevent='x'\nstart='y'\n", "one of start, event or match"),
    ("[[line]]\nmatch='x'\n", "needs set or capture"),
    ("[[line]]\ncommand='x'\nfile_size='proof.size'\n", "(?P<file>"),
    ("line = 3\n", "array of tables"),
])
def test_bad_rule_files_name_file_table_and_key(tmp_path: Path, text: str,
                                                message: str) -> None:
    with pytest.raises(RuleFileError) as err:
        rules_from(text, tmp_path)
    assert message in str(err.value)
    assert str(tmp_path / "rules.toml") in str(err.value)


def test_other_readers_sections_are_accepted(tmp_path: Path) -> None:
    rules = rules_from(RULES, tmp_path)
    assert [r.kind for r in rules.lines] == ["phase", "event"]
    assert rules.label == str(tmp_path / "rules.toml")


def test_presets_resolve_by_name_or_path(tmp_path: Path) -> None:
    assert resolve_rule_file("snarkjs") == PRESETS_DIR / "snarkjs.toml"
    assert load_line_rules("snarkjs").label == "snarkjs"
    path = tmp_path / "mine.toml"
    path.write_text("")
    assert resolve_rule_file(str(path)) == path
    with pytest.raises(FileNotFoundError, match="snarkjs"):
        resolve_rule_file("nargo")


@pytest.mark.parametrize(("command", "found"), [
    ("npx snarkjs groth16 prove c.zkey w.wtns p.json pub.json -v", True),
    ("/x/node_modules/.bin/snarkjs plonk verify vk.json pub.json p.json", True),
    ("snarkjs g16p c.zkey w.wtns p.json pub.json", True),
    ("npx circom2 c.circom --r1cs --wasm", True),
    ("snarkjs powersoftau new bn128 10 p.ptau", False),
    ("./target/release/prove --model m.onnx", False),
])
def test_presets_are_detected_from_the_command(command: str, found: bool) -> None:
    rules = detect_preset(command)
    assert (rules is not None and rules.label == "snarkjs") is found


def test_every_name_in_the_shipped_preset_is_in_semconv() -> None:
    from otel_proofscope import semconv

    known = {v for cls in (semconv.Attr, semconv.CliProverAttr, semconv.CliProverSpanName,
                           semconv.CliProverEvent, semconv.LineAttr, semconv.SpanName)
             for k, v in vars(cls).items() if k.isupper() and isinstance(v, str)}
    rules = load_line_rules("snarkjs")
    used: set[str] = set()
    for r in rules.lines:
        used |= set(r.capture.values()) | set(r.set) | set(r.root) | set(r.attributes)
        used |= {n for n in (r.name, r.file_size) if n}
    assert used - known == set()
    assert rules.meta["sources"], "every preset cites where its names come from"


def test_parse_rejects_non_table_meta() -> None:
    with pytest.raises(RuleFileError, match=r"\[meta\]"):
        parse_line_rules({"meta": 3}, Path("x.toml"))


# ── the pump: bytes through unchanged ────────────────────────────────────────────────


def pump_through(data: list[bytes]) -> tuple[bytes, list[bytes], list[str]]:
    src_r, src_w = os.pipe()
    dst_r, dst_w = os.pipe()
    lines: list[bytes] = []
    over: list[str] = []
    pump = LinePump(src_r, dst_w, lambda b, t: lines.append(b), over.append, "stdout")
    out = bytearray()

    def drain() -> None:
        while chunk := os.read(dst_r, 65536):
            out.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    pump.start()
    for piece in data:
        os.write(src_w, piece)
    os.close(src_w)
    assert pump.join(10)
    os.close(dst_w)
    reader.join(10)
    os.close(dst_r)
    return bytes(out), lines, over


@settings(max_examples=80, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=20))
def test_pump_passes_every_byte_on_and_splits_lines(pieces: list[bytes]) -> None:
    out, lines, over = pump_through(pieces)
    data = b"".join(pieces)
    assert out == data
    assert lines == [x for x in re.split(rb"[\r\n]", data) if x]
    assert over == []


def test_pump_counts_an_overlong_line_and_keeps_going() -> None:
    big = b"y" * (MAX_LINE_BYTES + 10)
    out, lines, over = pump_through([b"a\n", big[:40000], big[40000:] + b"\nb\n"])
    assert out == b"a\n" + big + b"\nb\n"
    assert lines == [b"a", b"b"]
    assert len(over) == 1


def test_the_rule_files_in_docs_parse() -> None:
    import tomllib

    doc = (Path(__file__).parent.parent / "docs" / "provers.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", doc, flags=re.S)
    assert len(blocks) == 2
    for block in blocks:
        rules = parse_line_rules(tomllib.loads(block), Path("docs/provers.md"))
        assert rules.lines and rules.meta["sources"]
    excerpt = parse_line_rules(tomllib.loads(blocks[0]), Path("excerpt.toml"))
    run = Run(excerpt, PROVE)
    run.feed(fixture_lines("groth16_prove_v.out"))
    spans = run.finish()
    assert len(by_phase(spans, CliProverSpanName.GROTH16_MSM)) == 5
    assert len(by_phase(spans, CliProverSpanName.GROTH16_FFT)) == 6


# ── the CLI: --map, detection, --no-map ──────────────────────────────────────────────


def cli_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    return subprocess.run([sys.executable, "-m", "otel_proofscope", "run", "--out",
                           str(tmp_path / "out"), "--rerun", "off", "--no-gpu", *args],
                          capture_output=True, timeout=120, env=env, cwd=tmp_path)


def test_bad_map_is_a_usage_error_naming_the_problem(tmp_path: Path) -> None:
    proc = cli_run(tmp_path, "--map", "nargo", "--", "true")
    assert proc.returncode == 2
    assert b"no such preset" in proc.stderr and b"snarkjs" in proc.stderr
    (tmp_path / "bad.toml").write_text("[[line]]\nname='x'\nstart='a'\nend='b'\nfoo=1\n")
    proc = cli_run(tmp_path, "--map", str(tmp_path / "bad.toml"), "--", "true")
    assert proc.returncode == 2
    assert b"bad.toml" in proc.stderr and b"[[line]] #1: unknown key 'foo'" in proc.stderr


def test_detected_preset_and_no_map(tmp_path: Path) -> None:
    # A stand-in named snarkjs that replays recorded output (the real one: test_snarkjs.py).
    fake = tmp_path / "snarkjs"
    fake.write_text(f"#!{sys.executable}\nimport sys\n"
                    f"sys.stdout.buffer.write(open({str(FIXTURES / 'groth16_prove_v.out')!r},"
                    " 'rb').read())\nsys.exit(3)\n")
    fake.chmod(0o755)
    command = [str(fake), "groth16", "prove", "c.zkey", "w.wtns", "proof.json", "pub.json", "-v"]
    proc = cli_run(tmp_path, "--", *command)
    assert proc.returncode == 3
    assert proc.stdout == (FIXTURES / "groth16_prove_v.out").read_bytes()
    assert b"mapping snarkjs: log lines: 58 read, 58 matched" in proc.stderr
    assert b"cannot stat proof.json" in proc.stderr  # no proof file: no proof.size, said so
    proc = cli_run(tmp_path, "--no-map", "--", *command)
    assert proc.returncode == 3
    assert proc.stdout == (FIXTURES / "groth16_prove_v.out").read_bytes()
    assert b"mapping" not in proc.stderr


def test_a_missing_prover_exits_127_with_a_map(tmp_path: Path) -> None:
    proc = cli_run(tmp_path, "--map", "snarkjs", "--", str(tmp_path / "no-such-snarkjs"),
                   "groth16", "prove", "a", "b", "c", "d")
    assert proc.returncode == 127
    assert b"cannot start" in proc.stderr
    assert b"mapping snarkjs: log lines: 0 read" in proc.stderr


def test_a_slow_matcher_never_blocks_the_pump_and_counts_what_it_skips(
        snarkjs: LineRules) -> None:
    run = Run(snarkjs, PROVE)
    gate = threading.Event()
    feed = run.engine.feed

    def slow_feed(line: str | bytes, t: int) -> None:
        gate.wait(10)
        feed(line, t)

    run.engine.feed = slow_feed  # type: ignore[method-assign]
    matcher = Matcher(run.engine, max_pending=3)
    matcher.start()
    lines = fixture_lines("groth16_prove_v.out")
    for i, line in enumerate(lines):  # returns at once, full queue or not
        matcher.line(line, i)
    gate.set()
    assert matcher.stop(10)
    run.finish()
    s = run.engine.stats
    assert s.lines == len(lines) == s.matched + s.unmatched + s.malformed + s.dropped
    assert len(lines) - 4 <= s.dropped < len(lines)  # 3 queued + 1 in hand were matched
    assert DROPS.total(signal=DROP_SIGNAL) == s.dropped
    matcher.line(b"late", 0)  # after stop: counted, not matched
    assert run.engine.stats.dropped == s.dropped
