"""Start the export process's interpreter and imports before ``configure()`` knows its work.

The export child spends ~1.3 s (2-CPU machine, at rest) on an interpreter and the Rerun
SDK's imports before it can draw. Started inside ``configure()``, that start-up overlapped
only the prover's own work; a short run (``proofscope demo``: ~0.1 s of proving) then
waited for it at its exit. A command that knows it will draw Rerun calls :func:`prestart`
first thing, so the child imports while the prover's process imports its own modules;
``configure()`` then hands the waiting child its configuration (:func:`take`).

Protocol: the child is started with :data:`ARG` and, after its imports, reads one header
from its stdin: a 4-byte big-endian length and that many bytes of JSON,
``{"config": ..., "env": {"set": {...}, "unset": [...]}}`` (the parent's environment as
it changed since the child started: the child reads its variables after the header).
End of input before the header means nobody took it: it exits 0 without a word.

This module imports the standard library (and the stdlib-only ``child_command``): it
runs before the prover's imports.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import struct
import subprocess
import threading
from typing import Any

from otel_proofscope.rerun.child_command import child_command

#: The child's one argument when it waits for its configuration on stdin.
ARG = "--config-from-stdin"
MODULE = "otel_proofscope.rerun.export_worker"
HEADER = struct.Struct(">I")
#: Larger headers are refused by the child; the parent then starts a fresh child.
MAX_HEADER_BYTES = 1 << 20
#: What a header may take in the pipe without blocking ``configure()`` on a child still
#: importing (Linux pipes hold 64 KiB; POSIX guarantees 4 KiB).
PIPE_SAFE_BYTES = 4096

_lock = threading.Lock()
_waiting: subprocess.Popen[bytes] | None = None
_env_at_start: dict[str, str] = {}


def prestart() -> bool:
    """Start the export child now, if none is waiting; True when one is (or was) waiting.

    Never raises: a child that cannot start here is started by ``configure()`` as before.
    """
    global _waiting, _env_at_start
    with _lock:
        if _waiting is not None:
            return True
        try:
            # A process group of its own: a Ctrl-C while it imports (before it can
            # ignore SIGINT as every child of the prover does) must not print a
            # KeyboardInterrupt traceback; the parent stops it by closing its stdin.
            env = dict(os.environ)  # what the child starts with: take() sends the changes
            _waiting = subprocess.Popen(child_command(MODULE, ARG),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        close_fds=True, process_group=0, env=env)
        except (OSError, ValueError):  # no process groups (Windows): configure() starts it
            return False
        _env_at_start = env
    return True


def take(config: dict[str, Any]) -> subprocess.Popen[bytes] | None:
    """The waiting child, configured with ``config``; None when there is none (or it
    died, or the header would not fit the pipe): the caller starts one itself."""
    global _waiting
    with _lock:
        proc, _waiting = _waiting, None
        before = _env_at_start
    if proc is None:
        return None
    now = dict(os.environ)
    env = {"set": {k: v for k, v in now.items() if before.get(k) != v},
           "unset": sorted(k for k in before if k not in now)}
    body = json.dumps({"config": config, "env": env}).encode()
    if proc.poll() is not None or len(body) + HEADER.size > PIPE_SAFE_BYTES:
        _discard(proc)
        return None
    assert proc.stdin is not None
    try:
        proc.stdin.write(HEADER.pack(len(body)) + body)
        proc.stdin.flush()
    except OSError:
        _discard(proc)
        return None
    return proc


def read_header(fd: int = 0) -> dict[str, Any] | None:
    """In the child: the header from ``fd``, unbuffered (the frames that follow belong to
    the worker's own reader); None at end of input. Raises ValueError on a bad header."""
    size = _read_exactly(fd, HEADER.size)
    if size is None:
        return None
    (length,) = HEADER.unpack(size)
    if length > MAX_HEADER_BYTES:
        raise ValueError(f"export process: configuration header of {length} bytes "
                         f"(at most {MAX_HEADER_BYTES})")
    body = _read_exactly(fd, length)
    if body is None:
        return None
    try:
        header = json.loads(body)
    except ValueError as exc:
        raise ValueError(f"export process: the configuration header is not JSON: {exc}") \
            from None
    if not isinstance(header, dict) or not isinstance(header.get("config"), dict):
        raise ValueError("export process: the configuration header is not "
                         '{"config": {...}, "env": {...}}')
    return header


def apply_env(env: Any) -> None:
    """In the child: the parent's environment changes since the child started."""
    if not isinstance(env, dict):
        return
    for key, value in (env.get("set") or {}).items():
        if isinstance(key, str) and isinstance(value, str):
            os.environ[key] = value
    for key in env.get("unset") or ():
        if isinstance(key, str):
            os.environ.pop(key, None)


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks: list[bytes] = []
    while n > 0:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _discard(proc: subprocess.Popen[bytes]) -> None:
    # It has done nothing but import: stopped at once, so an exit never waits for it.
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(1.0)


def _discard_waiting() -> None:
    global _waiting
    with _lock:
        proc, _waiting = _waiting, None
    if proc is not None:
        _discard(proc)


def _forget_in_fork() -> None:
    # A forked process must not hand the parent's waiting child a configuration, nor
    # hold its stdin open (the child would wait for the fork's exit to see its end).
    global _waiting, _lock
    _lock = threading.Lock()
    proc, _waiting = _waiting, None
    if proc is not None:
        for pipe in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()


atexit.register(_discard_waiting)
os.register_at_fork(after_in_child=_forget_in_fork)
