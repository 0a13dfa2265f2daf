"""The root collects its own log by the retention flags, keeping the floor and the chain."""

from __future__ import annotations

import json
from typing import Any

from testkit.procs import run_mercury
from testkit.wait import wait_until


def test_root_collects_old_log_records_by_its_retention_flags(root_factory: Any) -> None:
    root = root_factory(
        "--log-keep-entries",
        "10",
        "--log-min-entries",
        "20",
        "--log-keep-seconds",
        "0",
        "--log-gc-interval-s",
        "0.2",
    )
    _name, token = root.producer(["r/"])
    c = root.client(token)
    for i in range(60):
        assert c.put(f"/v1/kv/r/{i}", content=b"v%d" % i).status_code == 200

    def collected() -> dict[str, Any] | None:
        st: dict[str, Any] = json.loads(run_mercury("status", "--json", str(root.data_dir)).stdout)
        return st if st["log_first_seq"] > 1 else None

    st = wait_until(collected, 20, "the root's log collected", interval=0.3)
    # the 60 writes, and the usage series' documents when a minute closed meanwhile
    assert st["seq"] >= 60 and c.get(f"/v1/usage/{_name}").json()["writes"] == 60
    # collected, but never below the floor
    assert 1 < st["log_first_seq"] <= st["seq"] - 20 + 1
    r = run_mercury("verify", str(root.data_dir))  # the retained chain still verifies
    assert r.returncode == 0, r.stdout + r.stderr
