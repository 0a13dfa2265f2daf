"""The HTTP point-get shortcut (`reads/fasthttp.py`, compiled replies of `reads/fastget`)
answers exactly what the ASGI path answers: two real read servers over the same store, one
with `--no-fast-path`, get the same raw requests; their raw replies must be equal byte for
byte once the `date` header (the wall clock) is set aside."""

from __future__ import annotations

import json
import re
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

from acl.model import DOC_NAME, Acl, Consumer, TokenInfo
from acl.tokens import hash_token
from core.errors import CRCError
from store import layout
from store.ops import SET, Op
from store.store import Store
from testkit import metrics
from testkit.procs import Procs, free_port, wait_http

BIG = bytes(range(256)) * 64  # 16 KiB: stored in chunks (the shortcut's full path)
SECRET = b"UNIQUE-VALUE-0123456789"
TOKEN = "mct_fast-path-test-token"

REQUESTS = [
    b"GET /v1/kv/a HTTP/1.1\r\nHost: x\r\n\r\n",
    b"HEAD /v1/kv/a HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/kv/nope HTTP/1.1\r\nHost: x\r\n\r\n",
    b"HEAD /v1/kv/nope HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/kv/dir/%ff%00key HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/kv/dir/with/slash HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/kv/big HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/kv/bad HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/kv/" + b"k" * 501 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/kv/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b'GET /v1/kv/a HTTP/1.1\r\nHost: x\r\nIf-None-Match: "1"\r\n\r\n',
    b'GET /v1/kv/a HTTP/1.1\r\nHost: x\r\nIf-None-Match: "7", *\r\n\r\n',
    b"GET /v1/kv/a?x=1 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/kv/a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    # Two pipelined requests in one segment, then a route the shortcut never takes.
    b"GET /v1/kv/a HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/kv/nope HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/kv/a HTTP/1.1\r\nHost: x\r\n\r\n",
    b"PUT /v1/kv/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nz",
    # Heads the compiled pre-parse takes (fastget.http_request) next to ones it leaves.
    b"GET /v1/kv/a HTTP/1.1\r\nHost: x\r\nAccept: */*\r\nUser-Agent: t/1\r\n\r\n",
    b"HEAD /v1/kv/a HTTP/1.1\r\nhost: x\r\nX-Y:z\r\n\r\n",
    b"GET /v1/kv/a HTTP/1.1\r\n\r\n",
    b"GET /v1/kv/a!$&'()*+,;=:@b HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/kv/a HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n",
]
#: Requests after which the server closes the connection (compared until EOF).
CLOSING = [
    b"GET /v1/kv/a HTTP/1.0\r\n\r\n",
    b"HEAD /v1/kv/a HTTP/1.0\r\n\r\n",
    b"GET /v1/kv/a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /v1/kv/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
]
AUTH_REQUESTS = [
    b"GET /v1/kv/a HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n",
    b"GET /v1/kv/nope HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n",
    b"GET /v1/kv/dir/with/slash HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
    + TOKEN.encode()
    + b"\r\n\r\n",
    b"GET /v1/kv/a HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n\r\n",
    b"GET /v1/kv/a HTTP/1.1\r\nHost: x\r\n\r\n",
]

_DATE = re.compile(rb"\r\ndate: [^\r]*\r\n")


def _make_store(path: str) -> None:
    with Store.create(path, sync=True) as s:
        s.apply(
            [
                Op(SET, b"a", b"value-a", "p"),
                Op(SET, b"dir/\xff\x00key", b"\x00\xfe", "p"),
                Op(SET, b"dir/with/slash", b"s", "p"),
                Op(SET, b"big", BIG, "p"),
                Op(SET, b"bad", SECRET, "p"),
            ]
        )
        consumer = Consumer("c", ("a", "nope"), {"t": TokenInfo(hash_token(TOKEN))})
        s.put_docs({DOC_NAME: json.dumps(Acl(consumers={"c": consumer}).to_json()).encode()})
    data = bytearray(Path(layout.data_file(path)).read_bytes())
    # Every copy: the value's bytes are also in its log record's payload (snappy keeps
    # short literals), which may come first in the file.
    at = data.find(SECRET)
    assert at >= 0
    while at >= 0:
        data[at + 3] ^= 0x01
        at = data.find(SECRET, at + 1)
    Path(layout.data_file(path)).write_bytes(bytes(data))
    with Store.open(path, readonly=True) as s, pytest.raises(CRCError):
        s.get(b"bad")  # `bad` now fails its CRC


#: Every server's `--http-idle-timeout` (that the flag reaches `mercury.readserve` at all is
#: shown with a 2 s timeout in tests/faults/test_hostile_listeners.py).
IDLE_S = 5


def _start(procs: Procs, path: str, *extra: str) -> int:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "mercury.readserve",
        path,
        "--listen",
        f"127.0.0.1:{port}",
        *extra,
    ]
    argv += ["--http-idle-timeout", str(IDLE_S)]
    p = procs.start(argv, name="reads")
    wait_http(f"http://127.0.0.1:{port}/healthz", proc=p)
    return port


def _exchange(port: int, request: bytes, replies: int, until_eof: bool = False) -> bytes:
    """Send `request`; read until `replies` whole answers arrived (or EOF). A HEAD's
    answer has no body whatever its content-length says."""
    head = request.startswith(b"HEAD ")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        buf = b""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not until_eof and _complete(buf, head) >= replies:
                break
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            buf += chunk
        return buf


def _complete(buf: bytes, head: bool = False) -> int:
    """Whole answers at the front of `buf` (content-length framed; none for HEAD)."""
    n, pos = 0, 0
    while True:
        end = buf.find(b"\r\n\r\n", pos)
        if end < 0:
            return n
        m = re.search(rb"content-length: (\d+)", buf[pos:end])
        length = int(m.group(1)) if m and not head else 0
        pos = end + 4 + length
        if pos > len(buf):
            return n
        n += 1


def _normal(reply: bytes) -> bytes:
    return _DATE.sub(b"\r\ndate: -\r\n", reply)


@pytest.fixture
def two_servers(tmp_path: Path, procs: Procs) -> tuple[int, int, int, int]:
    d = str(tmp_path / "s")
    _make_store(d)
    return (
        _start(procs, d),
        _start(procs, d, "--no-fast-path"),
        _start(procs, d, "--read-auth"),
        _start(procs, d, "--read-auth", "--no-fast-path"),
    )


def test_shortcut_replies_equal_the_asgi_path(two_servers: tuple[int, int, int, int]) -> None:
    fast, slow, fast_auth, slow_auth = two_servers
    for req in REQUESTS:
        n = req.count(b" HTTP/1.")
        a = _exchange(fast, req, n)
        b = _exchange(slow, req, n)
        assert _normal(a) == _normal(b), req
        assert a.count(b"HTTP/1.1 ") == n, (req, a)
    for req in CLOSING:
        a = _exchange(fast, req, 1, until_eof=True)
        b = _exchange(slow, req, 1, until_eof=True)
        assert _normal(a) == _normal(b), req
        assert b"connection: close\r\n" in a
    for req in AUTH_REQUESTS:
        a = _exchange(fast_auth, req, 1)
        b = _exchange(slow_auth, req, 1)
        assert _normal(a) == _normal(b), req
    # What the shortcut served, spot-checked against the store.
    hit = _exchange(fast, REQUESTS[0], 1)
    assert hit.startswith(b"HTTP/1.1 200 OK\r\n") and hit.endswith(b"\r\n\r\nvalue-a")
    assert b"\r\nserver: uvicorn\r\n" in hit and b'\r\netag: "1"\r\n' in hit
    assert _exchange(fast, REQUESTS[6], 1).endswith(BIG)
    bad = _exchange(fast, REQUESTS[7], 1)
    assert bad.startswith(b"HTTP/1.1 500 ") and SECRET[:3] not in bad
    assert _exchange(fast_auth, AUTH_REQUESTS[2], 1).startswith(b"HTTP/1.1 403 ")
    assert _exchange(fast_auth, AUTH_REQUESTS[3], 1).startswith(b"HTTP/1.1 401 ")


def test_many_keep_alive_gets_on_one_connection(two_servers: tuple[int, int, int, int]) -> None:
    """A keep-alive connection served only by the shortcut stays open and in order."""
    fast = two_servers[0]
    reqs = [b"GET /v1/kv/a HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /v1/kv/nope HTTP/1.1\r\n\r\n"]
    with socket.create_connection(("127.0.0.1", fast), timeout=10) as s:
        for i in range(200):
            s.sendall(reqs[i % 2])
            buf = b""
            while _complete(buf) < 1:
                chunk = s.recv(1 << 16)
                assert chunk, "closed"
                buf += chunk
            assert buf.startswith(b"HTTP/1.1 200 " if i % 2 == 0 else b"HTTP/1.1 404 ")


def test_idle_keep_alive_connection_is_closed(two_servers: tuple[int, int, int, int]) -> None:
    """A connection served only by the shortcut is closed once idle for the listener's
    idle timeout (`--http-idle-timeout`, 5 s here), as one served through ASGI is: the
    shortcut's answers start each wait for the next request head; not while it is in use."""
    fast = two_servers[0]

    def idle_closed() -> float:
        text = httpx.get(f"http://127.0.0.1:{fast}/metrics", timeout=5).text
        return metrics.value(text, "mercury_http_connections_closed_total", reason="idle")

    before = idle_closed()
    with socket.create_connection(("127.0.0.1", fast), timeout=20) as s:
        t0 = time.monotonic()
        while time.monotonic() - t0 < IDLE_S + 2:  # in use past the timeout: stays open
            s.sendall(b"GET /v1/kv/a HTTP/1.1\r\nHost: x\r\n\r\n")
            buf = b""
            while _complete(buf) < 1:
                chunk = s.recv(1 << 16)
                assert chunk, "closed while in use"
                buf += chunk
            time.sleep(0.5)  # the client's pause between requests, under the idle timeout
        assert s.recv(1) == b""  # closed by the server (within the socket's 20 s)...
    assert idle_closed() == before + 1  # ... for its idle deadline, not for anything else
