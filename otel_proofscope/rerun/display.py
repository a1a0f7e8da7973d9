"""Whether a spawned Rerun viewer can open a window on this machine.

On Linux the viewer needs a reachable X11 or Wayland server. Without one it binds its
port, accepts the recording, then exits in winit, and everything sent to it is lost.
A DISPLAY that names no running server (a stale ``:99`` left over from a CI job, an
ssh session whose forwarding closed) is as fatal as no DISPLAY at all, so each named
server is connected to, briefly, before a viewer is spawned.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Mapping

#: How long one display socket may take to accept (a local socket answers in µs).
CONNECT_TIMEOUT_S = 0.3

_X_DISPLAY = re.compile(r"^(?P<host>[^:]*):(?P<number>\d+)(?:\.\d+)?$")
_ADVICE = ("record to a file instead (--rerun file:PATH.rrd) and open it where there "
           "is a display: rerun PATH.rrd")


def _unix_accepts(path: str, timeout_s: float) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(path)
            return True
    except OSError:
        return False


def _tcp_accepts(host: str, port: int, timeout_s: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def x_server_answers(display: str, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether an X server accepts connections for ``display`` (``[host]:N[.screen]``).

    A local display is tried on its Unix socket, then Linux's abstract socket of the
    same name (Xvfb and Xorg listen on both); a remote one on TCP port 6000+N, which
    is where ssh X forwarding listens.
    """
    match = _X_DISPLAY.match(display.strip())
    if match is None:
        return False
    host, number = match["host"], int(match["number"])
    if host in ("", "unix") or host.startswith("/"):
        path = f"/tmp/.X11-unix/X{number}"
        return _unix_accepts(path, timeout_s) or _unix_accepts("\0" + path, timeout_s)
    return _tcp_accepts(host, 6000 + number, timeout_s)


def wayland_server_answers(name: str, env: Mapping[str, str],
                           timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether the Wayland compositor socket ``name`` accepts connections (a relative
    name lives in ``$XDG_RUNTIME_DIR``, as libwayland resolves it)."""
    if os.path.isabs(name):
        return _unix_accepts(name, timeout_s)
    runtime = env.get("XDG_RUNTIME_DIR")
    return bool(runtime) and _unix_accepts(os.path.join(str(runtime), name), timeout_s)


def display_unavailable(env: Mapping[str, str] | None = None) -> str | None:
    """Why a spawned viewer cannot open a window here, or None where it can.

    Other platforms than Linux always have a window system. ``WAYLAND_SOCKET`` (an
    inherited, already connected descriptor) is trusted as given.
    """
    if not sys.platform.startswith("linux"):
        return None
    env = os.environ if env is None else env
    x_display = env.get("DISPLAY", "")
    wayland = env.get("WAYLAND_DISPLAY", "")
    if env.get("WAYLAND_SOCKET"):
        return None
    if not x_display and not wayland:
        return ("no display (DISPLAY and WAYLAND_DISPLAY are unset), so the viewer "
                f"cannot start; {_ADVICE}")
    if wayland and wayland_server_answers(wayland, env):
        return None
    if x_display and x_server_answers(x_display):
        return None
    named = ", ".join(f"{var}={value}" for var, value in
                      (("DISPLAY", x_display), ("WAYLAND_DISPLAY", wayland)) if value)
    return (f"no display server answers ({named} is set, but nothing accepts "
            f"connections there), so the viewer would open no window; {_ADVICE}")
