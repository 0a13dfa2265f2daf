"""memcached writes on the root (`--memcached-producer NAME`): the protocol's semantics over
a real store (memcached/writes.py, the writer applying each request in one store
transaction), then a real root with pymemcache: durable gateway writes, the ACL, flags,
CAS uniques, noreply ordering, flush_all limited to the producer's keyspaces."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheClientError, MemcacheServerError

from core import errors as e
from core import ttl
from memcached.writes import MemcachedWriteHandler, incr_decr, refusal, split_flags, with_flags
from net.tcp import Wait
from store.ops import SET, Op
from store.store import Store
from testkit.procs import Procs, free_port, run_mercury
from testkit.sockets import converse
from tests.gateway.conftest import Root, make_root
from tests.kt.test_kt_writes import StoreWriter

# --- pure --------------------------------------------------------------------------------


@given(st.binary(max_size=64), st.integers(0, (1 << 32) - 1))
def test_flags_round_trip(data: bytes, flags: int) -> None:
    assert split_flags(with_flags(data, flags, True), True) == (data, flags)
    assert split_flags(with_flags(data, flags, False), False) == (data, 0)


@given(st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1))
def test_incr_decr_arithmetic(n: int, delta: int) -> None:
    assert incr_decr(b"%d" % n, delta, True) == (n + delta) % (1 << 64)
    assert incr_decr(b"%d" % n, delta, False) == max(0, n - delta)
    assert incr_decr(b"%d  " % n, delta, False) == max(0, n - delta)  # decr's padding


def test_incr_decr_refuses_what_is_not_a_number() -> None:
    for bad in (b"", b"x", b"-1", b"1.5", b" 1", b"%d" % (1 << 64)):
        assert incr_decr(bad, 1, True) is None


def test_refusals_say_whether_a_retry_can_help() -> None:
    assert refusal(e.ForbiddenError("not yours")).startswith(b"CLIENT_ERROR not yours")
    assert refusal(e.TooLargeError("big")).startswith(b"SERVER_ERROR object too large for cache")
    assert refusal(e.ShuttingDownError("bye")).startswith(b"SERVER_ERROR bye")


# --- semantics over a real store -----------------------------------------------------------


async def _answer(h: MemcachedWriteHandler, data: bytes) -> bytes:
    buf = bytearray(data)
    run = h.run(buf)
    out: list[bytes] = []
    while True:
        try:
            chunk = next(run)
        except StopIteration:
            return b"".join(out)
        if isinstance(chunk, Wait):
            await asyncio.wait([chunk.future])
        out.append(chunk)


def ask(h: MemcachedWriteHandler, data: bytes) -> bytes:
    return asyncio.run(_answer(h, data))


@pytest.fixture
def mc(store: Store) -> MemcachedWriteHandler:
    return MemcachedWriteHandler(store, StoreWriter(store), flags_in_value=True)


def test_storage_words(mc: MemcachedWriteHandler, store: Store) -> None:
    assert ask(mc, b"add k/a 0 0 1\r\n1\r\n") == b"STORED\r\n"
    assert ask(mc, b"add k/a 0 0 1\r\n2\r\n") == b"NOT_STORED\r\n"
    assert ask(mc, b"replace k/none 0 0 1\r\n2\r\n") == b"NOT_STORED\r\n"
    assert ask(mc, b"replace k/a 7 0 1\r\n3\r\n") == b"STORED\r\n"
    assert ask(mc, b"append k/a 9 0 2\r\n45\r\n") == b"STORED\r\n"
    assert ask(mc, b"prepend k/a 9 0 2\r\n12\r\n") == b"STORED\r\n"
    assert ask(mc, b"append k/none 0 0 1\r\nx\r\n") == b"NOT_STORED\r\n"
    # append/prepend keep the item's flags (7), as memcached does
    assert ask(mc, b"get k/a\r\n") == b"VALUE k/a 7 5\r\n12345\r\nEND\r\n"
    assert store.get(b"k/a").value == b"12345" + (7).to_bytes(4, "big")  # type: ignore[union-attr]
    assert ask(mc, b"delete k/a\r\n") == b"DELETED\r\n"
    assert ask(mc, b"delete k/a\r\n") == b"NOT_FOUND\r\n"
    assert ask(mc, b"delete k/a 5\r\n") == b"CLIENT_ERROR bad command line format\r\n"


def test_stats_count_the_writes(mc: MemcachedWriteHandler) -> None:
    ask(mc, b"set k/a 0 0 1\r\n1\r\nadd k/a 0 0 1\r\n1\r\ndelete k/a\r\ndelete k/a\r\n")
    ask(mc, b"cas k/a 0 0 1 1\r\n1\r\ntouch k/a 0\r\nincr k/a 1\r\n")
    stats = dict(
        line.split(b" ")[1:] for line in ask(mc, b"stats\r\n").splitlines() if b" " in line
    )
    assert stats[b"cmd_set"] == b"3" and stats[b"cas_misses"] == b"1"
    assert (stats[b"delete_hits"], stats[b"delete_misses"]) == (b"1", b"1")
    assert (stats[b"touch_misses"], stats[b"incr_misses"]) == (b"1", b"1")
    assert stats[b"cmd_get"] == b"0"  # the read counters are still there


def test_cas_unique_is_the_values_seq(mc: MemcachedWriteHandler, store: Store) -> None:
    assert ask(mc, b"cas k/c 0 0 1 1\r\nx\r\n") == b"NOT_FOUND\r\n"
    ask(mc, b"set k/c 0 0 1\r\n1\r\n")
    seq = store.get(b"k/c").seq  # type: ignore[union-attr]
    assert ask(mc, b"gets k/c\r\n") == b"VALUE k/c 0 1 %d\r\n1\r\nEND\r\n" % seq
    ask(mc, b"set k/other 0 0 1\r\n1\r\n")  # other keys' writes leave it alone
    assert ask(mc, b"gets k/c\r\n") == b"VALUE k/c 0 1 %d\r\n1\r\nEND\r\n" % seq
    assert ask(mc, b"cas k/c 0 0 1 %d\r\n2\r\n" % (seq + 100)) == b"EXISTS\r\n"
    assert ask(mc, b"cas k/c 0 0 1 %d\r\n2\r\n" % seq) == b"STORED\r\n"
    assert ask(mc, b"cas k/c 0 0 1 %d\r\n3\r\n" % seq) == b"EXISTS\r\n"
    assert store.get(b"k/c").value[:-4] == b"2"  # type: ignore[union-attr]


def test_incr_decr(mc: MemcachedWriteHandler) -> None:
    assert ask(mc, b"incr k/n 1\r\n") == b"NOT_FOUND\r\n"
    ask(mc, b"set k/n 3 0 2\r\n10\r\n")
    assert ask(mc, b"incr k/n 5\r\n") == b"15\r\n"
    assert ask(mc, b"decr k/n 20\r\n") == b"0\r\n"
    assert ask(mc, b"incr k/n x\r\n") == b"CLIENT_ERROR invalid numeric delta argument\r\n"
    assert ask(mc, b"get k/n\r\n") == b"VALUE k/n 3 1\r\n0\r\nEND\r\n"
    ask(mc, b"set k/s 0 0 3\r\nabc\r\n")
    assert ask(mc, b"incr k/s 1\r\n").startswith(b"CLIENT_ERROR cannot increment")


def test_exptime_gives_a_deadline_and_touch_changes_it(
    mc: MemcachedWriteHandler, store: Store
) -> None:
    def deadline() -> int:
        v = store.get(b"k/t")
        assert v is not None
        return v.expires_us

    t0 = ttl.now_us()
    assert ask(mc, b"set k/t 0 60 1\r\nx\r\n") == b"STORED\r\n"
    assert t0 + 60_000_000 <= deadline() <= ttl.now_us() + 60_000_000
    ask(mc, b"append k/t 0 0 1\r\ny\r\n")  # append keeps the item's deadline
    assert deadline() >= t0 + 60_000_000
    assert ask(mc, b"incr k/t 1\r\n").startswith(b"CLIENT_ERROR")  # (not a number)
    assert ask(mc, b"touch k/t 0\r\n") == b"TOUCHED\r\n" and deadline() == 0
    assert ask(mc, b"touch k/t 10\r\n") == b"TOUCHED\r\n" and deadline() > 0
    # a Unix time: beyond one year is refused naming the bound, the key unchanged
    far = ask(mc, b"set k/t 0 4102444800 1\r\nz\r\n")
    assert far.startswith(b"CLIENT_ERROR exptime of") and b"maximum" in far
    assert store.get(b"k/t").value == b"xy" + bytes(4)  # type: ignore[union-attr]
    # already past (negative): memcached expires it at once, so the set deletes the key
    assert ask(mc, b"set k/t 0 -1 1\r\nx\r\n") == b"STORED\r\n"
    assert store.get(b"k/t") is None
    assert ask(mc, b"add k/t 0 -1 1\r\nx\r\n").startswith(b"CLIENT_ERROR")
    assert ask(mc, b"touch k/t 0\r\n") == b"NOT_FOUND\r\n"
    ask(mc, b"set k/t 0 0 1\r\nx\r\n")
    assert ask(mc, b"gat 0 k/t\r\n") == b"VALUE k/t 0 1\r\nx\r\nEND\r\n"
    assert ask(mc, b"gat 10 k/t\r\n").startswith(b"CLIENT_ERROR gat/gats take exptime 0")
    assert ask(mc, b"flush_all 10\r\n").startswith(b"CLIENT_ERROR flush_all takes no delay")


def test_noreply_writes_are_applied_in_order(mc: MemcachedWriteHandler) -> None:
    got = ask(mc, b"set k/q 0 0 1 noreply\r\n1\r\nappend k/q 0 0 1 noreply\r\n2\r\nget k/q\r\n")
    assert got == b"VALUE k/q 0 2\r\n12\r\nEND\r\n"
    # a refused noreply write answers nothing (as memcached), the next command still runs;
    # the refusal is counted
    before = _count("noreply")
    assert ask(mc, b"set k/q 0 4102444800 1 noreply\r\n3\r\nget k/q\r\n") == got
    assert _count("noreply") == before + 1


def _count(reason: str) -> float:
    from prometheus_client import REGISTRY

    v = REGISTRY.get_sample_value(
        "mercury_read_errors_total", {"op": "memcached_write", "reason": reason}
    )
    return v or 0.0


def test_flags_refused_where_they_cannot_be_kept(store: Store) -> None:
    plain = MemcachedWriteHandler(store, StoreWriter(store), flags_in_value=False)
    assert ask(plain, b"set k/f 5 0 1\r\nx\r\n").startswith(b"CLIENT_ERROR flags are not kept")
    assert ask(plain, b"set k/f 0 0 1\r\nx\r\n") == b"STORED\r\n"
    assert store.get(b"k/f").value == b"x"  # type: ignore[union-attr]


def test_flush_all_deletes_the_producers_keys_only(mc: MemcachedWriteHandler, store: Store) -> None:
    ask(mc, b"set k/1 0 0 1\r\nx\r\nset k/2 0 0 1\r\nx\r\n")
    store.apply([e_op(b"other/1")])
    assert ask(mc, b"flush_all\r\n") == b"OK\r\n"
    assert store.get(b"k/1") is None and store.get(b"k/2") is None
    assert store.get(b"other/1") is not None


def e_op(key: bytes) -> Op:
    return Op(SET, key, b"v", owner="someone")


# --- a real root ---------------------------------------------------------------------------

NAME = "mcw"


@pytest.fixture(scope="module")
def mc_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Root, int, str]]:
    """A root whose memcached listener writes as producer `NAME` (keyspaces ``w/`` and
    ``g/``, the latter guarded at 2 deletes per batch), flags kept; a second producer
    owns ``other/``."""
    tmp = tmp_path_factory.mktemp("mcroot")
    (tmp / "logs").mkdir()
    procs = Procs(tmp / "logs")
    port = free_port()
    try:
        root = make_root(
            procs,
            tmp / "data",
            "--memcached-listen",
            f"127.0.0.1:{port}",
            "--memcached-producer",
            NAME,
            "--memcached-flags",
        )
        r = root.admin().put(
            f"/v1/admin/producers/{NAME}",
            json={"keyspaces": ["w/", "g/"], "guards": {"g/": {"max_deletes_per_batch": 2}}},
        )
        assert r.status_code in (200, 201), r.text
        r = root.admin().post(f"/v1/admin/producers/{NAME}/tokens")
        assert r.status_code == 201, r.text
        root.producer(["other/"])
        yield root, port, r.json()["token"]
        root.close_clients()
    finally:
        procs.stop_all()


def stored(root: Root, token: str, key: str) -> bytes | None:
    r = root.client(token).get(f"/v1/kv/{key}")
    return None if r.status_code == 404 else r.content


def test_pymemcache_writes_are_durable_gateway_writes(mc_root: tuple[Root, int, str]) -> None:
    root, port, token = mc_root
    c = Client(("127.0.0.1", port), default_noreply=False, timeout=10)
    try:
        assert c.set("w/a", b"1", flags=5) is True
        # the gateway stored it (data, then the flags as 4 big-endian bytes: KT's opts=f)
        assert stored(root, token, "w/a") == b"1" + (5).to_bytes(4, "big")
        assert c.get("w/a") == b"1"
        assert c.add("w/a", b"2") is False
        value, cas = c.gets("w/a")
        assert value == b"1"
        assert c.cas("w/a", b"3", cas) is True
        assert c.cas("w/a", b"4", cas) is False
        assert c.delete("w/a") is True
        assert c.delete("w/a") is False
        # noreply (pymemcache's default) still applies in order on the connection
        c.set("w/b", b"x", noreply=True)
        assert c.get("w/b") == b"x"
        # outside the producer's keyspaces: a client error, nothing written
        with pytest.raises(MemcacheClientError):
            c.set("other/x", b"1")
        assert c.get("other/x") is None
        # the mass-delete guard holds for flush_all: three keys under g/, at most 2 a batch
        for k in ("g/1", "g/2", "g/3"):
            c.set(k, b"1")
        with pytest.raises(MemcacheClientError):
            c.flush_all(noreply=False)
        assert c.get("g/1") == b"1"
        # over the gateway's value limit: memcached's own words
        with pytest.raises(MemcacheServerError):
            c.set("w/big", b"x" * (26 << 20))
    finally:
        c.close()


VERSION = b"version\r\n"
VERSION_REPLY = b"VERSION 1.6.0-mercury\r\n"
BAD_LINE = b"CLIENT_ERROR bad command line format\r\n"


def test_a_malformed_storage_lines_data_block_is_never_run(
    mc_root: tuple[Root, int, str],
) -> None:
    """The red-team repro: a storage line refused before its data block was read had the
    block run as commands (here a `delete` of another key, and a `set` of a new one)."""
    root, port, token = mc_root
    assert converse(port, b"set w/victim 0 0 4\r\nkeep\r\n" + VERSION, VERSION_REPLY) == (
        b"STORED\r\n" + VERSION_REPLY
    )
    victim = b"VALUE w/victim 0 4\r\nkeep\r\nEND\r\n"
    block = b"delete w/victim"  # flags not a number: the line is refused, the block eaten
    got = converse(
        port,
        b"set w/other x 0 %d\r\n%s\r\nget w/victim\r\n" % (len(block), block) + VERSION,
        VERSION_REPLY,
    )
    assert got == BAD_LINE + victim + VERSION_REPLY
    block = b"set w/injected 0 0 3"  # a cas without its unique: refused, the block eaten
    got = converse(
        port,
        b"cas w/other 0 0 %d\r\n%s\r\nabc\r\nget w/injected\r\n" % (len(block), block) + VERSION,
        VERSION_REPLY,
    )
    assert got == BAD_LINE + b"ERROR\r\n" + b"END\r\n" + VERSION_REPLY  # `abc` is no command
    assert stored(root, token, "w/injected") is None
    assert stored(root, token, "w/other") is None
    assert stored(root, token, "w/victim") == b"keep" + bytes(4)


@pytest.mark.parametrize(
    ("line", "reply"),
    [
        (b"set w/other 0 0 zz\r\n", BAD_LINE),  # no block length to skip
        (b"set w/other 0 0\r\n", BAD_LINE),
        (b"cas w/other 0 0 -1 5\r\n", BAD_LINE),
        (b"set w/other 0 0 2\r\nabc\r\n", b"CLIENT_ERROR bad data chunk\r\n"),
        (b"set w/other 0 0 %d\r\n" % ((32 << 20) + 1), b"CLIENT_ERROR object too large\r\n"),
    ],
    ids=["length-not-a-number", "no-length", "negative-length", "bad-data-chunk", "too-large"],
)
def test_out_of_sync_storage_lines_close_the_connection(
    mc_root: tuple[Root, int, str], line: bytes, reply: bytes
) -> None:
    """Where the stream cannot be resynchronised, the answer is the error and the
    connection closes: what follows is never run as commands."""
    root, port, token = mc_root
    assert converse(port, b"set w/victim2 0 0 4\r\nkeep\r\n" + VERSION, VERSION_REPLY) == (
        b"STORED\r\n" + VERSION_REPLY
    )
    assert converse(port, line + b"delete w/victim2\r\nset w/injected2 0 0 1\r\nx\r\n") == reply
    assert converse(port, b"get w/victim2 w/injected2\r\n", b"END\r\n") == (
        b"VALUE w/victim2 0 4\r\nkeep\r\nEND\r\n"
    )
    assert stored(root, token, "w/injected2") is None


def test_without_a_producer_the_root_listener_is_read_only(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    procs = Procs(tmp_path / "logs")
    port = free_port()
    try:
        root = make_root(procs, tmp_path / "data", "--memcached-listen", f"127.0.0.1:{port}")
        name, token = root.producer()
        r = httpx.put(
            f"{root.url}/v1/kv/{name}/k",
            content=b"v",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert r.status_code in (200, 201), r.text
        c = Client(("127.0.0.1", port), default_noreply=False, timeout=10)
        try:
            assert c.get(f"{name}/k") == b"v"
            with pytest.raises(MemcacheServerError, match="read-only"):
                c.set(f"{name}/k", b"w")
        finally:
            c.close()
        root.close_clients()
    finally:
        procs.stop_all()


def test_memcached_writes_need_a_loopback_listener(tmp_path: Path) -> None:
    run_mercury("init", str(tmp_path / "d"))
    r = run_mercury(
        "root",
        str(tmp_path / "d"),
        "--memcached-listen",
        "0.0.0.0:11211",
        "--memcached-producer",
        "p",
        "--allow-unauthenticated-reads",
    )
    assert r.returncode == 2, r.stderr
    assert "--memcached-producer needs a loopback --memcached-listen" in r.stderr
