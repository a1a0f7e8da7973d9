"""``scripts/rerun-screenshot`` without a Vulkan driver says what to install (no
traceback), and never writes into docs/ unless told (issue 30)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "rerun-screenshot"


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path, env=full,
                          capture_output=True, text=True, timeout=120, check=False)


def test_no_vulkan_driver_says_what_to_install(tmp_path: Path) -> None:
    rrd = tmp_path / "x.rrd"
    rrd.write_bytes(b"")
    done = _run(tmp_path, str(rrd), VK_ICD_FILENAMES=str(tmp_path / "none.json"))
    assert done.returncode == 2
    assert "mesa-vulkan-drivers" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_driver_that_cannot_load_says_what_to_install(tmp_path: Path) -> None:
    """The viewer starts, then dies on its first frame: the raw ConnectionError before."""
    icd = tmp_path / "broken.json"
    icd.write_text('{"file_format_version": "1.0.0", "ICD": {"library_path": '
                   '"/nonexistent/libvulkan_broken.so", "api_version": "1.3.0"}}')
    from otel_proofscope.rerun.exporter import RerunSpanExporter

    rrd = tmp_path / "empty.rrd"
    exporter = RerunSpanExporter(f"file:{rrd}")
    exporter.shutdown()
    done = _run(tmp_path, str(rrd), "--out", str(tmp_path / "shot.png"),
                VK_ICD_FILENAMES=str(icd))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "mesa-vulkan-drivers" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_default_out_is_not_in_docs() -> None:
    text = SCRIPT.read_text()
    assert "docs/images" not in text.split("def main", 1)[1].split("args = ap.parse_args", 1)[0]
    assert 'tempfile.mkdtemp(prefix="proofscope-screenshot-")' in text
