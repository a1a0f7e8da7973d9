"""`proofscope import`: an existing profile (Chrome trace-event JSON) → OTLP and Rerun."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

HELP = "import a profile (Chrome trace-event JSON) as spans and metrics, to OTLP and Rerun"

DESCRIPTION = """\
Turn an existing profile into OpenTelemetry spans and metrics: OTLP/JSON-lines files in
OUT (or OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set) and a Rerun recording, the same
outputs as `demo` and `replay`.

Chrome trace-event JSON, as written by tracing-chrome (Rust), Perfetto's legacy JSON
export and viztracer (Python): complete events (ph X) and B/E pairs become spans, instant
events become span events, counters (ph C) become gauge metrics; pid becomes the
resource attribute process.pid, tid the span attribute thread.id. Timestamps are kept
exactly (microseconds × 1000, no float rounding). Malformed events are reported with
their index and byte offset and skipped; everything else is still imported, and every
skipped entry is counted in the summary.
"""

EPILOG = """\
examples:
  proofscope import trace.json                     ./proofscope-out/ + proofscope.rrd
  proofscope import trace.json --map sp1           SP1's spans as the proof walk
  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 proofscope import result.json
  viztracer -o result.json my_prover.py && proofscope import result.json --rerun spawn

The spans keep the file's own timestamps (often microseconds since the profiler
started, i.e. early 1970 in a trace viewer); --rebase now shifts them all by one
constant so the trace starts at the time of the import, durations unchanged.
"""

#: Spans handed to the pipeline before it is flushed: well below the per-sink queue
#: bound (PROOFSCOPE_MAX_QUEUE, default 8192), so an import never overflows it.
CHUNK = 1024


def register(sub: Any) -> None:
    from otel_proofscope.cli.replay_cmd import add_telemetry_args

    p: argparse.ArgumentParser = sub.add_parser(
        "import", help=HELP, description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH", help="the profile to import ('-' for stdin)")
    p.add_argument("--format", choices=("auto", "chrome"), default="auto",
                   help="input format (default: detected from the content)")
    p.add_argument("--map", default=None, metavar="FILE|PRESET",
                   help="mapping rules that turn the profile's spans into proof phases "
                        "(a preset: sp1, jolt; or a rule file; default $PROOFSCOPE_MAP)")
    p.add_argument("--rebase", choices=("keep", "now"), default="keep",
                   help="keep the file's timestamps (default) or shift them so the trace "
                        "starts now")
    add_telemetry_args(p)
    p.add_argument("--strict", action="store_true",
                   help="exit 1 if any entry of the file was skipped")
    p.set_defaults(handler=run)


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    return Path(path).expanduser().read_bytes()


def run(args: argparse.Namespace) -> int:
    from otel_proofscope.cli.replay_cmd import start_telemetry
    from otel_proofscope.integrations.trace_import import chrome
    from otel_proofscope.integrations.trace_import.convert import convert
    from otel_proofscope.mapping.rules import RuleError
    from otel_proofscope.mapping.wiring import ProofMetricsFromSpans, mapper_for, summary

    def fail(message: str) -> int:
        print(f"proofscope import: {message}", file=sys.stderr)
        return 2

    try:
        data = _read(args.path)
    except OSError as exc:
        return fail(f"cannot read {args.path}: {exc.strerror or exc}")
    if args.format == "auto" and not chrome.looks_like_chrome(data[:4096]):
        return fail(f"{args.path}: format not recognised (supported: Chrome trace-event "
                    "JSON); pass --format chrome to try anyway")
    try:
        parsed = chrome.parse(data)
    except chrome.ChromeFormatError as exc:
        return fail(f"{args.path}: {exc}")
    try:
        mapper = mapper_for(args.map)
    except RuleError as exc:
        return fail(f"--map: {exc}")

    telemetry, notes = start_telemetry(args, "proofscope-import", map_rules=mapper)
    offset = 0
    starts = [s.start_ns for s in parsed.spans] + [c.ts_ns for c in parsed.counters]
    if args.rebase == "now" and starts:
        offset = time.time_ns() - min(starts)
    source = "<stdin>" if args.path == "-" else str(Path(args.path).resolve())
    converted = convert(parsed, telemetry.tracer_provider.resource, offset_ns=offset,
                        source=source)
    # configure() put the proof metrics on the tracer provider; these spans bypass it.
    proof_metrics = ProofMetricsFromSpans(mapper, telemetry.meter_provider) if mapper else None
    rc = 0
    try:
        for n, span in enumerate(converted.spans, start=1):
            for processor in telemetry.span_processors:
                processor.on_end(span)
            if proof_metrics is not None:
                proof_metrics.on_end(span)
            if n % CHUNK == 0:
                telemetry.force_flush()
        if converted.points:
            for exporter in telemetry.metric_exporters:
                exporter.export(converted.metrics)
    except KeyboardInterrupt:
        notes.append("interrupted")
        rc = 130
    finally:
        report = telemetry.shutdown()
    lines = summary_lines(parsed, converted.traces, converted.points)
    if mapper is not None:
        lines.append(summary(mapper))
    lines += notes + report.lines()
    print("\n".join(f"proofscope import: {line}" for line in lines), file=sys.stderr)
    if args.strict and parsed.skipped and rc == 0:
        rc = 1
    return rc


def summary_lines(parsed: Any, traces: int, points: int) -> list[str]:
    """What was read, ignored and skipped (the counts always add up to the entries)."""
    used = sum(parsed.used.values())
    lines = [f"read {parsed.entries} entries: {used} used, {sum(parsed.ignored.values())} "
             f"ignored, {sum(parsed.skipped.values())} skipped",
             f"imported {len(parsed.spans)} spans in {traces} traces, {parsed.instants} "
             f"span events, {points} counter points"]
    if parsed.unterminated:
        lines.append(f"{parsed.unterminated} spans never ended in the file: imported up to "
                     "its last timestamp (chrome.unterminated=true)")
    if parsed.instants_as_spans:
        lines.append(f"{parsed.instants_as_spans} instant events outside any span: imported "
                     "as zero-length spans")
    if parsed.ignored:
        lines.append("ignored: " + ", ".join(f"{k} ×{v}" for k, v in
                                             sorted(parsed.ignored.items())))
    if parsed.skipped:
        lines.append("skipped: " + ", ".join(f"{k} ×{v}" for k, v in
                                             sorted(parsed.skipped.items())))
        lines += parsed.errors
        more = sum(parsed.skipped.values()) - len(parsed.errors)
        if more > 0:
            lines.append(f"… and {more} more")
    lines += parsed.notes
    return list(lines)
