"""Migrations: planned purely, applied per step in one transaction, crash-safe, idempotent."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from core.errors import FormatError, NewerFormatError, PendingMigrationsError
from migrations.plan import Step, plan
from migrations.runner import STEPS, migrate, pending
from store.layout import K_FORMAT, U32
from store.ops import DELETE, SET, Op
from store.store import CURRENT_FORMAT, Store, read_format_version
from testkit.procs import mercury_cmd, run_mercury
from tests.conftest import assert_store_ok


def _noop(mtx: object, progress: object) -> None:
    return None


def test_plan_is_the_ordered_path_between_versions() -> None:
    steps = [Step(1, "a", "", _noop), Step(2, "b", "", _noop), Step(3, "c", "", _noop)]
    assert [s.name for s in plan(1, 4, steps)] == ["a", "b", "c"]
    assert [s.name for s in plan(2, 3, steps)] == ["b"]
    assert plan(4, 4, steps) == []
    with pytest.raises(NewerFormatError):
        plan(5, 4, steps)
    with pytest.raises(FormatError):
        plan(1, 4, [steps[0], steps[2]])


def _old_store(path: str, n: int = 25_000) -> None:
    """A format-1 store (no usage counters) with data from two owners."""
    s = Store.create(path, format_version=1, sync=False)
    for i in range(0, n, 5_000):
        s.apply([Op(SET, b"k%06d" % j, b"v" * (j % 50), "ab"[j % 2]) for j in range(i, i + 5_000)])
    s.apply([Op(DELETE, b"k000000", owner="a"), Op(SET, b"big", os.urandom(9000), "b")])
    s.close()


def test_store_with_pending_migrations_refuses_to_open(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    _old_store(d, 10)
    with pytest.raises(PendingMigrationsError, match="mercury migrate"):
        Store.open(d)
    r = run_mercury("verify", d)
    assert r.returncode == 2 and "mercury migrate" in r.stderr


def test_newer_format_refuses_to_open(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    Store.create(d, sync=False).close()
    s = Store.open(d)
    with s.env.begin(write=True) as txn:
        txn.put(K_FORMAT, U32.pack(CURRENT_FORMAT + 1), db=s.dbs.meta)
    s.close()
    with pytest.raises(NewerFormatError, match="never downgrade"):
        Store.open(d)
    r = run_mercury("migrate", d)
    assert r.returncode == 2 and "newer" in r.stderr


def test_migrate_backfills_usage_counters(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    _old_store(d)
    r = run_mercury("migrate", "--dry-run", d)
    assert r.returncode == 0 and "0002_usage_counters" in r.stdout
    assert read_format_version(d) == 1  # dry run changed nothing
    assert [s.name for s in migrate(d)] == [
        "0002_usage_counters",
        "0003_replicated_docs",
        "0004_key_checksum",
        "0005_root_state_in_log",
        "0006_chain_hash",
        "0007_expiry",
    ]
    assert pending(d) == [] and migrate(d) == []  # idempotent
    s = Store.open(d)
    try:
        u = s.usage()
        assert u["a"].keys == 12_499 and u["b"].keys == 12_501
        assert_store_ok(s)  # counters equal a recount
    finally:
        s.close()


@pytest.mark.parametrize("failpoint", ["migrate.0002.mid_scan", "migrate.0002.before_commit"])
def test_sigkill_mid_migration_then_rerun(tmp_path: Path, failpoint: str) -> None:
    d = str(tmp_path / "s")
    _old_store(d)
    env = dict(os.environ, MERCURY_FAILPOINTS=f"{failpoint}=kill")
    p = subprocess.run(mercury_cmd("migrate", d), env=env, capture_output=True, timeout=120)
    assert p.returncode == -signal.SIGKILL
    assert read_format_version(d) == 1  # nothing of the step committed
    s = Store.open(d, check_format=False)
    assert s.usage() == {}
    s.close()
    r = run_mercury("migrate", d)
    assert r.returncode == 0, r.stderr
    s = Store.open(d)
    try:
        assert_store_ok(s)
    finally:
        s.close()


def test_every_step_is_registered_once_in_order() -> None:
    assert [s.from_version for s in STEPS] == list(range(1, CURRENT_FORMAT))
