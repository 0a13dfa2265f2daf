"""SIGKILL a writer process at random points, 50 times: the store always opens and verifies
clean, every batch is all-or-nothing and the last seq is the last committed batch."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from store.store import Store
from tests.conftest import assert_store_ok
from tests.faults.store_writer import K
from tests.support.procs import REPO

KILLS = 50


def test_sigkill_writer_50_times_store_always_consistent(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    Store.create(d).close()
    rnd = random.Random(int(os.environ.get("MERCURY_SEED", "7")))
    acked = -1
    for _round in range(KILLS):
        p = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.store_writer", d],
            stdout=subprocess.PIPE,
            cwd=REPO,
        )
        assert p.stdout is not None
        # wait for the first commit of this round, then kill at a random point after it
        line = p.stdout.readline().decode()
        assert line.startswith("committed"), line
        time.sleep(rnd.uniform(0, 0.05))
        os.kill(p.pid, signal.SIGKILL)
        out = line + p.stdout.read().decode()
        p.stdout.close()
        p.wait(10)
        for row in out.splitlines():
            if row.startswith("committed "):
                acked = max(acked, int(row.split()[1]))
        s = Store.open(d)
        try:
            seq = s.last_seq()
            assert seq % (K + 1) == 0, f"partial batch: last seq {seq}"
            batches = seq // (K + 1)
            assert batches - 1 >= acked, "an acknowledged batch is missing"
            latest = s.get(b"latest")
            assert latest is not None and int(latest.value) == batches - 1
            with s.reader() as r:
                for i in (batches - 1, batches):  # last committed: all; next: none
                    n = sum(1 for _ in r.scan(prefix=b"b%06d-" % i, keys_only=True))
                    assert n == (K if i < batches else 0), f"batch {i}: {n} of {K} keys"
            assert_store_ok(s)
        finally:
            s.close()
    assert acked > 0


@pytest.mark.parametrize("failpoint", ["store.apply.log_written", "store.apply.before_commit"])
def test_sigkill_inside_the_batch_transaction_leaves_nothing_of_it(
    tmp_path: Path, failpoint: str
) -> None:
    d = str(tmp_path / "s")
    Store.create(d).close()
    env = dict(os.environ, MERCURY_FAILPOINTS=f"{failpoint}=kill")
    p = subprocess.run(
        [sys.executable, "-m", "tests.faults.store_writer", d],
        env=env,
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )
    assert p.returncode == -signal.SIGKILL and b"committed" not in p.stdout
    s = Store.open(d)
    try:
        assert s.last_seq() == 0 and s.get(b"latest") is None
        assert_store_ok(s)
    finally:
        s.close()
