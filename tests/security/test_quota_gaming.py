"""A storage quota (``max_bytes_stored``) cannot be gamed: not by one batch that sets a
key many times, nor by overwriting another producer's value in a shared keyspace.

Real root process over HTTP; the usage counters (``/v1/usage/NAME``) are the truth the
quota must hold against after every accepted write.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.procs import Procs
from tests.gateway.conftest import Root, make_root


@pytest.fixture
def root(tmp_path: Path, procs: Procs) -> Iterator[Root]:
    r = make_root(procs, tmp_path / "data")
    yield r
    r.close_clients()


def _usage(root: Root, name: str) -> dict[str, Any]:
    r = root.admin().get(f"/v1/usage/{name}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _set(key: str, value: str) -> dict[str, str]:
    return {"op": "set", "key": key, "value": value}


def test_one_batch_setting_a_key_many_times_is_not_negative_growth(root: Root) -> None:
    limit = 20_000
    name, tok = root.producer(quota={"max_bytes_stored": limit})
    c = root.client(tok)
    big = "x" * 10_000
    assert c.put(f"/v1/kv/{name}/a", content=big.encode()).status_code == 200
    # `a` shrunk to "" a thousand times used to count as -10 MB of growth, which paid for
    # a 100 KB value beside it in the same batch.
    ops = [_set(f"{name}/a", "") for _ in range(1000)] + [_set(f"{name}/b", "y" * 100_000)]
    r = c.post("/v1/batch", json={"ops": ops})
    assert r.status_code == 507, r.text
    assert _usage(root, name)["bytes"] <= limit
    # The reverse order (the big set first, the shrinks after) is refused alike.
    ops = [_set(f"{name}/b", "y" * 100_000)] + [_set(f"{name}/a", "") for _ in range(1000)]
    assert c.post("/v1/batch", json={"ops": ops}).status_code == 507
    assert _usage(root, name)["bytes"] <= limit
    # An honest batch that fits still passes.
    ops = [_set(f"{name}/a", "z" * 5_000), _set(f"{name}/c", "w" * 5_000)]
    assert c.post("/v1/batch", json={"ops": ops}).status_code == 200
    assert _usage(root, name)["bytes"] <= limit


def test_writes_admitted_but_not_committed_count(root: Root) -> None:
    """Async writes return before their commit; their growth still counts."""
    limit = 50_000
    name, tok = root.producer(quota={"max_bytes_stored": limit})
    c = root.client(tok)
    statuses = [
        c.put(f"/v1/kv/{name}/k{i}?async=true", content=b"v" * 10_000).status_code
        for i in range(20)
    ]
    assert set(statuses) <= {202, 507} and 507 in statuses
    c.post("/v1/batch", json={"ops": [_set(f"{name}/sync", "")]})  # after the async ones
    assert _usage(root, name)["bytes"] <= limit


def test_overwriting_another_producers_value_is_charged_in_full(root: Root) -> None:
    a = root.admin()
    for who in ("alice", "mallory"):
        body = {"keyspaces": ["common/"], "shared": ["common/"]}
        if who == "mallory":
            body["quota"] = {"max_bytes_stored": 100_000}  # type: ignore[assignment]
        assert a.put(f"/v1/admin/producers/{who}", json=body).status_code in (200, 201)
    tokens = {
        who: a.post(f"/v1/admin/producers/{who}/tokens").json()["token"]
        for who in ("alice", "mallory")
    }
    alice = root.client(tokens["alice"])
    mallory = root.client(tokens["mallory"])
    mib = b"m" * (1 << 20)
    assert alice.put("/v1/kv/common/big", content=mib).status_code == 200
    # Mallory replaces alice's 1 MiB with her own 1 MiB: she stores 1 MiB, ten times her
    # quota; "growth 0 against the stored value" let that through.
    r = mallory.put("/v1/kv/common/big", content=mib)
    assert r.status_code == 507, r.text
    assert _usage(root, "mallory")["bytes"] <= 100_000
    assert alice.get("/v1/kv/common/big").content == mib
    # Within her quota she may overwrite it; the key's bytes move to her.
    assert mallory.put("/v1/kv/common/big", content=b"s" * 50_000).status_code == 200
    assert 50_000 < _usage(root, "mallory")["bytes"] <= 100_000
    assert _usage(root, "alice")["keys"] == 0


def test_quota_answers_are_never_retryable(root: Root) -> None:
    """A refusal that can never succeed is a 507, not a 429 with Retry-After."""
    name, tok = root.producer(quota={"max_bytes_stored": 1000})
    r = root.client(tok).put(f"/v1/kv/{name}/x", content=b"x" * 5000)
    assert r.status_code == 507
    assert "retry-after" not in {k.lower() for k in r.headers}
    assert isinstance(r, httpx.Response)
