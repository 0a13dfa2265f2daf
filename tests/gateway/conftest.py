"""A real `mercury root` process over HTTP, shared by the tests of a module."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.logged import entries_since
from testkit.procs import Procs, free_port, run_mercury, wait_http

_names = itertools.count()


@dataclass
class Root:
    """A running root: its URL, data dir, admin token and process."""

    procs: Procs
    data_dir: Path
    url: str
    admin_token: str
    args: tuple[str, ...]
    proc: Any = None
    clients: list[httpx.Client] = field(default_factory=list)

    def start(self) -> None:
        """(Re)start the root process on the same port and data dir."""
        self.proc = self.procs.start_mercury("root", str(self.data_dir), *self.args, name="root")
        wait_http(self.url + "/healthz", proc=self.proc)

    def admin(self) -> httpx.Client:
        """An HTTP client carrying the admin token."""
        return self.client(self.admin_token)

    def client(self, token: str | None = None) -> httpx.Client:
        """An HTTP client (closed at teardown), with `token` as bearer when given."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        c = httpx.Client(base_url=self.url, headers=headers, timeout=30.0)
        self.clients.append(c)
        return c

    def producer(self, keyspaces: list[str] | None = None, **config: Any) -> tuple[str, str]:
        """Create a producer with a fresh name (keyspace ``<name>/`` by default) and
        return (name, token)."""
        name = f"p{next(_names)}"
        body = {"keyspaces": keyspaces if keyspaces is not None else [f"{name}/"], **config}
        r = self.admin().put(f"/v1/admin/producers/{name}", json=body)
        assert r.status_code in (200, 201), r.text
        r = self.admin().post(f"/v1/admin/producers/{name}/tokens")
        assert r.status_code == 201, r.text
        return name, r.json()["token"]

    def close_clients(self) -> None:
        for c in self.clients:
            c.close()
        self.clients.clear()


def init_store(data_dir: Path) -> str:
    """`mercury init` a store; return its admin token."""
    r = run_mercury("init", str(data_dir))
    assert r.returncode == 0, r.stderr
    return (data_dir / "admin.token").read_text().strip()


def make_root(procs: Procs, data_dir: Path, *extra: str, window_ms: int = 20) -> Root:
    """Init a store in `data_dir` and start a root on free ports."""
    token = init_store(data_dir)
    port = free_port()
    args = (
        "--listen",
        f"127.0.0.1:{port}",
        "--repl-listen",
        f"127.0.0.1:{free_port()}",
        "--batch-window-ms",
        str(window_ms),
        *extra,
    )
    root = Root(procs, data_dir, f"http://127.0.0.1:{port}", token, args)
    root.start()
    return root


@pytest.fixture(scope="module")
def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Root]:
    """One root per test module (20 ms window, fsync on); stopped by PID at teardown."""
    tmp = tmp_path_factory.mktemp("root")
    logs = tmp / "logs"
    logs.mkdir()
    procs = Procs(logs)
    try:
        root = make_root(procs, tmp / "data")
        yield root
        root.close_clients()
    finally:
        procs.stop_all()


@pytest.fixture
def root(tmp_path: Path, procs: Procs) -> Iterator[Root]:
    """A root of its own for one test (20 ms window)."""
    r = make_root(procs, tmp_path / "data")
    yield r
    r.close_clients()


@pytest.fixture
def root_factory(tmp_path: Path, procs: Procs) -> Iterator[Any]:
    """`root_factory(window_ms=..., *extra_args)`: roots of this test, clients closed and
    processes stopped at teardown."""
    made: list[Root] = []

    def make(*extra: str, window_ms: int = 20) -> Root:
        r = make_root(procs, tmp_path / f"data{len(made)}", *extra, window_ms=window_ms)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close_clients()


def logged_since(root: Root, seq: int) -> list[tuple[int, bytes]]:
    """(op, key) of every log entry the root committed after `seq` (`entries_since`)."""
    return entries_since(root.data_dir, seq)
