"""The proofscope command line."""

from __future__ import annotations

import subprocess
import sys

from otel_proofscope.cli import SUBCOMMANDS, main
from otel_proofscope.version import __version__


def test_help_lists_every_subcommand() -> None:
    out = subprocess.run(["proofscope", "--help"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    for name in ("demo", "gpu", "run", "serve", "replay", "import", "diff"):
        assert f"    {name} " in out
    assert set(SUBCOMMANDS) == {"demo", "gpu", "run", "serve", "replay", "import", "diff"}


def test_version() -> None:
    out = subprocess.run([sys.executable, "-m", "otel_proofscope", "--version"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == f"proofscope {__version__}"


def test_no_command_prints_help_and_fails(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_every_subcommand_has_help() -> None:
    for name in SUBCOMMANDS:
        proc = subprocess.run(["proofscope", name, "--help"], capture_output=True, text=True,
                              timeout=60)
        # All of it on failure: it failed once beside two CPU hogs and did not again.
        assert proc.returncode == 0, (name, proc.returncode, proc.stdout[-2000:],
                                      proc.stderr)
        assert proc.stdout.startswith("usage: proofscope " + name)


def test_a_subcommand_builds_only_its_own_parser() -> None:
    """`proofscope demo` used to register every subcommand first: serve's OTLP receiver
    and diff's statistics, ~0.45 s of imports before the demo's telemetry started."""
    code = ("import sys; from otel_proofscope.cli import build_parser, _command; "
            "p = build_parser(_command(['-v', 'demo', '--out', 'x'])); "
            "print(sorted(m for m in ('otel_proofscope.integrations.otlp_receiver.core', "
            "'otel_proofscope.diff.render') if m in sys.modules)); "
            "print(sorted(build_parser()._subparsers._group_actions[0].choices))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.splitlines()
    assert out[0] == "[]"
    assert out[1] == str(sorted(SUBCOMMANDS))  # the whole parser still has them all
