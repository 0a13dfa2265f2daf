"""Reading exactly what a test expects from a socket."""

from __future__ import annotations

import socket
import ssl
import time


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


def closed_within(s: socket.socket, seconds: float) -> bool:
    """Whether the peer closes `s` (EOF or reset) within `seconds`; data first (an error
    reply) is read and skipped."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            if s.recv(65536) == b"":
                return True
        except TimeoutError:  # an OSError too: caught first
            return False
        except (OSError, ssl.SSLError):
            return True
    return False


def endless_head(s: socket.socket, head: bytes, pad: bytes, times: int) -> tuple[bool, bytes]:
    """Send `head` and then `pad` `times` times, a request head that never ends, and read
    what comes back until the peer closes (10 s at most): (closed, what was answered)."""
    got = b""
    closed = False
    try:
        s.sendall(head)
        for _ in range(times):
            s.sendall(pad)
    except OSError:
        closed = True
    if not closed:
        s.settimeout(10)
        try:
            while chunk := s.recv(4096):
                got += chunk
            closed = True
        except TimeoutError:
            pass  # still open: the head is being read on and on
        except OSError:
            closed = True
    return closed, got


def recv_until(s: socket.socket, end: bytes, timeout: float | None = 10.0) -> bytes:
    """What `s` receives up to and including `end`, or up to the peer's close (less then);
    `timeout`: seconds for each read (None: the socket's own)."""
    if timeout is not None:
        s.settimeout(timeout)
    got = b""
    while not got.endswith(end):
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    return got
