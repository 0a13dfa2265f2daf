"""memcached's lone `get` answered whole: the compiled `McGet` (`reads/_fastget.pyx`) does
what the pure-Python reference (`reads/fastget.py`) does, byte for byte, over a real LMDB
store — the same replies, the same requests handed to the fallback, the same keys counted
as read, the same counters and histogram observations — for hits, misses, `gets`, flags,
bad keys, chunked and CRC-failing records, partial lines, pipelined and other commands.
And the reference answers what the listener's full path (`MemcachedHandler.run`) answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from memcached import protocol as mc
from memcached.server import MemcachedHandler
from reads import fastget
from store import format as fmt
from store.store import Store

try:
    from reads import _fastget as cy  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - `make build` builds it
    pytest.skip("reads._fastget is not built (make build)", allow_module_level=True)

#: Keys the examples store records under (short ones, and one at the key limit).
KEYS = [b"a", b"hot01", b"k\x00\xff", b"x" * fmt.MAX_KEY]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = Store.create(str(tmp_path_factory.mktemp("mcget") / "data"))
    yield s
    s.close()


@st.composite
def stored(draw: st.DrawFn) -> dict[bytes, bytes]:
    """Raw records for some of KEYS: good inline ones mostly, some chunked (the value is
    in chunks the store's reader reassembles), some corrupted or cut (the CRC fails)."""
    out: dict[bytes, bytes] = {}
    for key in KEYS:
        how = draw(st.sampled_from(["absent", "good", "good", "chunked", "flip", "cut"]))
        if how == "absent":
            continue
        value = draw(st.binary(max_size=300))
        rec = fmt.encode_record(key, draw(st.integers(0, 2**64 - 1)), b"p", value, False)
        if how == "chunked":
            rec = fmt.encode_record(key, 7, b"p", value, True)
        elif how == "flip":
            i = draw(st.integers(0, len(rec) - 1))
            rec = rec[:i] + bytes([rec[i] ^ (1 << draw(st.integers(0, 7)))]) + rec[i + 1 :]
        elif how == "cut":
            rec = rec[: draw(st.integers(1, len(rec)))]
        out[key] = rec
    return out


spaces = st.text(alphabet=" \t\x0b\x0c\r", min_size=1, max_size=3).map(str.encode)
any_key = st.sampled_from(KEYS) | st.binary(min_size=1, max_size=8).filter(
    lambda k: not any(c in b" \t\n\r\x0b\x0c" for c in k)
)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """What a connection may receive in one segment: mostly one get line, and its
    neighbours (several keys, other verbs and cases, odd spacing, no CR, a partial line,
    pipelined commands, an over-long key, binary junk)."""
    verb = draw(st.sampled_from([b"get", b"gets", b"GET", b"gat", b"version", b""]))
    keys = draw(st.lists(any_key, min_size=0, max_size=3))
    if draw(st.booleans()):
        keys = [draw(st.sampled_from(KEYS))]
    line = verb
    for k in keys:
        line += draw(spaces) + k
    if draw(st.booleans()):
        line += draw(spaces)
    end = draw(st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n", b"", b"\r\nget a\r\n"]))
    data = line + end
    how = draw(st.sampled_from(["as is"] * 6 + ["long key", "junk", "cut"]))
    if how == "long key":
        data = b"get " + b"y" * (fmt.MAX_KEY + 1) + b"\r\n"
    elif how == "junk":
        data = draw(st.binary(max_size=40))
    elif how == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    return data


class Recorder:
    """One implementation's McGet with what it hands out: fallbacks and keys read."""

    def __init__(self, impl: type[fastget.McGet], store: Store, flags: bool) -> None:
        self.fallbacks: list[bytes] = []
        self.read: list[bytes] = []
        self.registry = CollectorRegistry()
        hist = Histogram("t_seconds", "t", ["p"], registry=self.registry)
        self.observe = fastget.SourcedObserve(hist, "x")
        self.child = hist.labels("x")
        self.get = impl(
            store.env,
            store.dbs.data,
            flags,
            self.fallback,
            self.observe,
            self.read.append,
            fmt.MAX_KEY,
            mc.MAX_LINE,
        )

    def fallback(self, data: bytes) -> bytes | None:
        self.fallbacks.append(data)
        return b"FALLBACK\r\n" if data.startswith(b"get") else None

    def observed(self) -> int:
        """Observations a scrape sees (it folds whatever is pending, C counts included)."""
        n = self.registry.get_sample_value("t_seconds_count", {"p": "x"})
        assert n == sum(b.get() for b in self.child._buckets)
        return int(n or 0)

    def state(self) -> tuple[object, ...]:
        g = self.get
        return (self.fallbacks, self.read, g.cmd_get, g.get_hits, g.get_misses, self.observed())


def put_all(store: Store, recs: dict[bytes, bytes]) -> None:
    with store.env.begin(write=True, db=store.dbs.data) as txn:
        for key in KEYS:
            txn.delete(key)
        for key, rec in recs.items():
            txn.put(key, rec)


@settings(max_examples=300, deadline=None)
@given(stored(), st.lists(requests(), min_size=1, max_size=6), st.booleans())
def test_compiled_mcget_agrees(
    store: Store, recs: dict[bytes, bytes], reqs: list[bytes], flags: bool
) -> None:
    put_all(store, recs)
    pure = Recorder(fastget.McGet, store, flags)
    comp = Recorder(cy.McGet, store, flags)
    for data in reqs:
        assert comp.get(data) == pure.get(data), data
    assert comp.state() == pure.state()


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_bucket_agrees(store: Store, v: float) -> None:
    pure = Recorder(fastget.McGet, store, False)
    comp = Recorder(cy.McGet, store, False)
    assert comp.get.bucket(v) == pure.get.bucket(v)


@settings(max_examples=200, deadline=None)
@given(stored(), requests(), st.booleans())
def test_reference_answers_what_the_full_path_answers(
    store: Store, recs: dict[bytes, bytes], data: bytes, flags: bool
) -> None:
    """Whatever McGet answers itself (not handed to the fallback) is the full path's
    answer to the same bytes; a record it declines (chunked, failing) goes to the
    fallback, never answered wrongly."""
    put_all(store, recs)
    rec = Recorder(fastget.McGet, store, flags)
    got = rec.get(data)
    if rec.fallbacks:
        return
    handler = MemcachedHandler(store, flags_in_value=flags)
    assert got == handler.step(bytearray(data))[0]


@pytest.mark.parametrize("impl", [fastget.McGet, cy.McGet])
def test_a_scrape_sees_every_observation(store: Store, impl: type[fastget.McGet]) -> None:
    """Across the C batch boundary (FLUSH_EVERY) and between folds alike."""
    put_all(store, {b"a": fmt.encode_record(b"a", 3, b"p", b"v", False)})
    rec = Recorder(impl, store, False)
    for n in range(1, 600):
        rec.get(b"get a\r\n" if n % 3 else b"get nope\r\n")
        if n % 97 == 0 or n in (255, 256, 257, 512, 599):
            assert rec.observed() == n


def test_handler_serves_through_the_compiled_mcget(tmp_path: Path) -> None:
    """The listener's shortcut is the compiled McGet when built (and the pure one under
    MERCURY_PURE=1), and `stats` counts what it answered."""
    with Store.create(str(tmp_path / "d")) as s:
        put_all(s, {b"a": fmt.encode_record(b"a", 3, b"p", b"v", False)})
        h = MemcachedHandler(s)
        assert isinstance(h.fast, fastget.IMPL.McGet)
        assert h.fast(b"get a\r\n") == b"VALUE a 0 1\r\nv\r\nEND\r\n"
        assert h.fast(b"gets zz\r\n") == b"END\r\n"
        stats = h.step(bytearray(b"stats\r\n"))[0]
        assert b"STAT cmd_get 2\r\n" in stats
        assert b"STAT get_hits 1\r\n" in stats
        assert b"STAT get_misses 1\r\n" in stats
