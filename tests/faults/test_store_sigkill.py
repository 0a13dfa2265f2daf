"""SIGKILL a writer process at random points, 50 times: the store always opens and verifies
clean, every batch is all-or-nothing, and every key holds exactly the value of its last
acknowledged batch or of a batch sent after it — never an older value, never one that no
writer sent."""

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
from testkit.procs import REPO
from tests.conftest import assert_store_ok
from tests.faults.store_writer import PER_BATCH, K, S, fresh_value, shared_value

KILLS = 50


def test_sigkill_writer_50_times_store_always_consistent(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    Store.create(d).close()
    rnd = random.Random(int(os.environ.get("MERCURY_SEED", "7")))
    acked = -1  # highest batch a writer reported committed
    sent = -1  # highest batch a writer began to apply
    for _round in range(KILLS):
        p = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.store_writer", d],
            stdout=subprocess.PIPE,
            cwd=REPO,
        )
        assert p.stdout is not None
        # wait for the first commit of this round, then kill at a random point after it
        out = ""
        while not out.splitlines()[-1:] or not out.splitlines()[-1].startswith("committed"):
            line = p.stdout.readline().decode()
            assert line, f"writer ended before its first commit: {out!r}"
            out += line
        time.sleep(rnd.uniform(0, 0.05))  # deliberate: the kill lands at a random point
        os.kill(p.pid, signal.SIGKILL)
        out += p.stdout.read().decode()
        p.stdout.close()
        p.wait(10)
        for row in out.splitlines():
            if row.startswith("committed "):
                acked = max(acked, int(row.split()[1]))
            elif row.startswith("sending "):
                sent = max(sent, int(row.split()[1]))
        s = Store.open(d)
        try:
            seq = s.last_seq()
            assert seq % PER_BATCH == 0, f"partial batch: last seq {seq}"
            last = seq // PER_BATCH - 1  # the last batch the store holds
            assert last >= acked, f"acknowledged batch {acked} missing (store at {last})"
            assert last <= sent, f"store holds batch {last}, but only {sent} was sent"
            latest = s.get(b"latest")
            assert latest is not None and int(latest.value) == last
            with s.reader() as r:
                for j in range(S):  # overwritten by every batch: the last one's value
                    v = r.get(b"shared-%02d" % j)
                    assert v is not None and v.value == shared_value(last, j), (j, v)
                n = 0
                for k, v in r.scan(prefix=b"b"):  # fresh keys: exactly what was sent
                    i, j = (int(x) for x in k[1:].split(b"-"))
                    assert i <= last, f"key {k!r} of batch {i} beyond the last ({last})"
                    assert v is not None and v.value == fresh_value(i, j), (k, v)
                    n += 1
                assert n == (last + 1) * K, f"{n} fresh keys for {last + 1} batches"
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
