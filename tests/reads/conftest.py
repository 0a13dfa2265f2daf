"""Read-side fixtures: a real `python -m mercury.readserve` process over the test's store."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from store.ops import SET, Op
from store.store import Store
from testkit.procs import Procs, free_port, wait_http, wait_port


@dataclass
class ReadServer:
    """Ports of a running read server."""

    http: int
    kt: int | None
    memcached: int | None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http}"


StartReads = Callable[..., ReadServer]


@pytest.fixture
def start_reads(store: Store, procs: Procs) -> StartReads:
    """Start a read server over `store` (in another process, as on a replica)."""

    def start(*, role: str = "replica", kt: bool = False, memcached: bool = False) -> ReadServer:
        srv = ReadServer(
            free_port(), free_port() if kt else None, free_port() if memcached else None
        )
        argv = [sys.executable, "-m", "mercury.readserve", store.path, "--role", role]
        argv += ["--listen", f"127.0.0.1:{srv.http}"]
        if srv.kt:
            argv += ["--kt-listen", f"127.0.0.1:{srv.kt}"]
        if srv.memcached:
            argv += ["--memcached-listen", f"127.0.0.1:{srv.memcached}"]
        p = procs.start(argv, name="reads")
        wait_http(srv.url + "/healthz", proc=p)
        for port in (srv.kt, srv.memcached):
            if port:
                wait_port(port, proc=p)
        return srv

    return start


def put(store: Store, pairs: dict[bytes, bytes]) -> int:
    """Apply `pairs` in one batch; return the last seq."""
    res = store.apply([Op(SET, k, v, "test") for k, v in pairs.items()])
    return res.last_seq
