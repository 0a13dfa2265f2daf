"""`mercury acl apply` and `mercury usage` against a real root."""

from __future__ import annotations

import json
from pathlib import Path

from testkit.procs import run_mercury
from tests.gateway.conftest import Root

DOC = """
producers:
  team-a:
    keyspaces: ["cli-a/"]
    quota: {ops_per_s: 100, burst: 200, max_delay_ms: 500}
    guards: {"cli-a/": {refuse_empty: true}}
  team-b:
    keyspaces: ["cli-b/"]
"""


def _apply(root: Root, tmp_path: Path, text: str, *extra: str):
    f = tmp_path / "acl.yaml"
    f.write_text(text)
    tok = tmp_path / "admin.token"
    tok.write_text(root.admin_token)
    return run_mercury(
        "acl",
        "apply",
        str(f),
        "--url",
        root.url,
        "--admin-token-file",
        str(tok),
        "--keep-unlisted",
        *extra,
    )


def test_acl_apply_prints_diff_and_is_idempotent(shared_root: Root, tmp_path: Path) -> None:
    r = _apply(shared_root, tmp_path, DOC)
    assert r.returncode == 0, r.stderr
    assert "+ producer team-a" in r.stdout and "+ producer team-b" in r.stdout
    again = _apply(shared_root, tmp_path, DOC)
    assert again.returncode == 0 and again.stdout.strip() == "no changes"
    changed = _apply(shared_root, tmp_path, DOC.replace("ops_per_s: 100", "ops_per_s: 50"))
    assert "~ producer team-a" in changed.stdout and "quota.ops_per_s: 100 -> 50" in changed.stdout
    cfg = {p["name"]: p for p in shared_root.admin().get("/v1/admin/producers").json()["producers"]}
    assert cfg["team-a"]["quota"]["ops_per_s"] == 50
    assert cfg["team-a"]["guards"]["cli-a/"]["refuse_empty"] is True


def test_acl_apply_refuses_overlap_and_bad_documents(shared_root: Root, tmp_path: Path) -> None:
    bad = _apply(shared_root, tmp_path, "producers:\n  x: {keyspaces: [1]}\n")
    assert bad.returncode != 0 and "keyspaces" in bad.stderr
    overlap = _apply(
        shared_root,
        tmp_path,
        'producers:\n  ov-a: {keyspaces: ["o/"]}\n  ov-b: {keyspaces: ["o/p/"]}\n',
    )
    # one all-or-nothing PUT of the document: 422 naming the overlap
    assert overlap.returncode != 0 and "422" in overlap.stderr and "overlaps" in overlap.stderr


def test_usage_table_and_json(shared_root: Root, tmp_path: Path) -> None:
    name, tok = shared_root.producer()
    shared_root.client(tok).put(f"/v1/kv/{name}/k", content=b"v")
    f = tmp_path / "admin.token"
    f.write_text(shared_root.admin_token)
    table = run_mercury("usage", "--url", shared_root.url, "--admin-token-file", str(f))
    assert table.returncode == 0, table.stderr
    assert "producer" in table.stdout.splitlines()[0] and name in table.stdout
    js = run_mercury("usage", "--url", shared_root.url, "--admin-token-file", str(f), "--json")
    rows = {r["producer"]: r for r in json.loads(js.stdout)["producers"]}
    assert rows[name]["keys"] == 1 and rows[name]["writes"] == 1


def test_acl_apply_moves_keyspaces_between_producers(shared_root: Root, tmp_path: Path) -> None:
    """Two producers swap keyspaces in one apply: no step is refused as an overlap."""
    before = 'producers:\n  mv-a: {keyspaces: ["mv1/"]}\n  mv-b: {keyspaces: ["mv2/"]}\n'
    after = 'producers:\n  mv-a: {keyspaces: ["mv2/"]}\n  mv-b: {keyspaces: ["mv1/x/"]}\n'
    assert _apply(shared_root, tmp_path, before).returncode == 0
    r = _apply(shared_root, tmp_path, after)
    assert r.returncode == 0, r.stderr
    cfg = {p["name"]: p for p in shared_root.admin().get("/v1/admin/producers").json()["producers"]}
    assert cfg["mv-a"]["keyspaces"] == ["mv2/"] and cfg["mv-b"]["keyspaces"] == ["mv1/x/"]
