"""Properties and fuzzing of the memcached text protocol parser and handler."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ReadProtocolError
from reads import memcached_protocol as mc
from reads.memcached_server import MemcachedHandler
from store.ops import SET, Op
from store.store import Store

mkeys = st.binary(min_size=1, max_size=40).filter(lambda k: not any(c <= 32 for c in k))


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = Store.create(str(tmp_path_factory.mktemp("mc") / "s"), sync=False, map_size=1 << 26)
    s.apply([Op(SET, b"k1", b"v1", "t")])
    yield s
    s.close()


@given(st.lists(mkeys, min_size=1, max_size=30), st.sampled_from([b"get", b"gets", b"GET"]))
def test_get_line_parses_to_its_keys_only_once_complete(keys: list[bytes], verb: bytes) -> None:
    line = verb + b" " + b" ".join(keys) + b"\r\n"
    for cut in range(len(line) - 1):
        got = mc.parse_command(line[:cut])
        assert got is None
    got = mc.parse_command(line + b"get")
    assert got is not None
    cmd, n = got
    assert n == len(line) and cmd.keys == keys and cmd.reply is None


@given(st.binary(max_size=300))
def test_parser_on_garbage_answers_or_refuses(data: bytes) -> None:
    try:
        got = mc.parse_command(data)
    except ReadProtocolError as err:
        assert err.close
        return
    if got is not None:
        assert 0 < got[1] <= len(data)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=100), max_size=4))
def test_handler_survives_any_bytes_and_keeps_serving(
    small_store: Store, pieces: list[bytes]
) -> None:
    h = MemcachedHandler(small_store)
    buf = bytearray()
    for p in pieces:
        buf += p
        reply, close = h.step(buf)
        assert isinstance(reply, bytes)
        if close:
            break
    buf = bytearray(b"get k1\r\n")
    assert h.step(buf) == (b"VALUE k1 0 2\r\nv1\r\nEND\r\n", False)
