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
        assert proc.returncode == 0, (name, proc.stderr)
        assert proc.stdout.startswith("usage: proofscope " + name)
