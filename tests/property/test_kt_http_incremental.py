"""The KT listener's incremental HTTP parser (`kt_protocol.HttpParser`): fed a request in
any split, it answers what a parse from scratch of the bytes received so far answers (the
same request, the same error, or "incomplete"), agrees with a plain reference parser of
chunked bodies, and its work stays linear in the bytes received (a chunked body of
thousands of chunks dribbled two bytes per segment must not re-scan every chunk line on
every segment)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, SupportsIndex

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.errors import ReadProtocolError
from kt import protocol as kt
from kt.server import KtHandler
from net.tcp import drain
from store.ops import SET, Op
from store.store import Store

#: Small limits, so generated bodies reach every bound (set for each example).
SMALL = {"MAX_LINE": 40, "MAX_CHUNKS": 6, "MAX_BODY": 64, "MAX_HEADERS": 4}

#: ("done", (method, target, headers, body, bytes consumed)), ("more", None) or
#: ("error", (status, message)).
Outcome = tuple[str, Any]


def outcome(parse: Callable[[], tuple[kt.HttpRequest, int] | None]) -> Outcome:
    """What one parse answered."""
    try:
        got = parse()
    except ReadProtocolError as err:
        return "error", (err.status, err.message)
    if got is None:
        return "more", None
    req, n = got
    return "done", (req.method, req.target, req.headers, req.body, n)


def fresh(data: bytes) -> Outcome:
    """What a parse from scratch of `data` answers."""
    return outcome(lambda: kt.parse_http(data))


def feed_split(data: bytes, cuts: list[int]) -> Iterator[tuple[int, Outcome]]:
    """Feed `data` to one HttpParser as segments ending at `cuts` (then the rest), as a
    connection does; yields (bytes received, outcome) until it completes or fails."""
    parser = kt.HttpParser()
    buf = bytearray()
    for end in [*sorted(set(cuts)), len(data)]:
        if end <= len(buf):
            continue
        buf += data[len(buf) : end]
        got = outcome(partial(parser.feed, buf))
        yield len(buf), got
        if got[0] != "more":
            return


def reference_chunked(buf: bytes, pos: int) -> tuple[bytes, int] | None:
    """A chunked body from `pos` parsed in one plain pass (the grammar and bounds the
    parser implements, written without any state kept between calls)."""
    chunks: list[bytes] = []
    total = 0

    def line(p: int, what: str) -> tuple[bytes, int] | None:
        nl = buf.find(b"\n", p)
        if nl < 0:
            if len(buf) - p > kt.MAX_LINE:
                raise ReadProtocolError(f"{what} too long", status=400)
            return None
        if nl - p > kt.MAX_LINE:
            raise ReadProtocolError(f"{what} too long", status=400)
        return buf[p:nl], nl + 1

    while True:
        got = line(pos, "chunk size line")
        if got is None:
            return None
        text, pos = got
        try:
            size = int(text.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise ReadProtocolError("bad chunk size", status=400) from None
        if size < 0:
            raise ReadProtocolError("bad chunk size", status=400)
        total += size
        if total > kt.MAX_BODY:
            raise ReadProtocolError("request body too large", status=413)
        if size == 0:
            for _ in range(kt.MAX_HEADERS + 1):
                got = line(pos, "trailer")
                if got is None:
                    return None
                text, pos = got
                if not text.rstrip(b"\r"):
                    return b"".join(chunks), pos
            raise ReadProtocolError("too many trailer lines", status=400)
        if len(chunks) >= kt.MAX_CHUNKS:
            raise ReadProtocolError("too many chunks", status=400)
        if len(buf) < pos + size:
            return None
        chunks.append(buf[pos : pos + size])
        pos += size
        got = line(pos, "line after chunk data")
        if got is None:
            return None
        pos = got[1]


HEAD = b"POST /rpc/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


@st.composite
def chunked_bodies(draw: st.DrawFn) -> bytes:
    """A chunked body: mostly well formed (chunks, extensions, trailers, bare LF line
    ends), sometimes with a part out of bounds or broken, sometimes with bytes mutated."""
    eol = draw(st.sampled_from([b"\r\n", b"\n"]))
    # over-long lines (past SMALL's MAX_LINE) in some bodies only, so most bodies get past them
    long = draw(st.integers(0, 3)) == 0
    parts: list[bytes] = []
    for data in draw(st.lists(st.binary(min_size=1, max_size=30), max_size=9)):
        size = b"%x" % len(data)
        size = draw(st.sampled_from([size, size.upper(), b"0" + size, b" " + size]))
        exts = [b"", b"", b";a=b", b"; name"] + ([b";" + b"e" * 50] if long else [])
        ends = [eol, eol, eol, b"junk" + eol] + ([b"x" * 50 + eol] if long else [])
        parts.append(size + draw(st.sampled_from(exts)) + eol + data + draw(st.sampled_from(ends)))
    parts.append(b"0" + draw(st.sampled_from([b"", b";x"])) + eol)
    trailers = [b"T: 1"] + ([b"X-T: " + b"v" * 50] if long else [])
    for t in draw(st.lists(st.sampled_from(trailers), max_size=6)):
        parts.append(t + eol)
    parts.append(eol)
    body = b"".join(parts)
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        at = draw(st.integers(0, len(body)))
        junk = draw(st.sampled_from([b"", b"-", b"\n", b"\r\n", b"zz", b";", b"f" * 9, b"\x00"]))
        drop = draw(st.integers(0, 3))
        body = body[:at] + junk + body[at + drop :]
    return body


splits = st.lists(st.integers(0, 600), max_size=12)


@settings(max_examples=400, deadline=None)
@given(chunked_bodies(), splits, st.sampled_from([b"", b"GET /k HTTP/1.1\r\n\r\n"]))
def test_chunked_body_in_any_split_parses_as_a_whole_parse_and_the_reference(
    body: bytes, cuts: list[int], after: bytes
) -> None:
    data = HEAD + body + after
    with pytest.MonkeyPatch.context() as mp:
        for name, value in SMALL.items():
            mp.setattr(kt, name, value)
        whole = fresh(data)
        for received, got in feed_split(data, [len(HEAD) + c for c in cuts]):
            assert got == fresh(data[:received]), received
        assert got == whole
        try:
            ref: Outcome = ("done", reference_chunked(data, len(HEAD)))
        except ReadProtocolError as err:
            ref = ("error", (err.status, err.message))
    if whole[0] == "done":
        _method, _target, _headers, parsed_body, consumed = whole[1]
        assert ref == ("done", (parsed_body, consumed))
    else:
        assert ref == (whole if whole[0] == "error" else ("done", None))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.sampled_from(
            [
                b"GET /a%2Fb HTTP/1.1\r\nHost: x\r\n\r\n",
                b"\r\n",
                b"POST /rpc/get HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc",
                b"PUT /k HTTP/1.1\r\nContent-Length: 999\r\n\r\n",
                b"POST /rpc/void HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
                b"GET / HTTP/2.0\r\n\r\n",
                b"X-Long: " + b"h" * 50 + b"\r\n",
                b"A: b\n",
                b"BREW /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
                b"GET /x HTTP/1.1\r\nbad header\r\n\r\n",
            ]
        ),
        min_size=1,
        max_size=5,
    ),
    st.binary(max_size=40),
    splits,
)
def test_any_request_in_any_split_parses_as_a_parse_from_scratch(
    pieces: list[bytes], noise: bytes, cuts: list[int]
) -> None:
    data = b"".join(pieces) + noise
    with pytest.MonkeyPatch.context() as mp:
        for name, value in SMALL.items():
            mp.setattr(kt, name, value)
        for received, got in feed_split(data, cuts):
            assert got == fresh(data[:received]), received


# --- work stays linear ----------------------------------------------------------------


class CountingBuf(bytearray):
    """A connection buffer that counts the bytes the parser scans (searches, copies)."""

    scanned = 0

    def find(  # type: ignore[override]
        self, sub: bytes, start: SupportsIndex | None = None, end: SupportsIndex | None = None
    ) -> int:
        a = 0 if start is None else min(int(start), len(self))
        b = len(self) if end is None else min(int(end), len(self))
        at = super().find(sub, a, b)
        CountingBuf.scanned += max(0, (b if at < 0 else at + 1) - a)
        return at

    def __getitem__(self, key: Any) -> Any:
        got = super().__getitem__(key)
        if isinstance(key, slice):
            CountingBuf.scanned += len(got)
        return got


@pytest.fixture
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = Store.create(str(tmp_path_factory.mktemp("kt") / "s"), sync=False, map_size=1 << 24)
    s.apply([Op(SET, b"k1", b"v1", "t")])
    yield s
    s.close()


def test_dribbled_many_chunk_body_costs_work_linear_in_its_bytes(small_store: Store) -> None:
    """The red-team repro: 4,095 one-byte chunks, then a big chunk's data two bytes per
    segment. Before the fix every segment re-scanned all 4,095 chunk lines."""
    session = KtHandler(small_store).session()
    buf = CountingBuf()
    prefix = HEAD + b"1\r\nx\r\n" * 4095 + b"fa0\r\n"
    segments = [prefix] + [b"yy"] * 2000 + [b"\r\n0\r\n\r\n"]
    CountingBuf.scanned = 0
    received = 0
    replies = []
    for seg in segments:
        buf += seg
        received += len(seg)
        reply, close = drain(session.run(buf))
        assert not close
        if reply:
            replies.append(reply)
    assert len(replies) == 1 and replies[0].startswith(b"HTTP/1.1 200 OK")
    assert not buf
    # Each byte is searched about once and copied about once (plus the body's join).
    assert CountingBuf.scanned <= 4 * received, (CountingBuf.scanned, received)
