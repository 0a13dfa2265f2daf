"""Usage over time: the minute counters, their documents in a real store, retention, the
range query, and `GET /v1/usage/series` / `GET /usage` on a real root."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import usage_series as us
from store.ops import DELETE, EXPIRE, SET, Op, Result, Status
from store.store import Store
from store.usage import stored_bytes
from testkit.procs import run_mercury
from testkit.wait import wait_until
from tests.gateway.conftest import Root

T0 = 1_795_000_000 // 86400 * 86400  # a UTC midnight (2026-11-18)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _series(store: Store, clock: Clock, keyspaces: dict[str, tuple[str, ...]]) -> us.UsageSeries:
    s = us.for_store(store, lambda p: keyspaces.get(p, ()), dict)
    s.clock = clock
    return s


def _commit(store: Store, s: us.UsageSeries, now: float, ops: list[Op], producer: str) -> None:
    """What the batcher does: due documents ride in the batch, then its results count."""
    changes = s.due(
        now,
        lambda: {n: (u.keys, u.bytes) for n, u in store.usage().items()},
        starting=[producer],
    )
    out = store.apply(ops, doc_changes=changes or None)
    s.written(changes)
    s.add_results(producer, ops, out.results, now)


def _set(key: str, value: bytes, owner: str) -> Op:
    return Op(SET, key.encode(), value, owner)


def test_count_results_splits_by_keyspace_and_status() -> None:
    ops = [
        Op(SET, b"a/1", b"xyz", "p"),
        Op(SET, b"b/1", b"12", "p"),
        Op(SET, b"a/2", b"dup", "p"),
        Op(DELETE, b"a/3", b"", "p"),
        Op(DELETE, b"a/4", b"", "p"),
    ]
    res = [
        Result(Status.WRITTEN, 1),
        Result(Status.WRITTEN, 2),
        Result(Status.DUPLICATE, 0),
        Result(Status.DELETED, 3),
        Result(Status.ABSENT, 0),
    ]
    got = us.count_results(ops, res, us.keyspace_finder(["a/", "b/"]))
    assert got == {"a/": [1, 6, 1, 1, 0, 0, 0, 0], "b/": [1, 5, 0, 0, 0, 0, 0, 0]}


def test_keyspace_finder_takes_the_longest_prefix() -> None:
    find = us.keyspace_finder(["a/", "a/b/", "c/"])
    assert callable(find) and us.keyspace_finder(["only/"]) == "only/"
    assert find(b"a/b/1") == "a/b/"
    assert find(b"a/x") == "a/"
    assert find(b"zz") == ""


def test_parse_time_and_range() -> None:
    now = T0 + 12 * 3600
    assert us.parse_time("-24h", now) == now - 86400
    assert us.parse_time("30m", now) == now - 1800
    assert us.parse_time("2026-11-18T01:00:00Z", now) == T0 + 3600
    with pytest.raises(ValueError, match="timezone"):
        us.parse_time("2026-11-18T01:00:00", now)
    for bad in ("garbage", "+1h", "1w", ""):  # refused naming both accepted forms
        with pytest.raises(ValueError, match="neither RFC 3339"):
            us.parse_time(bad, now)
    rng = us.parse_range("-1h", None, "1m", now)
    # a range ending now holds the present second (`until` is exclusive)
    assert (rng.since, rng.until, rng.step) == (now - 3600, now + 1, 60)
    assert us.parse_range("-2h", "-1h", "1m", now).until == now - 3600
    assert us.parse_range("-1h", "now", "1m", now + 0.5).until == now + 1
    assert us.parse_range("-30d", None, None, now).step == 3600  # finest with <= 5000 points
    with pytest.raises(ValueError, match="at most"):
        us.parse_range("-30d", None, "1m", now)
    with pytest.raises(ValueError, match="before"):
        us.parse_range("now", "-1h", None, now)
    with pytest.raises(ValueError, match="step"):
        us.parse_range("-1h", None, "5m", now)


def test_minutes_fold_into_replicated_documents_with_the_next_batch(tmp_path: Path) -> None:
    store = Store.create(str(tmp_path / "s"), sync=False)
    clock = Clock(T0 + 10 * 3600 + 5)
    s = _series(store, clock, {"p": ("p/",)})
    _commit(store, s, clock.t, [_set("p/1", b"v1", "p"), _set("p/2", b"v22", "p")], "p")
    # The minute is open: nothing is written yet, not even the state before it (a new
    # producer: nothing), kept as the previous minute's end until this minute closes:
    # a batch never carries a log entry of the series on its own account.
    assert store.scan_docs("usage/") == []
    # ...but it is already visible to a query (from memory)
    rng = us.parse_range("-10m", None, "1m", clock.t + 60)
    clock.t += 60
    pts = us.query(s, "p", None, rng, None)
    assert sum(p["writes"] or 0 for p in pts) == 2
    assert [p["bytes"] for p in pts][-3:] == [0, 0, 0]  # the start state, carried forward
    seq_before = store.last_seq()
    _commit(store, s, clock.t, [_set("p/3", b"v", "p")], "p")  # next minute's first batch
    docs = dict(store.scan_docs("usage/"))
    assert sorted(docs) == ["usage/h/p/20261118", "usage/m/p/20261118095", "usage/m/p/20261118100"]
    # written in that batch's transaction and log record: one record for data + documents
    assert store.last_seq() == seq_before + 1 + 3
    first = orjson.loads(docs["usage/m/p/20261118095"].body)
    assert first["s"] == [[9, 0, 0]] and first["m"] == {}
    hour = orjson.loads(docs["usage/m/p/20261118100"].body)
    assert hour["t"] == T0 + 10 * 3600
    assert hour["m"] == {"p/": [[0, 2, 3 + 2 + 3 + 3, 0, 0, 0, 0, 0]]}
    # keys and stored bytes as the minute ended (before the third key)
    assert hour["s"] == [[0, 2, stored_bytes(3, 2, 1) + stored_bytes(3, 3, 1)]]
    # the day's rollup gets the block when the block is over; until then an hourly query
    # reads those minutes from memory
    assert orjson.loads(docs["usage/h/p/20261118"].body) == {"t": T0, "m": {}, "s": [[9, 0, 0]]}
    hourly = us.query(s, "p", None, us.parse_range("-2h", None, "1h", clock.t), None)
    assert sum(p["writes"] or 0 for p in hourly) == 3
    clock.t = T0 + 10 * 3600 + 600 + 5
    _commit(store, s, clock.t, [_set("p/4", b"v", "p")], "p")
    day = orjson.loads(store.get_doc("usage/h/p/20261118").body)  # type: ignore[union-attr]
    assert day["m"] == {"p/": [[10, 3, 15, 0, 0, 0, 0, 0]]}
    hourly = us.query(s, "p", None, us.parse_range("-2h", None, "1h", clock.t), None)
    assert sum(p["writes"] or 0 for p in hourly) == 4  # rolled + open, never twice
    store.close()


def test_a_restarted_series_adds_to_the_stored_hour(tmp_path: Path) -> None:
    store = Store.create(str(tmp_path / "s"), sync=False)
    clock = Clock(T0 + 3600)
    s = _series(store, clock, {"p": ("p/",)})
    _commit(store, s, clock.t, [_set("p/1", b"a", "p")], "p")
    store.put_docs(s.due(clock.t, dict, all_=True))  # a clean stop
    s2 = _series(store, clock, {"p": ("p/",)})  # a new process, same minute
    _commit(store, s2, clock.t, [_set("p/2", b"b", "p")], "p")
    store.put_docs(s2.due(clock.t + 60, dict))
    hour = orjson.loads(store.get_doc("usage/m/p/20261118010").body)  # type: ignore[union-attr]
    assert hour["m"]["p/"] == [[0, 2, 8, 0, 0, 0, 0, 0]]
    store.close()


def test_quota_outcomes_count_once_per_change() -> None:
    totals: dict[str, dict[str, int]] = {"p": {"held": 3, "refused": 1, "too_large": 0}}
    saved: dict[str, bytes | None] = {}
    s = us.UsageSeries(
        saved.get, lambda *_: [], lambda _p: ("p/",), lambda: totals, clock=Clock(T0)
    )
    s.add_quota(T0)
    totals["p"]["held"] = 5
    s.add_quota(T0 + 1)
    pts = us.query(s, "p", None, us.Range(T0, T0 + 60, 60), None)
    assert (pts[0]["held"], pts[0]["refused"], pts[0]["refused_429"]) == (5, 1, 1)
    assert us.query(s, "p", "p/", us.Range(T0, T0 + 60, 60), None)[0]["held"] == 0


def test_retention_drops_old_minute_and_hour_documents(tmp_path: Path) -> None:
    store = Store.create(str(tmp_path / "s"), sync=False)
    now = T0 + 400 * 86400
    store.put_docs(
        {
            us.block_name("p", int(now) - 32 * 86400): b'{"t":0,"m":{},"s":[]}',
            us.block_name("p", int(now) - 30 * 86400): b'{"t":0,"m":{},"s":[]}',
            us.day_name("p", int(now) - 367 * 86400): b'{"t":0,"m":{},"s":[]}',
            us.day_name("p", int(now) - 300 * 86400): b'{"t":0,"m":{},"s":[]}',
        }
    )
    s = _series(store, Clock(now), {"p": ("p/",)})
    changes = s.due(now, lambda: {"p": (0, 0)})
    assert sorted(n for n, v in changes.items() if v is None) == [
        us.day_name("p", int(now) - 367 * 86400),
        us.block_name("p", int(now) - 32 * 86400),
    ]
    store.put_docs(changes)
    s.written(changes)
    assert len(store.scan_docs("usage/")) == 2
    store.close()


@settings(max_examples=40, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.integers(0, 3 * 3600), st.integers(1, 5), st.sampled_from(["a/", "b/"])),
        max_size=30,
    )
)
def test_every_step_sums_the_same_totals(events: list[tuple[int, int, str]]) -> None:
    """Whatever minutes the writes fall in, 1m, 1h and 1d steps give the same totals per
    keyspace, folded into documents or still in memory."""
    saved: dict[str, bytes | None] = {}

    def list_docs(prefix: str, after: str, limit: int) -> list[tuple[str, bytes]]:
        return [
            (n, b) for n, b in sorted(saved.items()) if n.startswith(prefix) and n > after and b
        ][:limit]

    s = us.UsageSeries(saved.get, list_docs, lambda _p: ("a/", "b/"), clock=Clock(T0))
    for dt, n, ks in sorted(events):
        t = T0 + dt
        saved.update(s.due(t, dict))
        ops = [Op(SET, f"{ks}{i}".encode(), b"v", "p") for i in range(n)]
        s.add_results("p", ops, [Result(Status.WRITTEN, 1)] * n, t)
    s.clock = Clock(T0 + 4 * 3600)
    for sel in ["a/", "b/", None]:
        want = sum(n for _dt, n, k in events if sel in (None, k))
        for step in (60, 3600, 86400):
            rng = us.Range(T0 // step * step, T0 + 4 * 3600, step)
            got = sum(p["writes"] or 0 for p in us.query(s, "p", sel, rng, None))
            assert got == want, (sel, step)


# --- a real root ---------------------------------------------------------------------------


def test_series_endpoint_on_a_real_root(shared_root: Root) -> None:
    name, token = shared_root.producer(quota={"max_bytes_stored": 1_000_000})
    other, other_token = shared_root.producer()
    c = shared_root.client(token)
    for i in range(20):
        r = c.put(f"/v1/kv/{name}/k{i}", content=b"x" * 100)
        assert r.status_code == 200, r.text
    assert c.put(f"/v1/kv/{name}/k0", content=b"x" * 100).json()["status"] == "duplicate"
    r = c.get("/v1/usage/series", params={"since": "-1h", "step": "1m"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["producer"] == name and body["step"] == "1m"
    assert len(body["points"]) in (60, 61)  # the current minute, open, is the last point
    assert sum(p["writes"] for p in body["points"]) == 20
    assert sum(p["duplicates"] for p in body["points"]) == 1
    assert sum(p["bytes_written"] for p in body["points"]) == 20 * (len(name) + 4 + 100) - 10
    assert body["points"][-1]["keys"] == 20
    assert body["max_bytes_stored"] == 1_000_000
    by_ks = c.get("/v1/usage/series", params={"since": "-1h", "keyspace": f"{name}/"}).json()
    assert sum(p["writes"] for p in by_ks["points"]) == 20
    assert by_ks["points"][-1]["keys"] == 20  # the producer's only keyspace: its keys
    # at a coarse step the range still says what it started from (finer than a step)
    daily = c.get("/v1/usage/series", params={"since": "-2d", "step": "1d"}).json()
    assert daily["start"] == {"keys": 0, "bytes": 0}  # a new producer: nothing before
    assert daily["points"][-1]["bytes"] == body["points"][-1]["bytes"] > 0
    # a producer sees only itself; the admin sees anyone
    r = shared_root.client(other_token).get("/v1/usage/series", params={"producer": name})
    assert r.status_code == 403
    r = shared_root.admin().get("/v1/usage/series", params={"producer": name, "since": "-2h"})
    assert sum(p["writes"] for p in r.json()["points"]) == 20
    assert shared_root.client(token).get("/v1/usage/series?since=yesterday").status_code == 400
    assert shared_root.client().get("/v1/usage/series").status_code == 401
    # /v1/usage rows carry the quota and the share of the storage cap used
    row = next(
        x for x in shared_root.admin().get("/v1/usage").json()["producers"] if x["producer"] == name
    )
    assert row["quota"]["max_bytes_stored"] == 1_000_000
    assert row["used_pct"] == pytest.approx(100 * row["bytes"] / 1_000_000, abs=0.001)
    del other


def test_history_survives_a_restart_and_reaches_the_log(root: Root) -> None:
    name, token = root.producer()
    c = root.client(token)
    for i in range(5):
        assert c.put(f"/v1/kv/{name}/k{i}", content=b"v").status_code == 200
    root.close_clients()
    metrics = root.client().get("/metrics").text
    assert f'mercury_usage_writes_total{{producer="{name}"}} 5.0' in metrics
    root.procs.terminate(root.proc)  # SIGTERM: a clean stop writes the open minute
    with Store.open(str(root.data_dir), readonly=True) as st_:
        found = st_.scan_docs(f"usage/m/{name}/")
        # one hour (two when the minute before the first write lies in the hour before)
        assert 1 <= len(found) <= 2
        writes = [
            row[1] for _n, d in found for rows in orjson.loads(d.body)["m"].values() for row in rows
        ]
        assert writes == [5]
        # written by a log entry (so replicas and a promoted root have it): its version
        # is the seq of a record in the log
        seq = found[-1][1].seq
        rec = st_.read_log(seq, max_records=1)[0]
        assert rec.first_seq <= seq <= rec.last_seq
    root.start()
    r = root.client(token).get("/v1/usage/series", params={"since": "-1h"})
    assert sum(p["writes"] for p in r.json()["points"]) == 5
    # the Prometheus usage counters start where the last process left them
    text = root.client().get("/metrics").text
    assert f'mercury_usage_writes_total{{producer="{name}"}} 5.0' in text


def test_usage_page_and_its_files(shared_root: Root) -> None:
    c = shared_root.client()
    r = c.get("/usage")
    assert r.status_code == 200 and "<title>Mercury usage</title>" in r.text
    assert "default-src 'none'" in r.headers["content-security-policy"]
    js = c.get("/usage/static/vendor/uPlot.iife.min.js")
    assert js.status_code == 200 and "uPlot" in js.text
    assert c.get("/usage/static/usage.js").status_code == 200
    assert c.get("/usage/static/../app.py").status_code == 404
    assert c.get("/usage/static/vendor/README.md").status_code == 404


def test_sparkline() -> None:
    from mercury.cmd_usage import sparkline

    assert sparkline([]) == ""
    assert sparkline([0, 0]) == "  "
    assert sparkline([0, 1, 8]) == " ▁█"
    assert len(sparkline(list(range(1000)))) == 48


def test_cli_usage_since_with_sparklines(shared_root: Root, tmp_path: Path) -> None:
    name, token = shared_root.producer()
    c = shared_root.client(token)
    for i in range(7):
        assert c.put(f"/v1/kv/{name}/s{i}", content=b"abc").status_code == 200
    f = tmp_path / "admin.token"
    f.write_text(shared_root.admin_token)
    base = ("usage", "--url", shared_root.url, "--admin-token-file", str(f))
    out = run_mercury(*base, "--since", "24h", "--producer", name)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["producer", "writes", "bytes_written"]
    row = lines[1].split()
    assert row[0] == name and row[1] == "7"
    assert any(ch in lines[1] for ch in "▁▂▃▄▅▆▇█")
    js = run_mercury(*base, "--since", "24h", "--producer", name, "--json")
    doc = orjson.loads(js.stdout)
    (p,) = doc["producers"]
    assert p["writes"] == 7 and p["bytes_written"] == 7 * (len(name) + 3 + 3)
    assert p["growth"] == p["bytes"]  # a new producer grew from nothing in the window
    totals = run_mercury(*base)
    assert totals.returncode == 0 and "used" in totals.stdout.splitlines()[0]


def test_a_replica_holds_the_series_so_a_promoted_root_keeps_it(root: Root) -> None:
    from testkit.replication import status, wait_for
    from tests.replicator.nodes import start_replica

    name, token = root.producer()
    c = root.client(token)
    for i in range(4):
        assert c.put(f"/v1/kv/{name}/r{i}", content=b"v").status_code == 200
    repl_port = int(root.args[root.args.index("--repl-listen") + 1].rsplit(":", 1)[1])
    rep = start_replica(root.procs, root.data_dir.parent / "rep", [repl_port], repl=False)
    seq = root.admin().get("/v1/status").json()["seq"]
    wait_for(lambda: status(rep.http)["seq"] >= seq, 60, "replica bootstrapped")
    root.close_clients()
    root.procs.terminate(root.proc)  # the clean stop writes the open minute through the log
    with Store.open(str(root.data_dir), readonly=True) as s:
        want = s.scan_docs("usage/")
        seq = s.last_seq()
    assert any(n.startswith(f"usage/m/{name}/") for n, _d in want)
    root.start()  # the replica reconnects and receives that last record
    wait_for(lambda: status(rep.http)["seq"] >= seq, 60, "replica caught up")
    root.procs.terminate(rep.proc)
    root.procs.terminate(root.proc)
    with Store.open(str(root.data_dir), readonly=True) as s:
        want = s.scan_docs("usage/")  # the restarted root may have added a minute
    with Store.open(str(rep.data_dir), readonly=True) as r:
        assert r.scan_docs("usage/") == want  # same bodies, same versions


def _naive_counts(ops: list[Op], results: list[Result], kss: list[str]) -> dict[str, list[int]]:
    """The counting rule, op by op (what the fast paths must agree with)."""
    out: dict[str, list[int]] = {}
    for op, res in zip(ops, results, strict=True):
        ks = max((k for k in kss if op.key.startswith(k.encode())), key=len, default="")
        col = {Status.WRITTEN: 0, Status.DELETED: 2, Status.DUPLICATE: 3}.get(res.status)
        if col is None:
            continue
        row = out.setdefault(ks, [0] * len(us.COLS))
        row[col] += 1
        if col == 0:
            row[1] += len(op.key) + len(op.value)
    return out


@settings(max_examples=200, deadline=None)
@given(
    kss=st.sampled_from([["a/"], ["a/", "b/"], ["a/", "a/x/", "b/"]]),
    rows=st.lists(
        st.tuples(
            st.sampled_from(["a/", "b/", "a/x/", "z/"]),
            st.binary(max_size=5),
            st.binary(max_size=9),
            st.sampled_from(list(Status)),
        ),
        max_size=40,
    ),
)
def test_count_results_agrees_with_the_op_by_op_rule(
    kss: list[str], rows: list[tuple[str, bytes, bytes, Status]]
) -> None:
    rows = [r for r in rows if len(kss) > 1 or r[0].startswith(kss[0])]  # one keyspace: all in
    ops = [Op(SET, p.encode() + k, v, "p") for p, k, v, _s in rows]
    results = [Result(s, 1) for *_x, s in rows]
    got = us.count_results(ops, results, us.keyspace_finder(kss))
    assert got == _naive_counts(ops, results, kss)


def test_every_keyspace_carries_its_own_keys_and_bytes(tmp_path: Path) -> None:
    """A keyspace's series shows its own keys/stored bytes at each minute's end: its
    producer's when it has no other keyspace, the store's per-keyspace figures when it has
    several (overwrites, deletes and the minute's start state included)."""
    store = Store.create(str(tmp_path / "s"), sync=False)
    # Written before the series tracked anything: counted once when q is first seen.
    store.apply([_set("q/b/0", b"old", "q")])
    clock = Clock(T0 + 3600 + 5)
    s = _series(store, clock, {"p": ("p/",), "q": ("q/a/", "q/b/")})
    _commit(store, s, clock.t, [_set("p/1", b"v1", "p")], "p")
    _commit(store, s, clock.t, [_set("q/a/1", b"v1", "q"), _set("q/b/1", b"v", "q")], "q")
    clock.t += 60
    _commit(store, s, clock.t, [_set("p/2", b"v2", "p")], "p")
    _commit(
        store,
        s,
        clock.t,
        [_set("q/a/2", b"v2", "q"), _set("q/a/1", b"longer", "q"), Op(DELETE, b"q/b/0")],
        "q",
    )
    clock.t += 60
    _commit(store, s, clock.t, [_set("p/3", b"v3", "p")], "p")  # closes the second minute
    rng = us.parse_range("-5m", None, "1m", clock.t + 60)
    only = us.query(s, "p", "p/", rng, None)
    whole = us.query(s, "p", None, rng, None)
    assert [p["keys"] for p in only] == [p["keys"] for p in whole]
    start: dict[str, int | None] = {}
    qa = us.query(s, "q", "q/a/", rng, None, start)
    qb = us.query(s, "q", "q/b/", rng, None)

    def at(points: list[dict[str, int | None]], t: int) -> tuple[int | None, int | None]:
        (p,) = [p for p in points if p["t"] == t]
        return p["keys"], p["bytes"]

    m0 = T0 + 3600  # q's first minute
    assert at(only, m0) == (1, stored_bytes(3, 2, 1))
    # the state before q's first batch, as the previous minute's end
    assert start == {"keys": 0, "bytes": 0}
    assert at(qa, m0 - 60) == (0, 0) and at(qb, m0 - 60) == (1, stored_bytes(5, 3, 1))
    # the first minute's end, then the second's (an overwrite and a delete counted)
    assert at(qa, m0) == (1, stored_bytes(5, 2, 1))
    assert at(qb, m0) == (2, stored_bytes(5, 3, 1) + stored_bytes(5, 1, 1))
    assert at(qa, m0 + 60) == (2, stored_bytes(5, 6, 1) + stored_bytes(5, 2, 1))
    assert at(qb, m0 + 60) == (1, stored_bytes(5, 1, 1))
    now_q = store.usage()["q"]
    qa_now = us.query(s, "q", "q/a/", rng, (now_q.keys, now_q.bytes))
    qb_now = us.query(s, "q", "q/b/", rng, (now_q.keys, now_q.bytes))
    assert (qa_now[-1]["keys"], qa_now[-1]["bytes"]) == (
        2,
        stored_bytes(5, 6, 1) + stored_bytes(5, 2, 1),
    )
    assert (qb_now[-1]["keys"], qb_now[-1]["bytes"]) == (1, stored_bytes(5, 1, 1))
    # the keyspaces add up to the producer
    assert qa_now[-1]["keys"] + qb_now[-1]["keys"] == now_q.keys  # type: ignore[operator]
    assert qa_now[-1]["bytes"] + qb_now[-1]["bytes"] == now_q.bytes  # type: ignore[operator]
    # and the minute documents carry them, so they survive a restart
    changes = s.due(
        clock.t, lambda: {n: (u.keys, u.bytes) for n, u in store.usage().items()}, all_=True
    )
    store.put_docs(changes)
    again = _series(store, clock, {"p": ("p/",), "q": ("q/a/", "q/b/")})
    assert us.query(again, "q", "q/a/", rng, None) == qa
    assert us.query(again, "q", "q/b/", rng, None) == qb
    store.close()


def test_a_batch_is_counted_per_producer_as_its_requests_one_by_one() -> None:
    """`add_requests` (one pass per producer) counts what `add_results` per request does."""

    class Req:
        def __init__(self, producer: str, ops: list[Op]) -> None:
            self.producer, self.ops = producer, ops

    def series() -> us.UsageSeries:
        return us.UsageSeries(
            lambda _n: None, lambda *_: [], {"p": ("p/a/", "p/b/"), "q": ("q/",)}.__getitem__
        )

    reqs = [
        Req("p", [_set("p/a/1", b"x", "p"), _set("p/b/1", b"yy", "p")]),
        Req("q", [_set("q/1", b"zzz", "q")]),
        Req("p", [Op(DELETE, b"p/a/2", owner="p")]),
    ]
    results = [
        [Result(Status.WRITTEN, 1), Result(Status.DUPLICATE, 1)],
        [Result(Status.WRITTEN, 2)],
        [Result(Status.DELETED, 3)],
    ]
    batch, one_by_one = series(), series()
    batch.add_requests(reqs, results, T0)
    for r, res in zip(reqs, results, strict=True):
        one_by_one.add_results(r.producer, r.ops, res, T0)
    rng = us.Range(T0, T0 + 60, 60)
    for producer, ks in (("p", None), ("p", "p/a/"), ("p", "p/b/"), ("q", None)):
        assert us.query(batch, producer, ks, rng, None) == us.query(
            one_by_one, producer, ks, rng, None
        )
    assert us.query(batch, "p", "p/a/", rng, None)[0]["deletes"] == 1


@settings(max_examples=300, deadline=None)
@given(
    kss=st.sampled_from([["a/", "b/"], ["a/", "a/x/", "b/"], ["a/x/", "a/", "a/xy/", "ab/"]]),
    keys=st.lists(
        st.builds(
            bytes.__add__,
            st.sampled_from([b"a/", b"a/x/", b"a/xy/", b"ab/", b"b/", b"z/", b"a"]),
            st.binary(max_size=3),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_one_keyspace_for_a_whole_request_only_when_every_key_has_it(
    kss: list[str], keys: list[bytes]
) -> None:
    """`Finder.common` (a request's keyspace without a per-key call) never names a keyspace
    that some key does not have, and names it whenever every key has the same."""
    find = us.keyspace_finder(kss)
    assert isinstance(find, us.Finder)
    got = find.common(keys)
    each = {find(k) for k in keys}
    if got is not None:
        assert each == {got}
    elif len(each) == 1 and each != {""}:
        # allowed to miss only when another keyspace begins between the least and greatest
        (ks,) = each
        lo, hi = min(keys), max(keys)
        assert any(lo < p.encode() <= hi for p in kss if p != ks)


def test_a_producer_with_several_keyspaces_sees_each_ones_keys_and_bytes(
    shared_root: Root,
) -> None:
    """On a real root: keys/bytes per keyspace follow writes, overwrites, a chunked value
    and a prefix delete, and add up to the producer's."""
    x = uuid.uuid4().hex[:8]
    a, b = f"f15{x}a/", f"f15{x}b/"
    name, token = shared_root.producer(keyspaces=[a, b])
    c = shared_root.client(token)
    for i in range(5):
        assert c.put(f"/v1/kv/{a}k{i}", content=b"x" * 10).status_code == 200
    for i in range(3):
        assert c.put(f"/v1/kv/{b}k{i}", content=b"y" * 20).status_code == 200
    assert c.put(f"/v1/kv/{b}big", content=b"z" * 9000).status_code == 200  # chunked
    assert c.put(f"/v1/kv/{a}k0", content=b"longer-value").status_code == 200  # overwrite
    r = c.delete("/v1/kv", params={"prefix": f"{a}k1"})
    assert r.status_code == 200, r.text

    def now(keyspace: str | None) -> tuple[int, int]:
        params = {"since": "-10m", "step": "1m"}
        if keyspace is not None:
            params["keyspace"] = keyspace
        body = c.get("/v1/usage/series", params=params).json()
        last = body["points"][-1]
        return last["keys"], last["bytes"]

    ka, kb, whole = now(a), now(b), now(None)
    n = len(name)
    assert ka == (4, stored_bytes(len(a) + 2, 12, n) + 3 * stored_bytes(len(a) + 2, 10, n))
    assert kb == (4, 3 * stored_bytes(len(b) + 2, 20, n) + stored_bytes(len(b) + 3, 9000, n))
    assert whole == (ka[0] + kb[0], ka[1] + kb[1])


def test_a_range_ending_now_holds_the_state_now_across_a_minute_turn(tmp_path: Path) -> None:
    """The range is parsed at M:59.9; the clock turns to M+1 before the query runs. The last
    point still holds the keys/bytes now (not the state before the minute's first batch,
    which for a new producer is zero)."""
    store = Store.create(str(tmp_path / "s"), sync=False)
    clock = Clock(T0 + 10 * 3600 + 30)
    s = _series(store, clock, {"p": ("p/",)})
    _commit(store, s, clock.t, [_set("p/1", b"v1", "p"), _set("p/2", b"v22", "p")], "p")
    u = store.usage()["p"]
    now = T0 + 10 * 3600 + 59.9
    rng = us.parse_range("-10m", None, "1m", now)
    clock.t = now + 0.2  # the next minute began meanwhile
    pts = us.query(s, "p", None, rng, (u.keys, u.bytes), None, now)
    assert (pts[-1]["keys"], pts[-1]["bytes"]) == (u.keys, u.bytes) == (2, u.bytes)
    assert u.bytes > 0
    store.close()


def test_the_minute_just_begun_is_in_a_range_ending_now(tmp_path: Path) -> None:
    """Writes in the first second of a minute are in the answer at once: the range ending
    now holds the present second, so its last point is that minute (CI saw 16 of 20
    writes when the query came within that second)."""
    store = Store.create(str(tmp_path / "s"), sync=False)
    turn = T0 + 10 * 3600 + 600  # a minute that also begins a block
    clock = Clock(turn - 0.5)
    s = _series(store, clock, {"p": ("p/",)})
    _commit(store, s, clock.t, [_set("p/1", b"v", "p")], "p")
    clock.t = turn + 0.2
    _commit(store, s, clock.t, [_set("p/2", b"v", "p"), _set("p/3", b"v", "p")], "p")
    for step in ("1m", "1h", "1d"):
        pts = us.query(s, "p", None, us.parse_range("-1h", None, step, clock.t), None)
        assert sum(p["writes"] or 0 for p in pts) == 3, step
        last = pts[-1]["t"]
        assert last is not None and last <= turn < last + us.STEPS[step]
    store.close()


def test_counts_that_arrive_after_their_minute_closed_still_count_in_every_step(
    tmp_path: Path,
) -> None:
    """A batch's counts reach the series on the event loop after its commit; the next
    batch's commit may close their minute first. The minute then closes twice, and the
    hour and day totals keep both parts."""
    store = Store.create(str(tmp_path / "s"), sync=False)
    m = T0 + 10 * 3600 + 120
    clock = Clock(m + 10)
    s = _series(store, clock, {"p": ("p/",)})
    _commit(store, s, m + 10, [_set("p/1", b"v", "p")], "p")
    # the next batch commits at m+60 before the first one's counts were added...
    changes = s.due(m + 60.1, lambda: {}, starting=["p"])
    store.apply([_set("p/2", b"v", "p")], doc_changes=changes or None)
    s.written(changes)
    # ...which are stamped with their own (earlier) time, in the minute just closed
    s.add_results("p", [_set("p/9", b"v", "p")], [Result(Status.WRITTEN, 1)], m + 59.9)
    s.add_results("p", [_set("p/2", b"v", "p")], [Result(Status.WRITTEN, 1)], m + 60.1)
    clock.t = m + 130
    _commit(store, s, clock.t, [_set("p/3", b"v", "p")], "p")
    for step in ("1m", "1h", "1d"):
        pts = us.query(s, "p", None, us.parse_range("-1h", None, step, clock.t), None)
        assert sum(p["writes"] or 0 for p in pts) == 4, step
    # and once the block is over, the day document holds all four
    clock.t = m + 900
    _commit(store, s, clock.t, [_set("p/4", b"v", "p")], "p")
    pts = us.query(s, "p", None, us.parse_range("-1h", None, "1h", clock.t), None)
    assert sum(p["writes"] or 0 for p in pts) == 5
    store.close()


def test_a_query_is_whole_when_a_document_leaves_the_cache_while_it_reads(
    tmp_path: Path,
) -> None:
    """The query reads the stored documents, then memory. A document folded, written and
    evicted by the commit thread in between is in neither version it read; the query
    sees the eviction and reads again."""
    store = Store.create(str(tmp_path / "s"), sync=False)
    turn = T0 + 10 * 3600 + 600  # a block turns: the block before leaves the cache
    clock = Clock(turn - 30)
    s = _series(store, clock, {"p": ("p/",)})
    _commit(store, s, clock.t, [_set("p/1", b"v", "p"), _set("p/2", b"v", "p")], "p")
    real_list = s._list
    raced: list[int] = []

    def list_then_commit(prefix: str, after: str, limit: int) -> list[tuple[str, bytes]]:
        got = real_list(prefix, after, limit)
        if not raced:  # two batches commit meanwhile: the first folds, the next evicts
            raced.append(1)
            _commit(store, s, turn + 1, [_set("p/3", b"v", "p")], "p")
            _commit(store, s, turn + 2, [_set("p/4", b"v", "p")], "p")
        return got

    s._list = list_then_commit
    clock.t = turn + 3
    pts = us.query(s, "p", None, us.parse_range("-1h", None, "1m", clock.t), None)
    assert raced and s.evictions > 0
    assert sum(p["writes"] or 0 for p in pts) == 4
    store.close()


def test_a_purge_is_counted_in_the_series(shared_root: Root) -> None:
    """The purge's deletes reach the series like any write's (they were applied beside
    the batcher, and the series never saw them: 0 deletes, the keys still counted)."""
    name, token = shared_root.producer()
    c = shared_root.client(token)
    for i in range(5):
        assert c.put(f"/v1/kv/{name}/k{i}", content=b"x" * 10).status_code == 200
    a = shared_root.admin()
    r = a.delete(f"/v1/admin/producers/{name}", params={"purge": "true"})
    assert r.status_code == 200 and r.json()["purged"] == 5, r.text
    body = a.get("/v1/usage/series", params={"producer": name, "since": "-1h"}).json()
    assert sum(p["writes"] for p in body["points"]) == 5
    assert sum(p["deletes"] for p in body["points"]) == 5
    assert body["points"][-1]["keys"] == 0 and body["points"][-1]["bytes"] == 0


def test_expiries_count_apart_from_deletes_per_keyspace_and_old_rows_read_as_none() -> None:
    """`add_expiries` counts only ops the store expired, under their owner and keyspace, in
    the `expiries` column (never `deletes`); a stored row without the column (before it, or
    none) reads 0 and is written back without it."""
    kss = {"p": ("a/", "b/")}
    s = us.UsageSeries(lambda n: None, lambda p, a, n: [], lambda p: kss.get(p, ()))
    ops = [Op(EXPIRE, k, b"", "p", 1) for k in (b"a/1", b"a/2", b"b/1", b"c/1")]
    res = [Result(Status.EXPIRED, 9), Result(Status.EXPIRED, 9), Result(Status.ABSENT, 3)]
    res.append(Result(Status.EXPIRED, 9))
    s.add_expiries(ops, res, T0 + 5)
    _n, _docs, minutes, _snaps = s.view("p", "usage/m/p/", "", "~", rollup=False)
    exp = us.COLS.index("expiries")
    got = {ks: (c[exp], c[us.COLS.index("deletes")]) for ks, c in minutes[T0].items()}
    assert got == {"a/": (2, 0), "": (1, 0)}  # b/1 not expired; c/1 in no keyspace
    old = orjson.dumps({"t": T0, "m": {"a/": [[0, 1, 2, 3, 4, 5, 6, 7]]}, "s": []})
    doc = us.SlotDoc.decode(old, T0)
    assert doc.rows["a/"][0] == [1, 2, 3, 4, 5, 6, 7, 0]
    assert doc.encode() == old
    doc.add("a/", 0, [0] * exp + [2])
    assert orjson.loads(doc.encode())["m"]["a/"] == [[0, 1, 2, 3, 4, 5, 6, 7, 2]]


def test_expiries_in_the_series_and_usage_charge_no_quota(
    shared_root: Root, tmp_path: Path
) -> None:
    """Keys the root expires count as the owner's expiries in `/v1/usage/series`,
    `/v1/usage` and `mercury usage`, not as deletes, and take nothing from its rate
    quota: a bucket that the writes left 10 ops of (refilling 1 op per 100 s) still admits
    10 ops after 20 expiries, with nothing held or refused."""
    quota = {"ops_per_s": 0.01, "burst": 30, "max_delay_ms": 0}
    name, token = shared_root.producer(quota=quota)
    c = shared_root.client(token)
    ops = [{"op": "set", "key": f"{name}/t{i}", "value": "v", "ttl": "1s"} for i in range(20)]
    assert c.post("/v1/batch", json={"ops": ops}).status_code == 200
    admin = shared_root.admin()

    def row() -> dict[str, Any]:
        got: dict[str, Any] = admin.get(f"/v1/usage/{name}").json()
        return got

    wait_until(lambda: row()["expiries"] == 20, 30, "the 20 expiries in the usage counters")
    r = row()
    assert (r["keys"], r["deletes"], r["throttled"]) == (0, 0, 0), r
    assert not any(r["quota_ops"].values()), r  # nothing held, refused or too large

    def points() -> list[dict[str, int]]:
        r = c.get("/v1/usage/series", params={"since": "-1h", "step": "1m"})
        pts: list[dict[str, int]] = r.json()["points"]
        return pts

    # counted on the event loop just after the commit that the counters are part of
    wait_until(lambda: sum(p["expiries"] for p in points()) == 20, 10, "expiries in the series")
    pts = points()
    assert sum(p["deletes"] for p in pts) == 0 and sum(p["writes"] for p in pts) == 20
    (tmp_path / "admin.token").write_text(shared_root.admin_token)
    base = ("usage", "--url", shared_root.url, "--admin-token-file", str(tmp_path / "admin.token"))
    js = run_mercury(*base, "--since", "1h", "--producer", name, "--json")
    (w,) = orjson.loads(js.stdout)["producers"]
    assert (w["expiries"], w["deletes"]) == (20, 0), w
    rest = [{"op": "set", "key": f"{name}/u{i}", "value": "v"} for i in range(10)]
    r2 = c.post("/v1/batch", json={"ops": rest})
    assert r2.status_code == 200, r2.text
    assert c.post("/v1/batch", json={"ops": rest[:1]}).status_code == 429  # the bucket is real
