"""KT write semantics over a real store (kt/writes.py), the writer applying each
request as one store transaction; refusal mapping to KT statuses. Process-level tests with
the gateway are in test_root_writes.py."""

from __future__ import annotations

import asyncio
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core import errors as e
from kt.writes import CONFLICT, DUPLICATE, NO_RECORD, KtWriteFailed, KtWrites, kt_status
from store.ops import Op, Result
from store.store import Store


class StoreWriter:
    """Applies each request in one store transaction, as producer "p" (keyspace ``k/``)."""

    producer = "p"

    def __init__(self, store: Store) -> None:
        self.store = store
        self.requests: list[list[Op]] = []

    def keyspaces(self) -> tuple[bytes, ...]:
        return (b"k/",)

    async def write(self, ops: list[Op], nbytes: int) -> list[Result]:
        self.requests.append(ops)
        return self.store.apply([op._replace(owner="p") for op in ops]).results


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def failed(coro: object) -> tuple[int, bytes]:
    with pytest.raises(KtWriteFailed) as exc:
        run(coro)
    return exc.value.status, exc.value.message


def test_set_add_replace_remove(store: Store) -> None:
    w = KtWrites(store, StoreWriter(store))
    run(w.set(b"k/a", b"1"))
    assert failed(w.set(b"k/a", b"2", "add")) == (450, DUPLICATE)
    run(w.set(b"k/b", b"1", "add"))
    assert failed(w.set(b"k/none", b"2", "replace")) == (450, NO_RECORD)
    run(w.set(b"k/a", b"3", "replace"))
    assert store.get(b"k/a").value == b"3"  # type: ignore[union-attr]
    run(w.remove(b"k/a"))
    assert failed(w.remove(b"k/a")) == (450, NO_RECORD)
    assert (w.cnt_set_misses, w.cnt_remove_misses) == (2, 1)


def test_cas(store: Store) -> None:
    w = KtWrites(store, StoreWriter(store))
    run(w.cas(b"k/c", None, b"1"))  # absent -> set
    assert failed(w.cas(b"k/c", None, b"2")) == (450, CONFLICT)
    assert failed(w.cas(b"k/c", b"9", b"2")) == (450, CONFLICT)
    run(w.cas(b"k/c", b"1", b"2"))
    run(w.cas(b"k/c", b"2", None))  # remove
    assert store.get(b"k/c") is None
    run(w.cas(b"k/c", None, None))  # absent stays absent: nothing to do


@given(st.lists(st.integers(-(1 << 40), 1 << 40), min_size=1, max_size=6))
def test_increment_sums_as_8_byte_big_endian(
    tmp_path_factory: pytest.TempPathFactory, nums: list[int]
) -> None:
    s = Store.create(str(tmp_path_factory.mktemp("inc") / "s"), sync=False, map_size=1 << 26)
    try:
        w = KtWrites(s, StoreWriter(s))
        total = 0
        for n in nums:
            total += n
            assert run(w.increment(b"k/n", n, None)) == total
        assert s.get(b"k/n").value == struct.pack(">q", total)  # type: ignore[union-attr]
    finally:
        s.close()


def test_increment_orig_and_not_a_number(store: Store) -> None:
    w = KtWrites(store, StoreWriter(store))
    assert failed(w.increment(b"k/x", 1, "try"))[0] == 450
    assert run(w.increment(b"k/x", 5, "10")) == 15
    assert run(w.increment(b"k/x", 5, "set")) == 5  # "set": overwrite with num
    run(w.set(b"k/s", b"abc"))
    assert failed(w.increment(b"k/s", 1, None))[0] == 450


def test_append_bulk_and_clear(store: Store) -> None:
    sw = StoreWriter(store)
    w = KtWrites(store, sw)
    run(w.append(b"k/t", b"ab"))
    run(w.append(b"k/t", b"cd"))
    assert store.get(b"k/t").value == b"abcd"  # type: ignore[union-attr]
    assert run(w.set_bulk([(b"k/1", b"1"), (b"k/2", b"2")])) == 2
    assert run(w.remove_bulk([b"k/1", b"k/none"])) == 1
    store.apply([Op(1, b"z/other", b"x", "q")])
    assert run(w.clear()) == 2  # k/2 and k/t; z/other is not the producer's
    assert store.get(b"z/other") is not None
    assert len(sw.requests[-1]) == 2  # one request: the mass-delete guard sees it whole


@pytest.mark.parametrize(
    ("err", "status"),
    [
        (e.ForbiddenError("key outside the keyspaces"), 400),
        (e.WriteGuardError("too many deletes"), 400),
        (e.TooLargeError("value too large"), 400),
        (e.QuotaExceededError("slow down"), 503),
        (e.ShuttingDownError("stopping"), 503),
        (e.StorageQuotaError("full"), 500),
    ],
)
def test_refusals_keep_their_retry_meaning(err: e.MercuryError, status: int) -> None:
    got, message = kt_status(err)
    assert got == status
    assert err.message.encode() in message


def test_seize(store: Store) -> None:
    w = KtWrites(store, StoreWriter(store))
    run(w.set(b"k/s", b"v"))
    assert run(w.seize(b"k/s")) == b"v"
    assert store.get(b"k/s") is None
    assert failed(w.seize(b"k/s")) == (450, NO_RECORD)


def test_kt_writes_need_a_loopback_listener() -> None:
    from core.errors import ConfigError
    from gateway.protocol_writer import kt_writer_for

    assert kt_writer_for(None, None) is None
    assert kt_writer_for("p", ("127.0.0.1", 1978)) is not None
    assert kt_writer_for("p", ("::1", 1978)) is not None
    for bad in (None, ("0.0.0.0", 1978), ("10.1.2.3", 1978), ("kt.example", 1978)):
        with pytest.raises(ConfigError):
            kt_writer_for("p", bad)


def test_increment_double_keeps_kyoto_cabinets_record(store: Store) -> None:
    from kt.writes import DECUNIT, NOT_NUMBER

    w = KtWrites(store, StoreWriter(store))
    assert run(w.increment_double(b"k/d", 1.0, None)) == 1.0
    assert run(w.increment_double(b"k/d", 2.5, None)) == 3.5
    # Kyoto Cabinet's record: integral part, then the fraction in units of 10^-15
    assert store.get(b"k/d").value == struct.pack(">qq", 3, DECUNIT // 2)  # type: ignore[union-attr]
    assert run(w.increment_double(b"k/d", -4.25, None)) == -0.75
    assert run(w.increment_double(b"k/d", 9.0, "set")) == 9.0
    assert failed(w.increment_double(b"k/none", 1.0, "try")) == (450, NO_RECORD)
    assert run(w.increment_double(b"k/o", 0.5, "2")) == 2.5
    run(w.set(b"k/s", b"short"))
    assert failed(w.increment_double(b"k/s", 1.0, None)) == (450, NOT_NUMBER)


@given(st.floats(-1e9, 1e9, allow_nan=False), st.lists(st.floats(-1e6, 1e6, allow_nan=False)))
def test_add_double_tracks_the_sum(start: float, adds: list[float]) -> None:
    from kt.writes import DECUNIT, add_double, double_parts

    parts = double_parts(start)
    total = start
    for a in adds:
        parts = add_double(parts, a)
        total += a
    got = parts[0] + parts[1] / DECUNIT
    assert abs(got - total) <= 1e-6 * max(1.0, abs(total))
    assert abs(parts[1]) < DECUNIT
