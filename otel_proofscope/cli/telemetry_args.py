"""The telemetry arguments and start-up shared by the commands that turn another
program's output into spans (`replay`, `run`, `import`): one home, one behaviour."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


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


def prestart_export_process(args: argparse.Namespace | None = None) -> None:
    """Start the export process's interpreter and imports now (~1.3 s on two CPUs),
    beside this process's own imports, rather than at configure(); with ``args``, only
    when the command's Rerun target (as start_telemetry resolves it) is not ``off``."""
    import os

    if args is not None and (args.rerun or os.environ.get("PROOFSCOPE_RERUN")) == "off":
        return
    try:
        from otel_proofscope.rerun.prestart import prestart
    except ImportError:  # no rerun-sdk: start_telemetry / configure() say so
        return
    prestart()


def start_telemetry(args: argparse.Namespace, service_name: str,
                    handle_sigterm: bool = True, map_rules: Any = None) -> tuple[Any, list[str]]:
    """configure() from the shared arguments; returns (telemetry, notes).

    ``map_rules``: mapping rules for every span sink (``configure(map=...)``).
    """
    import os

    from otel_proofscope.setup import configure

    notes: list[str] = []
    target = args.rerun
    if target is None:
        target = os.environ.get("PROOFSCOPE_RERUN") or f"file:{args.out / 'proofscope.rrd'}"
    if target != "off":
        from otel_proofscope.demo_runner import rerun_available

        problem = rerun_available()
        if problem is not None:
            if args.rerun is not None:
                raise SystemExit(f"proofscope: --rerun {target}: {problem}")
            notes.append(f"no Rerun recording: {problem}")
            target = "off"
    from otel_proofscope.cli.outputs import start_fresh

    start_fresh(args.out)  # this run's files only, like its recording
    telemetry = configure(service_name=args.service_name or service_name, out_dir=args.out,
                          rerun=target, shutdown_timeout_s=args.flush_timeout,
                          handle_sigterm=handle_sigterm, set_global=True, map=map_rules)
    if target != "off":
        notes.append(f"rerun: {target}")
    return telemetry, notes
