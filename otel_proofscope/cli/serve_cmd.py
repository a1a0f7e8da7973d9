"""`proofscope serve`: receive OTLP (gRPC/HTTP) from any prover and draw it in Rerun"""

from __future__ import annotations

import argparse
from typing import Any

from otel_proofscope.cli import not_built


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("serve", help="receive OTLP (gRPC/HTTP) from any prover and draw it in Rerun", description="receive OTLP (gRPC/HTTP) from any prover and draw it in Rerun")
    p.set_defaults(handler=lambda args: not_built("serve", "integrations"))
