"""A :class:`~otel_proofscope.diff.report.Report` as markdown, plain text or JSON. Pure.

Markdown is written for ``$GITHUB_STEP_SUMMARY``: one headline that says whether anything
got slower, a line about the inputs, then the table worst first. JSON is for tools; its
durations are seconds and its shape is versioned by ``schema``.
"""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import Any

from otel_proofscope.diff.report import Report, Row, Side
from otel_proofscope.diff.stats import Verdict

SCHEMA = "proofscope.diff/1"
#: Slower groups named in the headline (the table and stderr name all of them).
HEADLINE_GROUPS = 3


class Format(StrEnum):
    MARKDOWN = "markdown"
    JSON = "json"
    TEXT = "text"


def duration(seconds: float) -> str:
    """Seconds in the unit that keeps three significant figures readable."""
    if math.isnan(seconds):
        return "–"
    a = abs(seconds)
    if a >= 1:
        return f"{seconds:.3g} s" if a < 100 else f"{seconds:.0f} s"
    if a >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    if a >= 1e-6:
        return f"{seconds * 1e6:.3g} µs"
    return f"{seconds * 1e9:.0f} ns"


def percent(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1f} %"


def interval(ci: tuple[float, float] | None) -> str:
    return "–" if ci is None else f"{ci[0]:+.1f} … {ci[1]:+.1f} %"


def p_value(p: float | None) -> str:
    if p is None:
        return "–"
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


def headline(report: Report) -> str:
    slower = report.slower
    threshold = f"{report.settings.threshold_pct:g} %"
    beyond = " beyond the run" if report.drift.applied else ""
    if slower:
        worst = ", ".join(f"{r.group.label} {percent(r.result.judged_pct)}{beyond}"
                          for r in slower[:HEADLINE_GROUPS])
        more = len(slower) - HEADLINE_GROUPS
        return f"{len(slower)} slower beyond {threshold}: {worst}" + (
            f" and {more} more" if more > 0 else "")
    faster = len(report.with_verdict(Verdict.FASTER))
    unchanged = len(report.with_verdict(Verdict.UNCHANGED))
    few = len(report.with_verdict(Verdict.TOO_FEW))
    parts = [f"{unchanged} unchanged"] + ([f"{faster} faster"] if faster else []) + (
        [f"{few} with too few samples"] if few else [])
    line = f"nothing slower beyond {threshold} ({', '.join(parts)})"
    d = report.drift
    if d.applied and abs(d.pct) > report.settings.threshold_pct:
        # Never hide it: a uniform change and machine load look the same here.
        line += f"; the whole run moved {percent(d.pct)} alike (load or a uniform change)"
    return line


def input_notes(side: Side, role: str) -> list[str]:
    """Lines about what could not be read from one side (empty when all was read)."""
    f = side.file
    notes: list[str] = []
    if f.bad_line_count:
        first = f.bad_lines[0]
        notes.append(f"{role} {f.source}: {f.bad_line_count} bad line(s) skipped and counted "
                     f"(first: line {first.line}: {first.reason})")
    if f.rejected_spans:
        notes.append(f"{role} {f.source}: {f.rejected_spans} span(s) rejected "
                     f"({f.rejected_reasons[0] if f.rejected_reasons else 'malformed'})")
    if side.samples.duplicates:
        notes.append(f"{role} {f.source}: {side.samples.duplicates} repeated span(s) (same "
                     f"trace and span id) counted once")
    if side.samples.outside_proofs:
        notes.append(f"{role} {f.source}: {side.samples.outside_proofs} span(s) under no "
                     f"proof span, not grouped")
    return notes


def _inputs(report: Report) -> str:
    s = report.settings
    return (f"base `{report.base.file.source}` ({report.base.proofs} proofs) → candidate "
            f"`{report.candidate.file.source}` ({report.candidate.proofs} proofs); "
            f"by {', '.join(b.value for b in report.by)}; threshold {s.threshold_pct:g} % "
            f"and {duration(s.floor_s)}, "
            f"Mann–Whitney α {s.alpha:g}, ≥ {s.min_samples} proofs a side")


def drift_line(report: Report) -> str:
    d = report.drift
    if d.groups == 0:
        return f"run-wide change {d.reason}"
    return f"run-wide change {percent(d.pct)} ({d.reason})"


def _columns(report: Report) -> tuple[str, ...]:
    judged = ("Δ beyond run", "95 % CI (beyond run)") if report.drift.applied else (
        "95 % CI",)
    return ("verdict", "group", "n base/cand", "median base", "median cand", "p90 base",
            "p90 cand", "Δ median", *judged, "p")


def _cells(row: Row, report: Report) -> tuple[str, ...]:
    r = row.result
    judged = (percent(r.judged_pct), interval(r.ci_pct)) if report.drift.applied else (
        interval(r.ci_pct),)
    return (r.verdict.value, row.group.label, f"{r.base.count}/{r.candidate.count}",
            duration(r.base.median), duration(r.candidate.median), duration(r.base.p90),
            duration(r.candidate.p90), percent(r.delta_pct), *judged, p_value(r.p_value))


_MARK = {Verdict.SLOWER: "🔴 slower", Verdict.FASTER: "🟢 faster",
         Verdict.UNCHANGED: "unchanged", Verdict.TOO_FEW: "too few samples"}


def _compact(cells: list[str], report: Report) -> list[str]:
    """verdict, group, median base → cand, the judged change (Δ median, or Δ beyond the
    run-wide change when that applies), its CI, p: what fits Rerun's diff panel at
    1280 px without scrolling sideways."""
    judged = cells[8:] if report.drift.applied else cells[7:]
    return [cells[0], cells[1], f"{cells[3]} → {cells[4]}", *judged]


def markdown(report: Report, *, emoji: bool = True, compact: bool = False) -> str:
    """The report for ``$GITHUB_STEP_SUMMARY``; ``emoji=False`` for renderers without
    emoji glyphs (Rerun's viewer refuses to draw a text it has no glyph for);
    ``compact`` leaves the sample counts and p90s out (the text and JSON reports and
    the CLI keep them) so the table fits the Rerun panel."""
    icon = ("❌ " if report.slower else "✅ ") if emoji else ""
    lines = [f"### {icon}proofscope diff: {headline(report)}", "",
             _inputs(report) + "; " + drift_line(report), ""]
    notes = input_notes(report.base, "base") + input_notes(report.candidate, "candidate")
    warn = "⚠️ " if emoji else "warning: "
    lines += [f"> {warn}{n}" for n in notes] + ([""] if notes else [])
    if not report.rows:
        lines.append("No spans to compare.")
        return "\n".join(lines) + "\n"
    columns = list(_columns(report))
    if compact:
        columns = _compact(columns, report)
        columns[2] = "median base → cand"
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "|".join(["---", "---"] + ["---:"] * (len(columns) - 2)) + "|")
    for row in report.rows:
        cells = list(_cells(row, report))
        cells[0] = _MARK[row.verdict] if emoji else row.verdict.value
        cells[1] = f"`{_md_escape(cells[1])}`"
        if row.verdict is Verdict.SLOWER:  # the change that was judged
            judged = 8 if report.drift.applied else 7
            cells[judged] = f"**{cells[judged]}**"
        if compact:
            cells = _compact(cells, report)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _md_escape(text: str) -> str:
    # A span name from a foreign trace must not break the table.
    return text.replace("|", "\\|").replace("`", "'").replace("\n", " ")


def text(report: Report) -> str:
    lines = [f"proofscope diff: {headline(report)}", _inputs(report), drift_line(report)]
    lines += [f"warning: {n}" for n in input_notes(report.base, "base")
              + input_notes(report.candidate, "candidate")]
    if not report.rows:
        return "\n".join([*lines, "no spans to compare"]) + "\n"
    columns = _columns(report)
    table = [columns, *(_cells(r, report) for r in report.rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    lines.append("")
    for row in table:
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))
                               ).rstrip())
    return "\n".join(lines) + "\n"


def _num(value: float) -> float | None:
    return None if math.isnan(value) else value


def _side(side: Side) -> dict[str, Any]:
    f = side.file
    return {"source": f.source, "proofs": side.proofs, "spans": len(f.spans),
            "lines": f.lines, "bad_lines": f.bad_line_count,
            "bad_line_examples": [{"line": b.line, "reason": b.reason} for b in f.bad_lines],
            "rejected_spans": f.rejected_spans, "contract": side.samples.contract,
            "spans_outside_proofs": side.samples.outside_proofs,
            "duplicate_spans": side.samples.duplicates}


def as_dict(report: Report) -> dict[str, Any]:
    s = report.settings
    groups = []
    for row in report.rows:
        r = row.result
        groups.append({
            "group": row.group.label, "family": row.group.family.value, "key": row.group.key,
            "verdict": r.verdict.value,
            "base": {"count": r.base.count, "median_s": _num(r.base.median),
                     "p90_s": _num(r.base.p90)},
            "candidate": {"count": r.candidate.count, "median_s": _num(r.candidate.median),
                          "p90_s": _num(r.candidate.p90)},
            "delta_pct": r.delta_pct, "judged_pct": r.judged_pct,
            "ci_pct": list(r.ci_pct) if r.ci_pct else None,
            "p_value": r.p_value})
    return {"schema": SCHEMA, "headline": headline(report),
            "exit_code": report.exit_code,
            "settings": {"threshold_pct": s.threshold_pct, "floor_s": s.floor_s,
                         "min_samples": s.min_samples,
                         "alpha": s.alpha, "by": [b.value for b in report.by],
                         "absolute": s.absolute},
            "drift": {"factor": report.drift.factor, "pct": report.drift.pct,
                      "groups": report.drift.groups, "applied": report.drift.applied,
                      "reason": report.drift.reason},
            "base": _side(report.base), "candidate": _side(report.candidate),
            "slower": [r.group.label for r in report.slower], "groups": groups}


def as_json(report: Report) -> str:
    return json.dumps(as_dict(report), indent=2, ensure_ascii=False) + "\n"


def render(report: Report, fmt: Format) -> str:
    if fmt is Format.MARKDOWN:
        return markdown(report)
    if fmt is Format.JSON:
        return as_json(report)
    return text(report)
