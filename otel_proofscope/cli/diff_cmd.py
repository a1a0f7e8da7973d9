"""`proofscope diff`: compare two runs' traces and fail when something got slower."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HELP = "compare two runs' traces; exit 1 when a phase, layer kind or span got slower"

DESCRIPTION = """\
Compare BASE and CANDIDATE, two OTLP/JSON-lines trace files (traces.jsonl from
`proofscope demo`, `replay`, configure(), or the collector's file exporter; a folder
means its traces.jsonl). Each proof is one sample: per group (proof phase, layer kind,
sumcheck rounds by layer kind; span name for traces without proof spans) the report
shows count, median, p90 and the change of the median with a 95 % bootstrap interval.
A group is "slower" only when its median grew by more than --threshold percent and
--floor ms per proof, the whole 95 % interval lies above the threshold, and a
one-sided Mann–Whitney test agrees (p < 0.01). When both runs did the same work, a
change shared by every group (machine load moves whole runs) is shown but not judged,
unless --absolute. So two runs of the same configuration do not fail a build, even on
a busy machine.

Exit status: 0 nothing slower, 1 something slower (named on stderr), 2 bad input
(file and line on stderr): also a run without proofs against one with proofs, two runs
with no group in common, and an input over the size caps (a line over 64 MiB, a file
over 2 GiB). A bad line inside a file is reported and counted and the rest is compared.
"""

EPILOG = """\
examples:
  proofscope diff base/ cand/                        text table, worst first
  proofscope diff base/ cand/ --format markdown >> "$GITHUB_STEP_SUMMARY"
  proofscope diff a.jsonl b.jsonl --format json      for tools
  proofscope diff base/ cand/ --by span              any trace, by span name
  proofscope diff base/ cand/ --rerun spawn          both runs side by side in Rerun

Record enough proofs for statistics, e.g. `proofscope demo --repeat 20 --rerun off`
(at least --min-samples per side; 10–30 give a useful interval). See docs/diff.md.
"""


def _percent(value: str) -> float:
    pct = float(value)
    if not pct >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 percent, got {value}")
    return pct


def _milliseconds(value: str) -> float:
    ms = float(value)
    if not ms >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 ms, got {value}")
    return ms


def _min_samples(value: str) -> int:
    n = int(value)
    if n < 2:
        raise argparse.ArgumentTypeError(f"must be >= 2, got {value}")
    return n


def _rerun_target(value: str) -> str:
    from otel_proofscope.rerun.target import parse_target

    try:
        parse_target(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def register(sub: Any) -> None:
    from otel_proofscope.diff.render import Format
    from otel_proofscope.diff.samples import By
    from otel_proofscope.diff.stats import (
        DEFAULT_FLOOR_S,
        DEFAULT_MIN_SAMPLES,
        DEFAULT_THRESHOLD_PCT,
    )

    p: argparse.ArgumentParser = sub.add_parser(
        "diff", help=HELP, description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", metavar="BASE", type=Path, help="trace file or folder (before)")
    p.add_argument("candidate", metavar="CANDIDATE", type=Path,
                   help="trace file or folder (after)")
    p.add_argument("--format", choices=[f.value for f in Format], default=Format.TEXT.value,
                   help="output format (default text)")
    p.add_argument("--by", choices=[b.value for b in By], action="append", default=None,
                   help="group by proof phase, layer kind (+ its sumcheck rounds) or span "
                        "name; repeatable (default: phase and layer-kind for proof traces, "
                        "span for any other)")
    p.add_argument("--threshold", metavar="PCT", type=_percent,
                   default=DEFAULT_THRESHOLD_PCT,
                   help=f"smallest median change that counts (default "
                        f"{DEFAULT_THRESHOLD_PCT:g})")
    p.add_argument("--floor", metavar="MS", type=_milliseconds,
                   default=DEFAULT_FLOOR_S * 1e3,
                   help=f"smallest change of a median, in ms per proof, that counts "
                        f"(default {DEFAULT_FLOOR_S * 1e3:g}: below one time slice lost to "
                        f"a neighbour; 0 on a quiet machine with µs-scale spans)")
    p.add_argument("--min-samples", metavar="N", type=_min_samples,
                   default=DEFAULT_MIN_SAMPLES,
                   help=f"proofs needed on each side for a verdict (default "
                        f"{DEFAULT_MIN_SAMPLES})")
    p.add_argument("--absolute", action="store_true",
                   help="judge raw changes, not changes beyond the run-wide drift (for "
                        "quiet machines or interleaved base/candidate recordings)")
    p.add_argument("--rerun", metavar="TARGET", type=_rerun_target, default=None,
                   help="also draw both runs: spawn | file:PATH.rrd | "
                        "rerun+http://HOST:PORT/proxy")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from otel_proofscope.diff import files, render, report
    from otel_proofscope.diff.samples import By

    try:
        base = files.read(args.base)
        candidate = files.read(args.candidate)
    except files.InputError as exc:
        print(f"proofscope diff: bad input: {exc}", file=sys.stderr)
        return 2
    settings = report.Settings(threshold_pct=args.threshold, floor_s=args.floor / 1e3,
                               min_samples=args.min_samples,
                               by=tuple(dict.fromkeys(By(b) for b in args.by or ())),
                               absolute=args.absolute)
    result = report.build(base, candidate, settings)
    if not result.rows:  # e.g. --by phase on traces without proof spans: never a silent pass
        print(f"proofscope diff: bad input: nothing to compare by "
              f"{', '.join(b.value for b in result.by)} in {base.source} and "
              f"{candidate.source} (try --by span)", file=sys.stderr)
        return 2
    problem = report.unusable(result)
    if problem:  # a run without proofs, or nothing in common: never a silent pass
        print(f"proofscope diff: bad input: {problem}", file=sys.stderr)
        return 2
    for role, side in (("base", result.base), ("candidate", result.candidate)):
        for note in render.input_notes(side, role):
            print(f"proofscope diff: warning: {note}", file=sys.stderr)
    sys.stdout.write(render.render(result, render.Format(args.format)))
    sys.stdout.flush()
    if args.rerun is not None:
        _draw(args.rerun, result)
    for row in result.slower:
        r = row.result
        beyond = f", {render.percent(r.judged_pct)} beyond the run-wide drift " \
            f"{render.percent(result.drift.pct)}" if result.drift.applied else ""
        print(f"proofscope diff: slower: {row.group.label}: median "
              f"{render.duration(r.base.median)} → {render.duration(r.candidate.median)} "
              f"({render.percent(r.delta_pct)}{beyond}; p {render.p_value(r.p_value)})",
              file=sys.stderr)
    return result.exit_code


def _draw(target: str, result: Any) -> None:
    from otel_proofscope.diff import render, rerun_view

    views = rerun_view.layout({"base": result.base.samples.proofs,
                               "candidate": result.candidate.samples.proofs},
                              result.base.samples.contract)
    try:
        where = rerun_view.write(target, views, render.markdown(result, emoji=False, compact=True))
    except Exception as exc:  # a viewer that is gone must not hide the verdict
        print(f"proofscope diff: warning: Rerun output failed ({target}): {exc!r}",
              file=sys.stderr)
        return
    print(f"proofscope diff: recording: {where}", file=sys.stderr)
