"""The CLI says each thing once: no Mesa XDG_RUNTIME_DIR errors, no drop or Rerun
warning repeated by the logger and the summary, a progress bar sized from the start."""

from __future__ import annotations

import os
import pty
import select
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_proofscope.cli.runtime_dir import ensure_private_runtime_dir


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "PROOFSCOPE_")) and k != "XDG_RUNTIME_DIR"}
    env.update(extra)
    return env


def _cli(*args: str, env: dict[str, str], prelude: str = "",
         timeout: float = 180) -> subprocess.CompletedProcess[str]:
    code = (f"import sys\n{prelude}\nfrom otel_proofscope.cli import main\n"
            f"sys.exit(main({list(args)!r}))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.parametrize("args", [("gpu",), ("demo", "--backend", "wgpu", "--layers", "2",
                                             "--width", "8", "--rerun", "off")],
                         ids=["gpu", "demo-wgpu"])
def test_no_xdg_runtime_dir_errors_when_unset(tmp_path: Path, args: tuple[str, ...]) -> None:
    pytest.importorskip("wgpu")
    full = [*args, "--out", str(tmp_path)] if args[0] == "demo" else list(args)
    proc = _cli(*full, env=_env())
    assert proc.returncode in (0, 2), proc.stderr  # 2: no wgpu adapter on this machine
    assert "XDG_RUNTIME_DIR" not in proc.stderr, proc.stderr


def test_private_runtime_dir_is_0700_and_kept_when_usable(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    made = ensure_private_runtime_dir()
    assert made is not None and os.environ["XDG_RUNTIME_DIR"] == made
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700
    assert ensure_private_runtime_dir() is None  # now usable: left alone
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(shared))
    replaced = ensure_private_runtime_dir()  # group/world-readable: not private
    assert replaced is not None and replaced != str(shared)


def test_drop_lines_are_printed_once(tmp_path: Path) -> None:
    # A collector that is not there: every span export fails and is counted.
    env = _env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{_free_port()}",
               OTEL_EXPORTER_OTLP_TIMEOUT="1", PROOFSCOPE_SHUTDOWN_TIMEOUT="2")
    proc = _cli("demo", "--out", str(tmp_path), "--layers", "2", "--width", "8",
                "--rerun", "off", env=env)
    both = proc.stdout + proc.stderr
    drop_lines = [line for line in both.splitlines() if "dropped: " in line
                  and "item(s)" in line]
    assert len(drop_lines) == 1, both


def test_rerun_unavailable_is_said_once(tmp_path: Path) -> None:
    proc = _cli("demo", "--out", str(tmp_path), "--layers", "2", "--width", "8",
                env=_env(), prelude="sys.modules['rerun'] = None")
    assert proc.returncode == 0, proc.stderr
    both = proc.stdout + proc.stderr
    assert both.count("rerun-sdk is not installed") == 1, both


def test_progress_bar_never_shows_an_unknown_total(tmp_path: Path) -> None:
    pytest.importorskip("rich")
    main_fd, child_fd = pty.openpty()
    env = _env(COLUMNS="120", TERM="xterm")
    proc = subprocess.Popen([sys.executable, "-m", "otel_proofscope", "demo", "--out",
                             str(tmp_path), "--layers", "3", "--width", "8", "--rerun", "off"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=child_fd, env=env)
    os.close(child_fd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main_fd], [], [], 0.5)
        if ready:
            try:
                data = os.read(main_fd, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(main_fd)
    assert proc.wait(30) == 0
    out = b"".join(chunks).decode(errors="replace")
    assert "3/3" in out, out  # it is the rich bar, and it finished
    assert "/?" not in out, out
