"""`proofscope run`: run any prover process under a proof span, sampling GPUs."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from otel_proofscope.mapping.files import preset_names

if TYPE_CHECKING:
    from otel_proofscope.mapping.lines import LineRules
    from otel_proofscope.mapping.rules import RuleSet

HELP = "run any prover process under a proof span, sampling GPUs"

DESCRIPTION = """\
Run a prover (any language) as one `proof` span. The child's environment carries
the trace context (TRACEPARENT, TRACESTATE, BAGGAGE) so an OpenTelemetry-instrumented
prover that extracts it joins the same trace, and PROOFSCOPE_STREAM: a path where it
may write proof-stream JSON lines, which become live layer/sumcheck spans. GPUs are
sampled (NVML) while it runs. The prover's exit code is proofscope's exit code;
SIGINT, SIGTERM and SIGHUP are forwarded to it.

The prover's stdout and stderr are read through pipes and passed on unchanged (--no-map
leaves it our terminal). A Rust prover's tracing-subscriber close lines (FmtSpan::CLOSE,
SP1's default logger) become its own span tree, found by itself or asked for with
--map rust-tracing. With --map PRESET (or a preset detected from the command, e.g.
snarkjs and circom2) its log lines become phase spans under the proof, and a preset's
span rules (e.g. sp1) rename the spans; --map takes several, comma-separated or
repeated (docs/provers.md).
"""

EPILOG = """\
examples:
  proofscope run -- ./target/release/prove --model m.onnx
  proofscope run --system stwo-ml --stream fifo -- cargo run --release --bin prove
  proofscope run --stream-url 'ws://127.0.0.1:8080/ws?token=T' -- ./prove
  proofscope run --map snarkjs -- npx snarkjs groth16 prove c.zkey w.wtns proof.json pub.json -v
  proofscope run --map rust-tracing,sp1 -- ./target/release/sp1-prove

OTEL_* variables are passed to the child unchanged. Our own summary goes to stderr.
"""


def register(sub: Any) -> None:
    from otel_proofscope.cli.telemetry_args import add_telemetry_args

    p: argparse.ArgumentParser = sub.add_parser(
        "run", help=HELP, description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_telemetry_args(p)
    p.add_argument("--system", default="unknown",
                   help="proof.system of the root span (gkr, ezkl, stwo-ml, …)")
    p.add_argument("--backend", default="unknown",
                   help="proof.backend of the root span (cpu, cuda, wgpu, metal)")
    p.add_argument("--model-name", default=None, help="proof.model.name of the root span")
    p.add_argument("--stream", choices=("file", "fifo", "off"), default="file",
                   help="how PROOFSCOPE_STREAM is offered: a file followed like tail -f "
                        "(default; the prover never blocks on us), a FIFO, or not at all")
    p.add_argument("--stream-path", metavar="PATH", default=None,
                   help="use PATH for PROOFSCOPE_STREAM (kept afterwards, replayable)")
    p.add_argument("--stream-url", metavar="ws://…", default=None,
                   help="also read the prover's proof-stream WebSocket")
    p.add_argument("--no-gpu", dest="gpu", action="store_false",
                   help="do not sample GPUs")
    p.add_argument("--kill-after", metavar="SECONDS", type=float, default=30.0,
                   help="SIGKILL the prover this long after a forwarded signal if it is "
                        "still running (default 30; 0 = never)")
    p.add_argument("--record-args", action="store_true",
                   help="record the full command line on the span (may contain secrets)")
    p.add_argument("--map", metavar="PRESET|FILE", action="append", default=None,
                   help="rules for the prover's output and spans: rust-tracing (its "
                        "console: close lines, tracing-forest trees, ark-std timers), a "
                        f"shipped preset ({', '.join(preset_names())}) or a TOML "
                        "rule file; several comma-separated or repeated; default: a preset "
                        "whose [meta].detect matches the command, if any, and rust-tracing "
                        "when close lines appear")
    p.add_argument("--no-map", action="store_true",
                   help="detect nothing: leave the prover's output on our terminal, "
                        "untouched")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...",
                   help="the prover command")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from otel_proofscope.cli.telemetry_args import prestart_export_process, start_telemetry

    prestart_export_process(args)  # its imports overlap ours and the argument checks
    from otel_proofscope.integrations.proof_stream.sources import SourceError
    from otel_proofscope.integrations.run import RunConfig, run_process

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("proofscope run: no command given (proofscope run -- CMD ARGS...)",
              file=sys.stderr)
        return 2
    try:
        rules, span_rules, console = _maps(args, command)
    except (OSError, ValueError) as exc:
        print(f"proofscope run: --map: {exc}", file=sys.stderr)
        return 2
    system, backend = args.system, args.backend
    if system == "unknown" and span_rules is not None and span_rules.meta.system:
        system = span_rules.meta.system
    if rules is not None:  # explicit --system / --backend win over the preset
        from otel_proofscope.semconv import Attr

        root = rules.root_attributes(" ".join(command))
        if system == "unknown":
            system = str(root.get(Attr.PROOF_SYSTEM, system))
        if backend == "unknown":
            backend = str(root.get(Attr.PROOF_BACKEND, backend))
    cfg = RunConfig(argv=command, system=system, backend=backend,
                    model_name=args.model_name, stream=args.stream,
                    stream_path=args.stream_path, stream_url=args.stream_url,
                    sample_gpus=args.gpu, kill_after_s=args.kill_after,
                    record_args=args.record_args, line_rules=rules, console=console)
    mapper = None
    if span_rules is not None:
        from otel_proofscope.mapping.wiring import mapper_for

        mapper = mapper_for(span_rules, use_env=False)
    # SIGTERM is forwarded to the prover, not turned into our own exit.
    telemetry, notes = start_telemetry(args, "proofscope-run", handle_sigterm=False,
                                       map_rules=mapper)
    try:
        result = run_process(cfg, tracer=telemetry.tracer,
                             tracer_provider=telemetry.tracer_provider,
                             meter_provider=telemetry.meter_provider)
    except (SourceError, ValueError, OSError) as exc:
        print(f"proofscope run: {exc}", file=sys.stderr)
        return 2
    finally:
        report = telemetry.shutdown(log_drops=False)  # printed in the summary
    if not args.quiet:
        if result.start_error is not None:  # it never ran: no "exited with" line
            lines = [f"{result.start_error} (exit code {result.exit_code})"]
        else:
            lines = [f"{command[0]} exited with code {result.exit_code}"
                     + (" (killed after --kill-after)" if result.killed else "")]
        lines += result.stream_lines + result.notes + notes
        if mapper is not None:
            from otel_proofscope.mapping.wiring import summary

            lines.append(summary(mapper))
        lines += report.lines()
        print("\n".join(f"proofscope run: {line}" for line in lines), file=sys.stderr)
    return result.exit_code


def _maps(args: argparse.Namespace, command: list[str]
          ) -> tuple[LineRules | None, RuleSet | None, str]:
    """What ``--map`` asks for: (line rules, span rules, the Rust console reader's mode).

    Without ``--map``: a preset detected from the command, and the console reader on
    ``auto``. A name may give line rules (snarkjs), span rules (sp1) or both.
    """
    from otel_proofscope.mapping.lines import detect_preset, load_line_rules
    from otel_proofscope.mapping.rules import load_rules
    from otel_proofscope.mapping.rust_console import NAME as RUST_TRACING

    names = [n.strip() for v in args.map or () for n in v.split(",") if n.strip()]
    if not names:
        if args.no_map:
            return None, None, "off"
        return detect_preset(" ".join(command)), None, "auto"
    console = "on" if RUST_TRACING in names else "off" if args.no_map else "auto"
    line_sets, span_sets = [], []
    for name in dict.fromkeys(n for n in names if n != RUST_TRACING):
        lines = load_line_rules(name)
        if lines.lines:
            line_sets.append(lines)
        spans = load_rules(name)
        if spans.spans or spans.events:
            span_sets.append(spans)
        if not lines.lines and not (spans.spans or spans.events):
            raise ValueError(f"{name}: no [[line]], [[span]] or [[event]] rules")
    if len(span_sets) > 1:
        raise ValueError("span rules from one preset or file at a time: "
                         + ", ".join(s.label for s in span_sets))
    rules = None
    if len(line_sets) == 1:
        rules = line_sets[0]
    elif line_sets:  # one engine: the rule files' lines in the order given
        first = line_sets[0]
        rules = replace(first, label="+".join(r.label for r in line_sets),
                        lines=tuple(r for s in line_sets for r in s.lines))
    return rules, (span_sets[0] if span_sets else None), console
