"""`kill -USR2` on a root under writers: the new executable takes the sockets, the old one
answers its open batch and hands the writer lock over; not one write fails or is lost,
and none is retried (real processes, real store)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx

from store.lock import holder_pid
from testkit.procs import Procs, alive
from testkit.wait import wait_until
from tests.gateway.conftest import make_root

#: Each writer stops after this many writes even if never told to (bounded load loop).
MAX_WRITES = 20_000


class Writers:
    def __init__(self, url: str, token: str, n: int) -> None:
        self.url, self.token = url, token
        self.acked: list[str] = []
        self.failed: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)
        ]

    def __enter__(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def _run(self, i: int) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=30.0) as c:
            for n in range(MAX_WRITES):
                if self.stop.is_set():
                    return
                key = f"p/w{i}-{n}"
                try:
                    r = c.put(f"/v1/kv/{key}", content=key.encode())
                    ok = r.status_code in (200, 201)
                    why = f"{key}: {r.status_code} {r.text[:80]}"
                except httpx.HTTPError as e:
                    ok, why = False, f"{key}: {e!r}"
                with self.lock:
                    (self.acked if ok else self.failed).append(key if ok else why)


def test_a_root_hands_over_under_writers_losing_and_failing_none(
    tmp_path: Path, procs: Procs
) -> None:
    root = make_root(procs, tmp_path / "root")
    _, tok = root.producer(["p/"])
    old = root.proc.pid
    new = 0
    try:
        with Writers(root.url, tok, 4) as wr:
            wait_until(lambda: len(wr.acked) >= 40, 30, "writes before the hand-over")
            os.kill(old, signal.SIGUSR2)
            assert root.proc.wait(60) == 0, procs.logs()
            new = wait_until(
                lambda: holder_pid(str(root.data_dir)) != old and holder_pid(str(root.data_dir)),
                30,
                "new lock holder",
            )
            after = len(wr.acked)
            wait_until(lambda: len(wr.acked) >= after + 40, 30, "writes after the hand-over")
        assert wr.failed == [], (len(wr.failed), wr.failed[:5], procs.logs())
        assert alive(new)
        # The old root's stop event names its successor (docs/operations.md, step 5). The
        # whole log: the successor writes to the same file, and `procs.logs()` keeps only
        # its last 4,000 characters, which the new root's batches can push the event out of.
        whole = "".join(f.read_text(errors="replace") for f in procs.log_dir.glob("*.log"))
        assert f'"handed_to":{new}' in whole, procs.logs()
        # Every acknowledged write is in the new root's store.
        admin = root.admin()
        missing = [k for k in wr.acked if admin.get(f"/v1/kv/{k}").content != k.encode()]
        assert missing == [], (len(missing), missing[:5])
    finally:
        root.close_clients()
        if new and alive(new):
            os.kill(new, signal.SIGTERM)
            wait_until(lambda: not alive(new), 30, "new root stopped")


def test_a_new_root_that_fails_leaves_the_old_one_writing(
    tmp_path: Path, procs: Procs, monkeypatch
) -> None:
    # Only a process started by a hand-over reaches this failpoint (net/handover.py).
    monkeypatch.setenv("MERCURY_FAILPOINTS", "handover-before-prepared=exit")
    root = make_root(procs, tmp_path / "root")
    _, tok = root.producer(["p/"])
    log = next((tmp_path / "logs").glob("root-*.log"))
    try:
        with Writers(root.url, tok, 2) as wr:
            wait_until(lambda: len(wr.acked) >= 20, 30, "writes before")
            os.kill(root.proc.pid, signal.SIGUSR2)
            wait_until(lambda: "handover-failed" in log.read_text(), 60, "hand-over abandoned")
            after = len(wr.acked)
            wait_until(lambda: len(wr.acked) >= after + 20, 30, "writes after")
        assert wr.failed == []
        assert root.proc.poll() is None and holder_pid(str(root.data_dir)) == root.proc.pid
        assert "exited with 3" in log.read_text()
    finally:
        root.close_clients()
