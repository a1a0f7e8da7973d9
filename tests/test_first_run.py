"""A new user's first two commands, checked against the files they depend on.

The README's "Set up" section holds exactly two commands: one that installs and runs
``proofscope demo`` and one that runs the tests. The first must work on a stock Debian
or Ubuntu Python (PEP 668 refuses ``pip install`` outside a virtual environment), and
the text must say which Python it needs; CONTRIBUTING.md must say what ``scripts/test``
installs — read here from ``pyproject.toml`` and ``scripts/test`` themselves, so neither
can drift.
``scripts/test`` must never stop a Prometheus it did not start.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SCRIPT = (ROOT / "scripts" / "test").read_text()
CONTRIBUTING = (ROOT / "CONTRIBUTING.md").read_text()


def setup_section() -> str:
    start = README.index("## Set up on a fresh machine")
    end = README.index("\n## ", start + 1)
    return README[start:end]


def sh_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```sh\n(.*?)```", text, re.S)]


def test_setup_holds_exactly_two_commands() -> None:
    blocks = sh_blocks(setup_section())
    assert len(blocks) == 2, blocks
    assert all("\n" not in b for b in blocks), "each set-up command is one line"
    assert blocks[0].split("&&")[-1].strip() == "proofscope demo"
    assert blocks[1] == "bash scripts/test"


def test_first_command_installs_into_a_virtual_environment() -> None:
    steps = [shlex.split(s) for s in sh_blocks(setup_section())[0].split("&&")]
    venv_at = steps.index(["python3", "-m", "venv", ".venv"])
    activate_at = steps.index([".", ".venv/bin/activate"])
    pip_at = next(i for i, s in enumerate(steps) if s[:2] == ["pip", "install"])
    assert venv_at < activate_at < pip_at, steps


def test_python_version_stated_as_pyproject_requires() -> None:
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "requires-python"]
    m = re.fullmatch(r">=\s*(\d+\.\d+)", requires)
    assert m, requires
    assert f"Python ≥ {m.group(1)}" in setup_section()


def test_contributing_says_what_scripts_test_installs() -> None:
    m = re.search(r"APT_PACKAGES=\(([^)]*)\)", SCRIPT)
    assert m
    apt = m.group(1).split()
    assert apt
    pip = re.search(r"pip install [^\n]*-e '(\.\[[^\]]+\])'", SCRIPT)
    assert pip
    for pkg in apt:
        assert f"`{pkg}`" in CONTRIBUTING, pkg
    assert f"pip install -e '{pip.group(1)}'" in CONTRIBUTING
    assert "CONTRIBUTING.md" in setup_section()
    peers = re.findall(r"^\s+(\S+)\) build_", (ROOT / "scripts" / "peers").read_text(), re.M)
    assert len(peers) == 4, peers
    for peer in peers:
        assert f"`{peer}`" in CONTRIBUTING, peer


def test_scripts_test_never_stops_a_foreign_prometheus() -> None:
    code = "\n".join(line.split("#", 1)[0] for line in SCRIPT.splitlines())
    for word in ("pkill", "killall", "systemctl", "service "):
        assert word not in code, word
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "test")], check=True)
