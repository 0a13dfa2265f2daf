"""The Kyoto Tycoon listener, proven with the real `ukt` client and with RESTful requests
byte for byte as python-kyototycoon sends them (real process, real sockets)."""

from __future__ import annotations

import base64
import socket

import pytest
import ukt

from kt import protocol as kt
from store.store import Store
from tests.reads.conftest import StartReads, put


def _raw(port: int, data: bytes, *, until_close: bool = False) -> bytes:
    """Send `data`; read one HTTP response (by Content-Length), or everything until the
    server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        got = b""
        while True:
            if not until_close and b"\r\n\r\n" in got:
                _status, headers, body = _parse_one(got)
                if len(body) >= int(headers.get("content-length", "0")):
                    return got
            chunk = s.recv(65536)
            if not chunk:
                return got
            got += chunk


def _parse_one(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return status, headers, body


@pytest.fixture
def kt_port(store: Store, start_reads: StartReads) -> int:
    put(store, {b"k1": b"v1", b"a:2": b"two", b"a/b": b"slash", b"bin": b"\x00\x01\xff"})
    put(store, {f"pre/{i:03d}".encode(): b"x" * i for i in range(50)})
    srv = start_reads(kt=True)
    assert srv.kt is not None
    return srv.kt


def test_ukt_binary_get_and_get_bulk(kt_port: int) -> None:
    db = ukt.KyotoTycoon("127.0.0.1", kt_port, serializer=ukt.KT_NONE)
    try:
        assert db.get("k1") == b"v1"
        assert db.get("missing") is None
        assert db.get_bulk(["k1", "a:2", "missing", "bin"]) == {
            "k1": b"v1",
            "a:2": b"two",
            "bin": b"\x00\x01\xff",
        }
        # binary writes are answered with KT's binary error
        with pytest.raises(ukt.KTError):
            db.set("k1", b"new")
        assert db.get("k1") == b"v1"
    finally:
        db.close_all()


def test_ukt_tsv_rpc_match_prefix_get_and_report(kt_port: int) -> None:
    db = ukt.KyotoTycoon("127.0.0.1", kt_port, serializer=ukt.KT_NONE)
    try:
        keys = db.match_prefix("pre/")
        assert sorted(keys) == [f"pre/{i:03d}" for i in range(50)]
        assert sorted(db.match_prefix("pre/", 5)) == [f"pre/{i:03d}" for i in range(5)]
        assert db.get_http("pre/010") == b"x" * 10
        assert db.get_bulk_http(["k1", "nope"]) == {"k1": b"v1"}
        assert db.check("k1") and not db.check("nope")
        report = db.report()
        assert int(report["db_total_count"]) == 54
        with pytest.raises(ukt.KTError):
            db.set_http("k1", b"new")
    finally:
        db.close_all()


def test_rest_get_as_python_kyototycoon_sends_it(kt_port: int) -> None:
    # python-kyototycoon: no leading "/", key quoted with safe="" (":" -> %3A)
    req = b"GET a%3A2 HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: identity\r\n\r\n"
    status, headers, body = _parse_one(_raw(kt_port, req))
    assert (status, body) == (200, b"two")
    assert headers["server"] == "KyotoTycoon/1.0.0"
    assert headers["content-length"] == "3"
    status, headers, body = _parse_one(_raw(kt_port, b"GET /a%2Fb HTTP/1.1\r\n\r\n"))
    assert (status, body) == (200, b"slash")
    status, headers, _ = _parse_one(_raw(kt_port, b"GET /0/missing HTTP/1.1\r\n\r\n"))
    assert status == 404 and headers["x-kt-error"] == "DB: 7: no record: no record"
    raw = _raw(kt_port, b"HEAD /k1 HTTP/1.0\r\n\r\n", until_close=True)
    status, headers, body = _parse_one(raw)
    assert (status, headers["content-length"], body) == (200, "2", b"")
    status, headers, _ = _parse_one(
        _raw(kt_port, b"PUT /k1 HTTP/1.1\r\nContent-Length: 1\r\n\r\nx")
    )
    assert status == 500 and headers["x-kt-error"].startswith("DB: 4: no permission")
    status, _, body = _parse_one(_raw(kt_port, b"GET /nodb/k1 HTTP/1.1\r\n\r\n"))
    assert (status, body) == (400, b"no such database\n")


def test_tsv_rpc_as_python_kyototycoon_sends_it(kt_port: int) -> None:
    # colenc=U bodies with keys quoted by urllib, flags as "atomic\t", GET with DB in the query
    body = b"atomic\t\n_a%3A2\t\n_k1\t\n"
    req = (
        b"POST /rpc/get_bulk HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: identity\r\n"
        b"Content-Length: %d\r\nContent-Type: text/tab-separated-values; colenc=U\r\n\r\n"
        % len(body)
    ) + body
    status, headers, resp = _parse_one(_raw(kt_port, req))
    assert status == 200
    assert kt.decode_tsv_response(resp, headers["content-type"]) == {
        b"_a:2": b"two",
        b"_k1": b"v1",
        b"num": b"2",
    }
    status, headers, resp = _parse_one(_raw(kt_port, b"GET /rpc/report?DB=0 HTTP/1.1\r\n\r\n"))
    out = kt.decode_tsv_response(resp, headers["content-type"])
    assert status == 200 and out[b"db_total_count"] == b"54"
    assert out[b"db_0"].startswith(b"count=54 size=")


def test_tsv_rpc_column_encodings_in_and_out(kt_port: int) -> None:
    def rpc(proc: str, body: bytes, colenc: str | None) -> tuple[int, dict[bytes, bytes]]:
        ctype = "text/tab-separated-values" + (f"; colenc={colenc}" if colenc else "")
        req = (
            f"POST /rpc/{proc} HTTP/1.1\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        status, headers, resp = _parse_one(_raw(kt_port, req))
        return status, kt.decode_tsv_response(resp, headers["content-type"])

    assert rpc("get", b"key\tk1\n", None) == (200, {b"value": b"v1"})
    b64 = base64.b64encode
    assert rpc("get", b64(b"key") + b"\t" + b64(b"bin") + b"\n", "B") == (
        200,
        {b"value": b"\x00\x01\xff"},
    )
    assert rpc("get", b"key\t=6B1\r\n", "Q") == (200, {b"value": b"v1"})
    assert rpc("get", b"key\ta%3A2\n", "U") == (200, {b"value": b"two"})
    assert rpc("get", b"key\tnope\n", None) == (450, {b"ERROR": b"DB: 7: no record: no record"})
    assert rpc("get_bulk", b"atomic\t\n_k1\t\n_bin\t\n_zz\t\n", None) == (
        200,
        {b"_k1": b"v1", b"_bin": b"\x00\x01\xff", b"num": b"2"},
    )
    status, out = rpc("match_prefix", b"prefix\tpre/00\nmax\t3\n", None)
    assert status == 200 and out == {
        b"_pre/000": b"0",
        b"_pre/001": b"1",
        b"_pre/002": b"2",
        b"num": b"3",
    }
    assert rpc("get", b"DB\t7\nkey\tk1\n", None) == (400, {b"ERROR": b"no such database"})
    assert rpc("nosuch", b"", None)[0] == 501
    assert rpc("set", b"key\tk\nvalue\tv\n", None)[0] == 500
    assert rpc("status", b"", None)[1][b"count"] == b"54"


def test_a_broken_escape_in_the_query_or_a_form_body_is_refused_as_in_tsv(
    kt_port: int,
) -> None:
    """`%zz` is no escape: decoded leniently it stayed `%zz`, a key the client did not
    name. The query string and form bodies refuse it as a TSV column does: 400."""

    def rpc(target: bytes, body: bytes | None = None, ctype: bytes = b"") -> tuple[int, bytes]:
        req = b"GET " + target + b" HTTP/1.1\r\n\r\n"
        if body is not None:
            req = (
                b"POST %s HTTP/1.1\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
                % (target, ctype, len(body))
            ) + body
        status, _headers, resp = _parse_one(_raw(kt_port, req))
        return status, resp

    form = b"application/x-www-form-urlencoded"
    tsv_u = b"text/tab-separated-values; colenc=U"
    assert rpc(b"/rpc/get?key=a%3A2") == (200, b"value\ttwo\n")
    assert rpc(b"/rpc/get", b"key=a%3A2", form) == (200, b"value\ttwo\n")
    refused = (400, b"ERROR\tinvalid parameters: invalid URL-encoded parameter\n")
    for target, body, ctype in (
        (b"/rpc/get?key=a%zz", None, b""),
        (b"/rpc/get?key=a%3", None, b""),
        (b"/rpc/get?key%zz=a%3A2", None, b""),
        (b"/rpc/get_bulk?_k1=&_a%zz=", None, b""),
        (b"/rpc/get", b"key=a%zz", form),
        (b"/rpc/get", b"key=k1&x=%", form),
        (b"/rpc/get?key=k1", b"DB=0&other=%G0", form),
    ):
        assert rpc(target, body, ctype) == refused, (target, body)
    # the TSV path's answer to the same escape, for comparison
    assert rpc(b"/rpc/get", b"key\ta%zz\n", tsv_u) == (
        400,
        b"ERROR\tinvalid parameters: invalid URL-encoded column\n",
    )
    assert rpc(b"/rpc/get?key=k1") == (200, b"value\tv1\n")
    # a RESTful path too: the key is the decoded path
    assert rpc(b"/a%3A2") == (200, b"two")
    for target in (b"/a%zz", b"/a%3", b"/0/k1%", b"/%G0/k1"):
        assert rpc(target) == (400, b"invalid URL-encoded path\n"), target


def test_binary_get_bulk_bytes_match_the_reference_capture(kt_port: int) -> None:
    req = bytes.fromhex("ba 00000000 00000001 0000 00000002") + b"k1"
    with socket.create_connection(("127.0.0.1", kt_port), timeout=5) as s:
        s.sendall(req)
        want = bytes.fromhex("ba 00000001 0000 00000002 00000002 000000ffffffffff") + b"k1v1"
        got = b""
        while len(got) < len(want):
            got += s.recv(1024)
        assert got == want
        # same connection: a miss, then HTTP on the same connection
        s.sendall(bytes.fromhex("ba 00000000 00000001 0000 00000004") + b"nope")
        assert s.recv(1024) == bytes.fromhex("ba 00000000")
        s.sendall(b"GET /k1 HTTP/1.1\r\n\r\n")
        assert s.recv(4096).endswith(b"\r\n\r\nv1")


def test_malformed_input_gets_an_error_and_the_listener_keeps_serving(kt_port: int) -> None:
    status, _, body = _parse_one(_raw(kt_port, b"GARBAGE\r\n\r\n", until_close=True))
    assert status == 400 and body.startswith(b"400 Bad Request")
    assert _raw(kt_port, b"GET /k1 HTTP/2.0\r\n\r\n", until_close=True) == b""
    assert _raw(kt_port, b"\xee\x00\x00", until_close=True) == b""
    status, _, _ = _parse_one(_raw(kt_port, b"GET /" + b"a" * 9000 + b"\r\n", until_close=True))
    assert status == 400
    big = b"POST /rpc/get HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (kt.MAX_BODY + 1)
    status, _, _ = _parse_one(_raw(kt_port, big, until_close=True))
    assert status == 413
    status, _, body = _parse_one(_raw(kt_port, b"GET /k1 HTTP/1.1\r\n\r\n"))
    assert (status, body) == (200, b"v1")


def test_root_kt_listener_serves_point_reads_only(store: Store, start_reads: StartReads) -> None:
    put(store, {b"p/1": b"1"})
    srv = start_reads(role="root", kt=True)
    assert srv.kt is not None
    db = ukt.KyotoTycoon("127.0.0.1", srv.kt, serializer=ukt.KT_NONE)
    try:
        assert db.get("p/1") == b"1"
        with pytest.raises(ukt.KTError):
            db.match_prefix("p/")
    finally:
        db.close_all()
