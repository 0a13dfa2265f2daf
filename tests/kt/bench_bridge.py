"""Measure kt-bridge throughput: `python -m tests.kt.bench_bridge [N]`.

A fake master (tests/kt/recorder.py) serves N synthetic 100-byte sets; the time is from
starting `mercury kt-bridge` (defaults: 200 ms window, 1,000 ops a batch) until its cursor
reaches the last entry, against a real root (20 ms window, fsync on). Figures in
docs/kt-compat.md.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from kt import ulog as kt_ulog
from testkit.procs import Procs
from tests.gateway.conftest import make_root
from tests.kt.recorder import ReplayMaster


def main(n: int) -> None:
    tmp = Path(tempfile.mkdtemp())
    (tmp / "logs").mkdir()
    procs = Procs(tmp / "logs")
    try:
        root = make_root(procs, tmp / "root")
        _, token = root.producer(["b/"])
        (tmp / "tok").write_text(token)
        base = 1_795_000_000_000_000_000
        entries = [
            kt_ulog.Entry(base + i, kt_ulog.encode_set(1, 0, b"k%06d" % i, b"v" * 100))
            for i in range(n)
        ]
        master = ReplayMaster(entries)
        state = tmp / "state"
        t0 = time.monotonic()
        p = procs.start_mercury(
            "kt-bridge",
            "--kt",
            f"127.0.0.1:{master.port}",
            "--url",
            root.url,
            "--token-file",
            str(tmp / "tok"),
            "--state",
            str(state),
            "--prefix",
            "b/",
            name="bridge",
        )
        deadline = t0 + 600
        while time.monotonic() < deadline:
            if state.exists():
                d = json.loads(state.read_text())
                if d["ts"] >= entries[-1].ts and d["pending"] is None:
                    break
            if p.poll() is not None:
                raise SystemExit(procs.logs())
            time.sleep(0.01)
        dt = time.monotonic() - t0
        print(f"{n} KT sets bridged in {dt:.2f} s ({n / dt:.0f}/s, bridge start included)")
        master.close()
    finally:
        procs.stop_all()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
