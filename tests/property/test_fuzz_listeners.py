"""Fuzz targets of the KT (HTTP, TSV-RPC, binary) and memcached parsers, in CI with a small
budget: random and mutated-valid byte streams, cut into random segments, either parse or
raise the protocol's own error (`ReadProtocolError`) — never anything else — and the
listener's session survives them (it answers or closes; no exception escapes)."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.errors import ReadProtocolError
from kt import protocol as kt
from kt.server import KtHandler
from memcached import protocol as mc
from memcached.server import MemcachedHandler
from net.tcp import Run, Session
from store.ops import SET, Op
from store.store import Store

FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

KT_VALID = [
    b"GET /k1 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"HEAD /k1 HTTP/1.0\r\n\r\n",
    b"POST /rpc/get HTTP/1.1\r\nContent-Type: text/tab-separated-values; colenc=B\r\n"
    b"Content-Length: 8\r\n\r\na2V5\taz E=\n",
    b"POST /rpc/get_bulk HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
    b"Content-Length: 13\r\n\r\n_k1=&_pre%2F1",
    b"POST /rpc/echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\na=b\r\n0\r\n\r\n",
    b"GET /rpc/match_prefix?prefix=pre HTTP/1.1\r\n\r\n",
    struct.pack(">BII", kt.MAGIC_GET_BULK, 0, 2) + b"\x00\x00\x00\x00\x00\x02k1"
    b"\x00\x00\x00\x00\x00\x01x",
    struct.pack(">BII", kt.MAGIC_SET_BULK, 1, 1) + struct.pack(">HIIq", 0, 1, 1, 0) + b"kv",
    struct.pack(">BIII", kt.MAGIC_PLAY_SCRIPT, 0, 1, 1) + b"f" + struct.pack(">II", 1, 1) + b"kv",
    struct.pack(">BIQH", kt.MAGIC_REPLICATION, 0, 0, 1),
]
MC_VALID = [
    b"get k1\r\n",
    b"gets k1 k2 pre/1\r\n",
    b"set k 0 0 2\r\nab\r\n",
    b"cas k 0 0 1 5 noreply\r\nx\r\n",
    b"delete k noreply\r\n",
    b"stats\r\n",
    b"version\r\n",
    b"verbosity 1\r\n",
    b"bogus\r\n",
]


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = Store.create(str(tmp_path_factory.mktemp("fuzz") / "s"), sync=False, map_size=1 << 26)
    s.apply([Op(SET, b"k1", b"v1", "t"), Op(SET, b"pre/1", b"\x00", "t")])
    yield s
    s.close()


@st.composite
def mutated(draw: st.DrawFn, valid: list[bytes]) -> bytes:
    """A concatenation of valid requests with random bytes flipped, inserted or cut."""
    data = bytearray(b"".join(draw(st.lists(st.sampled_from(valid), min_size=1, max_size=4))))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["flip", "insert", "cut"]))
        i = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[i] = draw(st.integers(0, 255))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[i : i + draw(st.integers(1, 8))]
    return bytes(data)


def streams(valid: list[bytes]) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=400), mutated(valid))


def segments(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in [*points, len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


def feed_session(session: Session, pieces: list[bytes]) -> None:
    """Feed `pieces` to a session the way `net.tcp` does: append, run to the end."""
    buf = bytearray()
    for piece in pieces:
        buf += piece
        run: Run = session.run(buf)
        while True:
            try:
                assert isinstance(next(run), bytes)
            except StopIteration as stop:
                close = bool(stop.value)
                break
        if close:
            return
        if buf:
            assert session.phase(buf) in ("header", "body")


@FUZZ
@given(streams(KT_VALID), st.lists(st.integers(0, 1 << 16), max_size=6))
def test_kt_parsers_parse_or_raise_their_own_error(data: bytes, cuts: list[int]) -> None:
    for piece in [data, *segments(data, cuts)]:
        try:
            if piece and kt.is_binary(piece[0]):
                kt.parse_binary(piece)
            else:
                got = kt.parse_http(piece)
                if got is not None:
                    kt.rpc_input(got[0])
                    kt.rest_key(got[0].path)
        except ReadProtocolError:
            pass


@FUZZ
@given(streams(KT_VALID), st.lists(st.integers(0, 1 << 16), max_size=6))
def test_kt_incremental_binary_parser_agrees_with_a_whole_parse(
    data: bytes, cuts: list[int]
) -> None:
    if not data or not kt.is_binary(data[0]):
        data = KT_VALID[6] + data
    try:
        whole = kt.parse_binary(data)
    except ReadProtocolError:
        whole = None
        failed = True
    else:
        failed = False
    parser = kt.BinaryParser()
    got = None
    buf = b""
    try:
        for piece in segments(data, cuts):
            buf += piece
            got = parser.feed(buf, budget=1)
            while got is None and not parser.starved:
                got = parser.feed(buf, budget=1)
            if got is not None:
                break
    except ReadProtocolError:
        assert failed
        return
    assert not failed
    assert got == whole


@FUZZ
@given(streams(KT_VALID), st.lists(st.integers(0, 1 << 16), max_size=6))
def test_kt_session_survives_any_segmented_stream(
    small_store: Store, data: bytes, cuts: list[int]
) -> None:
    feed_session(KtHandler(small_store).session(), segments(data, cuts))


@FUZZ
@given(streams(MC_VALID), st.lists(st.integers(0, 1 << 16), max_size=6))
def test_memcached_parser_parses_or_raises_its_own_error(data: bytes, cuts: list[int]) -> None:
    for piece in [data, *segments(data, cuts)]:
        with contextlib.suppress(ReadProtocolError):
            mc.parse_command(piece)


@FUZZ
@given(streams(MC_VALID), st.lists(st.integers(0, 1 << 16), max_size=6))
def test_memcached_session_survives_any_segmented_stream(
    small_store: Store, data: bytes, cuts: list[int]
) -> None:
    feed_session(MemcachedHandler(small_store), segments(data, cuts))
