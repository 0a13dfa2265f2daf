"""Fixtures every test package shares."""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx._transports.default as httpx_transport
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


#: Files whose tests load this 2-core machine most (a foreign client suite run through a
#: shim, schemathesis, a headless browser). pytest-xdist's loadfile scheduling hands out
#: files with the most tests first, so these one-to-three-test files all ran last, at once,
#: and starved each other and every process they started. They are spread instead: the
#: two longest start the run, the other two end it (the Makefile turns xdist's own
#: reordering off so this order is the one the workers take).
HEAVY_FIRST = ("tests/conformance/test_client_suites.py", "tests/gateway/test_schemathesis.py")
HEAVY_LAST = ("tests/reads/test_read_schemathesis.py", "tests/browser/test_usage_page.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return 0 if path in HEAVY_FIRST else 2 if path in HEAVY_LAST else 1

    items.sort(key=rank)  # stable: each file's tests keep their order


def _share_the_default_trust_store() -> None:
    """Load httpx's default CA bundle once per test process, not once per client.

    httpx builds a new SSLContext for every Client and every `httpx.get`, loading its whole
    CA bundle each time (about 27 ms of CPU), and the tests make thousands: every poll of
    `wait_http` while a process starts, every `root.admin()`. A profile of
    tests/gateway/test_acl_doc.py found 296 of them, 8 of the test process's 11 CPU
    seconds, taken from the processes under test on a CPU-bound run. The default context
    (verify=True, no client certificate, the same SSL_CERT_FILE/SSL_CERT_DIR) is the same
    every time, so it is built once and shared: a client verifies exactly as before, and
    httpcore only sets the same ALPN list ("http/1.1") on it per connection. Any other
    `verify` or `cert` is built as before."""
    build = httpx_transport.create_ssl_context  # type: ignore[attr-defined]

    @functools.cache
    def default(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
        return build()

    def create_ssl_context(
        verify: ssl.SSLContext | str | bool = True, cert: object = None, trust_env: bool = True
    ) -> ssl.SSLContext:
        if verify is True and cert is None and trust_env:
            return default(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
        return build(verify=verify, cert=cert, trust_env=trust_env)  # type: ignore[arg-type]

    httpx_transport.create_ssl_context = create_ssl_context  # type: ignore[attr-defined]


_share_the_default_trust_store()
