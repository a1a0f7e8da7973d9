"""The command line that starts one of our child processes with this very package.

Why: ``python -m MODULE`` puts the working directory first on the child's ``sys.path``.
A prover started from a folder that holds another ``otel_proofscope`` (a checkout of
another version, next to an installed one) got a child that imported that one: two
versions of the frame protocol talking to each other, and benchmarks that compared two
checkouts measured one of them twice. So the child runs with ``-P`` (nothing
prepended) and pins the package from the parent's own location first; everything else
resolves as the parent's environment says.

Standard library only: :mod:`otel_proofscope.rerun.prestart` runs before the prover's
imports.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: The folder that holds this package (``.../otel_proofscope/rerun/child_command.py``).
ROOT = str(Path(__file__).resolve().parents[2])

_BOOT = ("import sys; sys.path.insert(0, {root!r}); import otel_proofscope; "
         "sys.path.remove({root!r}); import runpy; "
         "runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")


def child_command(module: str, *args: str) -> list[str]:
    """``python`` running ``module`` as ``__main__`` with ``args``, as ``-m`` would, but
    importing the package from :data:`ROOT` whatever the working directory holds."""
    return [sys.executable, "-P", "-c", _BOOT.format(root=ROOT, module=module), *args]
