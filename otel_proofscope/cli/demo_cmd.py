"""`proofscope demo`: prove a small quantized network with the reference GKR prover."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HELP = "prove a small quantized network with the reference GKR prover"

DESCRIPTION = """\
Prove a small quantized network (MatMul, Add, square Activation, Mul, token-mixing
Attention over M31, challenges in QM31) with a real GKR/sumcheck prover, verify it,
and record everything: OTLP/JSON-lines traces and metrics in OUT (or OTLP when
OTEL_EXPORTER_OTLP_ENDPOINT is set) and a Rerun recording.
"""

EPILOG = """\
examples:
  proofscope demo                          ./proofscope-out/{traces,metrics}.jsonl + .rrd
  proofscope demo --rerun spawn            watch the proof live in the Rerun viewer
  proofscope demo --layers 16 --width 256  more work for dashboards and the GPU path
  proofscope demo --prometheus-port 9464 --hold 30
                                           keep /metrics up for 30 s after the proof

Witness data (activation statistics, attention scores) is captured for the local
Rerun view by default (--no-witness to stop); it never leaves the process over
OTLP or the JSON files unless PROOFSCOPE_EXPORT_WITNESS=1.
"""


def rerun_target(value: str) -> str:
    v = value.strip()
    if v in ("spawn", "off") or (v.startswith("file:") and len(v) > 5) or v.startswith(
            ("rerun+http://", "rerun+https://")):
        return v
    raise argparse.ArgumentTypeError(
        f"expected spawn, file:PATH, rerun+http://HOST:PORT/proxy or off, got {value!r}")


def _positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return n


def _port(value: str) -> int:
    n = int(value)
    if not 0 < n < 65536:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value}")
    return n


def _seconds(value: str) -> float:
    s = float(value)
    if not s >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {value}")
    return s


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo", help=HELP, description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", metavar="DIR", type=Path, default=Path("proofscope-out"),
                   help="output directory (default ./proofscope-out)")
    p.add_argument("--layers", metavar="N", type=_positive_int, default=8,
                   help="number of layers (default 8)")
    p.add_argument("--width", metavar="W", type=_positive_int, default=32,
                   help="hidden width, a power of two (default 32; rows = min(W, 64))")
    p.add_argument("--backend", choices=("cpu", "wgpu"), default="cpu",
                   help="where the matrix products run (default cpu)")
    p.add_argument("--rerun", metavar="TARGET", type=rerun_target, default=None,
                   help="spawn | file:PATH | rerun+http://HOST:PORT/proxy | off "
                        "(default file:DIR/proofscope.rrd)")
    p.add_argument("--no-telemetry", dest="telemetry", action="store_false",
                   help="prove without any telemetry (the overhead baseline)")
    p.add_argument("--seed", metavar="S", type=int, default=0,
                   help="seed of the network's weights and input (default 0)")
    p.add_argument("--prometheus-port", metavar="PORT", type=_port, default=None,
                   help="also serve Prometheus /metrics on 127.0.0.1:PORT")
    p.add_argument("--hold", metavar="SECONDS", type=_seconds, default=0.0,
                   help="keep the process and its endpoints up this long after the proof "
                        "(default 0)")
    p.add_argument("--repeat", metavar="N", type=_positive_int, default=1,
                   help="prove N times under one telemetry pipeline, e.g. to feed "
                        "rate panels in Grafana (default 1)")
    p.add_argument("--witness", action=argparse.BooleanOptionalAction, default=True,
                   help="capture activation statistics / attention scores for the local "
                        "Rerun view (default on; never exported over OTLP unless "
                        "PROOFSCOPE_EXPORT_WITNESS=1)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from otel_proofscope.cli.outputs import check_outputs, start_fresh

    if args.telemetry:
        problem = check_outputs(args.out, args.rerun)
        if problem:
            print(f"proofscope demo: {problem}", file=sys.stderr)
            return 2
        if args.rerun != "off":
            from otel_proofscope.cli.telemetry_args import prestart_export_process

            prestart_export_process()
        start_fresh(args.out)  # this run's files only, like its recording

    from otel_proofscope.demo_runner import BackendUnavailableError, DemoOptions, run_demo

    with progress_reporter(args.layers * args.repeat, per_proof=args.repeat > 1) as progress:
        options = DemoOptions(out_dir=args.out, layers=args.layers, width=args.width,
                              backend=args.backend, rerun=args.rerun,
                              telemetry=args.telemetry, seed=args.seed,
                              prometheus_port=args.prometheus_port, hold_s=args.hold,
                              repeat=args.repeat, witness=args.witness, progress=progress)
        try:
            result = run_demo(options)
        except BackendUnavailableError as exc:
            print(f"proofscope demo: backend {args.backend} is unavailable: {exc}",
                  file=sys.stderr)
            return 2
        except ValueError as exc:
            print(f"proofscope demo: {exc}", file=sys.stderr)
            return 2
    print("\n".join(f"proofscope demo: {line}" for line in result.summary_lines()))
    return 0 if result.verified else 1


@contextmanager
def progress_reporter(total: int | None = None, *, per_proof: bool = False
                      ) -> Iterator[Callable[[int, int, str], None]]:
    """A rich progress bar on a terminal, one quiet line per layer otherwise (one per
    proof with ``per_proof``: ``--repeat 20`` is 20 lines, not 180).

    ``total`` (the layer count over all proofs, known before proving) sizes the bar
    from the start, so it never shows ``0/?``.
    """
    if not sys.stderr.isatty():
        def plain(done: int, total: int, what: str) -> None:
            if per_proof and not what.endswith(("verified", "REJECTED")) \
                    and "REJECTED" not in what:
                return
            print(f"proofscope demo: [{done}/{total}] {what}", file=sys.stderr, flush=True)

        yield plain
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(TextColumn("proving"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task("building the network", total=total)

        def update(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=what)

        yield update
