"""The store commands, run as a user runs them."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from acl.tokens import hash_token
from store.ops import SET, Op
from store.snapshot import SnapshotInfo
from store.store import Store
from testkit.procs import run_mercury


def test_init_writes_a_private_admin_token_and_logs_only_its_hash(tmp_path: Path) -> None:
    d = tmp_path / "root"
    r = run_mercury("init", str(d))
    assert r.returncode == 0, r.stderr
    db_id = r.stdout.strip()
    token_file = d / "admin.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    s = Store.open(str(d))
    try:
        assert s.db_id == db_id
        # a replicated document, through the log: every replica holds it (format 5)
        doc = s.get_doc("admin_token_hash")
        assert doc is not None and doc.body == hash_token(token).encode() and doc.seq == 1
        assert s.get_state("admin_token_hash") is None
    finally:
        s.close()
    assert token.encode() not in (d / "data.mdb").read_bytes()


def test_init_refuses_an_existing_store(tmp_path: Path) -> None:
    d = str(tmp_path / "root")
    assert run_mercury("init", d).returncode == 0
    r = run_mercury("init", d)
    assert r.returncode == 2 and "already exists" in r.stderr


def test_status_json_has_the_contract_fields(tmp_path: Path) -> None:
    d = str(tmp_path / "root")
    run_mercury("init", d)
    s = Store.open(d)
    s.apply([Op(SET, b"a", b"1", "p")])
    s.close()
    r = run_mercury("status", "--json", d)
    st = json.loads(r.stdout)
    assert set(st) == {"db_id", "format_version", "seq", "hash_head", "log_first_seq"}
    assert st["seq"] == 2 and len(st["hash_head"]) == 64  # init logged the admin hash


def test_verify_clean_store_exits_zero(tmp_path: Path) -> None:
    d = str(tmp_path / "root")
    run_mercury("init", d)
    r = run_mercury("verify", d)
    assert r.returncode == 0 and "clean" in r.stdout


def test_snapshot_command_writes_file_and_description(tmp_path: Path) -> None:
    d = str(tmp_path / "root")
    run_mercury("init", d)
    out = tmp_path / "snap.mdb"
    r = run_mercury("snapshot", d, str(out))
    assert r.returncode == 0, r.stderr
    info = SnapshotInfo.from_json(r.stdout)
    assert out.stat().st_size == info.size and info.seq == 1  # the admin hash's record


def test_missing_store_is_a_clear_error(tmp_path: Path) -> None:
    r = run_mercury("status", str(tmp_path / "nope"))
    assert r.returncode == 2 and "mercury init" in r.stderr and "Traceback" not in r.stderr


def test_every_command_has_help() -> None:
    for cmd in ("init", "status", "verify", "migrate", "snapshot", "promote"):
        r = run_mercury(cmd, "--help")
        assert r.returncode == 0 and "usage: mercury" in r.stdout
