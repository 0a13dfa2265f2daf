"""Pure decisions of the replicator: lag from heartbeats, source choice and backoff."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from replicator import frames
from replicator.handshake import decide, needs_bootstrap
from replicator.lag import GRACE_US, lag_seconds
from replicator.selection import Selector

S = 1_000_000


def test_lag_is_unknown_before_any_contact() -> None:
    assert lag_seconds(10 * S, 0, 0, 0, 0, 1000) is None


def test_caught_up_with_fresh_heartbeat_is_zero_lag() -> None:
    assert lag_seconds(100 * S, 50, 99 * S, 99 * S + 500_000, 50, 1000) == 0.0


def test_behind_the_heartbeat_counts_from_last_known_root_time() -> None:
    assert lag_seconds(100 * S, 40, 97 * S, 99 * S + 500_000, 50, 1000) == 3.0


def test_silent_source_makes_lag_grow() -> None:
    now = 100 * S
    hb = now - 1000 * 1000 - GRACE_US - 1
    lag = lag_seconds(now, 50, hb, hb, 50, 1000)
    assert lag is not None and lag > 1.0


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6))
def test_lag_is_never_negative(applied: int, hb_seq: int, skew: int) -> None:
    lag = lag_seconds(100 * S, applied, 100 * S + skew, 100 * S + skew, hb_seq, 1000)
    assert lag is not None and lag >= 0


def test_failed_source_moves_on_at_once_then_backs_off_per_round() -> None:
    sel = Selector([("a", 1), ("b", 2)], base=0.1, cap=1.0)
    assert sel.failed() == 0.0 and sel.current == ("b", 2)
    assert sel.failed() == 0.1 and sel.current == ("a", 1)
    sel.failed()
    assert sel.failed() == 0.2
    for _ in range(20):
        wait = sel.failed()
    assert wait <= 1.0  # bounded


def test_progress_resets_backoff() -> None:
    sel = Selector([("a", 1)], base=0.1, cap=5.0)
    for _ in range(5):
        sel.failed()
    sel.connected()
    sel.progressed()
    assert sel.failed() == 0.1


def test_stale_source_moves_to_next() -> None:
    sel = Selector([("a", 1), ("b", 2), ("c", 3)])
    sel.stale()
    assert sel.current == ("b", 2)


# --- handshake -----------------------------------------------------------------------

SRC, DB, OTHER = b"\x01" * 16, b"\x02" * 16, b"\x03" * 16


def _hello(**kw: Any) -> frames.Hello:
    base = frames.Hello(
        frames.PROTOCOL_VERSION,
        frames.MODE_STREAM,
        0,
        b"\x09" * 16,
        DB,
        100,
        0,
        0,
        frames.ZERO_SHA,
    )
    return base._replace(**kw)


def _code(hello: frames.Hello, first: int = 1, closing: bool = False) -> int | None:
    r = decide(hello, source_id=SRC, db_id=DB, first_retained=first, closing=closing)
    return None if r is None else r.code


def test_handshake_accepts_a_replica_within_retained_history() -> None:
    assert _code(_hello()) is None
    assert _code(_hello(last_seq=99), first=100) is None


def test_handshake_refuses_with_named_codes() -> None:
    assert _code(_hello(version=99)) == frames.REFUSE_PROTOCOL
    assert _code(_hello(mode=7)) == frames.REFUSE_PROTOCOL
    assert _code(_hello(), closing=True) == frames.REFUSE_NOT_READY
    assert _code(_hello(client_id=SRC)) == frames.REFUSE_SELF
    assert _code(_hello(db_id=OTHER)) == frames.REFUSE_DB_ID
    assert _code(_hello(last_seq=50), first=52) == frames.REFUSE_BOOTSTRAP


def test_unknown_db_id_may_only_fetch_a_snapshot() -> None:
    assert _code(_hello(db_id=frames.ZERO_ID)) == frames.REFUSE_DB_ID
    assert _code(_hello(db_id=frames.ZERO_ID, mode=frames.MODE_SNAPSHOT)) is None


def test_newest_only_never_needs_history() -> None:
    assert _code(_hello(last_seq=0, options=frames.OPT_NEWEST_ONLY), first=500) is None


def test_needs_bootstrap() -> None:
    assert needs_bootstrap(False, 0, 1)
    assert not needs_bootstrap(True, 0, 1)
    assert needs_bootstrap(True, 10, 12)
    assert not needs_bootstrap(True, 11, 12)


def test_a_diverged_source_refuses_streams_and_snapshots_naming_it() -> None:
    msg = frames.diverged_refusal(7, b"\x01" * 32, "diverged")
    for mode in (frames.MODE_STREAM, frames.MODE_SNAPSHOT):
        got = decide(_hello(mode=mode), source_id=SRC, db_id=DB, first_retained=1, diverged=msg)
        assert got is not None and got.code == frames.REFUSE_DIVERGED and got.message == msg
