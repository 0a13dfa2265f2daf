"""The consistency rules' edge cases, one scenario each (the stateful property test,
tests/property/test_cache_rules.py, explores them at random)."""

from __future__ import annotations

from cache.rules import Coherence, Install


def test_an_answer_at_or_after_the_horizon_is_installed() -> None:
    c = Coherence(applied=5)
    assert c.decide(None, 5, b"k") is Install.INSTALL
    assert c.decide(None, 9, b"k") is Install.INSTALL


def test_an_entry_read_later_is_kept_over_an_older_answer() -> None:
    c = Coherence(applied=5)
    assert c.decide(8, 7, b"k") is Install.KEEP
    assert c.decide(8, 8, b"k") is Install.KEEP
    assert c.decide(8, 9, b"k") is Install.INSTALL


def test_an_answer_behind_the_stream_is_installed_only_if_its_key_did_not_change() -> None:
    c = Coherence(applied=5)
    c.invalidate(8, [(6, b"other"), (7, b"k"), (8, b"other")], lambda _k: None)
    assert c.decide(None, 7, b"k") is Install.INSTALL  # k unchanged in (7, 8]
    assert c.decide(None, 6, b"k") is Install.STALE  # k changed at 7
    assert c.decide(None, 6, b"x") is Install.INSTALL


def test_an_answer_behind_an_answer_that_ran_ahead_is_stale() -> None:
    # An answer read at 10 was served while the stream had applied 5: changes in (5, 10]
    # are not known yet, so an answer read at 7 may be older than what a client saw.
    c = Coherence(applied=5)
    c.installed(10)
    assert c.decide(None, 7, b"k") is Install.STALE
    assert c.decide(None, 10, b"k") is Install.INSTALL


def test_forgotten_invalidations_raise_the_floor() -> None:
    c = Coherence(applied=0, recent_keys=2)
    c.invalidate(3, [(1, b"a"), (2, b"b"), (3, b"c")], lambda _k: None)
    assert c.floor == 1  # a's change at 1 was forgotten
    assert c.decide(None, 0, b"z") is Install.STALE  # below the floor: unknown
    assert c.decide(None, 1, b"z") is Install.INSTALL


def test_invalidation_drops_entries_read_before_the_change_only() -> None:
    c = Coherence(applied=0)
    held = {b"old": 1, b"new": 5}
    drop = c.invalidate(4, [(3, b"old"), (4, b"new")], held.get)
    assert drop == [b"old"]
    assert c.applied == 4 and c.horizon == 4


def test_restart_without_history_forgets_invalidations_and_keeps_the_horizon() -> None:
    c = Coherence(applied=5)
    c.installed(12)
    c.restart_at(9)
    assert (c.applied, c.horizon, c.floor, len(c.recent)) == (9, 12, 9, 0)
