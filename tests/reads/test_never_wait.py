"""Reads never wait for writes: with another process holding LMDB's write transaction open
(the replica's applier mid-batch), every protocol keeps answering, with the last committed
value, and sees the new one once it commits."""

from __future__ import annotations

import subprocess
import sys

import httpx
import ukt
from pymemcache.client.base import Client

from store.store import Store
from tests.reads.conftest import ReadServer, StartReads, put

HOLDER = """
import sys
from store.store import Store
s = Store.open(sys.argv[1])
with s.env.begin(write=True, db=s.dbs.data) as txn:
    txn.put(b"scratch", b"not a record: never committed in this form")
    print("holding", flush=True)
    sys.stdin.readline()  # hold the write transaction until the test says so
    txn.abort()
s.close()
print("released", flush=True)
"""


def test_reads_answer_while_another_process_holds_the_write_transaction(
    store: Store, start_reads: StartReads
) -> None:
    put(store, {b"k": b"old"})
    srv = start_reads(kt=True, memcached=True)
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, store.path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            _read_while_held(holder, store, srv)
        finally:
            if holder.poll() is None:
                holder.kill()
            holder.wait(10)


def _read_while_held(holder: subprocess.Popen[str], store: Store, srv: ReadServer) -> None:
    assert srv.kt is not None and srv.memcached is not None
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline().strip() == "holding"
    kt = ukt.KyotoTycoon("127.0.0.1", srv.kt, serializer=ukt.KT_NONE, timeout=5)
    mc = Client(("127.0.0.1", srv.memcached), timeout=5)
    with httpx.Client(base_url=srv.url, timeout=5) as c:
        for _ in range(200):
            assert c.get("/v1/kv/k").content == b"old"
            assert kt.get("k") == b"old"
            assert mc.get("k") == b"old"
        assert len(c.get("/v1/range", params={"prefix": "k"}).json()["items"]) == 1
        assert holder.poll() is None  # the write transaction is still open
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "released"
        put(store, {b"k": b"new"})
        assert c.get("/v1/kv/k").content == b"new"
        assert kt.get("k") == b"new" and mc.get("k") == b"new"
    kt.close_all()
    mc.close()
