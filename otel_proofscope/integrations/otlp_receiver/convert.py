"""Old home of the OTLP decoder; it lives in :mod:`otel_proofscope.otlp.decode`.

This module *is* that module (the same object in ``sys.modules``), so every name,
private ones included, and every monkeypatch reach the one implementation.
"""

import sys

from otel_proofscope.otlp import decode
from otel_proofscope.otlp.decode import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = decode
