"""Filtered replica against a full replica, one run (prints JSON). Run by `make bench`.

A root (`testkit.replication.RootNode`: the store and its replication source) takes N keys
of 1 KiB of random bytes (snappy gains nothing on them) spread over ten prefixes
``p0/`` .. ``p9/``, interleaved in every batch of 1,000 (the worst case for a filter: no
run of skipped entries longer than a few), then deletes every 20th key. Two `mercury
replica` processes follow it from an empty store of its database (they stream from seq 1,
no snapshot): a full one, and a filtered one with ``--keyspace p0/`` (10 % of the keys).
Once both hold the root's last seq:

- bytes received: the log records each applied, as they came (their replication status
  document's ``applied_bytes``: header + compressed payload of every RECORD frame; the
  frames' own 10-byte headers and the heartbeats are left out, the same for both);
- disk: the size of each store's ``data.mdb`` and the pages LMDB uses in it;
- the time each took from the first write to holding the last seq;
- then the bootstrap: a full and a filtered replica started on an empty DATA_DIR, one after
  the other, each fetch a snapshot from the root (the filtered one a snapshot derived for
  its prefix): the bytes the root's source sent each, and their disk once streaming.

Ratios are filtered ÷ full. Goal (issue 35): both near the share of keys held (0.1).

Usage: .venv/bin/python bench/filtered_replica.py [--keys N] [--prefixes K]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lmdb

from replicator.status import read_status
from store.ops import DELETE, SET, Op
from store.store import Store
from testkit.procs import Procs, free_port, wait_http
from testkit.replication import RootNode, status, wait_for

BATCH = 1000
VALUE = 1024


def _at(port: int, seq: int) -> bool:
    return bool(status(port)["seq"] >= seq)


def _disk(data_dir: Path) -> dict[str, int]:
    """The store file's size and the bytes of the pages LMDB uses in it."""
    path = data_dir / "data.mdb"
    env = lmdb.open(str(data_dir), readonly=True, lock=False, max_dbs=32)
    try:
        info, st = env.info(), env.stat()
        used = (info["last_pgno"] + 1) * st["psize"]
    finally:
        env.close()
    return {"file_bytes": path.stat().st_size, "used_bytes": used}


def run(keys: int, prefixes: int) -> dict[str, Any]:
    rng = random.Random(35)
    with tempfile.TemporaryDirectory(prefix="mercury-filtered-") as tmp:
        base = Path(tmp)
        (base / "logs").mkdir()
        procs = Procs(base / "logs")
        root = RootNode(str(base / "root"), sync=False)
        try:
            nodes: dict[str, dict[str, Any]] = {}
            for name, extra in (("full", []), ("filtered", ["--keyspace", "p0/"])):
                d = base / name
                Store.create(str(d), db_id=root.store.db_id).close()
                http = free_port()
                argv = ["replica", str(d), "--listen", f"127.0.0.1:{http}"]
                argv += ["--source", f"127.0.0.1:{root.port}", *extra]
                proc = procs.start_mercury(*argv, name=name)
                wait_http(f"http://127.0.0.1:{http}/healthz", timeout=60, proc=proc)
                nodes[name] = {"dir": d, "http": http, "proc": proc}
            names = [f"p{i % prefixes}/{i:09d}".encode() for i in range(keys)]
            rng.shuffle(names)  # every batch holds keys of every prefix, interleaved
            t0 = time.monotonic()
            for b in range(0, keys, BATCH):
                root.store.apply(
                    [Op(SET, k, rng.randbytes(VALUE), owner="bench") for k in names[b : b + BATCH]]
                )
            gone = names[::20]
            for b in range(0, len(gone), BATCH):
                root.store.apply([Op(DELETE, k, owner="bench") for k in gone[b : b + BATCH]])
            last = root.store.last_seq()
            wrote_s = time.monotonic() - t0
            out: dict[str, Any] = {}
            for name, n in nodes.items():
                wait_for(functools.partial(_at, n["http"], last), 600, f"{name} at {last}")
                st = status(n["http"])
                assert st["hash_head"] == root.store.head()[1].hex(), name
                doc = read_status(str(n["dir"]))
                assert doc is not None
                out[name] = {
                    "caught_up_s": round(time.monotonic() - t0, 2),
                    "received_bytes": doc.applied_bytes,
                    "records": doc.applied_records,
                }
            for kind, extra in (("full", []), ("filtered", ["--keyspace", "p0/"])):
                d = base / f"boot-{kind}"
                http = free_port()
                before = root.source.stats.bytes_sent
                t1 = time.monotonic()
                argv = ["replica", str(d), "--listen", f"127.0.0.1:{http}"]
                proc = procs.start_mercury(
                    *argv, "--source", f"127.0.0.1:{root.port}", *extra, name=f"boot-{kind}"
                )
                wait_http(f"http://127.0.0.1:{http}/healthz", timeout=600, proc=proc)
                wait_for(functools.partial(_at, http, last), 600, f"boot-{kind} at {last}")
                out[kind]["bootstrap_sent_bytes"] = root.source.stats.bytes_sent - before
                out[kind]["bootstrap_s"] = round(time.monotonic() - t1, 2)
                procs.terminate(proc)
                out[kind]["bootstrap_disk"] = _disk(d)
            for name, n in nodes.items():
                procs.terminate(n["proc"])
                out[name].update(_disk(n["dir"]))
                with Store.open(str(n["dir"]), readonly=True) as s, s.reader() as r:
                    out[name]["keys"] = sum(1 for _ in r.scan())
        finally:
            procs.stop_all()
            root.close()
    full, flt = out["full"], out["filtered"]
    return {
        "bench": "filtered_replica",
        "keys_written": keys,
        "value_bytes": VALUE,
        "prefixes": prefixes,
        "held_share": round(flt["keys"] / max(1, full["keys"]), 4),
        "root_write_s": round(wrote_s, 2),
        "full": full,
        "filtered": flt,
        "received_ratio": round(flt["received_bytes"] / full["received_bytes"], 4),
        "disk_file_ratio": round(flt["file_bytes"] / full["file_bytes"], 4),
        "disk_used_ratio": round(flt["used_bytes"] / full["used_bytes"], 4),
        "bootstrap_sent_ratio": round(
            flt["bootstrap_sent_bytes"] / full["bootstrap_sent_bytes"], 4
        ),
        "bootstrap_disk_ratio": round(
            flt["bootstrap_disk"]["used_bytes"] / full["bootstrap_disk"]["used_bytes"], 4
        ),
        "load_average": os.getloadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--prefixes", type=int, default=10)
    a = ap.parse_args()
    print(json.dumps(run(a.keys, a.prefixes), indent=2))


if __name__ == "__main__":
    main()
