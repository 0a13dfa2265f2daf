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


def converse(port: int, data: bytes, until: bytes | None = None, timeout: float = 10.0) -> bytes:
    """Send `data` on a new connection to 127.0.0.1:`port` and read the replies: up to and
    including `until` when given (the connection stays open), else until the server
    closes the connection, which must happen within `timeout` seconds."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        got = b""
        while until is None or not got.endswith(until):
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                assert until is None, f"closed before {until!r}; got {got!r}"
                return got
            got += chunk
        return got
