"""The SDK's pure parts: batch cutting, 413 re-planning, retry waits, error mapping, watch
resumption. No sockets here; the behaviour against real nodes is in the other modules."""

from __future__ import annotations

import email.utils
import json

from hypothesis import given
from hypothesis import strategies as st

from mercury_client import errors, wire
from mercury_client.retry import RetryPolicy, server_wait

costs = st.lists(st.integers(min_value=0, max_value=50), max_size=60)


def _ops(cs: list[int]) -> list[wire.WireOp]:
    return [wire.WireOp({"op": "set", "key": str(i)}, c) for i, c in enumerate(cs)]


@given(costs, st.integers(1, 10), st.integers(1, 120))
def test_split_covers_every_op_in_order_within_bounds(
    cs: list[int], max_ops: int, max_bytes: int
) -> None:
    ops = _ops(cs)
    pieces = wire.split(ops, max_ops, max_bytes)
    # consecutive, in order, covering everything exactly once
    assert [i for a, b in pieces for i in range(a, b)] == list(range(len(ops)))
    for a, b in pieces:
        assert 1 <= b - a <= max_ops
        cost = sum(cs[a:b])
        # over the byte bound only when one op alone is
        assert cost <= max_bytes or b - a == 1


@given(costs, st.integers(1, 8), st.integers(1, 100))
def test_a_413_recut_never_reuses_an_idempotency_key_for_another_body(
    cs: list[int], max_ops: int, max_bytes: int
) -> None:
    plan = wire.BatchPlan(_ops(cs), "k", max_ops=20, max_bytes=10_000)
    sent: dict[str, object] = {}
    acked: list[int] = []
    rounds = 0
    while (piece := plan.next()) is not None and rounds < 500:
        rounds += 1
        key, body = plan.key(piece), plan.body(piece)
        assert sent.setdefault(key, body) == body, "one key, two different bodies"
        a, b = piece
        admissible = b - a <= max_ops and (sum(cs[a:b]) <= max_bytes or b - a == 1)
        if admissible:
            acked.extend(range(a, b))
            plan.done()
        elif not plan.too_large(max_ops, max_bytes):
            raise AssertionError("a piece the node would admit was not produced")
    assert acked == list(range(len(cs)))


def test_413_without_limits_halves_until_one_op() -> None:
    plan = wire.BatchPlan(_ops([1] * 8), "k")
    assert plan.next() == (0, 8)
    assert plan.too_large(None, None)
    assert plan.next() == (0, 4)
    assert plan.too_large(None, None) and plan.too_large(None, None)
    assert plan.next() == (0, 1)
    assert not plan.too_large(None, None)  # one op cannot be cut: the 413 stands


def test_encode_op_uses_b64_members_for_non_utf8() -> None:
    w = wire.encode_op(("set", b"k\xff", b"\x00\xfe"))
    assert w.doc == {"op": "set", "key_b64": "a/8=", "value_b64": "AP4="}
    assert w.cost == 4
    assert wire.encode_op(("delete", "é")).doc == {"op": "delete", "key": "é"}


def test_kv_path_percent_encodes_every_reserved_byte() -> None:
    assert wire.kv_path("a/b?c%d e") == "/v1/kv/a%2Fb%3Fc%25d%20e"
    assert wire.kv_path(b"\xff") == "/v1/kv/%FF"
    # dot segments would be resolved away by the HTTP client (`..` is /v1): escaped
    assert wire.kv_path("..") == "/v1/kv/%2E%2E" and wire.kv_path(".") == "/v1/kv/%2E"
    assert wire.kv_path("...") == "/v1/kv/..." and wire.kv_path("a.") == "/v1/kv/a."


@given(st.integers(0, 40), st.floats(0, 1))
def test_backoff_is_full_jitter_under_the_cap(attempt: int, r: float) -> None:
    p = RetryPolicy(attempts=100, base=0.1, cap=5.0)
    w = p.wait(attempt, {}, lambda: r)
    assert w is not None
    assert 0 <= w <= min(5.0, 0.1 * 2**attempt)


def test_server_wait_honours_retry_after_and_ratelimit() -> None:
    assert server_wait({"Retry-After": "3"}) == 3.0
    date = email.utils.formatdate(1_000_010, usegmt=True)
    assert server_wait({"retry-after": date}, now=1_000_000) == 10.0
    assert server_wait({"RateLimit": '"ops";r=0;t=2, "bytes";r=5;t=4'}) == 4.0
    assert server_wait({}) is None
    p = RetryPolicy(attempts=3, max_wait=60)
    w = p.wait(0, {"Retry-After": "2"}, lambda: 1.0)
    assert w is not None and 2.0 <= w <= 2.2
    assert p.wait(0, {"Retry-After": "61"}, lambda: 0.0) is None  # longer than we wait
    assert p.wait(2, {"Retry-After": "1"}, lambda: 0.0) is None  # no tries left


def test_problem_json_maps_to_typed_errors() -> None:
    body = b'{"type":"t","title":"Content Too Large","status":413,"detail":"d","max_ops":7}'
    err = errors.from_answer(413, {"Content-Type": "application/problem+json"}, body)
    assert isinstance(err, errors.TooLarge) and isinstance(err, errors.Refused)
    assert (err.status, err.title, err.detail, err.max_ops, err.max_bytes) == (
        413,
        "Content Too Large",
        "d",
        7,
        None,
    )
    q = errors.from_answer(429, {"Retry-After": "5"}, b"{}")
    assert isinstance(q, errors.QuotaExceeded) and q.retry_after == 5.0
    assert errors.RateLimited is errors.QuotaExceeded
    for status, cls in [
        (401, errors.Unauthorized),
        (403, errors.Forbidden),
        (404, errors.NoSuchRoute),  # a 404 that is no Mercury problem: not our API there
        (409, errors.Conflict),
        (410, errors.Gone),
        (412, errors.PreconditionFailed),
        (422, errors.Unprocessable),
        (418, errors.Refused),
        (503, errors.Unavailable),
        (507, errors.StorageFull),
        (500, errors.ServerError),
    ]:
        assert type(errors.from_answer(status, {}, b"not json")) is cls
    assert errors.from_answer(500, {}, b"oops").detail == "oops"
    # A 404's kind is its problem type: a missing key or resource, or a path no route serves
    for slug, cls in [
        ("no-such-key", errors.NotFound),
        ("not-found", errors.NotFound),
        ("no-such-route", errors.NoSuchRoute),
    ]:
        body = json.dumps({"type": errors.PROBLEM_TYPE + slug, "status": 404}).encode()
        assert type(errors.from_answer(404, {}, body)) is cls
        assert errors.key_absent(404, body) is (slug != "no-such-route")
    assert not errors.key_absent(404, b"<html>Not Found</html>")


def _change(seq: int, k: str) -> wire.Change:
    return wire.Change(seq, "set", k.encode(), b"v")


def test_watch_resume_skips_changes_of_the_last_seq_already_delivered() -> None:
    r = wire.Resume(5)
    assert r.restart() == 5
    assert r.fresh(_change(5, "a")) and r.fresh(_change(6, "b")) and r.fresh(_change(6, "c"))
    # dropped: ask again from seq 6, whose first two changes were delivered
    assert r.restart() == 6
    assert not r.fresh(_change(6, "b")) and not r.fresh(_change(6, "c"))
    assert r.fresh(_change(6, "d")) and r.fresh(_change(7, "e"))
    # dropped during a redelivery too
    assert r.restart() == 7
    assert not r.fresh(_change(7, "e"))
    assert r.restart() == 7
    assert not r.fresh(_change(7, "e")) and r.fresh(_change(8, "f"))
    # two reconnections in a row with nothing received between them (the node was down
    # for both): the change of seq 8 already delivered is still skipped
    assert r.restart() == 8 and r.restart() == 8
    assert not r.fresh(_change(8, "f")) and r.fresh(_change(9, "g"))


def test_watch_lines() -> None:
    assert wire.change({"heartbeat": True, "seq": 9}) is None
    c = wire.change({"seq": 3, "op": "delete", "key_b64": "/w=="})
    assert c == wire.Change(3, "delete", b"\xff", None)


def test_writes_without_idempotency_retry_only_answers_that_applied_nothing() -> None:
    from mercury_client.retry import retryable

    assert [s for s in (429, 500, 502, 503, 504, 507) if retryable(s, True)] == [
        429,
        502,
        503,
        504,
    ]
    assert [s for s in (429, 500, 502, 503, 504, 507) if retryable(s, False)] == [429, 503]


def test_the_async_client_offers_what_the_blocking_one_does() -> None:
    import inspect

    from mercury_client import AsyncClient, Client

    def api(cls: type) -> dict[str, list[tuple[str, object, object]]]:
        return {
            name: [
                (p.name, p.kind, p.default)
                for p in inspect.signature(fn).parameters.values()
                if p.name != "sleep"
            ]
            for name, fn in vars(cls).items()
            if callable(fn) and (not name.startswith("_") or name == "__init__")
        }

    sync_api, async_api = api(Client), api(AsyncClient)
    sync_api["aclose"] = sync_api.pop("close")
    assert sync_api == async_api


def test_a_malformed_stream_line_is_a_server_error_not_data() -> None:
    import pytest

    from mercury_client import calls

    for bad in ("{oops", "[1, 2]", '"text"'):
        with pytest.raises(errors.ServerError):
            calls.ndjson(bad)
    with pytest.raises(errors.ServerError):
        calls.range_item({"value": "no key"})
    with pytest.raises(errors.ServerError) as err:
        calls.range_item({"error": "crc failure"})
    assert err.value.detail == "crc failure"
    with pytest.raises(errors.ServerError):
        calls.watch_change({"op": "set", "key": "k"})  # no seq


def test_batch_result_counts_every_status_the_root_answers() -> None:
    r = wire.BatchResult()
    r.add({"seq": 7, "written": 2, "superseded": 1, "precondition_failed": 3, "absent": 1}, False)
    r.add({"seq": 5, "deleted": 1, "duplicates": 2}, True)
    assert (r.seq, r.written, r.deleted, r.duplicates, r.absent) == (7, 2, 1, 2, 1)
    assert (r.superseded, r.precondition_failed, r.requests, r.replayed) == (1, 3, 2, 1)


def test_watch_from_now_resumes_after_the_last_heartbeat() -> None:
    r = wire.Resume(None)
    assert r.restart() is None and r.complete_through() == -1
    r.heartbeat(7)  # the node's position when the stream opened
    assert r.restart() == 8 and r.complete_through() == 7
    assert r.fresh(_change(9, "a"))
    assert r.restart() == 9 and r.complete_through() == 8
    assert not r.fresh(_change(9, "a")) and r.fresh(_change(9, "b"))
    r.heartbeat(8)  # older than what was delivered: changes nothing
    assert r.restart() == 9
    r.heartbeat(12)  # everything up to 12 was sent: the partial seq 9 is complete
    assert r.restart() == 13 and r.complete_through() == 12
    # an explicit from_seq is never moved backwards by a heartbeat
    r = wire.Resume(20)
    r.heartbeat(5)
    assert r.restart() == 20


_keys = st.binary(min_size=1, max_size=3)


@given(
    st.dictionaries(_keys, st.binary(max_size=3), max_size=12),
    st.lists(st.tuples(_keys, st.none() | st.binary(max_size=3)), max_size=30),
    st.data(),
)
def test_overlay_over_pages_read_at_different_seqs_is_the_state_at_its_seq(
    initial: dict[bytes, bytes],
    writes: list[tuple[bytes, bytes | None]],
    data: st.DataObject,
) -> None:
    """A range read in pages, each page taken after some of the writes (in key order, at
    ever later seqs), overlaid with the writes, equals the state after the last write."""
    history = [dict(initial)]
    changes: list[wire.Change] = []
    for seq, (k, v) in enumerate(writes, start=1):
        state = dict(history[-1])
        if v is None:
            state.pop(k, None)
        else:
            state[k] = v
        history.append(state)
        changes.append(wire.Change(seq, "set" if v is not None else "delete", k, v))
    end = len(writes)
    # pages: cursors walk the key space in order, each page read at a later seq
    items: list[wire.Item] = []
    after: bytes | None = None
    seq = 0
    while True:
        seq = data.draw(st.integers(seq, end))
        page_size = data.draw(st.integers(1, 4))
        at = history[seq]
        page = sorted(k for k in at if after is None or k > after)[:page_size]
        items += [wire.Item(k, at[k]) for k in page]
        if len(page) < page_size:
            break
        after = page[-1]
    overlay = wire.Overlay(end)
    for c in [*changes, wire.Change(end + 1, "set", b"late", b"x")]:  # after `end`: ignored
        overlay.add(c)
    merged = list(overlay.merge(iter(items)))
    assert merged == [wire.Item(k, v) for k, v in sorted(history[end].items())]


@given(st.lists(st.tuples(_keys, st.binary(max_size=300)), max_size=20))
def test_spooled_items_round_trip(pairs: list[tuple[bytes, bytes]]) -> None:
    import io

    f = io.BytesIO(b"".join(wire.pack_item(wire.Item(k, v)) for k, v in pairs))
    assert list(wire.unpack_items(f)) == [wire.Item(k, v) for k, v in pairs]
