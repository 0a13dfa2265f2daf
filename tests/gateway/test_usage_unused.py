"""Unused-key analytics: read counting (`reads/readstats.py`), the root's ledger
(`gateway/usage_reads.py`) over a real store, and `GET /v1/usage/unused` end to end with a
real root and a real replica whose reads travel up the replication link."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from gateway import usage_reads as ur
from reads import readstats
from store.ops import SET, Op
from store.store import Store
from store.usage import stored_bytes
from testkit.procs import Procs, run_mercury
from testkit.replication import wait_for, wait_seq
from tests.gateway.conftest import make_root
from tests.replicator.nodes import start_replica


def test_counter_is_bounded_and_says_how_many_reads_it_dropped() -> None:
    c = readstats.ReadCounter(max_keys=3)
    for k in (b"a", b"b", b"a", b"c", b"d", b"e"):
        c.note(k)
    keys, dropped = c.take()
    assert keys == {b"a", b"b", b"c"} and dropped == 2
    assert c.take() == (set(), 0)


def test_summaries_round_trip_and_split_at_the_frame_bound() -> None:
    keys = [b"k%d" % i for i in range(readstats.PER_PAYLOAD + 5)]
    payloads = readstats.summaries(keys, 20_000, dropped=7)
    assert len(payloads) == 2
    assert all(len(p) <= readstats.MAX_PAYLOAD for p in payloads)
    got: set[bytes] = set()
    drops = 0
    for p in payloads:
        day, dropped, hashes = readstats.decode(p)
        assert day == 20_000
        drops += dropped
        got.update(hashes)
    assert drops == 7
    assert got == {readstats.key_hash(k) for k in keys}
    assert readstats.summaries([], 1) == []
    with pytest.raises(ValueError):
        readstats.decode(b"\x01\x00")


def test_note_read_is_a_no_op_until_enabled() -> None:
    readstats.disable()
    readstats.note_read(b"x")  # nothing to count into
    c = readstats.enable()
    try:
        readstats.note_read(b"x")
        readstats.note_reads([b"y", b"x"])
        assert c.take()[0] == {b"x", b"y"}
    finally:
        readstats.disable()


def _write(store: Store, keys: list[bytes], owner: str = "p") -> None:
    store.apply([Op(SET, k, b"value-of-" + k, owner=owner) for k in keys])


def test_ledger_lists_exactly_the_keys_not_read_and_persists_them(tmp_path: Path) -> None:
    store = Store.create(str(tmp_path / "s"), sync=False, map_size=1 << 28)
    try:
        keys = [b"p/k%02d" % i for i in range(20)]
        _write(store, keys)
        _write(store, [b"q/other"], owner="q")
        time.sleep(0.05)  # deliberate: every key older than the 20 ms window asked below
        ledger = ur.ReadLedger(store, readstats.key_hash)
        ledger.meta.since -= 3600  # tracked for an hour: the window is complete
        read = keys[::3]
        for p in readstats.summaries(read, readstats.day_of(time.time())):
            ledger.add(*readstats.decode(p))
        w = ur.window(ledger, 0.02 / 86400)  # the last 20 ms: every key is older
        assert w.complete
        page = ur.unused_page(ledger, [b"p/"], w, after=None, limit=100)
        want = [k for k in keys if k not in read]
        assert [i["key"].encode() for i in page["keys"]] == want
        assert page["bytes"] == sum(stored_bytes(len(k), 9 + len(k), 1) for k in want)
        # Pages: 4 at a time, each after the last one's key, together the same list.
        seen, after = [], None
        while True:
            pg = ur.unused_page(ledger, [b"p/"], w, after=after, limit=4)
            seen += [i["key"].encode() for i in pg["keys"]]
            if pg["next"] is None:
                break
            after = pg["next"]
        assert seen == want
        totals = ur.unused_totals(ledger, [b"p/", b"q/"], w)["rows"]
        assert totals[b"p/"]["unused_keys"] == len(want) and totals[b"q/"]["unused_keys"] == 1
        # A key written after the window began is too young to judge.
        _write(store, [b"p/new"])
        assert b"p/new" not in {
            i["key"].encode()
            for i in ur.unused_page(ledger, [b"p/"], w, after=None, limit=100)["keys"]
        }
        assert ledger.flush() >= 2  # meta + today's hashes
        assert ledger.flush() == 0  # nothing new: no transaction
        # A restarted (or promoted) root reads them back.
        again = ur.ReadLedger(store, readstats.key_hash)
        assert again.read_in([readstats.day_of(time.time())]) == {
            readstats.key_hash(k) for k in read
        }
        assert again.meta.since == ledger.meta.since
    finally:
        store.close()


def test_a_day_with_dropped_reads_makes_answers_incomplete(tmp_path: Path) -> None:
    store = Store.create(str(tmp_path / "s"), sync=False, map_size=1 << 28)
    try:
        ledger = ur.ReadLedger(store, readstats.key_hash)
        ledger.meta.since -= 86400
        ledger.add(readstats.day_of(time.time()), 3, [readstats.key_hash(b"p/a")])
        assert not ur.window(ledger, 1).complete
    finally:
        store.close()


def test_unused_keys_end_to_end_through_a_replica(
    tmp_path: Path, procs: Procs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Write keys on a real root, read some on a real replica (HTTP GET, get_bulk) and one
    on the root's gateway: once the replica's summary came up the replication link, the
    root lists exactly the others, with their bytes; a producer sees only itself."""
    monkeypatch.setenv("MERCURY_READSTATS_PERIOD_S", "0.3")
    root = make_root(procs, tmp_path / "root")
    try:
        name, token = root.producer()
        other, other_token = root.producer()
        c = root.client(token)
        keys = [f"{name}/k{i:02d}" for i in range(12)]
        for k in keys:
            r = c.put(f"/v1/kv/{k}", content=b"x" * 20)
            assert r.status_code == 200
        repl_port = int(root.args[root.args.index("--repl-listen") + 1].rsplit(":", 1)[1])
        rep = start_replica(procs, tmp_path / "replica", [repl_port], name="replica")
        wait_seq(rep.http, r.json()["seq"])  # caught up (without reading a key)
        time.sleep(1.2)  # deliberate: every key is now older than the 1-second window below
        read = [keys[0], keys[5], keys[7]]
        assert c.get(f"/v1/kv/{keys[7]}").status_code == 200  # on the root's gateway
        assert httpx.get(f"http://127.0.0.1:{rep.http}/v1/kv/{keys[0]}").status_code == 200
        r = httpx.post(
            f"http://127.0.0.1:{rep.http}/v1/get_bulk", json={"keys": [keys[5], f"{name}/missing"]}
        )
        assert r.status_code == 200
        days = 1 / 86400  # one second

        def unused() -> list[str]:
            r = c.get("/v1/usage/unused", params={"days": days, "limit": 100})
            assert r.status_code == 200, r.text
            return [i["key"] for i in r.json()["keys"]]

        want = [k for k in keys if k not in read]
        wait_for(lambda: unused() == want, 30, "the replica's reads at the root")
        doc = c.get("/v1/usage/unused", params={"days": days}).json()
        assert doc["bytes"] == sum(i["bytes"] for i in doc["keys"]) > 0
        assert doc["producer"] == name and doc["next_cursor"] is None
        summary = root.admin().get("/v1/usage/unused/summary", params={"days": days}).json()
        row = next(r for r in summary["rows"] if r["producer"] == name)
        assert (row["keys"], row["unused_keys"], row["unused_bytes"]) == (12, 9, doc["bytes"])
        # A producer reads only its own unused keys; the admin names any.
        assert (
            root.client(other_token).get("/v1/usage/unused", params={"producer": name}).status_code
            == 403
        )
        assert root.admin().get("/v1/usage/unused", params={"producer": other}).json()["keys"] == []
        assert c.get("/v1/usage/unused", params={"days": "0"}).status_code == 400
        # The flow is visible in Prometheus: keys summarised on the replica, READS frames
        # handled on the root.
        rep_metrics = httpx.get(f"http://127.0.0.1:{rep.http}/metrics").text
        assert "mercury_read_keys_summarised_total 2.0" in rep_metrics
        root_metrics = root.admin().get("/metrics").text
        assert 'mercury_upstream_frames_total{kind="1",outcome="handled"}' in root_metrics
        # The CLI: the summary table, and with --producer the keys themselves.
        f = tmp_path / "admin.token"
        f.write_text(root.admin_token)
        cli = ("--url", root.url, "--admin-token-file", str(f), "--days", str(days))
        out = run_mercury("usage", "unused", *cli, "--producer", name, "--limit", "4")
        assert out.returncode == 0, out.stderr
        listed = [ln.split()[0] for ln in out.stdout.splitlines() if ln.startswith(f"{name}/k")]
        assert listed == want[:4] and "--limit N for more" in out.stdout
        js = run_mercury("usage", "unused", *cli, "--producer", name, "--json", "--limit", "50")
        assert [k["key"] for k in json.loads(js.stdout)["keys"]] == want
        table = run_mercury("usage", "unused", *cli)
        assert table.returncode == 0, table.stderr
        row_line = next(ln for ln in table.stdout.splitlines() if ln.startswith(name + " "))
        assert row_line.split()[1:5] == [f"{name}/", "12", "9", str(doc["bytes"])]
    finally:
        root.close_clients()


def test_a_full_spool_drops_summaries_and_says_so_in_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readstats, "MAX_SPOOL_FILES", 2)
    sink = readstats.spool(str(tmp_path))
    day = readstats.day_of(time.time())
    for keys in ([b"a"], [b"b"], [b"c", b"d"]):  # the third finds two files waiting
        sink(readstats.summaries(keys, day)[0])
    d = tmp_path / readstats.SPOOL_DIR
    files = sorted(d.glob("*.bin"))
    assert len(files) == 2
    for f in files:
        f.unlink()  # the worker took them
    sink(readstats.summaries([b"e"], day)[0])
    (last,) = d.glob("*.bin")
    assert readstats.decode(last.read_bytes())[:2] == (day, 2)  # c and d were not counted


def test_a_summary_for_a_day_not_kept_is_ignored(tmp_path: Path) -> None:
    store = Store.create(str(tmp_path / "s"), sync=False, map_size=1 << 28)
    try:
        ledger = ur.ReadLedger(store, readstats.key_hash)
        today = readstats.day_of(time.time())
        for day in (0, today - ur.KEEP_DAYS, today + 2, 10**9):
            ledger.add(day, 0, [readstats.key_hash(b"p/a")])
        assert ledger.ignored == 4 and ledger.summaries == 0
        ledger.add(today + 1, 0, [readstats.key_hash(b"p/a")])  # a clock a little ahead
        assert ledger.summaries == 1
    finally:
        store.close()


def test_reads_on_a_tier_2_replica_reach_the_root_through_tier_1(
    tmp_path: Path, procs: Procs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root -> tier 1 -> tier 2, real processes: a key read only on tier 2 (an HTTP GET)
    is no longer unused at the root once tier 1 relayed tier 2's summary (a worker that
    does not relay fails this test)."""
    monkeypatch.setenv("MERCURY_READSTATS_PERIOD_S", "0.3")
    root = make_root(procs, tmp_path / "root")
    try:
        name, token = root.producer()
        c = root.client(token)
        for i in range(3):
            r = c.put(f"/v1/kv/{name}/k{i}", content=b"v")
            assert r.status_code == 200
        repl_port = int(root.args[root.args.index("--repl-listen") + 1].rsplit(":", 1)[1])
        t1 = start_replica(procs, tmp_path / "t1", [repl_port], name="t1")
        t2 = start_replica(procs, tmp_path / "t2", [t1.repl], name="t2")
        wait_seq(t2.http, r.json()["seq"])
        time.sleep(1.2)  # deliberate: every key is now older than the 1-second window below
        assert httpx.get(f"http://127.0.0.1:{t2.http}/v1/kv/{name}/k1").status_code == 200

        def unused() -> list[str]:
            doc = c.get("/v1/usage/unused", params={"days": 1 / 86400}).json()
            return [i["key"] for i in doc["keys"]]

        wait_for(lambda: unused() == [f"{name}/k0", f"{name}/k2"], 30, "tier 2's read at root")
    finally:
        root.close_clients()
