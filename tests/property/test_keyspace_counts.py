"""Keys and stored bytes per (owner, keyspace), kept as running totals in each batch's
transaction, equal a recount of the data after any batches: overwrites (by the same or
another owner), duplicates, deletes of present and absent keys, conditional ops that pass
or fail, values large enough to be chunked, nested keyspaces of one owner, reopen."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.check import check
from store.counters import recount
from store.format import CHUNK_SIZE
from store.ops import DELETE, SET, Op
from store.store import Store
from store.usage import keyspace_of, ks_encode, ks_table, ks_usage_key, stored_bytes

KEYSPACES = {"p": ["a/", "a/b/", "c/"], "q": ["d/", "e/"], "r": ["f/"]}
TABLE = ks_table(KEYSPACES)
KEYS = [p + s for p in (b"a/", b"a/b/", b"c/", b"d/", b"e/", b"f/", b"g/") for s in (b"1", b"2")]

values = st.one_of(
    st.binary(max_size=6), st.builds(lambda n: b"v" * n, st.sampled_from([CHUNK_SIZE + 7, 9000]))
)
ops = st.builds(
    Op,
    st.sampled_from([SET, SET, DELETE]),
    st.sampled_from(KEYS),
    values,
    st.sampled_from(["p", "q", "r", ""]),
    st.one_of(st.none(), st.none(), st.integers(min_value=0, max_value=6)),
    st.sampled_from([0, 0, 5]),  # a deadline sometimes (hypothesis infers one otherwise)
)


@st.composite
def one_keyspace_batches(draw: st.DrawFn) -> list[Op]:
    """A batch by one owner under one prefix: the store's no-per-op path when that is one
    of the owner's keyspaces no other overlaps (c/, d/, e/), the per-op path otherwise."""
    owner = draw(st.sampled_from(["p", "q", ""]))
    prefix = draw(st.sampled_from([b"a/", b"c/", b"d/", b"e/", b"f/"]))
    keys = [prefix + s for s in (b"1", b"2", b"3")]
    return draw(
        st.lists(
            st.builds(
                Op,
                st.sampled_from([SET, SET, DELETE]),
                st.sampled_from(keys),
                values,
                st.just(owner),
                st.one_of(st.none(), st.integers(0, 6)),
                st.sampled_from([0, 5]),
            ),
            min_size=1,
            max_size=8,
        )
    )


batches = st.one_of(st.lists(ops, max_size=8), one_keyspace_batches())


def expected(model: dict[bytes, tuple[int, str]]) -> dict[str, dict[str, tuple[int, int]]]:
    out: dict[str, dict[str, tuple[int, int]]] = {
        o: {p.decode(): (0, 0) for p in ps} for o, ps in TABLE.items()
    }
    for k, (vlen, owner) in model.items():
        ks = keyspace_of(TABLE[owner], k) if owner in TABLE else None
        if ks is not None:
            keys, nbytes = out[owner][ks.decode()]
            out[owner][ks.decode()] = (keys + 1, nbytes + stored_bytes(len(k), vlen, len(owner)))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(batches, max_size=8), reopen_at=st.integers(0, 8))
def test_running_totals_equal_a_recount(batches: list[list[Op]], reopen_at: int) -> None:
    d = tempfile.mkdtemp(prefix="mercury-ks-")
    store = Store.create(d + "/s", sync=False, map_size=1 << 28)
    try:
        writer = store._writer
        assert writer.set_keyspaces(TABLE) == sorted(TABLE)  # a new store: counted once
        model: dict[bytes, tuple[int, str]] = {}
        for i, batch in enumerate(batches):
            if i == reopen_at:
                store.close()
                store = Store.open(d + "/s", sync=False, map_size=1 << 28)
                writer = store._writer
                assert writer.set_keyspaces(TABLE) == []  # exact as stored: no recount
            store.apply(batch)
            for k in {op.key for op in batch}:
                v = store.get(k)
                if v is None:
                    model.pop(k, None)
                else:
                    model[k] = (len(v.value), v.owner)
        want = expected(model)
        for owner, prefixes in TABLE.items():
            assert writer.keyspace_usage(owner) == want[owner]
            with store.env.begin() as txn:
                counted = recount(txn, store.dbs.data, owner, prefixes)
            assert {ks.decode(): v for ks, v in counted.items()} == want[owner]
        assert writer.keyspace_usage("r") == {}  # one keyspace: the owner counters say it
    finally:
        store.close()
        shutil.rmtree(d, ignore_errors=True)


def test_recounted_when_the_log_moved_on_without_them_or_keyspaces_change() -> None:
    d = tempfile.mkdtemp(prefix="mercury-ks-")
    try:
        with Store.create(d + "/s", sync=False, map_size=1 << 26) as store:
            # Written before anything tracked keyspaces (an existing store).
            store.apply([Op(SET, b"a/1", b"xy", "p"), Op(SET, b"a/b/1", b"z", "p")])
            assert store._writer.set_keyspaces(TABLE) == ["p", "q"]
            assert store._writer.keyspace_usage("p")["a/"] == (1, stored_bytes(3, 2, 1))
            assert store._writer.keyspace_usage("p")["a/b/"] == (1, stored_bytes(5, 1, 1))
            store._writer.set_keyspaces({})  # a batch written while nothing is tracked
            store.apply([Op(SET, b"c/1", b"w", "p")])
            assert store._writer.set_keyspaces(TABLE) == ["p", "q"]  # stale: recounted
            assert store._writer.keyspace_usage("p")["c/"] == (1, stored_bytes(3, 1, 1))
            # "a/b/" leaves p: its key now counts in "a/"; q is unchanged.
            assert store._writer.set_keyspaces(ks_table({**KEYSPACES, "p": ["a/", "c/"]})) == ["p"]
            assert store._writer.keyspace_usage("p") == {
                "a/": (2, stored_bytes(3, 2, 1) + stored_bytes(5, 1, 1)),
                "c/": (1, stored_bytes(3, 1, 1)),
            }
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_check_compares_the_figures_with_a_recount() -> None:
    d = tempfile.mkdtemp(prefix="mercury-ks-")
    try:
        with Store.create(d + "/s", sync=False, map_size=1 << 26) as store:
            store.track_keyspaces(KEYSPACES)
            store.apply([Op(SET, b"a/1", b"xy", "p"), Op(SET, b"d/1", b"z", "q")])
            assert check(store).ok
            # Damage one record's figures (what a bug in the fold would leave behind).
            with store.env.begin(write=True) as txn:
                txn.put(ks_usage_key("q", b"d/"), ks_encode(5, 1), db=store.dbs.meta)
            report = check(store)
            assert not report.ok
            assert any("keyspace 'd/'" in p and "recount 1 keys" in p for p in report.problems)
    finally:
        shutil.rmtree(d, ignore_errors=True)
