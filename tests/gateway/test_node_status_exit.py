"""What an operator reads and does on running nodes: `/v1/status` says how much log a node
retains and which store copies it has set aside, `mercury prune-aside` removes them, and
every node kind exits 0 after a clean SIGTERM (a supervisor counts anything else as a
crash)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from testkit import metrics
from testkit.procs import Procs, run_mercury
from testkit.wait import wait_until
from tests.gateway.conftest import Root
from tests.replicator.nodes import start_replica


def _status(url: str) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(url + "/v1/status", timeout=5).json()
    return doc


def test_status_shows_retention_and_set_aside_copies(root: Root, procs: Procs) -> None:
    m = metrics.unlabelled(httpx.get(root.url + "/metrics", timeout=5).text)
    # The room the store-full alerts watch, read from this store and its filesystem.
    assert 0 < m["mercury_store_map_used_bytes"] < m["mercury_store_map_size_bytes"]
    assert 0 < m["mercury_store_disk_free_bytes"] <= m["mercury_store_disk_size_bytes"]
    st = _status(root.url)
    # `mercury init` logged the admin token's hash: one retained record, seconds old.
    assert st["log_first_seq"] == 1
    age = st["log_retained_seconds"]
    assert isinstance(age, float) and age >= 0
    assert st["set_aside"] == []

    # Copies as an HA standby (.diverged-) and `mercury restore` (.replaced-) leave them;
    # other dot directories are not theirs to list or remove.
    old = root.data_dir / ".diverged-1000"
    old.mkdir()
    (old / "data.mdb").write_bytes(b"x" * 4096)
    (root.data_dir / ".replaced-99999999999999").mkdir()
    (root.data_dir / ".diverged-notastamp").mkdir()
    names = [s["name"] for s in _status(root.url)["set_aside"]]
    assert names == [".diverged-1000", ".replaced-99999999999999"]
    listed = _status(root.url)["set_aside"][0]
    assert listed["bytes"] == 4096 and listed["age_seconds"] > 0

    # --older-than keeps the recent copy (stamped far in the future here).
    out = run_mercury("prune-aside", str(root.data_dir), "--older-than", "3600")
    assert out.returncode == 0, out.stderr
    assert ".diverged-1000" in out.stdout
    assert [s["name"] for s in _status(root.url)["set_aside"]] == [".replaced-99999999999999"]
    assert (root.data_dir / ".diverged-notastamp").is_dir()


def test_root_and_replica_exit_0_after_sigterm(root: Root, procs: Procs, tmp_path: Path) -> None:
    repl_port = int(root.args[root.args.index("--repl-listen") + 1].rsplit(":", 1)[1])
    r = start_replica(procs, tmp_path / "replica", [repl_port], repl=False)
    seq = _status(root.url)["seq"]
    wait_until(lambda: _status(f"http://127.0.0.1:{r.http}")["seq"] == seq, 30, "replica caught up")
    st = _status(f"http://127.0.0.1:{r.http}")
    assert st["log_first_seq"] == 1 and st["set_aside"] == []
    m = metrics.unlabelled(httpx.get(f"http://127.0.0.1:{r.http}/metrics", timeout=5).text)
    assert m["mercury_replication_streaming"] == 1.0
    assert m["mercury_store_map_used_bytes"] > 0
    assert procs.terminate(r.proc) == 0, procs.logs()
    assert procs.terminate(root.proc) == 0, procs.logs()
