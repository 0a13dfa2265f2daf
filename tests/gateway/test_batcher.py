"""The batcher's pure decisions agree with the real store's apply."""

from __future__ import annotations

import asyncio
import tempfile

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from core.errors import ShuttingDownError
from gateway.batcher import Batcher, _spread, coalesce, key_order, run_order, unsort
from store.ops import DELETE, SET, Op, Result, Status
from store.store import Store
from tests.conftest import assert_store_ok

ops_strategy = st.lists(
    st.tuples(
        st.sampled_from([SET, DELETE]),
        st.sampled_from([b"a", b"b", b"c"]),
        st.sampled_from([b"", b"1", b"2"]),
        st.one_of(st.none(), st.integers(0, 6)),
    ).map(lambda t: Op(t[0], t[1], t[2] if t[0] == SET else b"", "p", t[3])),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(ops_strategy, ops_strategy)
def test_coalescing_and_key_order_keep_statuses_and_the_final_state(
    setup: list[Op], batch: list[Op]
) -> None:
    with (
        tempfile.TemporaryDirectory() as d1,
        tempfile.TemporaryDirectory() as d2,
        tempfile.TemporaryDirectory() as d3,
    ):
        full = Store.create(d1 + "/s", sync=False, map_size=1 << 24)
        co = Store.create(d2 + "/s", sync=False, map_size=1 << 24)
        in_order = Store.create(d3 + "/s", sync=False, map_size=1 << 24)
        try:
            plain = [op._replace(expect_seq=None) for op in setup]
            for s in (full, co, in_order):
                s.apply(plain)
            # A condition names a committed seq (a client learns seqs from acks); seqs the
            # batch itself assigns are unknowable, and coalescing renumbers them.
            last = co.last_seq()
            batch = [
                op if op.expect_seq is None else op._replace(expect_seq=min(op.expect_seq, last))
                for op in batch
            ]
            kept, winner = coalesce(batch)
            applied = [batch[i] for i in kept]
            # Applying in key order (as the batcher does) gives every op the status it
            # gets in request order; only in-batch seqs are numbered differently.
            want = in_order.apply(applied).results
            order = key_order(applied)
            if order is not None:
                applied = [applied[j] for j in order]
            got = co.apply(applied).results
            if order is not None:
                got = unsort(got, order)
            assert [r.status for r in got] == [r.status for r in want]
            assert len(_spread(batch, kept, winner, got)) == len(batch)
            full.apply(batch)
            for k in (b"a", b"b", b"c"):
                a, b, c = full.get(k), co.get(k), in_order.get(k)
                assert (a and a.value) == (b and b.value) == (c and c.value)
            assert_store_ok(co)
        finally:
            full.close()
            co.close()
            in_order.close()


def _encode(results: list[Result]) -> bytes:
    return repr([(r.status.value, r.seq) for r in results]).encode()


@settings(max_examples=40, deadline=None)
@given(st.lists(ops_strategy, min_size=1, max_size=6))
def test_saved_answers_are_what_the_store_did(requests: list[list[Op]]) -> None:
    """Every request of one batch carries an Idempotency-Key: the answer stored durably with
    the batch equals the results its future resolves with (coalesced, key-ordered,
    duplicates and failed conditions included)."""

    async def run(store: Store) -> list[list[Result]]:
        b = Batcher(store, window_s=5.0, max_ops=1 << 20, max_bytes=1 << 30)
        b.start()
        futs = [
            b.submit(ops, 1, "p", idem_key=b"idem-%d" % i, answer=_encode)
            for i, ops in enumerate(requests)
        ]
        await b.close()  # commits the one open batch
        return [await f for f in futs]

    with tempfile.TemporaryDirectory() as d:
        store = Store.create(d + "/s", sync=False, map_size=1 << 24)
        try:
            store.apply([Op(SET, b"a", b"1", "p"), Op(SET, b"b", b"2", "p")])
            got = asyncio.run(run(store))
            for i, res in enumerate(got):
                saved = store.get_idempotent(b"idem-%d" % i)
                assert saved is not None
                assert saved[1] == _encode(res)
        finally:
            store.close()


def test_submit_after_close_is_refused_with_503(store: Store) -> None:
    async def run() -> None:
        b = Batcher(store, window_s=0.01, max_ops=10, max_bytes=1000)
        b.start()
        fut = b.submit([Op(SET, b"k", b"v", "p")], 2, "p")
        await b.close()
        assert (await fut)[0].seq == 1  # the open batch was committed at close
        with pytest.raises(ShuttingDownError):
            b.submit([Op(SET, b"k2", b"v", "p")], 2, "p")

    asyncio.run(run())


def test_batch_flushes_early_at_the_count_bound(store: Store) -> None:
    async def run() -> float:
        b = Batcher(store, window_s=5.0, max_ops=3, max_bytes=1 << 20)
        b.start()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        futs = [b.submit([Op(SET, bytes([65 + i]), b"v", "p")], 2, "p") for i in range(3)]
        await asyncio.gather(*futs)
        dt = loop.time() - t0
        await b.close()
        return dt

    assert asyncio.run(run()) < 5.0  # committed without waiting for the 5 s window


# Requests as bulk loaders send them: each one's keys in order (and sometimes not), from a
# small alphabet so that ranges overlap, touch or stay apart.
sorted_requests = st.lists(
    st.lists(st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"]), max_size=4).map(
        lambda ks: [Op(SET, k, b"v%d" % i, "p") for i, k in enumerate(sorted(ks))]
    )
    | ops_strategy,
    max_size=5,
)


@given(sorted_requests)
def test_run_order_is_key_order_by_whole_requests(requests: list[list[Op]]) -> None:
    batch = [op for ops in requests for op in ops]
    order = key_order(batch)
    want = batch if order is None else [batch[j] for j in order]
    runs = run_order(requests)
    if runs is not None:
        assert sorted(runs) == list(range(len(requests)))
        assert [op for i in runs for op in requests[i]] == want


def test_run_order_takes_disjoint_sorted_requests_in_any_arrival_order() -> None:
    reqs = [[Op(SET, b"k%02d" % (10 * r + j), b"v", "p") for j in range(3)] for r in (2, 0, 1)]
    assert run_order([*reqs, []]) == [1, 2, 0, 3]
    assert run_order([reqs[0], [Op(SET, b"k21", b"v", "p")]]) is None  # inside a range
    assert run_order([reqs[0], [Op(SET, b"k22", b"v", "p")]]) is None  # a shared key
    assert run_order([list(reversed(reqs[0]))]) is None


def _bulk(*ranges: tuple[int, int]) -> list[list[Op]]:
    """Requests of ascending keys, one per range, in the order given."""
    return [[Op(SET, b"k%03d" % k, b"v", "p") for k in range(a, b)] for a, b in ranges]


@settings(max_examples=40, deadline=None)
@given(sorted_requests)
@example(_bulk((20, 23), (0, 3), (10, 12)))  # a bulk load's requests, out of key order
@example(_bulk((0, 3), (2, 5)))  # overlapping: sorted op by op
def test_each_request_gets_its_own_results(requests: list[list[Op]]) -> None:
    """Through the batcher (whole requests in key order, or op by op), every op's result
    is its own: a written op that was its key's last write carries the seq the key holds
    after the commit, and (nothing superseded) every status is what applying the ops in
    arrival order gives."""

    async def run(store: Store) -> list[list[Result]]:
        b = Batcher(store, window_s=5.0, max_ops=1 << 20, max_bytes=1 << 30)
        b.start()
        futs = [b.submit(ops, 1, "p") for ops in requests]
        await b.close()  # commits the one open batch
        return [await f for f in futs]

    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        store = Store.create(d1 + "/s", sync=False, map_size=1 << 24)
        ref = Store.create(d2 + "/s", sync=False, map_size=1 << 24)
        try:
            plain = [op._replace(expect_seq=None) for ops in requests for op in ops]
            if any(op.expect_seq is not None for ops in requests for op in ops):
                return  # conditions name in-batch seqs here: the first test covers them
            got = asyncio.run(run(store))
            want = ref.apply(plain).results
            flat = [r for rs in got for r in rs]
            if len(coalesce(plain)[0]) == len(plain):  # nothing superseded
                assert [r.status for r in flat] == [r.status for r in want]
            last = {op.key: i for i, op in enumerate(plain)}
            for i, (op, r) in enumerate(zip(plain, flat, strict=True)):
                if r.status is Status.WRITTEN and last[op.key] == i:
                    assert store.version(op.key) == r.seq
        finally:
            store.close()
            ref.close()
