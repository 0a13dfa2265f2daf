"""Fixtures of the KT tests: a real root + replica per module, a producer and its token
file, and `mercury kt-bridge` processes stopped by PID."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.procs import Procs
from tests.client.conftest import Cluster, make_cluster


@pytest.fixture(scope="module")
def kt_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Procs]]:
    """One root (20 ms window) + one replica per test module, every process stopped by
    PID at teardown."""
    tmp = tmp_path_factory.mktemp("ktcluster")
    logs = tmp / "logs"
    logs.mkdir()
    procs = Procs(logs)
    try:
        c = make_cluster(procs, tmp)
        yield c, procs
        c.root.close_clients()
    finally:
        procs.stop_all()


def producer_token_file(c: Cluster, tmp: Path, keyspace: str) -> tuple[str, Path]:
    """A producer owning `keyspace`; (name, path of a file holding its token)."""
    name, token = c.root.producer([keyspace])
    path = tmp / f"{name}.token"
    path.write_text(token + "\n")
    return name, path
