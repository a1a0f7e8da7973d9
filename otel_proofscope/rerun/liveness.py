"""Is a Rerun gRPC endpoint alive? An HTTP/2 handshake, not just a TCP accept.

Why: a frozen viewer (a stopped process, a hung server, a wrong port held by something
silent) still has its kernel accept TCP connections, so a TCP probe calls it alive.
Rerun's gRPC sink then buffers everything, never delivers it, and blocks the process
forever at exit (``rerun_shutdown`` → ``GrpcSink::flush_blocking``). A live gRPC server
answers the HTTP/2 client preface with a SETTINGS frame at once (tonic, which Rerun's
server uses, does so before any request); a silent one does not.

Measured here: a ``rerun --serve-grpc`` server answers in < 5 ms; the probe of a
listening-but-silent port costs its timeout (0.5 s by default).
"""

from __future__ import annotations

import socket

#: RFC 9113 §3.4 client connection preface, then an empty SETTINGS frame (type 4).
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_FRAME_HEADER = 9
_SETTINGS = 0x4


def tcp_accepts(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """Whether something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def speaks_http2(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """Whether the server at host:port answers an HTTP/2 preface with SETTINGS within
    ``timeout_s`` (connect and answer together)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            s.sendall(_PREFACE)
            header = b""
            while len(header) < _FRAME_HEADER:
                chunk = s.recv(_FRAME_HEADER - len(header))
                if not chunk:
                    return False
                header += chunk
            return header[3] == _SETTINGS
    except OSError:
        return False
