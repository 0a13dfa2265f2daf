"""The segmented LRU: bounded in bytes, and one scan does not flush the hot set."""

from __future__ import annotations

import random

from cache.policy import Slru


def test_bytes_stay_within_the_budget() -> None:
    p = Slru(1000)
    rng = random.Random(1)
    for _i in range(2000):
        k = b"%d" % rng.randrange(300)
        p.admit(k, rng.randrange(1, 200))
        if rng.random() < 0.5:
            p.touch(k)
        assert p.held_bytes <= 1000


def test_an_entry_larger_than_the_budget_is_not_held() -> None:
    p = Slru(100)
    assert p.admit(b"big", 101) == [b"big"]
    assert b"big" not in p and p.held_bytes == 0


def test_a_scan_does_not_evict_the_hot_set() -> None:
    p = Slru(100 * 10)
    hot = [b"hot%d" % i for i in range(50)]
    for k in hot:  # read twice: protected
        p.admit(k, 10)
        p.touch(k)
    for i in range(10_000):  # every other key, once
        p.admit(b"scan%d" % i, 10)
    assert all(k in p for k in hot)


def test_an_lru_would_have_lost_it() -> None:
    # The same scan against a protected share too small for the hot set: the policy is
    # what keeps it, not the budget alone (the test above fails on a plain LRU).
    p = Slru(100 * 10, protected_share=0.01)
    hot = [b"hot%d" % i for i in range(50)]
    for k in hot:
        p.admit(k, 10)
        p.touch(k)
    for i in range(10_000):
        p.admit(b"scan%d" % i, 10)
    assert sum(k in p for k in hot) <= 1
