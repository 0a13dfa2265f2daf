"""Properties and fuzzing of the memcached text protocol parser and handler."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ReadProtocolError
from memcached import protocol as mc
from memcached.server import MemcachedHandler
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


# A storage line's arguments as a client may send them, well-formed or not.
_arg = st.one_of(
    st.sampled_from([b"0", b"1", b"x", b"-1", b"noreply", b"4294967296"]),
    st.binary(min_size=1, max_size=6).filter(lambda a: not any(c <= 32 for c in a)),
)


@given(
    st.sampled_from(sorted(mc.STORAGE)),
    st.lists(_arg, min_size=2, max_size=2),
    st.binary(max_size=40),
    st.lists(_arg, max_size=3),
    st.binary(max_size=20),
)
def test_a_storage_lines_data_block_is_consumed_whatever_else_is_wrong(
    verb: bytes, flags_exptime: list[bytes], block: bytes, extra: list[bytes], tail: bytes
) -> None:
    """Whenever a storage line's block length can be read, the block is consumed with the
    line — answered or refused, its bytes are never parsed as commands."""
    line = b" ".join([verb, b"k", *flags_exptime, b"%d" % len(block), *extra]) + b"\r\n"
    got = mc.parse_command(line + block + b"\r\n" + tail)
    assert got is not None
    cmd, n = got
    assert n == len(line) + len(block) + 2
    if cmd.reply is None:
        assert cmd.data == block
    else:
        assert cmd.reply == mc.client_error("bad command line format")
    whole = line + block + b"\r\n"
    for cut in range(len(whole)):  # incomplete: wait for the rest, consume nothing
        assert mc.parse_command(whole[:cut]) is None


@given(
    st.sampled_from(sorted(mc.STORAGE)),
    st.sampled_from([b"", b"x", b"-1", b"1x", b"+1", b"0x10"]),
    st.binary(max_size=30),
)
def test_a_storage_line_without_a_readable_length_closes(
    verb: bytes, length: bytes, tail: bytes
) -> None:
    line = verb + b" k 0 0 " + length + b"\r\n"
    with pytest.raises(ReadProtocolError) as err:
        mc.parse_command(line + tail)
    assert err.value.close


@given(st.binary(min_size=1, max_size=20), st.binary(min_size=2, max_size=2))
def test_a_block_not_ended_where_its_length_says_closes(block: bytes, end: bytes) -> None:
    if end == b"\r\n":
        end = b"\rX"
    with pytest.raises(ReadProtocolError) as err:
        mc.parse_command(b"set k x 0 %d\r\n" % len(block) + block + end + b"delete k\r\n")
    assert err.value.close and err.value.message == "bad data chunk"


_NOT_TEXT = [c for c in range(256) if not mc.is_text_start(c)]


@given(st.sampled_from(_NOT_TEXT), st.binary(max_size=60))
def test_a_command_no_text_command_begins_with_is_answered_at_once_and_closes(
    first: int, rest: bytes
) -> None:
    """A first byte that cannot begin a text command (binary response magic 0x81, a NUL,
    stray binary data): answered without waiting for a line end, and nothing after it —
    however much it looks like commands — is ever run."""
    assert 0x80 in _NOT_TEXT and 0x81 in _NOT_TEXT and 0x00 in _NOT_TEXT
    assert not any(mc.is_text_start(c) for c in _NOT_TEXT)
    data = bytes([first]) + rest + b"\r\nget k1\r\nversion\r\n"
    for cut in range(1, len(data) + 1):
        buf = data[:cut]
        if first == 0x80:
            with pytest.raises(ReadProtocolError) as err:
                mc.parse_command(buf)
            assert err.value.close
            continue
        got = mc.parse_command(buf)
        assert got is not None
        assert got == (mc.Command(b"", reply=mc.ERROR, close=True), len(buf))


@settings(deadline=None)
@given(st.sampled_from(_NOT_TEXT), st.binary(max_size=60))
def test_the_handler_answers_a_non_text_command_then_closes(
    small_store: Store, first: int, rest: bytes
) -> None:
    h = MemcachedHandler(small_store)
    buf = bytearray(b"get k1\r\n" + bytes([first]) + rest + b"\r\nget k1\r\n")
    reply, close = h.step(buf)
    want = b"CLIENT_ERROR binary protocol not supported\r\n" if first == 0x80 else mc.ERROR
    assert (reply, close) == (b"VALUE k1 0 2\r\nv1\r\nEND\r\n" + want, True)
    assert not buf


def test_every_text_command_begins_with_a_text_byte() -> None:
    for line in (b"get k", b"GETS k", b" get k", b"\tget k", b"\r\n", b"\n", b"mg k v"):
        assert mc.is_text_start(line[0])
