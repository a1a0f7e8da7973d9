"""The optional extras of the package, and the one install hint a missing one gets.

An optional dependency that is missing must say which extra brings it, never surface as
a raw ``ModuleNotFoundError`` (the names are those of ``pyproject.toml``).
"""

from __future__ import annotations

from typing import Final

DISTRIBUTION: Final = "otel-proofscope"


def install_hint(extra: str) -> str:
    """``pip install 'otel-proofscope[EXTRA]'``, the command that installs ``extra``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def missing(package: str, extra: str, exc: ImportError | None = None) -> str:
    """The message for a missing optional dependency: what, and how to install it."""
    why = f" ({exc})" if exc is not None else ""
    return f"{package} is not installed{why}; install it with: {install_hint(extra)}"
