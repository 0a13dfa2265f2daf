"""Keyspace-filtered replicas as real processes: root -> filtered replica -> narrower
filtered replica. Each holds exactly the root's keys under its prefixes, at the root's seq
and hash head; every gap of a faulty link is seen; a source refuses what it does not hold;
reads outside the keyspaces get a 421 naming where they are served."""

from __future__ import annotations

import functools
import socket
from pathlib import Path

import httpx

from store.check import check
from store.ops import DELETE, SET, Op
from store.store import Store
from testkit.procs import Procs, free_port, wait_http
from testkit.replication import RootNode, items, root_node, status, wait_for, wait_seq
from tests.faults.proxy import FaultProxy, Faults
from tests.replicator.nodes import start_replica


def _write(root: RootNode, rnd: int, n: int = 60) -> None:
    """Sets under a/, a/x/, b/ and c/ interleaved in each batch, and deletes of some."""
    for b in range(0, n, 20):
        ops = [
            Op(SET, f"{p}{i:04d}".encode(), f"v{rnd}-{i}".encode(), owner="t")
            for i in range(b, b + 20)
            for p in ("a/", "a/x/", "b/", "c/")
        ]
        root.store.apply(ops)
    root.store.apply(
        [Op(DELETE, f"{p}{i:04d}".encode(), owner="t") for i in (3, 7) for p in ("a/x/", "c/")]
    )


def _mc(port: int, request: bytes) -> bytes:
    """One memcached request's whole answer (it ends with END or an error line)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        out = b""
        while not out.endswith((b"END\r\n", b"ERROR\r\n")) and b"_ERROR " not in out:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        return out


def _refused(port: int) -> bool:
    errors: dict[str, int] = status(port).get("replication_errors") or {}
    return errors.get("refused", 0) > 0


def _assert_holds(root: RootNode, data_dir: Path, prefixes: tuple[bytes, ...]) -> None:
    """The store at `data_dir` holds exactly the root's keys under `prefixes`, at the
    root's seq and hash head, and its invariants hold (filtered log, usage counters)."""
    want = [(k, v) for k, v in items(root.store) if k.startswith(prefixes)]
    s = Store.open(str(data_dir), readonly=True)
    try:
        assert s.head() == root.store.head()
        assert items(s) == want
        report = check(s)
        assert report.ok, report
    finally:
        s.close()


def test_root_to_filtered_to_narrower_holds_its_subset_and_refuses_the_rest(
    tmp_path: Path, procs: Procs
) -> None:
    with root_node(str(tmp_path / "root")) as root:
        _write(root, 1)  # before: a new filtered replica bootstraps, then prunes
        f1 = start_replica(
            procs, tmp_path / "f1", [root.port], "--keyspace", "a/", "--keyspace", "b/", name="f1"
        )
        wait_seq(f1.http, root.store.last_seq())
        # Its bootstrap was a snapshot derived for its prefixes: smaller than the whole one.
        snaps = sorted((tmp_path / "root" / "snapshots").glob("snap-*.mdb*"))
        whole = [p for p in snaps if p.name.endswith(".mdb")]
        derived = [p for p in snaps if ".ks-" in p.name and not p.name.endswith(".json")]
        assert len(whole) == len(derived) == 1, snaps
        assert root.source.stats.bytes_sent == derived[0].stat().st_size
        assert derived[0].stat().st_size < whole[0].stat().st_size
        # Three more at once (their starts overlap): a narrower filtered replica of f1, and
        # a full and a wider one f1 must refuse (their stores made empty: they ask to
        # stream; a bootstrap is refused alike).
        mc_port, kt_port = free_port(), free_port()
        for name in ("full", "wide"):
            Store.create(str(tmp_path / name), db_id=root.store.db_id).close()
        f2 = start_replica(
            procs,
            tmp_path / "f2",
            [f1.repl],
            "--keyspace",
            "a/x/",
            "--memcached-listen",
            f"127.0.0.1:{mc_port}",
            "--kt-listen",
            f"127.0.0.1:{kt_port}",
            repl=False,
            name="f2",
            wait=False,
        )
        full = start_replica(
            procs, tmp_path / "full", [f1.repl], repl=False, name="full", wait=False
        )
        wide = start_replica(
            procs,
            tmp_path / "wide",
            [f1.repl],
            "--keyspace",
            "c/",
            repl=False,
            name="wide",
            wait=False,
        )
        for r in (f2, full, wide):
            wait_http(f"http://127.0.0.1:{r.http}/healthz", timeout=60, proc=r.proc)
        _write(root, 2)  # after: streamed filtered, f1 -> f2 re-filtered
        seq = root.store.last_seq()
        wait_seq(f1.http, seq)
        st2 = wait_seq(f2.http, seq)
        assert st2["keyspaces"] == ["a/x/"]
        assert status(f1.http)["keyspaces"] == ["a/", "b/"]
        assert st2["hash_head"] == root.store.head()[1].hex()

        base = f"http://127.0.0.1:{f2.http}"
        assert httpx.get(f"{base}/v1/kv/a/x/0001").content == b"v2-1"
        assert httpx.get(f"{base}/v1/kv/a/x/0003").status_code == 404  # deleted: inside
        outside = httpx.get(f"{base}/v1/kv/a/0001")  # held by f1, not by f2
        assert outside.status_code == 421, outside.text
        doc = outside.json()
        assert doc["type"].endswith("outside-keyspace")
        assert doc["sources"] == [f"127.0.0.1:{f1.repl}"] and doc["keyspaces"] == ["a/x/"]
        bulk = httpx.post(f"{base}/v1/get_bulk", json={"keys": ["a/x/0001", "b/0001"]})
        assert bulk.status_code == 421 and "'b/0001'" in bulk.json()["detail"]
        assert httpx.get(f"{base}/v1/range", params={"prefix": "a/x/00"}).status_code == 200
        assert httpx.get(f"{base}/v1/range", params={"prefix": "a/"}).status_code == 421
        assert httpx.get(f"{base}/v1/watch", params={"prefix": "b/"}).status_code == 421
        # memcached has no 421: a key outside is a SERVER_ERROR, never the END of a miss.
        assert _mc(mc_port, b"get a/x/0001\r\n") == b"VALUE a/x/0001 0 4\r\nv2-1\r\nEND\r\n"
        assert _mc(mc_port, b"get a/x/0003\r\n") == b"END\r\n"
        refused = _mc(mc_port, b"get a/x/0001 b/0001\r\n")
        assert refused.startswith(b"SERVER_ERROR key 'b/0001' is outside"), refused
        # KT alike: 421 where a miss (404, 450) would deny the key.
        kt = f"http://127.0.0.1:{kt_port}"
        assert httpx.get(f"{kt}/a%2Fx%2F0001").content == b"v2-1"  # (a slash names a db)
        assert httpx.get(f"{kt}/a%2Fx%2F0003").status_code == 404
        assert httpx.get(f"{kt}/b%2F0001").status_code == 421
        rpc = httpx.get(f"{kt}/rpc/get", params={"key": "b/0001"})
        assert rpc.status_code == 421 and b"outside" in rpc.content, rpc.content

        # f1 refused the full replica and the wider one, with the reason.
        for r, words in ((full, "a full replica needs a full source"), (wide, "'c/'")):
            wait_for(functools.partial(_refused, r.http), 30, f"{r.data_dir.name} refused")
            assert words in (status(r.http).get("replication_error") or "")
            assert status(r.http)["seq"] == 0
        for p in (f1, f2, full, wide):
            procs.terminate(p.proc)
        _assert_holds(root, tmp_path / "f1", (b"a/", b"b/"))
        _assert_holds(root, tmp_path / "f2", (b"a/x/",))


def test_a_filtered_stream_through_a_faulty_link_sees_every_gap(
    tmp_path: Path, procs: Procs
) -> None:
    with root_node(str(tmp_path / "root")) as root:
        Store.create(str(tmp_path / "f"), db_id=root.store.db_id).close()
        proxy = FaultProxy(root.port)
        try:
            f = start_replica(procs, tmp_path / "f", [proxy.port], "--keyspace", "b/", repl=False)
            for rnd, (faults, kind) in enumerate(
                [
                    (Faults(drop_every=3), "StreamGapError"),
                    (Faults(duplicate_every=3), "StreamGapError"),
                    (Faults(truncate_every=4), "ProtocolError"),
                ]
            ):
                proxy.faults = faults
                before = dict(status(f.http).get("replication_errors") or {})
                _write(root, rnd)
                wait_seq(f.http, root.store.last_seq())
                after = status(f.http).get("replication_errors") or {}
                assert after.get(kind, 0) > before.get(kind, 0), (faults, after)
            proxy.faults = Faults()
            procs.terminate(f.proc)
            _assert_holds(root, tmp_path / "f", (b"b/",))
        finally:
            proxy.close()
