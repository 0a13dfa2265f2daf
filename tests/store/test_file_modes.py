"""A node's data directory is 0700 and its files 0600, however the directory came to be:
`Store.create` (and so `mercury init`), a snapshot installed on a replica, a bootstrap."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from store import layout
from store.ops import SET, Op
from store.snapshot import install_snapshot, make_snapshot
from store.store import Store
from testkit.procs import run_mercury


@pytest.fixture(autouse=True)
def permissive_umask() -> Iterator[None]:
    """The usual 022 umask, under which LMDB's default mode gives world-readable files."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(p: str | Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def _assert_private(d: str | Path) -> None:
    assert _mode(d) == 0o700, oct(_mode(d))
    for name in ("data.mdb", "lock.mdb"):
        assert _mode(os.path.join(d, name)) == 0o600, (name, oct(_mode(os.path.join(d, name))))


def test_store_create_makes_a_private_directory(tmp_path: Path) -> None:
    d = tmp_path / "new" / "s"
    Store.create(str(d), sync=False).close()
    _assert_private(d)
    empty = tmp_path / "made-by-operator"
    empty.mkdir(mode=0o755)
    Store.create(str(empty), sync=False).close()
    _assert_private(empty)


def test_mercury_init_makes_a_private_directory(tmp_path: Path) -> None:
    d = tmp_path / "s"
    r = run_mercury("init", str(d))
    assert r.returncode == 0, r.stderr
    _assert_private(d)


def test_installed_snapshot_is_private(tmp_path: Path) -> None:
    src = Store.create(str(tmp_path / "src"), sync=False)
    try:
        src.apply([Op(SET, b"k", b"v", "p")])
        replica_dir = tmp_path / "replica"
        layout.make_data_dir(str(replica_dir))  # as bootstrap does before fetching
        assert _mode(replica_dir) == 0o700
        snap = str(replica_dir / "snapshot.mdb")  # same filesystem as the target
        info = make_snapshot(src, snap)
        assert _mode(snap) == 0o600
    finally:
        src.close()
    os.chmod(snap, 0o644)  # however the file arrived, it is made private on install
    installed = install_snapshot(snap, str(replica_dir), info)
    try:
        assert installed.get(b"k") is not None
    finally:
        installed.close()
    _assert_private(replica_dir)
