"""The batcher's pure decisions agree with the real store's apply."""

from __future__ import annotations

import asyncio
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ShuttingDownError
from gateway.batcher import Batcher, _spread, coalesce, key_order, predict, unsort
from store.ops import DELETE, SET, Op
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
def test_predict_equals_apply_and_coalescing_keeps_the_final_state(
    setup: list[Op], batch: list[Op]
) -> None:
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        full = Store.create(d1 + "/s", sync=False, map_size=1 << 24)
        co = Store.create(d2 + "/s", sync=False, map_size=1 << 24)
        try:
            plain = [op._replace(expect_seq=None) for op in setup]
            full.apply(plain)
            co.apply(plain)

            def lookup(key: bytes) -> tuple[int, bytes] | None:
                v = co.get(key)
                return None if v is None else (v.seq, v.value)

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
            in_order = predict(applied, lookup, co.last_seq())
            order = key_order(applied)
            if order is not None:
                applied = [applied[j] for j in order]
            predicted = predict(applied, lookup, co.last_seq())
            got = co.apply(applied).results
            assert predicted == got
            if order is not None:
                got = unsort(got, order)
            assert [r.status for r in got] == [r.status for r in in_order]
            assert len(_spread(batch, kept, winner, got)) == len(batch)
            full.apply(batch)
            for k in (b"a", b"b", b"c"):
                a, b = full.get(k), co.get(k)
                assert (a and a.value) == (b and b.value)
            assert_store_ok(co)
        finally:
            full.close()
            co.close()


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
