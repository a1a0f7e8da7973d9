"""Where a Rerun view goes: the target (``PROOFSCOPE_RERUN``) parsed, and the ledger's
name for the Rerun sink.

Kept apart from :mod:`otel_proofscope.rerun.sink` so that the prover's process can
choose and start the export process (``configure()``'s one Rerun route) without
importing the Rerun SDK, ~1.2 s of CPU that the child pays instead, overlapping the
prover's work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlparse

from otel_proofscope.semconv import SINK_RERUN

ENV_TARGET = "PROOFSCOPE_RERUN"
DEFAULT_TARGET = "file:proofscope.rrd"
DEFAULT_PORT = 9876
#: The ``proofscope.sink`` label of Rerun's entries in the drop ledger (not a RerunSink).
LEDGER_SINK = SINK_RERUN


@dataclass(frozen=True)
class Target:
    kind: Literal["off", "file", "spawn", "grpc"]
    path: str = ""
    url: str = ""
    host: str = ""
    port: int = 0

    @property
    def name(self) -> str:
        if self.kind == "file":
            return f"file:{os.path.abspath(self.path)}"
        if self.kind == "grpc":
            return self.url
        return self.kind


def parse_target(text: str | None) -> Target:
    """A target string (None: ``PROOFSCOPE_RERUN``, else the default ``.rrd`` file)."""
    if text is None:
        text = os.environ.get(ENV_TARGET, "").strip() or DEFAULT_TARGET
    text = text.strip()
    low = text.lower()
    if low in ("off", "none", "false", "0", ""):
        return Target("off")
    if low == "spawn":
        return Target("spawn", url=f"rerun+http://127.0.0.1:{DEFAULT_PORT}/proxy",
                      host="127.0.0.1", port=DEFAULT_PORT)
    if low.startswith("file:"):
        path = text[5:]
        if not path:
            raise ValueError("rerun target 'file:' needs a path, e.g. file:proofscope.rrd")
        return Target("file", path=path)
    url = text
    if "://" not in url:  # bare host:port, as stwo-ml's Rerun sink accepts
        url = f"rerun+http://{url}/proxy"
    parsed = urlparse(url)
    if not parsed.scheme.startswith("rerun") or not parsed.hostname:
        raise ValueError(f"unrecognised rerun target {text!r}: expected 'spawn', "
                         "'file:PATH.rrd', 'rerun+http://HOST:PORT/proxy' or 'off'")
    try:
        port = parsed.port or DEFAULT_PORT
    except ValueError:
        raise ValueError(f"rerun target {text!r}: bad port") from None
    return Target("grpc", url=url, host=parsed.hostname, port=port)
