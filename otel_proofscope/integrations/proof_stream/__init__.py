"""Bridge for the stwo-ml zkML prover's proof-stream JSON events (``ProofEvent``).

``decoder`` turns one JSON line into a typed ``schema`` event (pure), ``bridge`` turns
events into contract spans through ``ProofTracer``, ``sources`` reads lines from a
file, stdin, a FIFO or a WebSocket, and ``replay`` ties them together.
"""

from otel_proofscope.integrations.proof_stream.bridge import StreamBridge
from otel_proofscope.integrations.proof_stream.decoder import Decoded, DecodeError, decode_line
from otel_proofscope.integrations.proof_stream.stats import StreamStats

__all__ = ["DecodeError", "Decoded", "StreamBridge", "StreamStats", "decode_line"]
