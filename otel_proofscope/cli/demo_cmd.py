"""`proofscope demo`: prove a small quantized network with the reference GKR prover"""

from __future__ import annotations

import argparse
from typing import Any

from otel_proofscope.cli import not_built


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("demo", help="prove a small quantized network with the reference GKR prover", description="prove a small quantized network with the reference GKR prover")
    p.set_defaults(handler=lambda args: not_built("demo", "reference prover"))
