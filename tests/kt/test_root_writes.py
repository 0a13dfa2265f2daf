"""KT writes on the root (`--kt-producer NAME`), with real clients on a real root: the same
ACL, guards and durable commit as HTTP writes, KT's statuses (450 for a failed
add/replace/cas/remove), clear limited to the producer's keyspaces; without the flag,
writes stay refused."""

from __future__ import annotations

import base64
import datetime
import struct
import time
from collections.abc import Iterator
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path

import httpx
import pytest
import ukt

from testkit.procs import Procs, free_port
from testkit.sockets import converse
from tests.gateway.conftest import Root, make_root

NAME = "ktw"


@pytest.fixture(scope="module")
def kt_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Root, int, str]]:
    """A root whose KT listener writes as producer `NAME` (keyspaces ``w/`` and ``g/``, the
    latter guarded at 3 deletes per batch), and a second producer owning ``other/``."""
    tmp = tmp_path_factory.mktemp("ktroot")
    (tmp / "logs").mkdir()
    procs = Procs(tmp / "logs")
    kt = free_port()
    try:
        root = make_root(
            procs,
            tmp / "data",
            "--kt-listen",
            f"127.0.0.1:{kt}",
            "--kt-producer",
            NAME,
            "--kt-db-alias",
            "casket.kch",
        )
        r = root.admin().put(
            f"/v1/admin/producers/{NAME}",
            json={"keyspaces": ["w/", "g/"], "guards": {"g/": {"max_deletes_per_batch": 3}}},
        )
        assert r.status_code in (200, 201), r.text
        r = root.admin().post(f"/v1/admin/producers/{NAME}/tokens")
        assert r.status_code == 201, r.text
        root.producer(["other/"])
        yield root, kt, r.json()["token"]
        root.close_clients()
    finally:
        procs.stop_all()


def rpc(kt: int, proc: str, **params: str) -> tuple[int, dict[str, str]]:
    r = httpx.post(f"http://127.0.0.1:{kt}/rpc/{proc}", data=params, timeout=10)
    out = {}
    for line in r.text.splitlines():
        k, _, v = line.partition("\t")
        out[k] = v
    return r.status_code, out


def stored(root: Root, token: str, key: str) -> bytes | None:
    r = root.client(token).get(f"/v1/kv/{key}")
    return None if r.status_code == 404 else r.content


def test_binary_and_rpc_sets_are_durable_gateway_writes(kt_root: tuple[Root, int, str]) -> None:
    root, kt, token = kt_root
    db = ukt.KyotoTycoon("127.0.0.1", kt, serializer=ukt.KT_NONE)
    try:
        assert db.set("w/a", b"1") == 1  # binary set_bulk of one record
        assert db.set_bulk({"w/b": b"2", "w/c": b"3"}) == 2
        assert stored(root, token, "w/a") == b"1"
        assert db.get_bulk(["w/a", "w/b", "w/c"]) == {"w/a": b"1", "w/b": b"2", "w/c": b"3"}
        assert db.remove_bulk(["w/b", "w/missing"]) == 1
        assert stored(root, token, "w/b") is None
    finally:
        db.close_all()
    assert rpc(kt, "set", key="w/r", value="v") == (200, {})
    assert stored(root, token, "w/r") == b"v"


def test_conditional_procedures_answer_450(kt_root: tuple[Root, int, str]) -> None:
    root, kt, token = kt_root
    assert rpc(kt, "add", key="w/x", value="1")[0] == 200
    status, out = rpc(kt, "add", key="w/x", value="2")
    assert status == 450 and out["ERROR"] == "DB: 6: record duplication: record duplication"
    assert rpc(kt, "replace", key="w/x", value="3")[0] == 200
    status, out = rpc(kt, "replace", key="w/nope", value="3")
    assert status == 450 and out["ERROR"] == "DB: 7: no record: no record"
    status, out = rpc(kt, "cas", key="w/x", oval="wrong", nval="4")
    assert status == 450 and "logical inconsistency" in out["ERROR"]
    assert rpc(kt, "cas", key="w/x", oval="3", nval="4")[0] == 200
    assert stored(root, token, "w/x") == b"4"
    assert rpc(kt, "cas", key="w/x", oval="4")[0] == 200  # no nval: remove
    assert stored(root, token, "w/x") is None
    status, out = rpc(kt, "remove", key="w/x")
    assert status == 450 and out["ERROR"] == "DB: 7: no record: no record"
    assert rpc(kt, "set", key="w/x", value="5", DB="casket.kch")[0] == 200
    assert rpc(kt, "seize", key="w/x") == (200, {"value": "5"})
    assert rpc(kt, "seize", key="w/x")[0] == 450
    assert rpc(kt, "set", key="w/x", value="5", DB="nope")[0] == 400


def test_report_counts_the_writes(kt_root: tuple[Root, int, str]) -> None:
    _, kt, _ = kt_root
    before = rpc(kt, "report")[1]
    assert rpc(kt, "set", key="w/rep", value="1")[0] == 200
    assert rpc(kt, "remove", key="w/rep-missing")[0] == 450
    after = rpc(kt, "report")[1]
    assert int(after["cnt_set"]) == int(before["cnt_set"]) + 1
    assert int(after["cnt_remove_misses"]) == int(before["cnt_remove_misses"]) + 1
    assert NAME in after["conf_kt_features"]


def test_increment_and_append(kt_root: tuple[Root, int, str]) -> None:
    root, kt, token = kt_root
    assert rpc(kt, "increment", key="w/n", num="5") == (200, {"num": "5"})
    assert rpc(kt, "increment", key="w/n", num="-7") == (200, {"num": "-2"})
    assert stored(root, token, "w/n") == struct.pack(">q", -2)
    assert rpc(kt, "increment", key="w/absent", num="1", orig="try")[0] == 450
    assert rpc(kt, "set", key="w/s", value="abc")[0] == 200
    assert rpc(kt, "increment", key="w/s", num="1")[0] == 450  # not an 8-byte number
    assert rpc(kt, "append", key="w/s", value="def")[0] == 200
    assert rpc(kt, "append", key="w/t", value="new")[0] == 200
    assert stored(root, token, "w/s") == b"abcdef"
    assert stored(root, token, "w/t") == b"new"


def test_rest_put_and_delete(kt_root: tuple[Root, int, str]) -> None:
    root, kt, token = kt_root
    base = f"http://127.0.0.1:{kt}"
    r = httpx.put(f"{base}/w%2Frest", content=b"body", timeout=10)
    assert r.status_code == 201
    assert stored(root, token, "w/rest") == b"body"
    r = httpx.put(f"{base}/w%2Frest", content=b"x", headers={"X-Kt-Mode": "add"}, timeout=10)
    assert r.status_code == 450 and "duplication" in r.headers["X-Kt-Error"]
    r = httpx.put(f"{base}/w%2Fnew", content=b"x", headers={"X-Kt-Mode": "replace"}, timeout=10)
    assert r.status_code == 450 and "no record" in r.headers["X-Kt-Error"]
    # a database alias (--kt-db-alias) names database 0; another name is refused
    r = httpx.put(f"{base}/casket.kch/w%2Falias", content=b"a", timeout=10)
    assert r.status_code == 201 and stored(root, token, "w/alias") == b"a"
    assert httpx.put(f"{base}/other.kch/w%2Fx", content=b"a", timeout=10).status_code == 400
    assert httpx.delete(f"{base}/w%2Frest", timeout=10).status_code == 204
    r = httpx.delete(f"{base}/w%2Frest", timeout=10)
    assert r.status_code == 404 and "no record" in r.headers["X-Kt-Error"]
    # a broken escape names no key: refused, nothing written (raw: httpx would escape it)
    for method in (b"PUT", b"DELETE"):
        req = method + b" /w%2Fz%zz HTTP/1.1\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx"
        got = converse(kt, req)
        assert got.startswith(b"HTTP/1.1 400 ") and got.endswith(b"invalid URL-encoded path\n")
    assert stored(root, token, "w/z%zz") is None


def test_acl_refusal_is_not_retryable_and_writes_nothing(kt_root: tuple[Root, int, str]) -> None:
    root, kt, token = kt_root
    status, out = rpc(kt, "set", key="other/k", value="v")
    assert status == 400, out  # a refusal that can never succeed: not 503 (retry later)
    assert "other/k" in out["ERROR"]
    status, _ = rpc(kt, "set_bulk", **{"_w/ok": "1", "_other/no": "2"})
    assert status == 400
    assert stored(root, token, "w/ok") is None  # all-or-nothing, like an HTTP batch


def test_a_set_bulk_column_invalid_in_its_colenc_writes_nothing(
    kt_root: tuple[Root, int, str],
) -> None:
    """A stray byte in a Base64 key used to be skipped (`_w/tsv` stored under a key the
    client never named); now the whole call is refused."""
    root, kt, token = kt_root
    body = base64.b64encode(b"_w/tsv") + b"!\t" + base64.b64encode(b"1") + b"\n"
    r = httpx.post(
        f"http://127.0.0.1:{kt}/rpc/set_bulk",
        content=body,
        headers={"Content-Type": "text/tab-separated-values; colenc=B"},
        timeout=10,
    )
    assert r.status_code == 400, r.text
    assert r.text.startswith("ERROR\tinvalid parameters: invalid base64 column")
    assert stored(root, token, "w/tsv") is None
    r = httpx.post(
        f"http://127.0.0.1:{kt}/rpc/set_bulk",
        content=body.replace(b"!", b""),
        headers={"Content-Type": "text/tab-separated-values; colenc=B"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert stored(root, token, "w/tsv") == b"1"


def test_clear_deletes_only_the_producers_keys(kt_root: tuple[Root, int, str]) -> None:
    root, kt, token = kt_root
    _, other_token = root.producer(["keep/"])
    assert root.client(other_token).put("/v1/kv/keep/1", content=b"x").status_code == 200
    assert rpc(kt, "set", key="w/z", value="z")[0] == 200
    assert rpc(kt, "clear")[0] == 200
    assert stored(root, token, "w/z") is None
    assert stored(root, other_token, "keep/1") == b"x"


def test_without_kt_producer_writes_stay_refused(tmp_path: Path, procs: Procs) -> None:
    kt = free_port()
    root = make_root(procs, tmp_path / "data", "--kt-listen", f"127.0.0.1:{kt}")
    try:
        status, out = rpc(kt, "set", key="w/a", value="1")
        assert status == 500 and "no permission" in out["ERROR"]
        r = httpx.put(f"http://127.0.0.1:{kt}/w%2Fa", content=b"1", timeout=10)
        assert r.status_code == 500
    finally:
        root.close_clients()


def test_clear_obeys_the_mass_delete_guard(kt_root: tuple[Root, int, str]) -> None:
    root, kt, token = kt_root
    db = ukt.KyotoTycoon("127.0.0.1", kt, serializer=ukt.KT_NONE)
    try:
        assert db.set_bulk({f"g/{i}": b"x" for i in range(5)}) == 5
        status, out = rpc(kt, "clear")
        assert status == 400 and "deletes per batch" in out["ERROR"], out
        assert stored(root, token, "g/0") == b"x"  # nothing deleted
        assert db.remove_bulk([f"g/{i}" for i in range(3)]) == 3
        assert db.remove_bulk(["g/3", "g/4"]) == 2
    finally:
        db.close_all()


def test_increment_double_synchronize_and_writes_not_offered(
    kt_root: tuple[Root, int, str],
) -> None:
    root, kt, token = kt_root
    db = ukt.KyotoTycoon("127.0.0.1", kt, serializer=ukt.KT_NONE)
    try:
        assert db.increment_double("w/nd") == 1.0
        assert db.increment_double("w/nd", 2.5) == 3.5
    finally:
        db.close_all()
    assert stored(root, token, "w/nd") == struct.pack(">qq", 3, 5 * 10**14)
    # every acknowledged write is durable already: synchronize succeeds
    assert rpc(kt, "synchronize")[0] == 200
    # KT writes Mercury does not offer: 501 on a writing root, never "read-only node"
    status, out = rpc(kt, "vacuum")
    assert status == 501 and "not implemented" in out["ERROR"]


def test_kt_signal_parameters_are_refused_not_ignored(kt_root: tuple[Root, int, str]) -> None:
    """KT's WAIT/SIGNAL parameters are not offered: a call carrying one answers 501 at
    once (it neither waits on a condition nor writes as if it had signalled one), on the
    read procedures and the write procedures alike."""
    root, kt, token = kt_root
    assert rpc(kt, "set", key="w/sig", value="before")[0] == 200
    status, out = rpc(kt, "get", key="w/sig", WAIT="ready", WAITTIME="30")
    assert status == 501 and "WAIT parameter" in out["ERROR"], out
    status, out = rpc(kt, "set", key="w/sig", value="after", SIGNAL="ready")
    assert status == 501 and "SIGNAL parameter" in out["ERROR"], out
    status, out = rpc(kt, "remove", key="w/sig", SIGNAL="ready", SIGNALBROAD="1")
    assert status == 501, out
    assert stored(root, token, "w/sig") == b"before"  # neither write happened
    assert rpc(kt, "get", key="w/sig") == (200, {"value": "before"})


def test_rpc_xt_gives_the_key_a_deadline(kt_root: tuple[Root, int, str]) -> None:
    root, kt, token = kt_root
    assert rpc(kt, "set", key="w/xt", value="v", xt="3600") == (200, {})
    got = root.client(token).get("/v1/kv/w/xt")
    assert got.status_code == 200 and "expires" in got.headers
    assert rpc(kt, "set", key="w/xt", value="v") == (200, {})  # no xt: the deadline goes
    assert "expires" not in root.client(token).get("/v1/kv/w/xt").headers
    status, out = rpc(kt, "set", key="w/xt", value="v", xt=str(400 * 86400))
    assert status == 400 and "maximum" in out["ERROR"]
    assert rpc(kt, "set", key="w/xt", value="v", xt="-1") == (200, {})  # already past
    assert stored(root, token, "w/xt") is None


def _deadline_s(root: Root, token: str, key: str) -> int:
    """The root's deadline of `key` in whole Unix seconds (its `Expires`, rounded down)."""
    got = root.client(token).get(f"/v1/kv/{key}")
    assert got.status_code == 200 and "expires" in got.headers, got.headers
    return int(parsedate_to_datetime(got.headers["expires"]).timestamp())


def test_binary_set_bulk_xt_is_per_record_and_reads_answer_it(
    kt_root: tuple[Root, int, str],
) -> None:
    root, kt, token = kt_root
    db = ukt.KyotoTycoon("127.0.0.1", kt, serializer=ukt.KT_NONE)
    soon = int(time.time()) + 7200
    try:
        stored_n = db.set_bulk_details(
            [
                (0, "w/bx1", b"1", 3600),  # relative seconds
                (0, "w/bx2", b"2", -soon),  # negative: a Unix time
                (0, "w/bx3", b"3", None),  # no expiry: ukt sends INT64_MAX
            ]
        )
        assert stored_n == 3
        xt1, xt2 = _deadline_s(root, token, "w/bx1"), _deadline_s(root, token, "w/bx2")
        assert xt2 == soon
        assert "expires" not in root.client(token).get("/v1/kv/w/bx3").headers
        # the binary get_bulk answers each record's xt, KT's "never" for none
        got = {k: xt for _db, k, _v, xt in db.get_bulk_details([(0, "w/bx1"), (0, "w/bx3")])}
        assert got == {"w/bx1": xt1, "w/bx3": 0xFFFFFFFFFF}
        # a record already past removes its key (KT expires it at once); the others stand
        assert db.set_bulk_details([(0, "w/bx1", b"x", -1), (0, "w/bx4", b"4", 60)]) == 2
        assert stored(root, token, "w/bx1") is None and stored(root, token, "w/bx4") == b"4"
        # an xt beyond the year's bound refuses the whole request, nothing written
        with pytest.raises(ukt.ProtocolError):
            far = datetime.datetime.now() + datetime.timedelta(days=400)  # ukt: -Unix time
            db.set_bulk_details([(0, "w/bx5", b"5", far)])
        assert stored(root, token, "w/bx5") is None
    finally:
        db.close_all()

    # RPC get answers the xt column (Unix seconds), only for a record that expires
    assert rpc(kt, "get", key="w/bx2") == (200, {"value": "2", "xt": str(soon)})
    assert rpc(kt, "get", key="w/bx3") == (200, {"value": "3"})
    assert rpc(kt, "check", key="w/bx2") == (200, {"vsiz": "1", "xt": str(soon)})


def test_rest_put_x_kt_xt_and_rest_get_answers_it(kt_root: tuple[Root, int, str]) -> None:
    root, kt, token = kt_root
    base = f"http://127.0.0.1:{kt}"
    at = int(time.time()) + 3600
    # KT's own REST clients send X-Kt-Xt as a Unix time; an HTTP date is taken too
    r = httpx.put(f"{base}/w%2Frx", content=b"v", headers={"X-Kt-Xt": str(at)}, timeout=10)
    assert r.status_code == 201, r.headers
    assert _deadline_s(root, token, "w/rx") == at
    got = httpx.get(f"{base}/w%2Frx", timeout=10)
    assert got.status_code == 200
    assert int(parsedate_to_datetime(got.headers["x-kt-xt"]).timestamp()) == at
    date = formatdate(at + 60, usegmt=True)
    r = httpx.put(f"{base}/w%2Frx", content=b"v", headers={"X-Kt-Xt": date}, timeout=10)
    assert r.status_code == 201 and _deadline_s(root, token, "w/rx") == at + 60
    # a PUT without X-Kt-Xt clears the deadline; the GET then carries none
    assert httpx.put(f"{base}/w%2Frx", content=b"v", timeout=10).status_code == 201
    assert "x-kt-xt" not in httpx.get(f"{base}/w%2Frx", timeout=10).headers
    # refusals name the problem; a time already past removes the key
    r = httpx.put(f"{base}/w%2Frx", content=b"v", headers={"X-Kt-Xt": "soon"}, timeout=10)
    assert r.status_code == 400 and "X-Kt-Xt" in r.headers["x-kt-error"]
    far = str(int(time.time()) + 400 * 86400)
    r = httpx.put(f"{base}/w%2Frx", content=b"v", headers={"X-Kt-Xt": far}, timeout=10)
    assert r.status_code == 400 and "maximum" in r.headers["x-kt-error"]
    assert stored(root, token, "w/rx") == b"v"
    r = httpx.put(f"{base}/w%2Frx", content=b"v", headers={"X-Kt-Xt": "1"}, timeout=10)
    assert r.status_code == 201 and stored(root, token, "w/rx") is None
