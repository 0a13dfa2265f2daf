"""The batcher's pure decisions agree with the real store's apply."""

from __future__ import annotations

import asyncio
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ShuttingDownError
from gateway.batcher import Batcher, _spread, coalesce, key_order, unsort
from store.ops import DELETE, SET, Op, Result
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
