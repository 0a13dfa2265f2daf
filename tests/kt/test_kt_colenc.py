"""TSV-RPC bodies whose columns are not valid in the `colenc` their Content-Type declares
(Base64 outside its alphabet or badly padded, `%zz`, `=zz`) are refused with 400 and a
message naming the encoding, on a real `python -m mercury.readserve` — never decoded into
another key than the client named (which answered `200 num 0`)."""

from __future__ import annotations

import base64
import socket
import sys

import pytest

from kt import protocol as kt
from store.ops import SET, Op
from store.store import Store
from testkit.procs import Procs, free_port, wait_port


def post_tsv(port: int, proc: str, colenc: str, body: bytes) -> tuple[int, bytes, bytes]:
    """(status, Content-Type, body) of one TSV-RPC call on a fresh connection."""
    req = (
        b"POST /rpc/%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: text/tab-separated-values; colenc=%s\r\n"
        b"Content-Length: %d\r\n\r\n" % (proc.encode(), colenc.encode(), len(body))
    ) + body
    with socket.create_connection(("127.0.0.1", port), 10) as s:
        s.settimeout(10)
        s.sendall(req)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    head, _, payload = got.partition(b"\r\n\r\n")
    ctype = next(
        (
            h.split(b":", 1)[1].strip()
            for h in head.split(b"\r\n")
            if h.lower().startswith(b"content-type:")
        ),
        b"",
    )
    return int(head.split(b" ", 2)[1]), ctype, payload


@pytest.fixture
def kt_port(store: Store, procs: Procs) -> int:
    store.apply([Op(SET, b"a/b", b"v1", "t")])
    http, kt = free_port(), free_port()
    argv = [sys.executable, "-m", "mercury.readserve", store.path, "--role", "replica"]
    argv += ["--listen", f"127.0.0.1:{http}", "--kt-listen", f"127.0.0.1:{kt}"]
    p = procs.start(argv, name="reads")
    wait_port(http, proc=p)
    wait_port(kt, proc=p)
    return kt


@pytest.mark.parametrize(
    ("colenc", "line", "reason"),
    [
        ("B", b"!!!!\t!!!", b"invalid base64 column"),
        ("B", base64.b64encode(b"_a/b") + b"!\t", b"invalid base64 column"),
        ("B", b"X2EvYg\t", b"invalid base64 column"),  # padding missing
        ("U", b"_%zz\t%q", b"invalid URL-encoded column"),
        ("U", b"_a%2\t", b"invalid URL-encoded column"),
        ("Q", b"_a=zz\t", b"invalid quoted-printable column"),
    ],
)
def test_invalid_column_encoding_is_a_400_naming_it(
    kt_port: int, colenc: str, line: bytes, reason: bytes
) -> None:
    status, ctype, body = post_tsv(kt_port, "get_bulk", colenc, line + b"\n")
    assert status == 400, body
    assert ctype == b"text/tab-separated-values"
    assert body.startswith(b"ERROR\tinvalid parameters: " + reason), body


@pytest.mark.parametrize(
    ("colenc", "key"),
    [
        ("B", base64.b64encode(b"_a/b")),
        ("U", b"_a%2Fb"),
        ("U", b"_a/b"),
        ("Q", b"_a=2Fb"),
        ("Q", b"_a/b"),
    ],
)
def test_valid_column_encodings_still_read(kt_port: int, colenc: str, key: bytes) -> None:
    status, ctype, body = post_tsv(kt_port, "get_bulk", colenc, key + b"\t\n")
    assert status == 200, body
    assert kt.decode_tsv_response(body, ctype.decode()) == {b"_a/b": b"v1", b"num": b"1"}
