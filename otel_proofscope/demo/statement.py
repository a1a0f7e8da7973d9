"""What prover and verifier absorb before the first challenge, in the same order."""

from __future__ import annotations

from collections.abc import Mapping

from otel_proofscope.demo.circuit import Network
from otel_proofscope.demo.field import U64Array
from otel_proofscope.demo.transcript import Transcript


def bind_statement(transcript: Transcript, network: Network, commitments: Mapping[int, bytes],
                   output: U64Array) -> None:
    """The circuit shape, every weight commitment, the public input and the output."""
    transcript.absorb_int(b"rows", network.rows)
    transcript.absorb_int(b"width", network.width)
    transcript.absorb(b"kinds", ",".join(layer.kind.value for layer in network.layers).encode())
    for idx in sorted(commitments):
        transcript.absorb_int(b"commitment.index", idx)
        transcript.absorb(b"commitment", commitments[idx])
    transcript.absorb_m31_array(b"input", network.input)
    transcript.absorb_m31_array(b"output", output)


def begin_layer(transcript: Transcript, index: int, kind: str) -> None:
    transcript.absorb_int(b"layer.index", index)
    transcript.absorb(b"layer.kind", kind.encode())
