"""KT replication stream and update-log messages (pure): varnums, incremental parsing under
any TCP split, set/remove/clear decoding, malformed input refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kt import ulog as u


@given(st.integers(min_value=0, max_value=(1 << 63) - 1))
def test_varnum_round_trip(n: int) -> None:
    raw = u.write_varnum(n)
    assert u.read_varnum(raw + b"tail", 0) == (n, len(raw))


def test_varnum_known_bytes() -> None:
    # Kyoto Cabinet's own encoding: most significant group first, high bit on all but last
    assert u.write_varnum(0) == b"\x00"
    assert u.write_varnum(127) == b"\x7f"
    assert u.write_varnum(128) == b"\x81\x00"
    assert u.write_varnum(300) == b"\x82\x2c"


def test_varnum_truncated() -> None:
    with pytest.raises(u.KtStreamError):
        u.read_varnum(b"\x81", 0)


def test_hello_bytes() -> None:
    assert u.hello(0x0102030405060708, 65535) == (
        b"\xb1\x00\x00\x00\x00\x01\x02\x03\x04\x05\x06\x07\x08\xff\xff"
    )


_events = st.lists(
    st.one_of(
        st.tuples(st.just("nop"), st.integers(0, (1 << 64) - 1), st.just(b"")),
        st.tuples(st.just("entry"), st.integers(0, (1 << 64) - 1), st.binary(max_size=300)),
    ),
    max_size=20,
)


@settings(max_examples=200)
@given(_events, st.lists(st.integers(1, 50), min_size=1, max_size=30))
def test_parser_any_split(events: list[tuple[str, int, bytes]], cuts: list[int]) -> None:
    stream = b"".join(
        bytes([u.MAGIC_NOP]) + ts.to_bytes(8, "big") if kind == "nop" else u.encode_entry(ts, msg)
        for kind, ts, msg in events
    )
    want = [u.Nop(ts) if kind == "nop" else u.Entry(ts, msg) for kind, ts, msg in events]
    p = u.StreamParser()
    got: list[u.Event] = []
    pos = 0
    i = 0
    while pos < len(stream):
        n = cuts[i % len(cuts)]
        got += p.feed(stream[pos : pos + n])
        pos += n
        i += 1
    assert got == want
    assert not p.buf


def test_parser_refuses_unknown_magic_and_oversized() -> None:
    with pytest.raises(u.KtStreamError, match="magic"):
        u.StreamParser().feed(b"\x42")
    with pytest.raises(u.KtStreamError, match="bytes"):
        u.StreamParser(max_message=10).feed(u.encode_entry(1, b"x" * 11)[:13])


@given(
    st.integers(0, 65535),
    st.integers(0, 65535),
    st.binary(max_size=600),
    st.binary(max_size=2000),
    st.one_of(st.none(), st.integers(0, u.XT_NONE)),
)
def test_set_round_trip(sid: int, dbid: int, key: bytes, value: bytes, xt: int | None) -> None:
    msg = u.encode_set(sid, dbid, key, value, xt)
    c = u.decode(u.Entry(7, msg), persistent=xt is None)
    assert c == u.Change(7, sid, dbid, "set", key, value, u.XT_NONE if xt is None else xt)


def test_remove_clear_other_and_dummy() -> None:
    rm = b"\x00\x01\x00\x00\xa2" + u.write_varnum(3) + b"abc"
    assert u.decode(u.Entry(5, rm)) == u.Change(5, 1, 0, "remove", b"abc")
    assert u.decode(u.Entry(6, b"\x00\x01\x00\x02\xa5")) == u.Change(6, 1, 2, "clear")
    assert u.decode(u.Entry(7, b"\x00\x01\x00\x00\xa7")) == u.Change(7, 1, 0, "other")
    assert u.decode(u.Entry(8, b"")) is None


@pytest.mark.parametrize(
    "msg",
    [
        b"\x00\x01",  # shorter than sid + dbid + op
        b"\x00\x01\x00\x00\xa2" + u.write_varnum(4) + b"abc",  # remove size mismatch
        b"\x00\x01\x00\x00\xa1\x01\x01ab",  # value shorter than its expiry prefix
        b"\x00\x01\x00\x00\xa1\x05\x01ab",  # set sizes do not add up
    ],
)
def test_malformed_messages(msg: bytes) -> None:
    with pytest.raises(u.KtStreamError):
        u.decode(u.Entry(1, msg))
