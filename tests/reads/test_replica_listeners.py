"""End to end: writes through a real `mercury root` gateway, read back from a real
`mercury replica` over HTTP, Kyoto Tycoon (ukt, REST) and memcached (pymemcache); the
root's own KT listener serves point reads only."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
import ukt
from pymemcache.client.base import Client

from testkit.procs import Procs, free_port, run_mercury, wait_http, wait_port
from testkit.wait import wait_until


def _wait_seq(url: str, seq: int, timeout: float = 60.0) -> dict[str, object]:
    def reached() -> dict[str, object] | None:
        st: dict[str, object] = httpx.get(url + "/v1/status", timeout=5).json()
        return st if isinstance(st["seq"], int) and st["seq"] >= seq else None

    return wait_until(reached, timeout, f"{url} at seq {seq}")


def test_gateway_writes_are_served_by_a_replica_over_every_protocol(
    tmp_path: Path, procs: Procs
) -> None:
    root_dir = tmp_path / "root"
    init = run_mercury("init", str(root_dir))
    assert init.returncode == 0, init.stderr
    token = (root_dir / "admin.token").read_text().strip()
    http, repl, root_kt = free_port(), free_port(), free_port()
    root = procs.start_mercury(
        "root", str(root_dir),
        "--listen", f"127.0.0.1:{http}",
        "--repl-listen", f"127.0.0.1:{repl}",
        "--kt-listen", f"127.0.0.1:{root_kt}",
        "--batch-window-ms", "20",
        "--no-sync",
        name="root",
    )  # fmt: skip
    root_url = f"http://127.0.0.1:{http}"
    wait_http(root_url + "/healthz", proc=root)
    wait_port(root_kt, proc=root)
    admin = {"Authorization": f"Bearer {token}"}
    gw = httpx.Client(base_url=root_url, timeout=30)
    r = gw.put("/v1/admin/producers/cfg", json={"keyspaces": ["cfg/"]}, headers=admin)
    assert r.status_code in (200, 201), r.text
    ptoken = gw.post("/v1/admin/producers/cfg/tokens", headers=admin).json()["token"]
    auth = {"Authorization": f"Bearer {ptoken}"}
    ops = [{"op": "set", "key": f"cfg/{i:02d}", "value": f"v{i}"} for i in range(30)]
    assert gw.post("/v1/batch", json={"ops": ops}, headers=auth).is_success
    seq = gw.put("/v1/kv/cfg/bin", content=b"\x00\xff", headers=auth).json()["seq"]

    rhttp, rkt, rmc = free_port(), free_port(), free_port()
    rep = procs.start_mercury(
        "replica", str(tmp_path / "replica"),
        "--source", f"127.0.0.1:{repl}",
        "--listen", f"127.0.0.1:{rhttp}",
        "--kt-listen", f"127.0.0.1:{rkt}",
        "--memcached-listen", f"127.0.0.1:{rmc}",
        "--no-sync",
        name="replica",
    )  # fmt: skip
    rep_url = f"http://127.0.0.1:{rhttp}"
    try:
        wait_http(rep_url + "/healthz", timeout=60, proc=rep)
        wait_port(rkt, proc=rep)
        wait_port(rmc, proc=rep)
        st = _wait_seq(rep_url, seq)
        assert st["role"] == "replica" and "lag_seconds" in st and "source" in st

        with httpx.Client(base_url=rep_url) as c:
            r = c.get("/v1/kv/cfg%2F07")
            assert r.content == b"v7" and int(r.headers["x-mercury-seq"]) >= seq
            page = c.get("/v1/range", params={"prefix": "cfg/", "limit": "10"}).json()
            assert len(page["items"]) == 10 and page["next_cursor"]
            # a write made after the replica started streams to every listener
            seq2 = gw.put("/v1/kv/cfg/late", content=b"late", headers=auth).json()["seq"]
            _wait_seq(rep_url, seq2)
            assert c.get("/v1/kv/cfg%2Flate").content == b"late"
    finally:
        gw.close()

    kt = ukt.KyotoTycoon("127.0.0.1", rkt, serializer=ukt.KT_NONE)
    try:
        assert kt.get("cfg/03") == b"v3"
        assert kt.get("cfg/late") == b"late"
        assert kt.get_bulk(["cfg/01", "cfg/bin"]) == {"cfg/01": b"v1", "cfg/bin": b"\x00\xff"}
        assert len(kt.match_prefix("cfg/")) == 32
    finally:
        kt.close_all()
    with socket.create_connection(("127.0.0.1", rkt), timeout=5) as s:
        s.sendall(b"GET cfg%2F05 HTTP/1.1\r\n\r\n")  # as python-kyototycoon sends it
        assert s.recv(4096).endswith(b"\r\n\r\nv5")

    mc = Client(("127.0.0.1", rmc), timeout=5)
    try:
        got = mc.get_many(["cfg/00", "cfg/29", "cfg/late", "nope"])
        assert got == {"cfg/00": b"v0", "cfg/29": b"v29", "cfg/late": b"late"}
    finally:
        mc.close()

    # the root's KT listener serves point reads, never ranges
    root_db = ukt.KyotoTycoon("127.0.0.1", root_kt, serializer=ukt.KT_NONE)
    try:
        assert root_db.get("cfg/09") == b"v9"
        with pytest.raises(ukt.KTError):
            root_db.match_prefix("cfg/")
    finally:
        root_db.close_all()
