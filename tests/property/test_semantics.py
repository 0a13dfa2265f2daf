"""Write-semantics properties.

- A client that retries with the same Idempotency-Key and the same body sees one write,
  whatever the interleaving: retries while the first is in flight, after it committed,
  concurrent with other keys (real LMDB store, the gateway's `Idempotency` and `Batcher`).
- Batch answers say what the store did: each op's status is the one it gets applied one
  by one, or `superseded` for a set a later set of the same key replaced.
- Quota answers come true: waiting a refusal's Retry-After admits the same request in an
  otherwise idle system; a request refused as never admissible (413) is refused after any
  wait, and the largest admissible request it names is admitted by a full bucket.
"""

from __future__ import annotations

import asyncio
import tempfile

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.answers import Answer
from gateway.batcher import Batcher, _spread, coalesce, key_order, unsort
from gateway.idempotency import Hold, Idempotency, fingerprint, store_key
from gateway.quota import Bucket, ProducerBuckets, retry_seconds
from store.ops import DELETE, SET, Op, Result, Status
from store.store import Store

# --- idempotency: one write per key, every answer the first --------------------------------

#: Waves of requests: each wave's requests are sent concurrently, the waves one after the
#: other; a request names its Idempotency-Key (the body is a function of the key: a retry).
_waves = st.lists(
    st.lists(st.sampled_from("abcde"), min_size=1, max_size=6), min_size=1, max_size=5
)


async def _run_waves(store: Store, waves: list[list[str]]) -> dict[str, list[Answer]]:
    batcher = Batcher(store, window_s=0.002, max_ops=1000, max_bytes=1 << 20)
    batcher.start()
    idem = Idempotency(store, ttl_s=3600.0)

    async def put(name: str) -> Answer:
        key, value = f"k/{name}".encode(), f"value of {name}".encode()
        ikey = store_key("p", name)
        fp = fingerprint("PUT", b"/v1/kv/" + key, b"", {}, value)

        def answer(results: list[Result]) -> Answer:
            return Answer(200, {"seq": results[0].seq, "status": results[0].status.value}, {})

        async def write(_hold: Hold) -> Answer:
            fut = batcher.submit(
                [Op(SET, key, value, "p")],
                len(key) + len(value),
                "p",
                idem_key=ikey,
                answer=lambda rs: orjson.dumps(
                    {"status": answer(rs).status, "body": answer(rs).body, "fp": fp}
                ),
            )
            return answer(await fut)

        return await idem.once(ikey, name, fp, write)

    seen: dict[str, list[Answer]] = {}
    try:
        for wave in waves:
            got = await asyncio.gather(*(put(n) for n in wave))
            for n, a in zip(wave, got, strict=True):
                seen.setdefault(n, []).append(a)
    finally:
        await batcher.close()
    return seen


@settings(max_examples=30, deadline=None)
@given(_waves)
def test_retries_with_one_key_and_body_write_once(waves: list[list[str]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        store = Store.create(d + "/s", sync=False, map_size=1 << 24)
        try:
            seen = asyncio.run(_run_waves(store, waves))
            # per distinct key, however often and however it was retried: one change and
            # its one logged answer (format 5), so two log entries
            assert store.last_seq() == 2 * len(seen)
            for name, answers in seen.items():
                assert all(a.status == 200 for a in answers)
                assert all(a.body == answers[0].body for a in answers), (name, answers)
                assert answers[0].body["status"] == "written"
                v = store.get(f"k/{name}".encode())
                assert v is not None and v.seq == answers[0].body["seq"]
        finally:
            store.close()


# --- quota: a Retry-After comes true; a 413 never does ------------------------------------

_limit = st.one_of(st.none(), st.tuples(st.floats(0.5, 500), st.floats(1, 1000)))  # (rate, burst)
_history = st.lists(
    st.tuples(st.floats(0, 0.3), st.integers(1, 50), st.integers(0, 5000)), max_size=40
)


def _buckets(ops: tuple[float, float] | None, nb: tuple[float, float] | None) -> ProducerBuckets:
    return ProducerBuckets(
        Bucket.full(*ops, 0.0) if ops else None, Bucket.full(*nb, 0.0) if nb else None
    )


@settings(max_examples=300)
@given(_limit, _limit, st.floats(0, 3), _history, st.integers(1, 2000), st.integers(0, 10**6))
def test_waiting_retry_after_admits_the_same_request_when_idle(
    ops: tuple[float, float] | None,
    nb: tuple[float, float] | None,
    max_delay: float,
    history: list[tuple[float, int, int]],
    n_ops: int,
    n_bytes: int,
) -> None:
    pb = _buckets(ops, nb)
    now = 0.0
    for dt, h_ops, h_bytes in history:  # whatever happened before
        now += dt
        pb.take(now, h_ops, h_bytes, max_delay)
    d = pb.take(now, n_ops, n_bytes, max_delay)
    if d.admitted:
        return
    max_ops, max_bytes = pb.largest(max_delay)
    if d.never:
        # no wait admits it, and the answer names a request that a full bucket admits
        assert (max_ops is not None and n_ops > max_ops) or (
            max_bytes is not None and n_bytes > max_bytes
        )
        later = pb.take(now + 10**6, n_ops, n_bytes, max_delay)
        assert not later.admitted and later.never
        fits = pb.take(now + 10**6, max_ops or n_ops, max_bytes or n_bytes, max_delay)
        assert fits.admitted
        return
    # the Retry-After header (whole seconds) and the exact wait both come true
    assert max(d.waits) == d.retry_after
    for wait in (retry_seconds(d.retry_after), d.retry_after):
        idle = ProducerBuckets(
            Bucket(pb.ops.rate, pb.ops.burst, pb.ops.tokens, pb.ops.last) if pb.ops else None,
            Bucket(pb.bytes.rate, pb.bytes.burst, pb.bytes.tokens, pb.bytes.last)
            if pb.bytes
            else None,
        )
        again = idle.take(now + wait, n_ops, n_bytes, max_delay)
        assert again.admitted, (wait, d, again)


# --- answers: every op's reported status is what the store did -----------------------------

_ops = st.lists(
    st.tuples(
        st.sampled_from([SET, DELETE]),
        st.sampled_from([b"a", b"b", b"c"]),
        st.sampled_from([b"1", b"2"]),
        st.one_of(st.none(), st.none(), st.integers(0, 4)),
    ).map(lambda t: Op(t[0], t[1], t[2] if t[0] == SET else b"", "p", t[3])),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(_ops, _ops)
def test_batch_answers_say_what_applying_op_by_op_does(setup: list[Op], batch: list[Op]) -> None:
    """Through the batcher's pipeline (coalesce, key order, spread back), each op reports
    the status it gets when the ops are applied one by one, except on a key with only
    unconditional sets in the batch: the sets replaced by a later one say `superseded`, at
    the seq the last one got, and the last one is `written` or `duplicate` against the
    state before the batch (the superseded values were never stored)."""
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        batched = Store.create(d1 + "/s", sync=False, map_size=1 << 24)
        one_by_one = Store.create(d2 + "/s", sync=False, map_size=1 << 24)
        try:
            plain = [op._replace(expect_seq=None) for op in setup]
            batched.apply(plain)
            one_by_one.apply(plain)
            last = batched.last_seq()
            # conditions name committed versions (a client learns them from answers)
            batch = [
                op if op.expect_seq is None else op._replace(expect_seq=min(op.expect_seq, last))
                for op in batch
            ]
            kept, winner = coalesce(batch)
            applied = [batch[i] for i in kept]
            order = key_order(applied)
            if order is not None:
                applied = [applied[j] for j in order]
            res = batched.apply(applied).results
            if order is not None:
                res = unsort(res, order)
            got = _spread(batch, kept, winner, res)
            want = [one_by_one.apply([op]).results[0] for op in batch]
            for i, op in enumerate(batch):
                same_key = [o for o in batch if o.key == op.key]
                if got[i].status is Status.SUPERSEDED:
                    later = [o for o in batch[i + 1 :] if o.key == op.key]
                    assert op.op == SET and later
                    assert all(o.op == SET and o.expect_seq is None for o in same_key)
                    last_i = max(j for j, o in enumerate(batch) if o.key == op.key)
                    assert got[i].seq == got[last_i].seq
                elif len(same_key) > 1 and all(
                    o.op == SET and o.expect_seq is None for o in same_key
                ):
                    # the one set of a coalesced key the store applied: to the state before
                    # the batch (the superseded sets were never stored)
                    before: dict[bytes, bytes] = {}
                    for o in plain:
                        if o.op == DELETE:
                            before.pop(o.key, None)
                        elif o.op == SET:
                            before[o.key] = o.value
                    dup = before.get(op.key) == op.value
                    assert got[i].status is (Status.DUPLICATE if dup else Status.WRITTEN)
                else:
                    assert got[i].status is want[i].status, (i, batch, got, want)
            for k in (b"a", b"b", b"c"):
                x, y = batched.get(k), one_by_one.get(k)
                assert (x and x.value) == (y and y.value)
        finally:
            batched.close()
            one_by_one.close()


# --- the fingerprint tells requests apart -------------------------------------------------

_request = st.tuples(
    st.sampled_from(["PUT", "DELETE", "POST"]),
    st.binary(max_size=8),
    st.binary(max_size=6),
    st.dictionaries(
        st.sampled_from(["if-match", "if-none-match", "content-type", "x-other"]),
        st.text('ab*"0', max_size=3),
        max_size=3,
    ),
    st.binary(max_size=8),
)


@given(_request, _request)
def test_fingerprints_differ_exactly_when_requests_do(
    a: tuple[str, bytes, bytes, dict[str, str], bytes],
    b: tuple[str, bytes, bytes, dict[str, str], bytes],
) -> None:
    """Parts are length-prefixed (path "ab" + body "c" is not path "a" + body "bc"), and
    a header outside the fingerprint (here x-other) never makes two requests differ."""

    def meaningful(r: tuple[str, bytes, bytes, dict[str, str], bytes]) -> tuple[object, ...]:
        h = {k: v for k, v in r[3].items() if k != "x-other" and v}
        return (r[0], r[1], r[2], sorted(h.items()), r[4])

    same = fingerprint(*a) == fingerprint(*b)
    assert same == (meaningful(a) == meaningful(b))
