"""Helpers for tests that run `proofscope serve` as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path


def read_until(proc: subprocess.Popen[str], prefix: str, lines: list[str]) -> str:
    """Read serve's stdout up to the line starting with ``prefix``; return its last word
    (the endpoint of a "… listening on URL" line). Every line read is kept in ``lines``."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return line.strip().rsplit(" ", 1)[-1]
    raise AssertionError(f"no {prefix!r} line; got {lines}")


def proc_status(pid: int, field: str) -> int:
    """A memory field of /proc/PID/status (``VmRSS``, ``VmHWM``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(pid: int, limit_s: float = 60.0) -> None:
    """Until serve has drawn what it queued: under 5 % of a CPU for half a second."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        before = cpu_s(pid)
        time.sleep(0.5)
        if cpu_s(pid) - before < 0.025:
            return


class ProtobufReplies(BaseHTTPRequestHandler):
    """The base of the tests' OTLP/HTTP receivers: a protobuf reply, no access log."""

    def reply(self, status: int, payload: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        return None
