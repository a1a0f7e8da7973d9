"""`proofscope run`: run any prover process under a proof span, sampling GPUs"""

from __future__ import annotations

import argparse
from typing import Any

from otel_proofscope.cli import not_built


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("run", help="run any prover process under a proof span, sampling GPUs", description="run any prover process under a proof span, sampling GPUs")
    p.set_defaults(handler=lambda args: not_built("run", "integrations"))
