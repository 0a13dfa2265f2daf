"""Fixtures of the HA tests: a real etcd per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.etcd import Etcd
from testkit.procs import Procs


@pytest.fixture
def etcd(procs: Procs, tmp_path: Path) -> Etcd:
    """A fresh single-member etcd (stopped by PID with the test's other processes)."""
    return Etcd(procs, tmp_path / "etcd")
