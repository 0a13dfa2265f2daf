"""A real tree: root -> replica -> `mercury cache`, over TCP, with real LMDB files.

One test walks the whole life of a cache node, each step checking what it exists to catch:
misses fetched and then served as hits, a negative entry, writes and deletes invalidating
what is held (never served after the cache applied them), the budget held, a restart that
starts warm, the source gone (hits served, misses 503 + Retry-After), failover to the next
source, and ranges refused with a pointer.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path
from subprocess import Popen

import httpx

from testkit.procs import Procs, free_port, run_mercury, wait_http
from testkit.replication import status, wait_for
from tests.replicator.nodes import start_replica


def _root(tmp_path: Path, procs: Procs) -> tuple[str, int, dict[str, str]]:
    assert run_mercury("init", str(tmp_path / "root")).returncode == 0
    token = (tmp_path / "root" / "admin.token").read_text().strip()
    gw, repl = free_port(), free_port()
    root = procs.start_mercury(
        "root",
        str(tmp_path / "root"),
        "--listen",
        f"127.0.0.1:{gw}",
        "--repl-listen",
        f"127.0.0.1:{repl}",
        "--batch-window-ms",
        "5",
        name="root",
    )
    base = f"http://127.0.0.1:{gw}"
    wait_http(f"{base}/healthz", proc=root)
    admin = {"Authorization": f"Bearer {token}"}
    httpx.put(f"{base}/v1/admin/producers/p", json={"keyspaces": ["cfg/"]}, headers=admin)
    ptoken = httpx.post(f"{base}/v1/admin/producers/p/tokens", headers=admin).json()["token"]
    return base, repl, {"Authorization": f"Bearer {ptoken}"}


def _start_cache(
    procs: Procs, data: Path, http: int, mc: int, sources: list[int], kt: int
) -> Popen[bytes]:
    src = ",".join(f"127.0.0.1:{s}" for s in sources)
    p = procs.start_mercury(
        "cache", str(data), "--source", src, "--max-bytes", "1MiB",
        "--listen", f"127.0.0.1:{http}", "--memcached-listen", f"127.0.0.1:{mc}",
        "--kt-listen", f"127.0.0.1:{kt}", "--kt-db-alias", "casket.kch",
        "--max-lag", "30", name="cache",
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{http}/healthz", proc=p)
    return p


def _raw(port: int, path: str) -> bytes:
    """One GET's whole answer as sent, its `date` line removed."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET %s HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n" % path.encode())
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    return b"".join(line for line in got.splitlines(True) if not line.startswith(b"date:"))


def _kt_bulk(port: int, keys: list[bytes]) -> dict[bytes, bytes] | None:
    """A KT binary get_bulk of `keys` (database 0): the values found, None on KT's error."""
    req = struct.pack(">BII", 0xBA, 0, len(keys))
    for k in keys:
        req += struct.pack(">HI", 0, len(k)) + k
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(req)
        got = b""
        while got[:1] != b"\xbf" and (len(got) < 5 or _bulk_done(got) is None):
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
    return None if got[:1] == b"\xbf" else _bulk_done(got)


def _bulk_done(got: bytes) -> dict[bytes, bytes] | None:
    """The records of a complete binary get_bulk reply, None while incomplete."""
    (hits,) = struct.unpack_from(">I", got, 1)
    out, pos = {}, 5
    for _ in range(hits):
        if len(got) < pos + 18:
            return None
        _db, ksiz, vsiz, _xt = struct.unpack_from(">HIIq", got, pos)
        pos += 18
        if len(got) < pos + ksiz + vsiz:
            return None
        out[got[pos : pos + ksiz]] = got[pos + ksiz : pos + ksiz + vsiz]
        pos += ksiz + vsiz
    return out


def test_root_replica_cache(tmp_path: Path, procs: Procs) -> None:
    base, root_repl, producer = _root(tmp_path, procs)

    def put(key: str, value: bytes) -> int:
        r = httpx.put(f"{base}/v1/kv/{key}", content=value, headers=producer)
        assert r.status_code == 200, r.text
        return int(r.json()["seq"])

    put("cfg/a", b"one")
    replica = start_replica(procs, tmp_path / "replica", [root_repl], name="replica")
    http, mc, kt = free_port(), free_port(), free_port()
    cache = f"http://127.0.0.1:{http}"
    kts = f"http://127.0.0.1:{kt}"
    proc = _start_cache(procs, tmp_path / "cache", http, mc, [replica.repl, root_repl], kt)
    wait_for(lambda: status(http)["connected"], 30, "cache connected")

    # A miss, then a hit; an absent key is a negative entry, then a negative hit.
    r = httpx.get(f"{cache}/v1/kv/cfg/a")
    assert (r.status_code, r.content, r.headers["x-mercury-cache"]) == (200, b"one", "miss")
    r = httpx.get(f"{cache}/v1/kv/cfg/a")
    assert (r.status_code, r.content, r.headers["x-mercury-cache"]) == (200, b"one", "hit")
    # A hit answered in the parser's callback (cache/fasthttp.py) is the ASGI app's answer
    # byte for byte (a query string sends it the ASGI way), `date` aside.
    assert _raw(http, "/v1/kv/cfg/a") == _raw(http, "/v1/kv/cfg/a?asgi")
    assert b"x-mercury-cache: hit" in _raw(http, "/v1/kv/cfg/a")
    assert httpx.get(f"{cache}/v1/kv/cfg/none").headers["x-mercury-cache"] == "miss"
    r = httpx.get(f"{cache}/v1/kv/cfg/none")
    assert (r.status_code, r.headers["x-mercury-cache"]) == (404, "negative_hit")

    # A write invalidates both: once the cache applied its seq, the old value (and the old
    # absence) is never served again.
    seq = put("cfg/a", b"two")
    seq = max(seq, put("cfg/none", b"now"))
    wait_for(lambda: status(http)["seq"] >= seq, 30, "invalidation applied")
    assert httpx.get(f"{cache}/v1/kv/cfg/a").content == b"two"
    assert httpx.get(f"{cache}/v1/kv/cfg/none").content == b"now"
    r = httpx.post(f"{cache}/v1/get_bulk", json={"keys": ["cfg/a", "cfg/none", "cfg/x"]})
    assert r.json() == {"values": {"cfg/a": "two", "cfg/none": "now", "cfg/x": None}}
    st = status(http)
    assert st["hits"] >= 3 and st["negative_hits"] >= 1 and st["invalidations"] >= 2
    assert 0 < st["bytes"] <= st["max_bytes"]
    metrics = httpx.get(f"{cache}/metrics").text
    for name in ("hits", "misses", "negative_hits", "evictions", "invalidations"):
        assert f"mercury_cache_{name}_total" in metrics
    assert "mercury_cache_miss_seconds_bucket" in metrics

    # memcached: the same answers (a miss fetched, an absent key left out), writes refused.
    with socket.create_connection(("127.0.0.1", mc), timeout=10) as s:
        s.sendall(b"get cfg/a cfg/none cfg/zz\r\nset cfg/a 0 0 1\r\nx\r\n")
        got = b""
        while not got.endswith(b"read-only Mercury node; write through the gateway\r\n"):
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
    assert got.startswith(
        b"VALUE cfg/a 0 3\r\ntwo\r\nVALUE cfg/none 0 3\r\nnow\r\nEND\r\nSERVER_ERROR"
    ), got

    # KT: the same answers through the engine (a key never read is a miss fetched), on
    # REST, RPC and binary; writes refused as on a replica; a key walk refused with a
    # pointer to the sources.
    r = httpx.get(f"{kts}/cfg%2Fkt1")
    assert (r.status_code, r.headers["x-mercury-cache"]) == (404, "miss")
    seq = put("cfg/kt2", b"kv")
    wait_for(lambda: status(http)["seq"] >= seq, 30, "cache applied cfg/kt2")
    r = httpx.get(f"{kts}/casket.kch/cfg%2Fa")  # KT's database name (--kt-db-alias)
    assert (r.status_code, r.content, r.headers["x-mercury-cache"]) == (200, b"two", "hit")
    r = httpx.post(f"{kts}/rpc/get_bulk", data={"_cfg/a": "", "_cfg/none": "", "_cfg/kt1": ""})
    assert r.text.splitlines() == ["_cfg/a\ttwo", "_cfg/none\tnow", "num\t2"], r.text
    r = httpx.get(f"{kts}/rpc/get", params={"key": "cfg/kt2"})
    assert (r.status_code, r.text) == (200, "value\tkv\n")
    assert _kt_bulk(kt, [b"cfg/a", b"cfg/kt1", b"cfg/kt2"]) == {b"cfg/a": b"two", b"cfg/kt2": b"kv"}
    r = httpx.put(f"{kts}/cfg%2Fa", content=b"x")
    assert r.status_code == 500 and "no permission" in r.headers["x-kt-error"]
    r = httpx.get(f"{kts}/rpc/match_prefix", params={"prefix": "cfg/"})
    assert r.status_code == 501 and str(replica.repl) in r.text

    # Ranges are a replica's: refused with a pointer, not served partially.
    r = httpx.get(f"{cache}/v1/range", params={"prefix": "cfg/"})
    assert r.status_code == 421 and str(replica.repl) in r.json()["detail"]

    # Restart: warm (its entries are on disk), and a write made while it was down is
    # invalidated as it catches up before the old value could be served.
    assert procs.terminate(proc) == 0
    seq = put("cfg/a", b"three")
    wait_for(lambda: status(replica.http)["seq"] >= seq, 30, "replica applied")
    proc = _start_cache(procs, tmp_path / "cache", http, mc, [replica.repl, root_repl], kt)
    st = status(http)
    assert st["entries"] >= 2 and st["hits"] == 0
    wait_for(lambda: status(http)["seq"] >= seq, 30, "cache caught up")
    r = httpx.get(f"{cache}/v1/kv/cfg/none")
    assert (r.content, r.headers["x-mercury-cache"]) == (b"now", "hit")  # warm
    assert httpx.get(f"{cache}/v1/kv/cfg/a").content == b"three"

    # The replica gone: hits are still served; the cache fails over to the root.
    procs.kill(replica.proc)
    assert httpx.get(f"{cache}/v1/kv/cfg/none").headers["x-mercury-cache"] == "hit"
    wait_for(lambda: status(http)["source"] == f"127.0.0.1:{root_repl}", 30, "failover")
    seq = put("cfg/a", b"four")
    wait_for(lambda: status(http)["seq"] >= seq, 30, "invalidation from the root")
    assert httpx.get(f"{cache}/v1/kv/cfg/a").content == b"four"

    # No source at all: hits served, a miss is 503 with Retry-After (never a 404).
    procs.kill(procs.started[0])  # the root
    wait_for(lambda: not status(http)["connected"], 30, "source lost")
    assert httpx.get(f"{cache}/v1/kv/cfg/a").content == b"four"
    r = httpx.get(f"{cache}/v1/kv/cfg/never-read")
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    with socket.create_connection(("127.0.0.1", mc), timeout=30) as s:
        s.sendall(b"get cfg/never-read\r\n")
        assert s.recv(65536).startswith(b"SERVER_ERROR source unavailable")
    r = httpx.get(f"{kts}/rpc/get", params={"key": "cfg/never-read"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert _kt_bulk(kt, [b"cfg/a"]) == {b"cfg/a": b"four"}  # a hit, no source needed
    assert _kt_bulk(kt, [b"cfg/never-read"]) is None  # KT's error, never an empty answer


def test_a_lagging_cache_refuses_kt_reads(tmp_path: Path, procs: Procs) -> None:
    """With --refuse-when-lagging, a cache that heard nothing from a root (its source is not
    there) refuses every KT read as lagging, not as a miss it could not fetch."""
    http, kt = free_port(), free_port()
    p = procs.start_mercury(
        "cache", str(tmp_path / "cache"), "--source", f"127.0.0.1:{free_port()}",
        "--max-bytes", "1MiB", "--listen", f"127.0.0.1:{http}", "--kt-listen",
        f"127.0.0.1:{kt}", "--max-lag", "5", "--refuse-when-lagging", name="cache",
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{http}/healthz", proc=p)
    r = httpx.get(f"http://127.0.0.1:{kt}/rpc/get", params={"key": "cfg/a"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert "lagging" in r.text
    r = httpx.get(f"http://127.0.0.1:{kt}/cfg%2Fa")
    assert r.status_code == 503 and "lagging" in r.headers["x-kt-error"]
    assert _kt_bulk(kt, [b"cfg/a"]) is None
