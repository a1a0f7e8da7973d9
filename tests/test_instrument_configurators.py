"""``opentelemetry-instrument`` with this package and opentelemetry-distro both
installed: no "Configuration of … not loaded" warning on every run (issue 30)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from otel_proofscope.setup.autoconfig import _LOAD_LOGGER, quiet_equivalent_configurators

pytest.importorskip("opentelemetry.instrumentation")
ROOT = Path(__file__).resolve().parents[1]


def _entry_points(tmp_path: Path) -> Path:
    """This branch's distro entry point, as an installed package's metadata would list
    it (the shared venv's metadata predates it)."""
    site = tmp_path / "site"
    info = site / "otel_proofscope_eps-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: otel-proofscope-eps\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text(
        "[opentelemetry_distro]\nproofscope = otel_proofscope.setup.distro:ProofscopeDistro\n")
    return site


def _instrument(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    command = shutil.which("opentelemetry-instrument",
                           path=str(Path(sys.executable).parent)) or "opentelemetry-instrument"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    base.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(_entry_points(tmp_path))]),
                OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none",
                OTEL_LOGS_EXPORTER="none", **env)
    return subprocess.run([command, sys.executable, "-c", "print('ran')"], cwd=tmp_path,
                          env=base, capture_output=True, text=True, timeout=120, check=False)


def test_the_proofscope_distro_quiets_the_equivalent_configurator_warning(
        tmp_path: Path) -> None:
    done = _instrument(tmp_path, OTEL_PYTHON_DISTRO="proofscope")
    assert done.returncode == 0 and "ran" in done.stdout, done.stderr
    assert "not loaded" not in done.stderr


def test_the_filter_passes_other_configurators() -> None:
    logger = logging.getLogger(_LOAD_LOGGER)
    quiet_equivalent_configurators()
    quiet_equivalent_configurators()  # idempotent
    assert len([f for f in logger.filters if type(f).__name__ == "_EquivalentConfigurators"]) \
        == 1
    make = logger.makeRecord
    same = make(_LOAD_LOGGER, logging.WARNING, __file__, 1,
                "Configuration of %s not loaded, %s already loaded",
                ("proofscope", "configurator"), None)
    other = make(_LOAD_LOGGER, logging.WARNING, __file__, 1,
                 "Configuration of %s not loaded, %s already loaded",
                 ("vendor", "configurator"), None)
    assert not logger.filter(same)
    assert logger.filter(other)
