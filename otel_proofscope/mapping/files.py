"""Where rule files are: a shipped preset by name, or a path.

Shared by the span/event rules and the log-line rules so ``--map NAME`` means the same
file for both readers.
"""

from __future__ import annotations

import re
from pathlib import Path

#: The rule files shipped with the package (package data).
PRESETS_DIR = Path(__file__).resolve().parent / "presets"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def preset_names() -> list[str]:
    """Names of the shipped presets (``presets/<name>.toml``), sorted."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))


def resolve_rule_file(name_or_path: str) -> Path:
    """A shipped preset when ``name_or_path`` is a bare preset name, else a file path.

    Raises :class:`FileNotFoundError` naming both what was tried and the presets there are.
    """
    if _NAME.fullmatch(name_or_path) and not name_or_path.endswith(".toml"):
        preset = PRESETS_DIR / f"{name_or_path}.toml"
        if preset.is_file():
            return preset
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    raise FileNotFoundError(
        f"rule file {name_or_path!r}: no such preset ({', '.join(preset_names()) or 'none'}"
        f" shipped) and no such file")
