"""A real root and a replica following it, shared by the SDK tests of a module."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from testkit.procs import Procs
from testkit.wait import wait_until
from tests.gateway.conftest import Root, make_root
from tests.replicator.nodes import Replica, start_replica


@dataclass
class Cluster:
    """A root (writes) and one replica (reads) on 127.0.0.1."""

    root: Root
    replica: Replica

    @property
    def read_url(self) -> str:
        return f"http://127.0.0.1:{self.replica.http}"

    def caught_up(self, timeout: float = 30.0) -> None:
        """Wait until the replica applied everything the root committed."""
        want = httpx.get(self.root.url + "/v1/status", timeout=5).json()["seq"]
        wait_until(
            lambda: httpx.get(self.read_url + "/v1/status", timeout=5).json()["seq"] >= want,
            timeout,
            f"replica at seq {want}",
        )


def make_cluster(procs: Procs, base: Path) -> Cluster:
    """A root in `base`/root and a replica following it in `base`/replica."""
    root = make_root(procs, base / "root")
    repl = root.args[root.args.index("--repl-listen") + 1]
    replica = start_replica(procs, base / "replica", [int(repl.rsplit(":", 1)[1])], repl=False)
    return Cluster(root, replica)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One root + one replica per test module; every process stopped by PID at teardown."""
    tmp = tmp_path_factory.mktemp("cluster")
    logs = tmp / "logs"
    logs.mkdir()
    procs = Procs(logs)
    try:
        c = make_cluster(procs, tmp)
        yield c
        c.root.close_clients()
    finally:
        procs.stop_all()
