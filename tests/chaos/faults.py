"""Fault injectors for the chaos suite: real sockets and processes, no mocks."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class SilentListener:
    """A TCP port that accepts connections and never answers (a frozen viewer)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[socket.socket] = []
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)  # held open, never read, never answered

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for c in self.accepted:
            c.close()


@contextlib.contextmanager
def silent_listener() -> Iterator[SilentListener]:
    listener = SilentListener()
    try:
        yield listener
    finally:
        listener.close()


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_python(code: str, *args: str, env: dict[str, str], timeout: float,
               stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], env=env, text=True,
                          capture_output=True, timeout=timeout, input=stdin)


def drop_count(text: str, signal: str, sink: str, reason: str) -> int:
    """The count on an exit-summary line ``N signal → sink (reason)``, 0 when absent."""
    m = re.search(rf"(\d+) {re.escape(signal)} → {re.escape(sink)} \({re.escape(reason)}\)",
                  text)
    return int(m.group(1)) if m else 0
