"""Helpers for tests that run `proofscope serve` as a real subprocess."""

from __future__ import annotations

import subprocess


def read_until(proc: subprocess.Popen[str], prefix: str, lines: list[str]) -> str:
    """Read serve's stdout up to the line starting with ``prefix``; return its last word
    (the endpoint of a "… listening on URL" line). Every line read is kept in ``lines``."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return line.strip().rsplit(" ", 1)[-1]
    raise AssertionError(f"no {prefix!r} line; got {lines}")
