"""`proofscope gpu`: census of GPU backends, devices, measured metrics and capability gaps"""

from __future__ import annotations

import argparse
from typing import Any

from otel_proofscope.cli import not_built


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("gpu", help="census of GPU backends, devices, measured metrics and capability gaps", description="census of GPU backends, devices, measured metrics and capability gaps")
    p.set_defaults(handler=lambda args: not_built("gpu", "GPU telemetry"))
