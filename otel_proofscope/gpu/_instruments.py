"""Old name of :mod:`otel_proofscope.gpu.instruments` (``_instruments`` means the
instrumented library's requirements in the OpenTelemetry contrib layout).

This module *is* that module (the same object in ``sys.modules``).
"""

import sys

from otel_proofscope.gpu import instruments
from otel_proofscope.gpu.instruments import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = instruments
