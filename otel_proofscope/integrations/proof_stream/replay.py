"""Drive a bridge from a line source until the source ends."""

from __future__ import annotations

from otel_proofscope.integrations.proof_stream.bridge import StreamBridge
from otel_proofscope.integrations.proof_stream.sources import LineSource
from otel_proofscope.integrations.proof_stream.stats import StreamStats


def replay(source: LineSource, bridge: StreamBridge) -> StreamStats:
    """Feed every line of ``source`` into ``bridge``, then close the bridge.

    The bridge is closed (open spans ended, marked unterminated) even when the source
    fails or the caller is interrupted, so nothing is left half-open.
    """
    try:
        for line_no, raw in source.lines():
            bridge.feed_line(raw, line_no)
    finally:
        bridge.stats.reconnects = source.reconnects
        bridge.close()
    return bridge.stats
