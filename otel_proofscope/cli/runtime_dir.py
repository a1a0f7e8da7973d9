"""A private XDG runtime directory for the CLI when the session has none.

Mesa's Vulkan and GL drivers (wgpu's adapters, the Rerun viewer) print
``error: XDG_RUNTIME_DIR is invalid or not set in the environment`` once per adapter
probe when the variable is unset or points at something unusable (measured: 2–4 lines
for ``proofscope gpu`` and ``demo --backend wgpu`` on Debian 12 with lavapipe). The
XDG spec asks for a directory owned by the user with mode 0700; when there is none,
the CLI makes one under the temporary directory for the life of the process (child
processes inherit it) and removes it at exit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile

ENV = "XDG_RUNTIME_DIR"


def _usable(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and stat.S_IMODE(st.st_mode) & 0o077 == 0)


def ensure_private_runtime_dir() -> str | None:
    """Point ``XDG_RUNTIME_DIR`` at a private 0700 directory if it is unset or unusable;
    returns the directory made (None when the environment already had a usable one)."""
    if not hasattr(os, "getuid"):  # not a POSIX system: no XDG runtime dir to provide
        return None
    current = os.environ.get(ENV)
    if current and _usable(current):
        return None
    made = tempfile.mkdtemp(prefix="proofscope-xdg-")  # mkdtemp creates it 0700
    os.environ[ENV] = made
    atexit.register(shutil.rmtree, made, ignore_errors=True)
    return made
