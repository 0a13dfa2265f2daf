"""A KT key Mercury cannot hold (600 bytes) in the update log, replayed by a fake master to a
real `mercury kt-bridge` writing to a real root: without `--skip-refused` the bridge stops
at it and says how to get past it; with `--skip-refused FILE` it records that change in
FILE once and writes every other change, before and after it."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

from kt import ulog as kt_ulog
from testkit.procs import Procs
from tests.client.conftest import Cluster
from tests.kt.conftest import producer_token_file
from tests.kt.recorder import ReplayMaster
from tests.kt.test_recorded import _bridge, _under, _wait_state

LONG = b"big/" + b"x" * 596  # 600 bytes: over Mercury's 500


def _entries() -> list[kt_ulog.Entry]:
    base = time.time_ns()
    sets = [(b"a", b"1"), (b"b", b"2"), (LONG, b"too long"), (b"c", b"3"), (b"d", b"4")]
    out = [
        kt_ulog.Entry(base + i * 1_000_000, kt_ulog.encode_set(1, 0, k, v))
        for i, (k, v) in enumerate(sets)
    ]
    # a remove of the long key too, then one more set after it
    rm = b"\x00\x01\x00\x00" + bytes([kt_ulog.OP_REMOVE]) + kt_ulog.write_varnum(len(LONG)) + LONG
    out.append(kt_ulog.Entry(base + 10_000_000, rm))
    out.append(kt_ulog.Entry(base + 11_000_000, kt_ulog.encode_set(1, 0, b"e", b"5")))
    return out


def test_skip_refused_records_the_key_and_loses_nothing_else(
    kt_cluster: tuple[Cluster, Procs], tmp_path: Path
) -> None:
    c, procs = kt_cluster
    _, token = producer_token_file(c, tmp_path, "sk/")
    entries = _entries()
    master = ReplayMaster(entries)
    try:
        state, skipped = tmp_path / "sk.state", tmp_path / "skipped.jsonl"
        # Without the flag: stopped at the entry, naming the way past it.
        p = _bridge(procs, c, master.port, token, state, "sk/")
        assert p.wait(60) == 2
        assert "--skip-refused" in procs.logs()
        if state.exists():  # (its first batch ends at the long key: nothing saved yet)
            assert json.loads(state.read_text())["ts"] < entries[2].ts
        assert b"sk/c" not in _under(c, b"sk/")

        # With it: every other change arrives, the two changes of the long key are in FILE.
        argv = ["--skip-refused", str(skipped)]
        p = _bridge(procs, c, master.port, token, state, "sk/", *argv)
        _wait_state(state, entries[-1].ts, p)
        procs.terminate(p)
        want = {b"sk/a": b"1", b"sk/b": b"2", b"sk/c": b"3", b"sk/d": b"4", b"sk/e": b"5"}
        assert _under(c, b"sk/") == want
        lines = [json.loads(x) for x in skipped.read_text().splitlines()]
        assert [(d["ts"], d["op"], d["key_len"], d["db"]) for d in lines] == [
            (entries[2].ts, "set", 600, 0),
            (entries[5].ts, "remove", 600, 0),
        ]
        assert base64.b64decode(lines[0]["key_b64"]) == LONG
        assert "500" in lines[0]["reason"]

        # Replayed from the start (a lost state file): recorded once, nothing else moves.
        state.unlink()
        p = _bridge(procs, c, master.port, token, state, "sk/", *argv)
        _wait_state(state, entries[-1].ts, p)
        procs.terminate(p)
        assert len(skipped.read_text().splitlines()) == 2
        assert _under(c, b"sk/") == want
    finally:
        master.close()
