"""A missing optional dependency names the extra that installs it (no raw tracebacks).

Each check runs the real CLI in a subprocess where the module is made unimportable the
way a missing package is (``sys.modules[name] = None`` makes ``import name`` raise
``ModuleNotFoundError``), so nothing else about the environment changes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from otel_proofscope.extras import install_hint, missing


def _cli_without(modules: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    code = ("import sys\n"
            f"for m in {modules!r}: sys.modules[m] = None\n"
            "from otel_proofscope.cli import main\n"
            f"sys.exit(main({list(args)!r}))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)


def test_hint_is_the_pyproject_extra() -> None:
    assert install_hint("stream") == "pip install 'otel-proofscope[stream]'"
    assert missing("websockets", "stream").endswith(install_hint("stream"))


def test_replay_websocket_without_websockets_names_the_extra() -> None:
    proc = _cli_without(["websockets", "websockets.sync", "websockets.sync.client"],
                        "replay", "ws://127.0.0.1:9/ws?token=t", "--rerun", "off")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "pip install 'otel-proofscope[stream]'" in proc.stderr
    assert "token=t" not in proc.stderr  # the URL is still redacted


@pytest.mark.parametrize(("modules", "extra", "backend"),
                         [(["pynvml"], "nvml", "nvml"), (["wgpu"], "wgpu", "wgpu")])
def test_gpu_without_a_backend_module_names_the_extra(modules: list[str], extra: str,
                                                      backend: str) -> None:
    proc = _cli_without(modules, "gpu")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith(backend + " "))
    assert "unavailable" in line and f"pip install 'otel-proofscope[{extra}]'" in line, line
