"""`proofscope import`: an existing profile (Chrome trace-event JSON) → OTLP and Rerun."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from otel_proofscope.mapping.files import preset_names

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
  pip install viztracer
  viztracer -o result.json my_prover.py && proofscope import result.json --rerun spawn
  py-spy record --format chrometrace -o spy.json -- python my_prover.py
  proofscope import spy.json

Times (--rebase): most profilers count from their own start (viztracer, py-spy,
tracing-chrome), which a trace viewer shows as early 1970. By default (auto) such a
file is shifted by one constant so its first event is at the time of the import;
a file already stamped with wall-clock times (2000 until tomorrow) keeps them. 'now'
always shifts, 'keep' never does. Durations and order are exact either way, and a
shifted span keeps the file's own start in proofscope.source.start_time_ns (the shift:
resource attribute proofscope.import.time_offset_ns). A time that cannot be held once
shifted (before 1970, or past 2**63 ns) refuses its span, event or point, counted in
the summary and in proofscope.dropped (sink import, reason invalid).

The file is read as a stream and the import waits for its sinks (nothing is dropped
for speed: no live prover to protect); the parsed spans are kept as columns, ~100
bytes a span. Time and memory on 2 shared CPUs (the viztracer trace of
examples/toy_prover.py, a 1M-event file): benchmarks/README.md.
"""

#: Spans handed to the pipeline at once; the next chunk waits until every sink has
#: room for it (the Rerun queue holds 8,192 spans / 16 MiB by default).
CHUNK = 1024
#: Estimated bytes of a chunk (pipeline.processor.estimate_bytes) before it is sent early.
CHUNK_BYTES = 4 * 2**20
#: Counter points handed to the metric sinks at once.
POINT_CHUNK = 2048
#: How long one chunk waits for a sink that makes no room (a frozen viewer) before it is
#: sent anyway (the sink then counts what it cannot take).
STALL_S = 120.0
#: Earliest time taken as wall-clock by --rebase auto (2000-01-01, ns since 1970).
WALL_CLOCK_FROM_NS = 946_684_800 * 10**9
#: The ledger's sink name for what the import itself refused.
LEDGER_SINK = "import"


def register(sub: Any) -> None:
    from otel_proofscope.cli.telemetry_args import add_telemetry_args

    p: argparse.ArgumentParser = sub.add_parser(
        "import", help=HELP, description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH", help="the profile to import ('-' for stdin)")
    p.add_argument("--format", choices=("auto", "chrome"), default="auto",
                   help="input format (default: detected from the content)")
    p.add_argument("--map", default=None, metavar="FILE|PRESET",
                   help="mapping rules that turn the profile's spans into proof phases "
                        f"(a preset: {', '.join(preset_names())}; or a rule file; default "
                        "$PROOFSCOPE_MAP)")
    p.add_argument("--rebase", choices=("auto", "now", "keep"), default="auto",
                   help="shift the file's times so its first event is now: 'auto' "
                        "(default) unless they already are wall-clock times, 'now' "
                        "always, 'keep' never (see below)")
    add_telemetry_args(p)
    p.add_argument("--strict", action="store_true",
                   help="exit 1 if any entry of the file was skipped or refused")
    p.set_defaults(handler=run)


def _open(path: str) -> IO[bytes]:
    """The file, seekable: stdin is spooled (to disk beyond 16 MiB), because a file
    with bad entries is read a second time for their byte offsets."""
    if path == "-":
        spool = tempfile.SpooledTemporaryFile(max_size=16 * 2**20)  # noqa: SIM115
        shutil.copyfileobj(sys.stdin.buffer, spool, 1 << 20)
        spool.seek(0)
        return spool  # type: ignore[return-value]
    return Path(path).expanduser().open("rb")


def rebase_offset(mode: str, parsed: Any, now_ns: int | None = None) -> int:
    """The constant added to every time of ``parsed`` (see EPILOG)."""
    # The spans' column, not a list of a million starts (~36 MB at the peak).
    starts = [ts for ts in (parsed.spans.first_start(),
                            min((c.ts_ns for c in parsed.counters), default=None))
              if ts is not None]
    if mode == "keep" or not starts:
        return 0
    now = time.time_ns() if now_ns is None else now_ns
    first: int = min(starts)
    if mode == "auto" and WALL_CLOCK_FROM_NS <= first <= now + 86_400 * 10**9:
        return 0
    return now - first


def mapped_predicate(mapper: Any) -> Callable[[Any], bool] | None:
    """Whether a parsed span is one the mapping rules turn into a contract span."""
    if mapper is None:
        return None
    from otel_proofscope.mapping.apply import CONTRACT_SPANS

    rules = mapper.rules.spans

    def mapped(s: Any) -> bool:
        return s.name in CONTRACT_SPANS or any(r.match.matches(s.name, s.args) for r in rules)

    return mapped


class Feeder:
    """Hands spans to the pipeline in chunks, each once every sink has room for it.

    A chunk waits for the span processors to have handed the previous one to their
    exporters (``begin_flush``'s event) and for an in-process Rerun queue to take it
    (``backlog`` / ``can_take``); a sink that reports neither (a child process) is
    flushed instead. So the offline import never outruns a sink: nothing is dropped as
    ``queue_full``, and memory stays at a few chunks."""

    def __init__(self, telemetry: Any, proof_metrics: Any = None) -> None:
        self.telemetry = telemetry
        self.processors = list(telemetry.span_processors)
        self.proof_metrics = proof_metrics
        self.chunk: list[Any] = []
        self.size = 0
        self.sent = 0
        self.stalls = 0
        self._pending: list[threading.Event] = []
        # A chunk fits in half of the smallest queue on its way (PROOFSCOPE_MAX_QUEUE,
        # PROOFSCOPE_RERUN_QUEUE may be small). The processor has no public capacity.
        caps = [CHUNK]
        for processor in self.processors:
            cap = getattr(processor, "_max_queue", None)
            if isinstance(cap, int):
                caps.append(cap // 2)
            backlog = getattr(getattr(processor, "exporter", None), "backlog", None)
            state = backlog() if callable(backlog) else None
            if state is not None:
                caps.append(state[1] // 2)
        self.limit = max(1, min(caps))

    def add(self, span: Any) -> None:
        from otel_proofscope.pipeline.processor import estimate_bytes

        self.chunk.append(span)
        self.size += estimate_bytes(span)
        if len(self.chunk) >= self.limit or self.size >= CHUNK_BYTES:
            self.send()

    def send(self) -> None:
        chunk, self.chunk, self.size = self.chunk, [], 0
        if not chunk:
            return
        self.wait_for_room(chunk)
        for span in chunk:
            for processor in self.processors:
                processor.on_end(span)
            if self.proof_metrics is not None:
                self.proof_metrics.on_end(span)
        self.sent += len(chunk)
        self._pending = [e for e in (p.begin_flush() for p in self.processors
                                     if hasattr(p, "begin_flush")) if e is not None]

    def wait_for_room(self, items: Sequence[Any], points: int = 0) -> None:
        deadline = time.monotonic() + STALL_S
        for event in self._pending:
            if not event.wait(max(0.0, deadline - time.monotonic())):
                self.stalls += 1
        self._pending = []
        for processor in self.processors:
            exporter = getattr(processor, "exporter", None)
            backlog = getattr(exporter, "backlog", None)
            if not callable(backlog):
                continue
            state = backlog()
            if state is None:
                # A child process's sink (the export process, configure()'s Rerun
                # route): its queue is not visible here, so the wait is a flush that
                # travels to the child and returns once it drew everything sent so far.
                processor.force_flush(int(STALL_S * 1000))
                flush = getattr(exporter, "force_flush", None)
                if callable(flush) and not flush(int(STALL_S * 1000)):
                    self.stalls += 1
                continue
            n = len(items) + points
            can_take = getattr(exporter, "can_take", None)
            while True:
                queued, capacity = backlog()
                if queued == 0 or (queued + n <= capacity and (
                        not items or not callable(can_take) or can_take(items) is not False)):
                    break
                if time.monotonic() >= deadline:
                    self.stalls += 1
                    break
                time.sleep(0.01)

    def finish(self) -> None:
        self.send()
        self.wait_for_room(())


def run(args: argparse.Namespace) -> int:
    from otel_proofscope.cli.telemetry_args import prestart_export_process, start_telemetry

    prestart_export_process(args)  # its imports overlap ours and the argument checks
    from otel_proofscope.integrations.trace_import import chrome
    from otel_proofscope.integrations.trace_import.convert import Converter, send_order
    from otel_proofscope.ledger import DROPS
    from otel_proofscope.mapping.rules import RuleError
    from otel_proofscope.mapping.wiring import ProofMetricsFromSpans, mapper_for, summary
    from otel_proofscope.semconv import DropReason

    def fail(message: str) -> int:
        print(f"proofscope import: {message}", file=sys.stderr)
        return 2

    try:
        f = _open(args.path)
    except OSError as exc:
        return fail(f"cannot read {args.path}: {exc.strerror or exc}")
    with f:
        head = f.read(4096)
        f.seek(0)
        if args.format == "auto" and not chrome.looks_like_chrome(head):
            return fail(f"{args.path}: format not recognised (supported: Chrome "
                        "trace-event JSON); pass --format chrome to try anyway")
        try:
            parsed = chrome.parse_file(f)
        except chrome.ChromeFormatError as exc:
            return fail(f"{args.path}: {exc}")
        except OSError as exc:
            return fail(f"cannot read {args.path}: {exc.strerror or exc}")
    try:
        mapper = mapper_for(args.map)
    except RuleError as exc:
        return fail(f"--map: {exc}")

    telemetry, notes = start_telemetry(args, "proofscope-import", map_rules=mapper)
    offset = rebase_offset(args.rebase, parsed)
    source = "<stdin>" if args.path == "-" else str(Path(args.path).resolve())
    conv = Converter(parsed, telemetry.tracer_provider.resource, offset_ns=offset,
                     source=source)
    refused = conv.refused
    # What the import itself could not use: in the ledger, so the exit summary and
    # proofscope.dropped say so beside the sinks' own losses.
    DROPS.record("spans", LEDGER_SINK, DropReason.INVALID, refused.spans)
    DROPS.record("span_events", LEDGER_SINK, DropReason.INVALID, refused.events)
    DROPS.record("metric_points", LEDGER_SINK, DropReason.INVALID, refused.points)
    DROPS.record("trace_events", LEDGER_SINK, DropReason.INVALID,
                 sum(parsed.skipped.values()))
    # configure() put the proof metrics on the tracer provider; these spans bypass it.
    proof_metrics = ProofMetricsFromSpans(mapper, telemetry.meter_provider) if mapper else None
    feeder = Feeder(telemetry, proof_metrics)
    points = 0
    rc = 0
    try:
        for span in conv.spans(send_order(parsed, mapped_predicate(mapper))):
            feeder.add(span)
        feeder.finish()
        for data, n in conv.metric_chunks(POINT_CHUNK):
            feeder.wait_for_room((), n)
            for exporter in telemetry.metric_exporters:
                exporter.export(data)
            points += n
    except KeyboardInterrupt:
        notes.append("interrupted")
        rc = 130
    finally:
        report = telemetry.shutdown()
    lines = summary_lines(parsed, conv.traces, points, refused=refused, offset_ns=offset)
    if feeder.stalls:
        lines.append(f"a sink made no room for {STALL_S:.0f} s ({feeder.stalls}x): sent "
                     "anyway (what it could not take is counted below)")
    if mapper is not None:
        lines.append(summary(mapper))
    lines += notes + report.lines()
    print("\n".join(f"proofscope import: {line}" for line in lines), file=sys.stderr)
    if args.strict and (parsed.skipped or refused.spans or refused.points) and rc == 0:
        rc = 1
    return rc


def _n(count: int, one: str, many: str | None = None) -> str:
    """``count`` and the noun, singular or plural ("1 span", "7 span events")."""
    return f"{count} {one if count == 1 else (many or one + 's')}"


def summary_lines(parsed: Any, traces: int, points: int, *, refused: Any = None,
                  offset_ns: int = 0) -> list[str]:
    """What was read, ignored and skipped (the counts always add up to the entries)."""
    used = sum(parsed.used.values())
    spans = len(parsed.spans) - (refused.spans if refused is not None else 0)
    events = parsed.instants - (refused.events if refused is not None else 0)
    lines = [f"read {_n(parsed.entries, 'entry', 'entries')}: {used} used, "
             f"{sum(parsed.ignored.values())} ignored, {sum(parsed.skipped.values())} skipped",
             f"imported {_n(spans, 'span')} in {_n(traces, 'trace')}, "
             f"{_n(events, 'span event')}, {_n(points, 'counter point')}"]
    if offset_ns:
        lines.append(f"times shifted by {offset_ns / 1e9:+.3f} s so the first event is at "
                     "the import (--rebase keep keeps the file's; each span keeps its own "
                     "start in proofscope.source.start_time_ns)")
    if refused is not None and (refused.spans or refused.points):
        lines.append(f"refused {_n(refused.spans, 'span')} (with {_n(refused.events, 'event')})"
                     f" and {_n(refused.points, 'counter point')}: times outside [0, 2**63) "
                     "ns, which OTLP and Rerun cannot hold")
        lines += refused.reasons
    if parsed.unterminated:
        lines.append(f"{_n(parsed.unterminated, 'span')} never ended in the file: imported "
                     "up to its last timestamp (chrome.unterminated=true)")
    if parsed.instants_as_spans:
        lines.append(f"{_n(parsed.instants_as_spans, 'instant event')} outside any span: "
                     "imported as zero-length spans")
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
