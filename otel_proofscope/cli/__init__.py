"""The ``proofscope`` command line: one subcommand per thing a user does."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from otel_proofscope.version import __version__

#: subcommand → module under otel_proofscope.cli that defines register(subparsers).
SUBCOMMANDS: dict[str, str] = {
    "demo": "demo_cmd",
    "gpu": "gpu_cmd",
    "run": "run_cmd",
    "serve": "serve_cmd",
    "replay": "replay_cmd",
    "import": "import_cmd",
    "diff": "diff_cmd",
}

DESCRIPTION = """\
See inside a zero-knowledge proof: proof phases become OpenTelemetry spans, GPU
activity becomes OpenTelemetry metrics, and both are drawn live in Rerun alongside
standard OTLP export (Collector → Jaeger, Prometheus/Grafana).
"""

EPILOG = """\
examples:
  proofscope demo                       prove a small network; write ./proofscope-out/
  proofscope demo --rerun spawn         … and watch it live in the Rerun viewer
  proofscope gpu                        which GPU metrics this machine can give, and gaps
  proofscope run -- ./my-prover args    trace any prover process as one proof
  proofscope serve                      receive OTLP from any language, draw it in Rerun
  proofscope serve --map sp1            … with SP1's own span names mapped onto the proof
  proofscope import trace.json          a Chrome trace-event profile → OTLP + Rerun
  proofscope replay events.jsonl        turn a recorded proof-stream into spans
  proofscope diff base/ candidate/      which phases got slower; exit 1 if any did

Configuration uses the standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT, …)
and PROOFSCOPE_* variables; see the README.
"""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ``only`` the one subcommand a command line names:
    registering every subcommand imports serve's OTLP receiver and diff's statistics
    (~0.45 s) before ``proofscope demo`` could start its telemetry."""
    parser = argparse.ArgumentParser(
        prog="proofscope", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"proofscope {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more log output (repeat for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in SUBCOMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"otel_proofscope.cli.{module}").register(sub)
    return parser


def _command(given: Sequence[str]) -> str | None:
    """The subcommand a command line names (its first positional argument), if known:
    the top-level options take no values, so that is the first word without a dash."""
    first = next((arg for arg in given if not arg.startswith("-")), None)
    return first if first in SUBCOMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["--version"]:
        # Without building the parser: that imports every subcommand (serve's OTLP
        # receiver, diff's statistics, numpy), ~1 s for one line.
        print(f"proofscope {__version__}")
        return 0
    parser = build_parser(_command(given))
    args = parser.parse_args(given)
    if args.command is None:
        parser.print_help()
        return 2
    _setup_logging(args.verbose)
    # Before any GPU driver or viewer is loaded: Mesa complains on stderr without it.
    from otel_proofscope.cli.runtime_dir import ensure_private_runtime_dir

    ensure_private_runtime_dir()
    rc: int = args.handler(args)
    return rc


def _setup_logging(verbosity: int) -> None:
    import logging

    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 \
        else logging.DEBUG
    logging.basicConfig(level=level, format="proofscope: %(levelname)s %(name)s: %(message)s")


if __name__ == "__main__":
    sys.exit(main())
