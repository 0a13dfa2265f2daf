"""Reading exactly what a test expects from a socket."""

from __future__ import annotations

import socket


def recv_exact(s: socket.socket, n: int) -> bytes:
    """`n` bytes from `s`; fails the test if the peer closes first."""
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(min(1 << 20, n - len(out)))
        assert chunk, f"closed after {len(out)} of {n} bytes"
        out += chunk
    return bytes(out)
