"""User regexes cannot stall serve or the prover (issue 28, items 2, 3 and 14).

The catastrophic pattern ``^(\\w+\\s?)+_prove$`` against a name or a line of 25–40
``a``/``!`` characters took Python's ``re`` seconds to hours (~4x per 2 characters) while
holding the GIL. Each test runs the real path in a subprocess with a wall-clock bound,
so on a backtracking engine it fails by timeout instead of hanging the suite: the span
mapping ``serve --map`` applies, ``serve`` itself over real OTLP/gRPC, and ``run --map``
with a prover printing such lines (its own runtime compared with a run without
``--map``). Load-time checks: a pattern RE2 cannot compile, or a typo in a ``[[span]]``
table, stops ``serve``/``run`` with the file, the rule number and the pattern or key.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from chaos.faults import child_env

pytestmark = pytest.mark.chaos

EVIL = r"^(\w+\s?)+_prove$"
#: Names of 25 to 40 characters of `a` and `!`: the backtracking worst case.
EVIL_NAMES = [("a" * n)[:-1] + "!" for n in (25, 26, 31, 40)] + ["a!" * 20]
#: Generous: RE2 does each in microseconds; `re` needs ~10 s for 25 characters alone.
BOUND_S = 60

RULES = f"""
[meta]
name = "evil"
system = "evil"

[[span]]
match_regex = '{EVIL}'
to = "proof"

[[span]]
match = "layer"
to = "layer"

[[line]]
name = "evil.phase"
start = '{EVIL}'
end = '^done$'

[[line]]
name = "tick"
event = '^(\\w+\\s?)+_tick$'
"""


@pytest.fixture()
def rules(tmp_path: Path) -> Path:
    path = tmp_path / "evil.toml"
    path.write_text(RULES)
    return path


def test_span_mapping_of_hostile_names_returns_promptly(rules: Path) -> None:
    """The mapper serve --map uses (mapper_for + map_span) on hostile span names."""
    code = textwrap.dedent(f"""
        import sys, time
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext
        from otel_proofscope.mapping.wiring import mapper_for
        mapper = mapper_for({str(rules)!r}, use_env=False)
        names = {EVIL_NAMES!r} + ["aaaa bbb_prove"]
        t = time.perf_counter()
        out = [mapper.map_span(ReadableSpan(name=n, context=SpanContext(1, i + 1, False),
                                            resource=Resource({{}}), start_time=1,
                                            end_time=2)).name
               for i, n in enumerate(names)]
        print(out, round(time.perf_counter() - t, 3))
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=child_env(), text=True,
                          capture_output=True, timeout=BOUND_S)
    assert proc.returncode == 0, proc.stderr
    names = eval(proc.stdout.rsplit(" ", 1)[0])  # the printed list
    assert names == [*EVIL_NAMES, "proof"]  # hostile names pass through; a real one maps


def test_serve_keeps_serving_while_hostile_names_arrive(rules: Path, tmp_path: Path) -> None:
    """Hostile names sent to `serve --map` over gRPC; a legitimate proof right after is
    mapped, and SIGTERM stops serve within its usual bound."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from serve_helpers import read_until

    env = child_env(XDG_RUNTIME_DIR=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "0",
         "--http-port", "off", "--rerun", f"file:{tmp_path / 'serve.rrd'}",
         "--map", str(rules)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    killer = threading.Timer(BOUND_S * 2, proc.kill)
    killer.start()
    lines: list[str] = []
    try:
        endpoint = read_until(proc, "OTLP/gRPC listening on", lines)
        provider = TracerProvider(resource=Resource({"service.name": "attacker"}))
        provider.add_span_processor(SimpleSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=BOUND_S)))
        tracer = provider.get_tracer("evil")
        for name in EVIL_NAMES:
            with tracer.start_as_current_span(name):
                pass
        t0 = time.monotonic()
        with tracer.start_as_current_span("real_prove"), \
                tracer.start_as_current_span("layer"):
            pass
        legit_s = time.monotonic() - t0
        provider.shutdown()
        t1 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()
        proc.wait(BOUND_S)
        stop_s = time.monotonic() - t1
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    summary = "".join(lines) + out
    assert f"spans_accepted={len(EVIL_NAMES) + 2}" in summary, summary
    assert (f"mapped with {rules}: 2 of {len(EVIL_NAMES) + 2} spans (proof=1, "
            "proof.layer=1)") in summary
    assert legit_s < BOUND_S / 2 and stop_s < BOUND_S / 2, (legit_s, stop_s)


PRINTER = textwrap.dedent("""
    import os, sys, time
    n = int(sys.argv[1])
    evil = [("a" * k)[:-1] + "!" for k in (25, 26, 31, 40)]
    t = time.perf_counter()
    for i in range(n):
        sys.stdout.write(evil[i % len(evil)] + "\\n")
        if i % 100 == 0:
            sys.stdout.write("aaaa b_prove\\n")  # a real match: opens evil.phase
            sys.stdout.write("done\\n")
    sys.stdout.flush()
    with open(os.environ["CHILD_T"], "a") as f:
        f.write(f"{time.perf_counter() - t:.4f}\\n")
""")


def _run(tmp_path: Path, rules: Path | None, n: int) -> tuple[float, float, str]:
    """(the child's own runtime, our wall time, stderr) of `proofscope run` on PRINTER."""
    stamp = tmp_path / "child_t"
    stamp.unlink(missing_ok=True)
    printer = tmp_path / "printer.py"
    printer.write_text(PRINTER)
    env = child_env(XDG_RUNTIME_DIR=str(tmp_path), CHILD_T=str(stamp))
    cmd = [sys.executable, "-m", "otel_proofscope", "run", "--rerun", "off", "--no-gpu",
           "--out", str(tmp_path / "out"), *(["--map", str(rules)] if rules else []),
           "--", sys.executable, str(printer), str(n)]
    t = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=BOUND_S * 3)
    wall = time.monotonic() - t
    assert proc.returncode == 0, proc.stderr
    return float(stamp.read_text().split()[0]), wall, proc.stderr


def test_run_map_matches_hostile_lines_without_slowing_the_prover(
        rules: Path, tmp_path: Path) -> None:
    n = 20_000
    # interleaved, so load on the machine hits both alike; medians of 3
    plain, mapped = [], []
    err = ""
    for _ in range(3):
        plain.append(_run(tmp_path, None, n)[0])
        child_s, wall_s, err = _run(tmp_path, rules, n)
        mapped.append(child_s)
        assert wall_s < BOUND_S * 2, wall_s
    plain.sort()
    mapped.sort()
    # generous: a stalled match (re on one 26-character line) costs the child 20 s
    assert mapped[1] <= 5 * plain[1] + 2.0, (plain, mapped)
    stats = next(line for line in err.splitlines() if "log lines:" in line)
    read = int(stats.split("log lines: ")[1].split(" read")[0])
    assert read == n + 2 * (n // 100), stats  # every line accounted for
    assert "phases" in stats and "0 malformed" in stats


def test_run_map_reports_a_typo_in_a_span_table(tmp_path: Path) -> None:
    """Issue 30: `run --map FILE -- true` said nothing about a [[span]] typo."""
    bad = tmp_path / "typo.toml"
    bad.write_text("[[line]]\nname = 'x'\nevent = 'x'\n\n[[span]]\nmatch = 'prove'\n"
                   "to = 'proof'\n\n[[span]]\nmatch = 'layer'\nto = 'layer'\nindx = 'i'\n")
    proc = subprocess.run([sys.executable, "-m", "otel_proofscope", "run", "--rerun", "off",
                           "--map", str(bad), "--", "true"], env=child_env(
                               XDG_RUNTIME_DIR=str(tmp_path)),
                          capture_output=True, text=True, timeout=BOUND_S)
    assert proc.returncode == 2, proc.stderr
    assert f"{bad}: [[span]] #2: unknown key 'indx'" in proc.stderr


@pytest.mark.parametrize(("table", "pattern", "where"), [
    ("[[span]]\nmatch_regex = '{p}'\nto = 'proof'\n", r"(a)\1",
     "[[span]] #1 key 'match_regex'"),
    ("[[line]]\nname = 'x'\nstart = '{p}'\nend = 'y'\n", r"prove(?=d)", "[[line]] #1.start"),
])
def test_a_pattern_re2_cannot_use_is_refused_at_load_time(
        tmp_path: Path, table: str, pattern: str, where: str) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[span]]\nmatch = 'ok'\nto = 'verify'\n" if "[[line]]" in table else "")
    with bad.open("a") as f:
        f.write(table.replace("{p}", pattern))
    commands = [["run", "--rerun", "off"]]
    if "[[span]]" in table:  # serve reads only the span tables
        commands.append(["serve", "--grpc-port", "0", "--http-port", "off", "--rerun", "off"])
    for cmd in commands:
        tail = ["--", "true"] if cmd[0] == "run" else []
        proc = subprocess.run([sys.executable, "-m", "otel_proofscope", *cmd, "--map",
                               str(bad), *tail], env=child_env(XDG_RUNTIME_DIR=str(tmp_path)),
                              capture_output=True, text=True, timeout=BOUND_S)
        assert proc.returncode == 2, (cmd, proc.stderr)
        assert str(bad) in proc.stderr and where in proc.stderr, proc.stderr
        assert repr(pattern) in proc.stderr and "RE2" in proc.stderr, proc.stderr


def test_line_and_span_rules_are_numbered_alike(tmp_path: Path) -> None:
    from otel_proofscope.mapping.lines import RuleFileError, load_line_rules
    from otel_proofscope.mapping.rules import RuleError, load_rules

    path = tmp_path / "n.toml"
    path.write_text("[[span]]\nmatch = 'a'\nto = 'proof'\n[[span]]\nmatch = 'b'\nto = 'nope'\n")
    with pytest.raises(RuleError, match=r"\[\[span\]\] #2"):
        load_rules(str(path))
    path.write_text("[[line]]\nname = 'a'\nevent = 'a'\n[[line]]\nname = 'b'\nevnt = 'b'\n")
    with pytest.raises(RuleFileError, match=r"\[\[line\]\] #2"):
        load_line_rules(str(path))
    assert os.path.exists(path)
