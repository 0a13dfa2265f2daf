"""How soon a replica ahead of a root restored with `mercury restore` stops as diverged (JSON).

A root at seq 50 is snapshotted, takes 50 more writes that a real `mercury replica` applies,
is stopped and restored from the snapshot with `mercury restore`, and comes back on the same
port (the in-process `testkit.replication.RootNode`, a real source over TCP). Measured:
seconds from the restored root's source listening to the replica's `/v1/status` saying
`diverged`, with the root taking no write and taking `--rate` writes a second (batches of
10). The replica's reconnect backoff at that moment (up to 5 s, `replicator/selection.py`)
is part of the figure: it depends on how long the root was down.

Usage: .venv/bin/python bench/restored_root.py [--rate N]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from testkit.procs import Procs, free_port, run_mercury, wait_http  # noqa: E402
from testkit.replication import root_node, status, wait_seq  # noqa: E402

#: Give up on one run after this long (the unrestored worst case is a minute).
LIMIT_S = 90.0


def one_run(tmp: Path, rate: float) -> float:
    """Seconds until the replica reports diverged, for a restored root writing `rate`/s."""
    (tmp / "logs").mkdir()
    procs = Procs(tmp / "logs")
    try:
        live, snap = tmp / "root", tmp / "backup.mdb"
        with root_node(str(live)) as root:
            root.write(50, batch=10)
            port = root.port
        assert run_mercury("snapshot", str(live), str(snap)).returncode == 0
        with root_node(str(live), port=port, reopen=True) as root:
            root.write(50, start=50, batch=10)
            http = free_port()
            p = procs.start_mercury(
                "replica", str(tmp / "r"), "--listen", f"127.0.0.1:{http}",
                "--source", f"127.0.0.1:{port}",
            )  # fmt: skip
            wait_http(f"http://127.0.0.1:{http}/healthz", proc=p)
            wait_seq(http, 100)
        assert run_mercury("restore", str(snap), str(live)).returncode == 0
        with root_node(str(live), port=port, reopen=True) as root:
            t0 = time.monotonic()
            i = 0
            while status(http)["replication_state"] != "diverged":
                if time.monotonic() - t0 > LIMIT_S:
                    return float("inf")
                if rate:
                    root.write(10, start=1000 + i, batch=10, prefix="other")
                    i += 10
                    time.sleep(10 / rate)
                else:
                    time.sleep(0.02)
            return time.monotonic() - t0
    finally:
        procs.stop_all()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=200.0, help="writes/s in the second run")
    args = ap.parse_args()
    out = []
    for rate in (0.0, args.rate):
        with tempfile.TemporaryDirectory() as t:
            out.append(
                {"root_writes_per_s": rate, "seconds_to_diverged": round(one_run(Path(t), rate), 2)}
            )
    print(json.dumps({"bench": "restored_root", "runs": out}))


if __name__ == "__main__":
    main()
