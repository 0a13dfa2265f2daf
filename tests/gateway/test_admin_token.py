"""Rotating the admin token: `mercury acl admin-token rotate` against a real root.

The new token's hash replaces the old one's through the log: the old token is refused from
the next request on, after a restart too, and a replica holds the new hash (so a promoted
replica or an HA standby refuses the old token as well). A token file that cannot be
written fails before anything changes.
"""

from __future__ import annotations

import stat
from pathlib import Path

from acl.tokens import hash_token
from store.docs import ADMIN_HASH
from store.store import Store
from testkit.procs import Procs, run_mercury
from testkit.replication import wait_seq
from tests.gateway.conftest import Root
from tests.replicator.nodes import start_replica


def _rotate(root: Root, token_file: Path, *extra: str):
    return run_mercury(
        "acl", "admin-token", "rotate", "--url", root.url,
        "--admin-token-file", str(token_file), *extra,
    )  # fmt: skip


def _status(root: Root, token: str) -> int:
    return root.client(token).get("/v1/admin/producers").status_code


def test_rotation_refuses_the_old_token_everywhere(
    root: Root, tmp_path: Path, procs: Procs
) -> None:
    old = root.admin_token
    token_file = tmp_path / "admin.token"
    token_file.write_text(old + "\n")
    r = _rotate(root, token_file)
    assert r.returncode == 0, r.stderr
    new = token_file.read_text().strip()
    assert new and new != old and new not in r.stdout  # written, never printed
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert _status(root, old) == 401
    assert _status(root, new) == 200
    audit = root.client(new).get("/v1/admin/audit").json()
    assert any(a.get("action") == "rotate_admin_token" for a in audit["records"]), audit

    # The hash lives in the store's log: a restarted root and a replica hold it.
    procs.terminate(root.proc)
    root.start()
    assert _status(root, old) == 401
    assert _status(root, new) == 200
    repl_port = int(root.args[root.args.index("--repl-listen") + 1].rsplit(":", 1)[1])
    rep = start_replica(procs, tmp_path / "replica", [repl_port], repl=False, name="replica")
    root_seq = root.client(new).get("/v1/status").json()["seq"]
    wait_seq(rep.http, root_seq)
    procs.terminate(rep.proc)
    s = Store.open(str(tmp_path / "replica"), readonly=True)
    try:
        doc = s.get_doc(ADMIN_HASH)
        assert doc is not None and doc.body.decode() == hash_token(new)
    finally:
        s.close()


def test_an_unwritable_token_file_fails_before_anything_changes(root: Root, tmp_path: Path) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text(root.admin_token)
    r = _rotate(root, token_file, "--out", str(tmp_path / "missing-dir" / "admin.token"))
    assert r.returncode != 0
    assert _status(root, root.admin_token) == 200  # not rotated


def test_rotation_needs_the_admin_token(root: Root) -> None:
    _name, token = root.producer()
    r = root.client(token).post("/v1/admin/token")
    assert r.status_code == 403
    assert r.headers["content-type"].startswith("application/problem+json")
    assert root.client().post("/v1/admin/token").status_code == 401
