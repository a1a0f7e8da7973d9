"""`proofscope replay`: a proof-stream JSON file, pipe or WebSocket → spans and Rerun."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
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

Spans of a file replay are timed by replay, not by the proof; the durations the
stream measured are in proofscope.stream.duration (and the duration histograms)
where the producer sent a non-zero duration_ms.
"""


def add_telemetry_args(p: argparse.ArgumentParser) -> None:
    """--out / --rerun / --service-name / --flush-timeout, shared with `run`."""
    from otel_proofscope.cli.demo_cmd import rerun_target

    p.add_argument("--out", metavar="DIR", type=Path, default=Path("proofscope-out"),
                   help="output directory (default ./proofscope-out)")
    p.add_argument("--rerun", metavar="TARGET", type=rerun_target, default=None,
                   help="spawn | file:PATH | rerun+http://HOST:PORT/proxy | off "
                        "(default file:DIR/proofscope.rrd when rerun-sdk is installed)")
    p.add_argument("--service-name", metavar="NAME", default=None,
                   help="service.name of the telemetry (OTEL_SERVICE_NAME wins)")
    p.add_argument("--flush-timeout", metavar="SECONDS", type=float, default=None,
                   help="bound on the final flush (default PROOFSCOPE_SHUTDOWN_TIMEOUT "
                        "or 3 s)")


def start_telemetry(args: argparse.Namespace, service_name: str,
                    handle_sigterm: bool = True) -> tuple[Any, list[str]]:
    """configure() from the shared arguments; returns (telemetry, notes)."""
    import os

    from otel_proofscope.setup import configure

    notes: list[str] = []
    target = args.rerun
    if target is None:
        target = os.environ.get("PROOFSCOPE_RERUN") or f"file:{args.out / 'proofscope.rrd'}"
    if target != "off":
        from otel_proofscope.demo.runner import rerun_available

        problem = rerun_available()
        if problem is not None:
            if args.rerun is not None:
                raise SystemExit(f"proofscope: --rerun {target}: {problem}")
            notes.append(f"no Rerun recording: {problem}")
            target = "off"
    telemetry = configure(service_name=args.service_name or service_name, out_dir=args.out,
                          rerun=target, shutdown_timeout_s=args.flush_timeout,
                          handle_sigterm=handle_sigterm, set_global=True)
    if target != "off":
        notes.append(f"rerun: {target}")
    return telemetry, notes


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "replay", help=HELP, description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", metavar="FILE|-|ws://HOST:PORT/ws?token=…",
                   help="a JSON-lines file, '-' for stdin, a FIFO, or a WebSocket URL")
    add_telemetry_args(p)
    p.add_argument("--system", default="stwo-ml",
                   help="proof.system of the replayed proofs (default stwo-ml)")
    p.add_argument("--idle-timeout", metavar="SECONDS", type=float, default=None,
                   help="WebSocket: stop after this long without an event (default: never)")
    p.add_argument("--max-reconnects", metavar="N", type=int, default=5,
                   help="WebSocket: reconnect attempts after a broken connection (default 5)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 if any line was rejected")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from otel_proofscope.integrations.proof_stream.bridge import StreamBridge
    from otel_proofscope.integrations.proof_stream.replay import replay
    from otel_proofscope.integrations.proof_stream.sources import SourceError, open_source

    try:
        source = open_source(args.source, idle_timeout=args.idle_timeout,
                             max_reconnects=args.max_reconnects)
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
        report = telemetry.shutdown()
    if args.strict and bridge.stats.rejected and rc == 0:
        rc = 1
    lines = bridge.report_lines() + notes + report.lines()
    print("\n".join(f"proofscope replay: {line}" for line in lines), file=sys.stderr)
    return rc
