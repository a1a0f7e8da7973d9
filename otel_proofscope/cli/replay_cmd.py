"""`proofscope replay`: a proof-stream JSON file, pipe or WebSocket → spans and Rerun."""

from __future__ import annotations

import argparse
import sys
from typing import Any

HELP = "replay a proof-stream JSON file, pipe or WebSocket into spans"

DESCRIPTION = """\
Turn stwo-ml proof-stream events (one externally tagged JSON object per line, as its
WebSocket sink sends them) into proofscope spans and events: OTLP/JSON-lines files in
OUT (or OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set) and a Rerun recording.
Malformed lines, unknown variants and unknown fields are reported with their line
numbers and counted; they never stop the replay.
"""

EPILOG = """\
examples:
  proofscope replay events.jsonl                   ./proofscope-out/ + proofscope.rrd
  prover | proofscope replay -                     from stdin (or a FIFO path)
  proofscope replay 'ws://127.0.0.1:8080/ws?token=SECRET' --rerun spawn
                                                   live from a running prover

Spans of a replay are timed by replay, not by the proof; the durations the stream
measured are in proofscope.stream.duration (and the duration histograms) where the
producer sent a non-zero duration_ms. A file or stdin is a replay; a FIFO or a
WebSocket is live (span times are arrival times of a running prover). For a prover
piped in directly, say so: prover | proofscope replay - --live
"""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "replay", help=HELP, description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", metavar="FILE|-|ws://HOST:PORT/ws?token=…",
                   help="a JSON-lines file, '-' for stdin, a FIFO, or a WebSocket URL")
    from otel_proofscope.cli.telemetry_args import add_telemetry_args

    add_telemetry_args(p)
    p.add_argument("--system", default="stwo-ml",
                   help="proof.system of the replayed proofs (default stwo-ml)")
    p.add_argument("--idle-timeout", metavar="SECONDS", type=float, default=None,
                   help="WebSocket: stop after this long without an event (default: never)")
    p.add_argument("--max-reconnects", metavar="N", type=int, default=5,
                   help="WebSocket: reconnect attempts after a broken connection (default 5)")
    p.add_argument("--live", action=argparse.BooleanOptionalAction, default=None,
                   help="the producer is proving right now, so arrival times are its "
                        "times (default: live for a FIFO or WebSocket; a file or stdin "
                        "is a replay)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 if any line was rejected")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from otel_proofscope.cli.telemetry_args import prestart_export_process, start_telemetry

    prestart_export_process(args)  # its imports overlap ours and the argument checks
    from otel_proofscope.integrations.proof_stream.bridge import StreamBridge
    from otel_proofscope.integrations.proof_stream.replay import replay
    from otel_proofscope.integrations.proof_stream.sources import SourceError, open_source

    try:
        source = open_source(args.source, idle_timeout=args.idle_timeout,
                             max_reconnects=args.max_reconnects, live=args.live)
    except SourceError as exc:
        print(f"proofscope replay: {exc}", file=sys.stderr)
        return 2
    telemetry, notes = start_telemetry(args, "proofscope-replay")
    bridge = StreamBridge(tracer_provider=telemetry.tracer_provider,
                          meter_provider=telemetry.meter_provider, system=args.system,
                          source=source.name, live=source.live)
    rc = 0
    try:
        replay(source, bridge)
    except SourceError as exc:
        notes.append(str(exc))
        rc = 1
    except KeyboardInterrupt:
        notes.append("interrupted")
        rc = 130
    finally:
        report = telemetry.shutdown(log_drops=False)  # printed in the summary
    if args.strict and bridge.stats.rejected and rc == 0:
        rc = 1
    lines = bridge.report_lines() + notes + report.lines()
    print("\n".join(f"proofscope replay: {line}" for line in lines), file=sys.stderr)
    return rc
