"""A request answered before its body has all arrived (a 403 on the token, a 413 on
Content-Length) leaves the rest of that body on its connection: the root's listener
discards it as that request's body, and the next request on the connection gets its own
answer — never a 431 written for bytes that were no request head (which a keep-alive
client reads as the answer to its next request).

A real root process and a raw socket; bounded in size and time.
"""

from __future__ import annotations

import socket
from pathlib import Path

from testkit import metrics
from testkit.procs import Procs
from tests.gateway.conftest import make_root


def _request(token: str, body: bytes) -> bytes:
    head = (
        "POST /v1/batch HTTP/1.1\r\nHost: t\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _status_line(s: socket.socket) -> bytes:
    """The status line of the next answer on `s`, its head and body read whole."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"connection closed; got {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        chunk = s.recv(65536)
        assert chunk, "connection closed mid-answer"
        rest += chunk
    return head.split(b"\r\n", 1)[0]


def test_the_next_request_after_an_early_answer_gets_its_own_answer(
    tmp_path: Path, procs: Procs
) -> None:
    root = make_root(procs, tmp_path / "data")
    host, port = root.url.removeprefix("http://").split(":")
    # 300 KB of batch body, far beyond the 64 KiB head bound: the admin token is refused
    # (403) before any of it is read.
    big = b'{"ops": [' + b'{"op": "set", "key": "a", "value": "x"},' * 7500 + b"{}]}"
    before = metrics.value(
        root.client().get("/metrics").text,
        "mercury_http_connections_closed_total",
        reason="header_too_large",
    )
    with socket.create_connection((host, int(port)), timeout=10) as s:
        for _ in range(3):
            s.sendall(_request(root.admin_token, big))
            assert _status_line(s) == b"HTTP/1.1 403 Forbidden"
        s.sendall(_request(root.admin_token, b'{"ops": []}'))
        assert _status_line(s) == b"HTTP/1.1 403 Forbidden"
    after = metrics.value(
        root.client().get("/metrics").text,
        "mercury_http_connections_closed_total",
        reason="header_too_large",
    )
    assert after == before
    root.close_clients()
