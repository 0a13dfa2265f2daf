"""Properties and fuzzing of the Kyoto Tycoon protocol parsers and encoders."""

from __future__ import annotations

import base64
import binascii
import contextlib
import struct
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ReadProtocolError
from kt import protocol as kt
from kt.server import KtHandler
from store.ops import SET, Op
from store.store import Store

cols = st.binary(max_size=300)


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = Store.create(str(tmp_path_factory.mktemp("kt") / "s"), sync=False, map_size=1 << 26)
    s.apply([Op(SET, b"k1", b"v1", "t"), Op(SET, b"pre/1", b"\x00", "t")])
    yield s
    s.close()


@given(st.dictionaries(cols, cols, max_size=8))
def test_tsv_output_decodes_back_to_the_same_map(m: dict[bytes, bytes]) -> None:
    body, ctype = kt.encode_tsv(m)
    assert "colenc=Q" not in ctype
    if any(len(x) > 255 for kv in m.items() for x in kv):
        assert "colenc=" in ctype  # KT encodes every long column
    assert kt.decode_tsv_response(body, ctype) == m


@given(cols)
def test_every_column_encoding_decodes(raw: bytes) -> None:
    assert kt.decode_column(base64.b64encode(raw), "B") == raw
    assert kt.decode_column(kt.url_encode(raw), "U") == raw
    assert kt.decode_column(binascii.b2a_qp(raw, istext=False), "Q") == raw


@given(cols, st.integers(0, 1000), st.sampled_from(list(b"!*-_ .~\t\x00\x80\xff")))
def test_a_column_invalid_in_its_encoding_is_refused(raw: bytes, at: int, bad: int) -> None:
    """A stray byte in Base64, a broken `%` or `=` escape: 400, never a guess."""
    for colenc, enc, junk in (
        ("B", base64.b64encode(raw), bytes([bad])),
        ("U", kt.url_encode(raw), b"%" + bytes([bad])),
        ("Q", binascii.b2a_qp(raw, istext=False), b"=" + bytes([bad])),
    ):
        cut = at % (len(enc) + 1)
        with pytest.raises(ReadProtocolError) as err:
            kt.decode_column(enc[:cut] + junk + enc[cut:], colenc)
        assert err.value.status == 400


@given(
    st.dictionaries(st.binary(min_size=1, max_size=30), st.binary(max_size=30), max_size=6),
    st.integers(0, 1000),
    st.sampled_from(list(b"!*-_ .~\t\x00\x80\xffgzG")),
)
def test_a_broken_escape_in_a_query_or_form_is_refused(
    m: dict[bytes, bytes], at: int, bad: int
) -> None:
    """The query string and form bodies decode as strictly as a `colenc=U` TSV column: a
    well-formed one round-trips, a `%` not followed by two hex digits is 400."""
    raw = b"&".join(kt.url_encode(k) + b"=" + kt.url_encode(v) for k, v in m.items())
    assert kt.parse_form(raw) == m
    cut = at % (len(raw) + 1)
    for junk in (b"%" + bytes([bad]), b"%" + bytes([bad]) + b"0", b"%0" + bytes([bad])):
        with pytest.raises(ReadProtocolError) as err:
            kt.parse_form(raw[:cut] + junk + raw[cut:])
        assert err.value.status == 400


@given(st.lists(st.tuples(st.integers(0, 3), st.binary(max_size=40)), max_size=20))
def test_binary_get_bulk_round_trips(keys: list[tuple[int, bytes]]) -> None:
    req = struct.pack(">BII", 0xBA, 0, len(keys)) + b"".join(
        struct.pack(">HI", d, len(k)) + k for d, k in keys
    )
    for cut in range(len(req)):
        assert kt.parse_binary(req[:cut]) is None
    got = kt.parse_binary(req + b"\xba")
    assert got is not None
    parsed, n = got
    assert n == len(req) and parsed.keys == keys and parsed.magic == kt.MAGIC_GET_BULK


@given(st.binary(max_size=200))
def test_parsers_on_garbage_answer_or_refuse_never_crash(data: bytes) -> None:
    for parse in (kt.parse_binary, kt.parse_http):
        with contextlib.suppress(ReadProtocolError):
            parse(data)


@given(
    st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE"]),
    st.binary(min_size=1, max_size=30).map(kt.url_encode),
    st.binary(max_size=50),
)
def test_http_request_split_anywhere_parses_once_complete(
    method: str, target: bytes, body: bytes
) -> None:
    req = (
        method.encode()
        + b" /"
        + target
        + b" HTTP/1.1\r\nContent-Length: %d\r\nX-A: b\r\n\r\n" % len(body)
        + body
    )
    has_body = method in ("POST", "PUT")
    if not has_body:
        req = req[: len(req) - len(body)]
    for cut in range(len(req)):
        assert kt.parse_http(req[:cut]) is None
    got = kt.parse_http(req + b"GET")
    assert got is not None
    parsed, n = got
    assert n == len(req)
    assert parsed.method == method and parsed.headers["x-a"] == "b"
    assert parsed.body == (body if has_body else b"")
    assert kt.rest_key(parsed.path) == (None, kt.url_decode(target))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=120), max_size=4))
def test_handler_survives_any_bytes(small_store: Store, pieces: list[bytes]) -> None:
    h = KtHandler(small_store)
    buf = bytearray()
    for p in pieces:
        buf += p
        reply, close = h.step(buf)
        assert isinstance(reply, bytes)
        if close:
            break
    # a fresh connection still works after whatever happened
    buf = bytearray(b"GET /k1 HTTP/1.1\r\n\r\n")
    reply, close = h.step(buf)
    assert reply.endswith(b"\r\n\r\nv1") and not close and not buf


@given(
    st.sampled_from(
        [
            b"POST /rpc/get HTTP/1.1\r\nContent-Type: text/tab-separated-values; colenc=B\r\n",
            b"POST /rpc/get_bulk HTTP/1.1\r\nContent-Type: text/tab-separated-values; colenc=Q\r\n",
            b"POST /rpc/match_prefix HTTP/1.1\r\nContent-Type: text/tab-separated-values\r\n",
            b"POST /rpc/echo HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded\r\n",
        ]
    ),
    st.binary(max_size=100),
)
@settings(deadline=None)
def test_rpc_bodies_of_any_bytes_get_an_answer(
    small_store: Store, head: bytes, body: bytes
) -> None:
    buf = bytearray(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    reply, _ = KtHandler(small_store).step(buf)
    status = int(reply.split(b" ", 2)[1])
    assert status in (200, 400, 450)
