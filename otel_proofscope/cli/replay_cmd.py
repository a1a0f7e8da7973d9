"""`proofscope replay`: replay a proof-stream JSON file, pipe or WebSocket into spans"""

from __future__ import annotations

import argparse
from typing import Any

from otel_proofscope.cli import not_built


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("replay", help="replay a proof-stream JSON file, pipe or WebSocket into spans", description="replay a proof-stream JSON file, pipe or WebSocket into spans")
    p.set_defaults(handler=lambda args: not_built("replay", "integrations"))
