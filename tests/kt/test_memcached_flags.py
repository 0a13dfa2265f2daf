"""memcached flags as KT's memcached plug-in stores them with `opts=f` (the value's last 4
bytes, big-endian), served by a replica's memcached listener with `--memcached-flags`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memcached import protocol as mc
from memcached.server import MemcachedHandler
from store.ops import SET, Op
from store.store import Store


@given(st.binary(max_size=50), st.integers(0, (1 << 32) - 1), st.booleans())
def test_flags_come_from_the_last_4_bytes(data: bytes, flags: int, cas: bool) -> None:
    stored = data + flags.to_bytes(4, "big")
    reply = mc.encode_values([(b"k", stored, 7)], cas, flags_in_value=True)
    head = b"VALUE k %d %d" % (flags, len(data)) + (b" 7" if cas else b"")
    assert reply == head + b"\r\n" + data + b"\r\nEND\r\n"


def test_short_values_and_the_default() -> None:
    assert mc.encode_values([(b"k", b"ab", 1)], False, flags_in_value=True) == (
        b"VALUE k 0 2\r\nab\r\nEND\r\n"
    )
    # without the option the whole value is the data and flags are 0, as before
    assert mc.encode_values([(b"k", b"abcdefgh", 1)], False) == (
        b"VALUE k 0 8\r\nabcdefgh\r\nEND\r\n"
    )


def test_handler_serves_kt_flagged_values(store: Store) -> None:
    store.apply([Op(SET, b"cfg/a", b"hello" + (42).to_bytes(4, "big"), "p")])
    out, close = MemcachedHandler(store, flags_in_value=True).step(bytearray(b"get cfg/a\r\n"))
    assert (out, close) == (b"VALUE cfg/a 42 5\r\nhello\r\nEND\r\n", False)
    out, _ = MemcachedHandler(store).step(bytearray(b"get cfg/a\r\n"))
    assert out == b"VALUE cfg/a 0 9\r\nhello\x00\x00\x00*\r\nEND\r\n"
