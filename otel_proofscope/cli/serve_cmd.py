"""`proofscope serve`: receive OTLP (gRPC/HTTP) from any prover and draw it in Rerun."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from otel_proofscope.integrations.otlp_receiver.core import DEFAULT_MAX_MESSAGE_BYTES
from otel_proofscope.integrations.otlp_receiver.limits import DEFAULT_MAX_INFLIGHT_BYTES
from otel_proofscope.integrations.otlp_receiver.server import (
    DEFAULT_GRPC_PORT,
    DEFAULT_HOST,
    DEFAULT_HTTP_PORT,
)
from otel_proofscope.mapping.files import preset_names
from otel_proofscope.pipeline.gc_policy import CollectWhenIdle

HELP = "receive OTLP (gRPC/HTTP) from any prover and draw it in Rerun"
TOKEN_ENV = "PROOFSCOPE_SERVE_TOKEN"
DEFAULT_RRD = "proofscope-out/serve.rrd"
#: Bound on the shutdown after SIGINT/SIGTERM: in-flight requests, then the Rerun flush.
STOP_GRACE_S = 2.0
#: Span positions the Rerun trace view keeps for serve (its own default, 2**18, is
#: sized for one process's proof): 80,000 single-span traces from 2,000 services grew
#: serve by ~3.7 KB per trace with no plateau; past this bound the oldest traces go.
TRACE_SPANS = 16_384

EPILOG = f"""\
Point any OTLP exporter at it, e.g. for a Rust prover with opentelemetry-otlp:
  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 ./my-prover
or fan out from an OpenTelemetry Collector with an otlp exporter to 127.0.0.1:4317.

The bearer token (--token or ${TOKEN_ENV}) is checked on the gRPC metadata
'authorization' and the HTTP 'Authorization' header:
  OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer $TOKEN"
Rejected requests (bad token, garbage, oversized) get the OTLP error and are counted
in the drop summary printed at exit.
"""


def _port(text: str) -> int | None:
    if text.lower() == "off":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range: {value}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value}")
    return value


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help=HELP, description=HELP + ".", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default=DEFAULT_HOST,
                   help="address to listen on (default %(default)s; anything else needs a "
                        "token, and exposes the receiver to that network)")
    p.add_argument("--grpc-port", type=_port, default=DEFAULT_GRPC_PORT, metavar="PORT",
                   help="OTLP/gRPC port, 0 for any free one, 'off' to disable "
                        "(default %(default)s)")
    p.add_argument("--http-port", type=_port, default=DEFAULT_HTTP_PORT, metavar="PORT",
                   help="OTLP/HTTP port (/v1/traces, /v1/metrics), 0 for any free one, "
                        "'off' to disable (default %(default)s)")
    p.add_argument("--token", default=None,
                   help=f"require 'Authorization: Bearer TOKEN' (default ${TOKEN_ENV})")
    p.add_argument("--max-message-bytes", type=_positive, default=DEFAULT_MAX_MESSAGE_BYTES,
                   metavar="N", help="reject larger requests (default %(default)s)")
    p.add_argument("--max-inflight-bytes", type=_positive, default=None, metavar="N",
                   help="request bytes received, decoded or exported at once; HTTP "
                        "requests past it get 503 with a retry hint, gRPC ones wait for "
                        "room until their deadline, then RESOURCE_EXHAUSTED; all counted "
                        f"(default {DEFAULT_MAX_INFLIGHT_BYTES}, at least twice "
                        "--max-message-bytes)")
    p.add_argument("--rerun", default=None, metavar="TARGET",
                   help="spawn, file:PATH.rrd, rerun+http://HOST:PORT/proxy or off "
                        f"(default $PROOFSCOPE_RERUN, else file:{DEFAULT_RRD})")
    p.add_argument("--map", default=None, metavar="FILE|PRESET",
                   help="mapping rules that turn a foreign prover's spans into proof phases "
                        f"(a preset: {', '.join(preset_names())}; or a rule file; default "
                        "$PROOFSCOPE_MAP; "
                        "docs/mapping.md)")
    p.add_argument("--forward", default=None, metavar="ENDPOINT",
                   help="re-export what is received over OTLP (mapped names, the original "
                        "kept as an attribute, plus the proof metrics the mapped spans "
                        "imply) to ENDPOINT, a base URL for http/protobuf (default "
                        "$OTEL_EXPORTER_OTLP_ENDPOINT when set, and then a warning, not a "
                        "refusal, if it cannot be used; 'off' to disable). Refused when an "
                        "OTLP header variable holds serve's own token")
    p.add_argument("--forward-protocol", default=None, choices=("grpc", "http/protobuf"),
                   help="protocol of --forward (default $OTEL_EXPORTER_OTLP_PROTOCOL, "
                        "else grpc)")
    p.add_argument("--max-trace-spans", type=_positive, default=TRACE_SPANS, metavar="N",
                   help="span positions the trace view remembers (for the depth of later "
                        "children), all traces together; the oldest traces are forgotten "
                        "past it, so a long session plateaus (default %(default)s)")
    p.add_argument("--rrd-footer", action="store_true",
                   help="end a file:*.rrd recording with Rerun's footer, an index of every "
                        "chunk for fast random access. The SDK holds that index in memory "
                        "until serve exits (~8 KB a single-span trace), so by default a "
                        "long session writes no footer and its memory plateaus; the viewer "
                        "and rerun.chunk.RrdReader(...).stream() read the file either way "
                        "(RrdReader's store() needs the footer)")
    p.set_defaults(handler=serve)


def rerun_target(cli_value: str | None) -> str:
    target = (cli_value or os.environ.get("PROOFSCOPE_RERUN") or f"file:{DEFAULT_RRD}").strip()
    return target


def _exporters(target: str, trace_spans: int = TRACE_SPANS,
               footer: bool = False) -> tuple[list[Any], list[Any]]:
    if target.lower() == "off":
        return [], []
    if target.startswith("file:"):
        Path(target[len("file:"):]).expanduser().parent.mkdir(parents=True, exist_ok=True)
    from otel_proofscope.rerun.exporter import RerunMetricExporter, RerunSpanExporter

    spans = RerunSpanExporter(target)
    bound_trace_view(spans, trace_spans)
    sink = getattr(spans, "sink", None)
    if sink is not None:  # before the first span: the file opens on the first send
        sink.footer = footer
    return [spans], [RerunMetricExporter(target)]


def bound_trace_view(exporter: Any, spans: int) -> None:
    """Bound what the in-process trace view remembers (``TraceTranslator.max_placed``,
    its public knob): a receiver runs for days, a prover's process does not."""
    translator = getattr(getattr(exporter, "sink", None), "trace", None)
    if translator is not None and hasattr(translator, "max_placed"):
        translator.max_placed = max(1, min(int(translator.max_placed), spans))


def trace_view_line(exporters: list[Any]) -> str | None:
    """How many traces the trace view still remembers, of how many it drew."""
    for exporter in exporters:
        translator: Any = getattr(getattr(exporter, "sink", None), "trace", None)
        kept = getattr(translator, "_traces", None)
        drawn = getattr(translator, "traces_seen", None)
        if kept is not None and isinstance(drawn, int):
            forgotten = max(0, drawn - len(kept))
            return (f"trace view: {len(kept)} traces remembered, {forgotten} older ones "
                    f"forgotten (bound: {translator.max_placed} span positions)")
    return None


#: Hosts that bind every interface (``--host ""`` used to print ``http://:PORT``).
_ALL_INTERFACES = ("", "0.0.0.0", "::")


def _where(host: str) -> str:
    return "all interfaces" if host.strip() in _ALL_INTERFACES else host


def _shown(endpoint: str, host: str) -> str:
    if host.strip() not in _ALL_INTERFACES:
        return endpoint
    port = endpoint.rsplit(":", 1)[1]
    scheme = "http://" if endpoint.startswith("http") else ""
    return f"{scheme}127.0.0.1:{port} (all interfaces, port {port})"


def serve(args: argparse.Namespace) -> int:
    from otel_proofscope.integrations.otlp_receiver.core import SENDER_DROPPED
    from otel_proofscope.integrations.otlp_receiver.server import OtlpReceiver

    token = args.token or os.environ.get(TOKEN_ENV) or None
    if token is not None and not token.strip():
        print("proofscope serve: the token is empty or whitespace, so no request could ever "
              "authenticate; give a real token or none", file=sys.stderr)
        return 2
    if args.grpc_port is None and args.http_port is None:
        print("proofscope serve: both transports are off; nothing to serve", file=sys.stderr)
        return 2
    where = _where(args.host)
    if args.host not in ("127.0.0.1", "::1", "localhost") and not token:
        print(f"proofscope serve: warning: listening on {where} without a token; anyone "
              "who can reach it can write to your Rerun view", file=sys.stderr)
    target = rerun_target(args.rerun)
    from otel_proofscope.mapping.rules import RuleError
    from otel_proofscope.mapping.wiring import mapper_for, summary, wrap

    try:
        mapper = mapper_for(args.map)
    except RuleError as exc:
        print(f"proofscope serve: --map: {exc}", file=sys.stderr)
        return 2
    from otel_proofscope.cli import serve_forward

    forward = None
    endpoint, source = serve_forward.endpoint_from(args.forward)
    if endpoint is not None and endpoint.lower() != "off":
        try:
            serve_forward.check_not_self(endpoint, args.host, (args.grpc_port, args.http_port))
            serve_forward.check_token_stays(token)
            forward = serve_forward.Forward(endpoint, mapper, args.forward_protocol)
        except serve_forward.ForwardError as exc:
            if source == "--forward":
                print(f"proofscope serve: --forward: {exc}", file=sys.stderr)
                return 2
            print(f"proofscope serve: warning: not forwarding to ${source}: {exc}",
                  file=sys.stderr)
    try:
        span_exporters, metric_exporters = _exporters(target, args.max_trace_spans,
                                                         args.rrd_footer)
        rerun_spans = list(span_exporters)
        if forward is not None:
            span_exporters = [serve_forward.Fanout(*span_exporters, forward.span_exporter)]
            metric_exporters = [*metric_exporters, forward.metric_exporter]
        span_exporters = [wrap(e, mapper) for e in span_exporters]
    except ImportError as exc:
        print(f"proofscope serve: the Rerun exporter is unavailable ({exc}); install "
              "otel-proofscope[rerun] or pass --rerun off", file=sys.stderr)
        return 2
    try:
        receiver = OtlpReceiver(span_exporters, metric_exporters, host=args.host,
                                grpc_port=args.grpc_port, http_port=args.http_port,
                                token=token, max_message_bytes=args.max_message_bytes,
                                max_inflight_bytes=args.max_inflight_bytes)
    except OSError as exc:
        print(f"proofscope serve: cannot listen: {exc}", file=sys.stderr)
        for exp in [*span_exporters, *metric_exporters]:
            exp.shutdown()
        if forward is not None:
            forward.shutdown(0.1)
        return 1

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    collector: CollectWhenIdle | None = None
    try:
        receiver.start()
        # Collections when idle (and every 10 s under load), not every 10,000 allocations:
        # a decoded request's spans are freed by reference counting once drawn.
        collector = CollectWhenIdle(lambda: sorted(receiver.stats().items())).start()
        if receiver.grpc_endpoint:
            print(f"OTLP/gRPC listening on {_shown(receiver.grpc_endpoint, args.host)}",
                  flush=True)
        if receiver.http_endpoint:
            print(f"OTLP/HTTP listening on {_shown(receiver.http_endpoint, args.host)}",
                  flush=True)
        footer = ""
        if target.startswith("file:"):
            footer = ("  (with a footer: memory grows with the session)" if args.rrd_footer
                      else "  (no footer, so a long session's memory plateaus; "
                           "--rrd-footer writes one)")
        print(f"Rerun: {target}{footer}" + ("  (token required)" if token else ""),
              flush=True)
        if mapper is not None:
            print(f"mapping: {mapper.rules.label}", flush=True)
        if forward is not None:
            print(f"forwarding to {forward.endpoint} ({forward.protocol})", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        if collector is not None:
            collector.pause()  # the drawing left gets the time until the deadline
        receiver.stop(STOP_GRACE_S)
        if forward is not None:
            forward.shutdown(STOP_GRACE_S)
        for s, handler in previous.items():
            signal.signal(s, handler)
    stats = receiver.stats()
    declared = {k[len(SENDER_DROPPED):]: v for k, v in stats.items()
                if k.startswith(SENDER_DROPPED)}
    received = {k: v for k, v in stats.items() if not k.startswith(SENDER_DROPPED)}
    print("received: " + (", ".join(f"{k}={v}" for k, v in sorted(received.items())) or
                          "nothing"), flush=True)
    # Lost before they were sent (the senders' own limits), so never in DROPS below.
    print("dropped by the senders before sending (their dropped_*_count): " + (
        ", ".join(f"{n} {what}" for what, n in sorted(declared.items()))
        or "none declared"), flush=True)
    if mapper is not None:
        print(summary(mapper), flush=True)
    if forward is not None:
        print(forward.summary(), flush=True)
    view = trace_view_line(rerun_spans)
    if view:
        print(view, flush=True)
    for line in accounting_lines(target, stats.get("spans_accepted", 0)):
        print(line, flush=True)
    return 0


def accounting_lines(target: str, spans_received: int) -> list[str]:
    """Where every received span went: drawn, or not drawn with a reason; then drops."""
    from otel_proofscope.ledger import DROPS
    from otel_proofscope.rerun.tally import TALLY

    drops = DROPS.summary_lines()
    if target.lower() == "off":
        return [f"rerun: off; {spans_received} span(s) received and not drawn", *drops]
    line = TALLY.summary_line(DROPS)
    if spans_received and not TALLY.drawn and not DROPS.total():
        # Nothing drawn and nothing counted: do not claim that nothing was lost.
        return [line, "dropped: unknown (spans were received but none was drawn or counted)"]
    return [line, *drops]
