"""The HTTP point-get pre-parse and lookup (`reads/_fastget.pyx`: `http_request`,
`http_get`) agree with the pure-Python reference (`reads/fastget.py`) on arbitrary request
heads and records, and what the pre-parse accepts httptools parses to the same method, key
and keep-alive (so the reply is the one the parser's path would make: `tests/reads/
test_fasthttp.py` compares those bytes on real servers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote_to_bytes

import httptools
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reads import fastget
from store import format as fmt
from store.layout import K_LAST_SEQ, U64
from store.store import Store

try:
    from reads import _fastget as cy  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - `make build` builds it
    pytest.skip("reads._fastget is not built (make build)", allow_module_level=True)

key_chars = st.sampled_from(
    list(b"abcXYZ019-._~!$&'()*+,;=:@/") + list(b'%? #"<>\\^`{|}\x00\x7f\xff\t\r\n')
)
keys = st.lists(key_chars, min_size=0, max_size=12).map(bytes)
names = st.sampled_from(
    [
        b"Host",
        b"host",
        b"Accept",
        b"X-Y",
        b"User-Agent",
        b"Content-Length",
        b"connection",
        b"If-None-Match",
        b"Authorization",
        b"Expect",
        b"UPGRADE",
        b"Transfer-Encoding",
        b"Bad Name",
        b"",
        b"N@me",
        b"A_B",
    ]
)
values = st.lists(st.sampled_from([*list(b'ab 1/\t:"*'), 0, 127, 200, 13, 10]), max_size=8).map(
    bytes
)


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from([b"GET", b"GET", b"HEAD", b"PUT", b"get", b"POST"]))
    prefix = draw(st.sampled_from([b"/v1/kv/", b"/v1/kv/", b"/v1/kv", b"/v2/kv/", b"/"]))
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2"]))
    out = method + b" " + prefix + draw(keys) + b" " + version + b"\r\n"
    for _ in range(draw(st.integers(0, 4))):
        sep = draw(st.sampled_from([b": ", b":", b" : ", b""]))
        out += draw(names) + sep + draw(values) + draw(st.sampled_from([b"\r\n"] * 5 + [b"\n"]))
    out += draw(st.sampled_from([b"\r\n"] * 5 + [b"", b"\r\nGET /v1/kv/a HTTP/1.1\r\n\r\n"]))
    if draw(st.integers(0, 9)) == 0:
        out = draw(st.binary(max_size=60))
    return out


@settings(max_examples=500)
@given(heads(), st.integers(0, 20))
def test_http_request_agrees(data: bytes, max_key: int) -> None:
    assert cy.http_request(data, max_key) == fastget.http_request(data, max_key)


class Parsed:
    """What httptools makes of a request: its callbacks, recorded."""

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = 0

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_message_complete(self) -> None:
        self.complete += 1


@settings(max_examples=500)
@given(heads())
def test_what_the_pre_parse_takes_httptools_parses_alike(data: bytes) -> None:
    got = fastget.http_request(data, fmt.MAX_KEY)
    if got is None:
        return
    key, head_only = got
    rec = Parsed()
    parser: Any = httptools.HttpRequestParser(rec)
    parser.feed_data(data)  # raises on anything httptools refuses
    assert rec.complete == 1
    assert parser.get_method() == (b"HEAD" if head_only else b"GET")
    assert parser.get_http_version() == "1.1" and parser.should_keep_alive()
    assert rec.url == b"/v1/kv/" + key and unquote_to_bytes(key) == key
    for name, _ in rec.headers:
        assert name not in (b"content-length", b"transfer-encoding", b"expect", b"upgrade")
        assert name not in (b"if-none-match", b"connection", b"authorization")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = Store.create(str(tmp_path_factory.mktemp("httpget") / "data"))
    yield s
    s.close()


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([b"a", b"b/c", b"zz"]),
    st.sampled_from(["absent", "good", "good", "chunked", "flip"]),
    st.binary(max_size=200),
    st.integers(0, 2**64 - 1),
    st.binary(max_size=40),
    st.booleans(),
)
def test_http_get_agrees(
    store: Store, key: bytes, how: str, value: bytes, seq: int, head: bytes, head_only: bool
) -> None:
    with store.env.begin(write=True) as txn:
        txn.delete(key, db=store.dbs.data)
        if how != "absent":
            rec = fmt.encode_record(key, 5, b"p", value, how == "chunked")
            if how == "flip":
                rec = rec[:-1] + bytes([rec[-1] ^ 1]) if len(rec) > fmt.RECORD_FIXED + 1 else b""
            txn.put(key, rec, db=store.dbs.data)
        txn.put(K_LAST_SEQ, U64.pack(seq), db=store.dbs.meta)
    args = (store.env, store.dbs.data, store.dbs.meta, K_LAST_SEQ, head, key, head_only)
    got = cy.http_get(*args)
    assert got == fastget.http_get(*args)
    if how == "good":
        assert got == fastget.http_value(head, key, rec, seq, head_only, False)
    elif how in ("absent", "chunked"):
        assert got is None
