"""Schemathesis over the read API's /openapi.json — a real `mercury replica` of a real root
with `--read-auth`, and a `mercury.readserve` without it: no generated input produces a 5xx, and
every answer is one the document declares (status, content type, headers, body schema)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from store.ops import SET, Op
from store.store import Store
from testkit.procs import Procs
from testkit.replication import wait_for
from tests.gateway.conftest import Root, make_root
from tests.reads.conftest import StartReads
from tests.replicator.nodes import start_replica
from tests.support import openapi_fuzz

#: Keys of every shape the reads answer differently: text, bytes that are not UTF-8, a value
#: over one page (chunked), an empty one.
VALUES = {
    b"a": b"value-a",
    b"a/b": b"\x00\xfe not utf-8",
    b"x/big": b"x" * 20_000,
    b"0": b"",
    b"-/%": b"percent",
}


def _assert_clean(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_a_replica_with_read_auth_answers_only_what_its_document_declares(
    tmp_path: Path, procs: Procs
) -> None:
    root = make_root(procs, tmp_path / "root")
    try:
        _replica_run(root, tmp_path, procs)
    finally:
        root.close_clients()


def _replica_run(root: Root, tmp_path: Path, procs: Procs) -> None:
    spaces = ["a", "0", "x", "-", "%", "/"]
    r = root.admin().put("/v1/admin/producers/p", json={"keyspaces": spaces})
    assert r.status_code in (200, 201), r.text
    producer = root.admin().post("/v1/admin/producers/p/tokens").json()["token"]
    r = root.admin().put("/v1/admin/consumers/c", json={"keyspaces": spaces})
    assert r.status_code in (200, 201), r.text
    consumer = root.admin().post("/v1/admin/consumers/c/tokens").json()["token"]
    for k, v in VALUES.items():
        r = root.client(producer).put("/v1/kv/" + k.decode(), content=v)
        assert r.status_code == 200, r.text
    replica = start_replica(
        procs, tmp_path / "r1", [int(root.args[3].split(":")[1])], "--read-auth", name="r1"
    )
    base = f"http://127.0.0.1:{replica.http}"
    auth = {"Authorization": f"Bearer {consumer}"}
    wait_for(lambda: httpx.get(f"{base}/v1/kv/a", headers=auth).status_code == 200, 30, "sync")
    _assert_clean(openapi_fuzz.run(base, 40, token=consumer))
    assert httpx.get(f"{base}/healthz").status_code == 200


def test_a_read_server_without_auth_answers_only_what_its_document_declares(
    store: Store, start_reads: StartReads
) -> None:
    store.apply([Op(SET, k, v, "p") for k, v in VALUES.items()])
    srv = start_reads()
    _assert_clean(openapi_fuzz.run(srv.url, 40))
    assert httpx.get(srv.url + "/healthz").status_code == 200
