"""A value that fails its CRC is an error on every read path, never bytes (real process)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import httpx
import pytest
import ukt
from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheServerError

from core.errors import CRCError
from store import layout
from store.ops import SET, Op
from store.store import Store
from testkit.procs import Procs, free_port, wait_http, wait_port

SECRET = b"UNIQUE-VALUE-0123456789"


def _corrupt_store(path: str) -> None:
    with Store.create(path, sync=True) as s:
        s.apply([Op(SET, b"good", b"fine", "p"), Op(SET, b"bad", SECRET, "p")])
    data = bytearray(Path(layout.data_file(path)).read_bytes())
    # Every copy: the value's bytes are also in its log record's payload (snappy keeps
    # short literals), which may come first in the file.
    at = data.find(SECRET)
    assert at >= 0
    while at >= 0:
        data[at + 5] ^= 0x01
        at = data.find(SECRET, at + 1)
    Path(layout.data_file(path)).write_bytes(bytes(data))
    with Store.open(path, readonly=True) as s, pytest.raises(CRCError):
        s.get(b"bad")  # the premise: `bad` fails its CRC


def test_crc_failure_is_an_error_on_every_protocol(tmp_path: Path, procs: Procs) -> None:
    d = str(tmp_path / "s")
    _corrupt_store(d)
    http, kt, mc = free_port(), free_port(), free_port()
    p = procs.start(
        [
            sys.executable, "-m", "mercury.readserve", d,
            "--listen", f"127.0.0.1:{http}",
            "--kt-listen", f"127.0.0.1:{kt}",
            "--memcached-listen", f"127.0.0.1:{mc}",
        ],
        name="reads",
    )  # fmt: skip
    url = f"http://127.0.0.1:{http}"
    wait_http(url + "/healthz", proc=p)
    wait_port(kt, proc=p)
    wait_port(mc, proc=p)
    flipped = bytearray(SECRET)
    flipped[5] ^= 0x01
    with httpx.Client(base_url=url) as c:
        r = c.get("/v1/kv/bad")
        assert r.status_code == 500
        assert r.headers["content-type"] == "application/problem+json"
        assert bytes(flipped) not in r.content
        assert c.get("/v1/kv/good").content == b"fine"
        r = c.post("/v1/get_bulk", json={"keys": ["good", "bad"]})
        assert r.status_code == 500 and bytes(flipped) not in r.content
        r = c.get("/v1/range", params={"prefix": "b"})
        assert r.status_code == 500 and bytes(flipped) not in r.content
        assert c.get("/v1/range", params={"prefix": "b", "keys_only": "true"}).status_code == 200
        r = c.get("/v1/range", headers={"Accept": "application/x-ndjson"})
        assert b'"error"' in r.content and bytes(flipped) not in r.content

    db = ukt.KyotoTycoon("127.0.0.1", kt, serializer=ukt.KT_NONE)
    try:
        with pytest.raises(ukt.KTError):
            db.get("bad")
        assert db.get("good") == b"fine"
    finally:
        db.close_all()
    with socket.create_connection(("127.0.0.1", kt), timeout=5) as s:
        s.sendall(b"GET /bad HTTP/1.1\r\n\r\n")
        resp = s.recv(4096)
        assert resp.startswith(b"HTTP/1.1 500") and bytes(flipped) not in resp

    client = Client(("127.0.0.1", mc), timeout=5)
    try:
        with pytest.raises(MemcacheServerError):
            client.get("bad")
        assert client.get("good") == b"fine"
    finally:
        client.close()

    metrics = httpx.get(url + "/metrics").text
    crc = [ln for ln in metrics.splitlines() if ln.startswith("mercury_crc_failures_total ")]
    assert crc and float(crc[0].split()[1]) >= 6
    assert 'mercury_read_errors_total{op="memcached_get",reason="crc"}' in metrics
