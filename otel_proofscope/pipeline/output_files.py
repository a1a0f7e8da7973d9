"""Output files created without following a planted link, and output folders checked
before anything is written to them.

Why: an output folder is often shared (``proofscope-out`` in a project, a CI workspace),
and every file in it was opened by name. A symbolic link planted at
``OUT/traces.jsonl`` made the prover append its telemetry to whatever file the link
named; one at ``OUT/proofscope.rrd`` had the recording written over its target.

* :func:`open_output` opens with ``O_NOFOLLOW`` (the last component may not be a link)
  and ``O_NONBLOCK`` (a planted FIFO cannot hang the open), then requires a regular
  file (or a character device named on purpose, such as ``/dev/null``): a link, a
  FIFO, a socket or a folder is refused with an :class:`UnsafeOutputError` naming the
  path. Append-only files (``traces.jsonl``) cannot be created ``O_EXCL``: several
  processes of one job may share them by design.
* :func:`refuse_link` checks a path that a library opens itself (Rerun's ``.rrd``
  writer, the upstream metrics file exporter). A link planted between the check and
  that library's open is still followed: the remaining race, closed only where we
  hold the file ourselves (see ``rerun/sink.py``, which opens the recording first
  with :func:`open_output` and keeps it open).
* :func:`check_folder` turns "a file where the folder should be" and "a folder that
  cannot be written" into one error naming who asked for that folder (``out_dir=``,
  ``PROOFSCOPE_OUT_DIR``, ``--out``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import IO, Any


class UnsafeOutputError(OSError):
    """An output path that is refused: a symbolic link, not a regular file, or a folder
    that cannot hold output. The message names the path (and who chose it)."""


def _describe_link(path: str | os.PathLike[str]) -> str:
    try:
        return f" (to {os.readlink(path)!r})"
    except OSError:
        return ""


def refuse_link(path: str | os.PathLike[str], what: str = "output file") -> None:
    """Raise :class:`UnsafeOutputError` when ``path`` is a symbolic link. A path that
    does not exist (or sits under a file) passes: its writer reports that failure."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeOutputError(
            errno.ELOOP, f"refusing to write {what} {os.fspath(path)!r}: it is a symbolic "
            f"link{_describe_link(path)}; remove it or choose another path")


def _writable_kind(mode: int) -> bool:
    # A regular file, or a character device a user names on purpose (/dev/null,
    # /dev/full); a FIFO, socket or folder planted at the path is refused.
    return stat.S_ISREG(mode) or stat.S_ISCHR(mode)


def open_output_fd(path: str | os.PathLike[str], *, append: bool,
                   what: str = "output file") -> int:
    """A descriptor for writing ``path`` (created 0o644 when missing; appended to, or
    truncated), refusing a symbolic link or anything but a regular file at ``path``."""
    flags = (os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
             | (os.O_APPEND if append else 0))
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            refuse_link(path, what)  # names the link and its target
        raise UnsafeOutputError(exc.errno or errno.EIO,
                                f"cannot write {what} {os.fspath(path)!r}: "
                                f"{exc.strerror or exc}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not _writable_kind(mode):
            raise UnsafeOutputError(
                errno.EINVAL, f"refusing to write {what} {os.fspath(path)!r}: it exists "
                "and is not a regular file")
        if not append and stat.S_ISREG(mode):
            os.ftruncate(fd, 0)  # only now: a FIFO was never truncated
        # Blocking writes from here on (O_NONBLOCK only guarded the open).
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_output(path: str | os.PathLike[str], mode: str = "a", *,
                what: str = "output file", **kwargs: Any) -> IO[Any]:
    """:func:`open` for writing (``"a"``, ``"w"``, ``"ab"``, ``"wb"``) through
    :func:`open_output_fd`."""
    if mode.rstrip("b") not in ("a", "w"):
        raise ValueError(f"open_output writes only: mode {mode!r}")
    fd = open_output_fd(path, append=mode.startswith("a"), what=what)
    try:
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def check_folder(path: str | os.PathLike[str], source: str) -> None:
    """Raise :class:`UnsafeOutputError` naming ``source`` (the argument or variable that
    chose ``path``) when ``path`` cannot be, or become, a writable folder: it is a file,
    a file sits where one of its parents should be, or the nearest existing folder
    cannot be written."""
    p = Path(path)
    probe = p
    while True:
        try:
            st = os.stat(probe)
        except FileNotFoundError:
            if probe.parent == probe:
                return
            probe = probe.parent
            continue
        except NotADirectoryError:
            st = None
        except OSError as exc:
            raise UnsafeOutputError(exc.errno or errno.EIO,
                                    f"{source}: output folder {os.fspath(p)!r} cannot be "
                                    f"used: {exc.strerror or exc}") from exc
        break
    if st is None or not stat.S_ISDIR(st.st_mode):
        if probe == p and st is not None:
            where = "is a file"
        elif st is not None:
            where = f"has a file where folder {os.fspath(probe)!r} should be"
        else:
            where = "has a file where one of its parent folders should be"
        raise UnsafeOutputError(errno.ENOTDIR, f"{source}: output folder {os.fspath(p)!r} "
                                               f"{where}; choose a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        what = "is" if probe == p else f"would be created in {os.fspath(probe)!r}, which is"
        raise UnsafeOutputError(errno.EACCES, f"{source}: output folder {os.fspath(p)!r} "
                                              f"{what} not writable")
