"""``scripts/preset-names`` on the real sources of the plonky3 and arkworks presets: the
crates the peer provers build from (their versions read from the peers' Cargo.lock,
their sources from cargo's registry, where building the peers put them). Every rule
must match a name those sources define: an upstream rename fails here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from peers import peer

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "preset-names"
CARGO_HOME = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))


def _locked(lock: Path) -> dict[str, str]:
    text = lock.read_text()
    return dict(re.findall(r'\[\[package\]\]\nname = "([^"]+)"\nversion = "([^"]+)"', text))


def _crate(name: str, version: str) -> Path:
    found = sorted(CARGO_HOME.glob(f"registry/src/*/{name}-{version}"))
    if not found:
        pytest.fail(f"{name} {version} is not in cargo's registry ({CARGO_HOME}): "
                    "scripts/peers fetches it when it builds the peer", pytrace=False)
    return found[0]


def _tree(tmp_path: Path, lock: Path, prefix: str) -> Path:
    """The locked crates of ``prefix``, each at its path in the upstream repository."""
    out = tmp_path / "src"
    for name, version in _locked(lock).items():
        if not name.startswith(prefix):
            continue
        crate = _crate(name, version)
        vcs = json.loads((crate / ".cargo_vcs_info.json").read_text())
        shutil.copytree(crate, out / (vcs.get("path_in_vcs") or name), dirs_exist_ok=True)
    return out


def _check(tree: Path, preset: str, upstream: str) -> str:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tree), preset,
                           "--upstream", upstream], capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"rules that match no name defined here (rules from {upstream}) (0)" in out, out
    return out


def test_plonky3_rules_match_plonky3_s_own_names(tmp_path: Path) -> None:
    peer("plonky3-prover")
    tree = _tree(tmp_path, ROOT / "tests" / "plonky3_prover" / "Cargo.lock", "p3-")
    out = _check(tree, "plonky3", "Plonky3/Plonky3")
    for name in ("prove", "commit to trace data", "commit to quotient poly chunks", "open",
                 "FRI prover", "commit phase", "query phase", "verify"):
        assert f"'{name}'" in out.split("names no rule matches")[0], name


def test_arkworks_rules_match_ark_groth16_s_timers(tmp_path: Path) -> None:
    peer("arkworks-prover")
    tree = _tree(tmp_path, ROOT / "tests" / "arkworks_prover" / "Cargo.lock", "ark-groth16")
    out = _check(tree, "arkworks", "arkworks-rs/groth16")
    assert "(start_timer!)" in out
