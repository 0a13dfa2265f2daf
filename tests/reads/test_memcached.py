"""The memcached listener, proven with the real `pymemcache` client and raw bytes."""

from __future__ import annotations

import socket

import pytest
from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheServerError

from store.store import Store
from testkit.sockets import converse
from tests.reads.conftest import StartReads, put


@pytest.fixture
def mc_port(store: Store, start_reads: StartReads) -> int:
    put(store, {b"k1": b"v1", b"cfg:a": b"\x00\r\nbinary"})
    put(store, {f"m{i}".encode(): b"%d" % i for i in range(200)})
    srv = start_reads(memcached=True)
    assert srv.memcached is not None
    return srv.memcached


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        return got


def test_pymemcache_get_many_gets_version_stats(store: Store, mc_port: int) -> None:
    c = Client(("127.0.0.1", mc_port), timeout=5)
    try:
        assert c.get("k1") == b"v1"
        assert c.get("missing") is None
        assert c.get("cfg:a") == b"\x00\r\nbinary"
        many = c.get_many([f"m{i}" for i in range(200)] + ["nope"])
        assert len(many) == 200 and many["m7"] == b"7"
        value, cas = c.gets("k1")
        assert value == b"v1" and int(cas) == store.get(b"k1").seq  # type: ignore[union-attr]
        assert c.version().startswith(b"1.6")
        stats = c.stats()
        assert stats[b"curr_items"] == 202
        with pytest.raises(MemcacheServerError):
            c.set("k1", b"new", noreply=False)
        with pytest.raises(MemcacheServerError):
            c.delete("k1", noreply=False)
        assert c.get("k1") == b"v1"  # the connection stayed in sync after refused writes
    finally:
        c.close()


def test_malformed_and_oversized_input_keeps_connection_or_process_healthy(mc_port: int) -> None:
    got = _raw(mc_port, b"bogus\r\n\r\nget\r\nset k x 0 2\r\nzz\r\nget k1\r\nquit\r\nget k1\r\n")
    assert got == (
        b"ERROR\r\nERROR\r\nERROR\r\nCLIENT_ERROR bad command line format\r\n"
        b"VALUE k1 0 2\r\nv1\r\nEND\r\n"
    )
    # a storage line whose block length cannot be read: nothing after it can be trusted
    got = _raw(mc_port, b"set k 0 0 zz\r\nget k1\r\n")
    assert got == b"CLIENT_ERROR bad command line format\r\n"
    # a refused storage command's data block is consumed, even if it looks like a command
    got = _raw(mc_port, b"set k 0 0 8\r\nget k1\r\n\r\nget k1\r\n")
    assert got.startswith(b"SERVER_ERROR") and got.endswith(b"VALUE k1 0 2\r\nv1\r\nEND\r\n")
    assert _raw(mc_port, b"get " + b"k" * 70_000).startswith(b"CLIENT_ERROR line too long")
    assert _raw(mc_port, b"\x80\x00\x00\x00").startswith(b"CLIENT_ERROR binary")
    assert _raw(mc_port, b"get k1 " + b"x" * 600 + b"\r\n") == (
        b"CLIENT_ERROR bad command line format\r\n"
    )
    assert _raw(mc_port, b"get k1\r\n") == b"VALUE k1 0 2\r\nv1\r\nEND\r\n"


VERSION = b"version\r\n"
VERSION_REPLY = b"VERSION 1.6.0-mercury\r\n"
BAD_LINE = b"CLIENT_ERROR bad command line format\r\n"
K1 = b"VALUE k1 0 2\r\nv1\r\nEND\r\n"


def test_a_malformed_storage_lines_data_block_is_never_run(mc_port: int) -> None:
    """The red-team repro, byte for byte: the data block of a refused storage line was run
    as commands. A read listener refuses writes, so here the block is a `get` whose
    answer must not appear, and the repro's own blocks must not be answered."""
    got = converse(mc_port, b"set k x 0 6\r\nget k1\r\nget k1\r\n" + VERSION, VERSION_REPLY)
    assert got == BAD_LINE + K1 + VERSION_REPLY
    got = converse(
        mc_port, b"set demo/other x 0 18\r\ndelete demo/victim\r\n" + VERSION, VERSION_REPLY
    )
    assert got == BAD_LINE + VERSION_REPLY
    got = converse(
        mc_port,
        b"cas demo/other 0 0 23\r\nset demo/injected 0 0 3\r\nabc\r\n" + VERSION,
        VERSION_REPLY,
    )
    assert got == BAD_LINE + b"ERROR\r\n" + VERSION_REPLY  # `abc` is no command


@pytest.mark.parametrize(
    ("line", "reply"),
    [
        (b"set k 0 0 zz\r\n", BAD_LINE),
        (b"set k 0 0\r\n", BAD_LINE),
        (b"set k 0 0 -1\r\n", BAD_LINE),
        (b"set k 0 0 2\r\nabc\r\n", b"CLIENT_ERROR bad data chunk\r\n"),
    ],
    ids=["length-not-a-number", "no-length", "negative-length", "bad-data-chunk"],
)
def test_out_of_sync_storage_lines_close_the_connection(
    mc_port: int, line: bytes, reply: bytes
) -> None:
    assert converse(mc_port, line + b"get k1\r\n" + VERSION) == reply
    assert converse(mc_port, b"get k1\r\n", b"END\r\n") == K1  # others still served


def test_stats_subcommands_are_not_served(mc_port: int) -> None:
    """memcached answers ERROR to a `stats` subcommand it does not serve; Mercury serves
    none (no slabs, items, settings), so it says so rather than answer the general stats."""
    for sub in (b"items", b"slabs", b"settings", b"conns", b"nonsense"):
        assert converse(mc_port, b"stats " + sub + b"\r\n" + VERSION, VERSION_REPLY) == (
            b"ERROR\r\n" + VERSION_REPLY
        )
    assert converse(mc_port, b"stats\r\n", b"END\r\n").startswith(b"STAT pid ")


@pytest.mark.parametrize(
    "stray",
    [b"\x81", b"\x81\x00\x00\x05\x00\x00\x00\x00", b"\x00", b"\xff\xfe", b"\x1b["],
    ids=["response-magic", "binary-response-header", "nul", "high-bytes", "escape"],
)
def test_a_command_no_text_command_begins_with_is_answered_at_once_and_closes(
    mc_port: int, stray: bytes
) -> None:
    """A stray binary-protocol byte other than 0x80 (the response magic 0x81, a NUL, any
    byte no text command begins with) is answered `ERROR` and the connection closed at
    once: not after the header timeout (10 s), and with no line end needed."""
    with socket.create_connection(("127.0.0.1", mc_port), timeout=3) as s:
        s.sendall(stray)  # no line end, and the connection stays open on our side
        got = b""
        while chunk := s.recv(65536):  # a TimeoutError here: still waiting for a line
            got += chunk
        assert got == b"ERROR\r\n"
    # What follows the stray byte is never run, even lines that are commands.
    got = converse(mc_port, b"get k1\r\n" + stray + b"\r\nget k1\r\nversion\r\n", timeout=3)
    assert got == K1 + b"ERROR\r\n"
    # The same bytes in a data block are the client's bytes: consumed, never a command.
    block = stray + b"\r\nget k1\r\n"
    got = converse(
        mc_port, b"set k 0 0 %d\r\n" % len(block) + block + b"\r\n" + VERSION, VERSION_REPLY
    )
    assert (
        got == b"SERVER_ERROR read-only Mercury node; write through the gateway\r\n" + VERSION_REPLY
    )
    assert converse(mc_port, b"get k1\r\n", b"END\r\n") == K1
