"""Fixtures every test package shares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store.check import check
from store.store import Store
from testkit.procs import Procs


def assert_store_ok(store: Store) -> None:
    """Fail the test when any store invariant is broken (see `store/check.py`)."""
    report = check(store)
    assert report.ok, "store invariants broken:\n" + "\n".join(report.problems)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A fresh store in a temp dir (no fsync: tests do not test the disk); its invariants
    are checked at teardown."""
    s = Store.create(str(tmp_path / "store"), sync=False, map_size=1 << 30)
    try:
        yield s
        assert_store_ok(s)
    finally:
        s.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """Start real processes; every one still running is stopped by PID at teardown."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    p = Procs(log_dir)
    try:
        yield p
    finally:
        p.stop_all()
