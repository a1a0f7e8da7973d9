"""`proofscope gpu` census and scripts/gpu-check, run for real on this machine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from otel_proofscope.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _nvml_missing() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return True
    pynvml.nvmlShutdown()
    return False


def test_gpu_json_census(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpu", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    backends = {b["name"]: b for b in data["backends"]}
    assert set(backends) == {"nvml", "wgpu"}
    if _nvml_missing():
        assert backends["nvml"] == {"name": "nvml", "available": False,
                                    "reason": "unavailable", "detail": "LibraryNotFound",
                                    "devices": []}
    wg = backends["wgpu"]
    if wg["available"]:
        for dev in wg["devices"]:
            assert dev["backend"] in {"vulkan", "metal", "d3d12", "gl"}
            assert dev["hw_id"].startswith("wgpu:")
            gaps = {g["capability"]: g["reason"] for g in dev["gaps"]}
            assert gaps["utilization"] == "unsupported"
            assert gaps["occupancy"] == "unsupported"
            assert gaps["stall_counters"] == "unsupported"
            assert set(dev["measured"]) | set(gaps) >= {"kernel_timestamps", "power"}


def test_gpu_table_census(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpu", "--no-wgpu"]) == 0
    out = capsys.readouterr().out
    assert "GPU backends" in out
    # The status column says "unavailable" once; the detail column says why.
    assert "unavailable  unavailable" not in out
    if _nvml_missing():
        assert re.search(r"^nvml +unavailable +LibraryNotFound$", out, re.M), out
        assert "emits no gpu.* telemetry" in out


def test_gpu_check_script_degrades_gracefully(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    os.chmod(tmp_path, 0o700)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu-check"),
                           "--seconds", "0.2"], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if _nvml_missing():
        assert "NVML unavailable: LibraryNotFound" in proc.stdout
    assert "result: OK" in proc.stdout
    if "wgpu unavailable" not in proc.stdout:
        assert proc.stdout.count(": ok (") == 3
        assert "gpu.submit.duration" in proc.stdout
