"""Several URLs in the SDK (pure): where a call goes next, and how long retries go on."""

from __future__ import annotations

import pytest

from ha.lease import DEFAULT_TTL_S
from mercury_client import calls
from mercury_client.retry import (
    DEFAULT_BUDGET_S,
    DEFAULT_POLICY,
    HA_LEASE_TTL_S,
    RetryPolicy,
)


def test_urls_from_a_list_or_a_comma_separated_string() -> None:
    assert calls.node_urls("http://a:1, http://b:2/,") == ["http://a:1", "http://b:2"]
    assert calls.node_urls(["http://a:1", "https://b"]) == ["http://a:1", "https://b"]
    with pytest.raises(ValueError):
        calls.node_urls(" , ")
    with pytest.raises(ValueError):
        calls.node_urls("a:1")


def test_a_failed_url_moves_on_and_a_round_ends_once_each_failed() -> None:
    r = calls.Route(["http://a", "http://b", "http://c"])
    assert r.base() == "http://a"
    assert not r.failed() and r.base() == "http://b"
    assert not r.failed() and r.base() == "http://c"
    assert r.failed()  # every one failed: wait before the next round
    r.waited()
    assert r.base() == "http://a" and not r.failed()
    # An answer resets the round and is where the next calls start.
    r.answered("http://c/v1/kv/k")
    assert r.base() == "http://c"
    assert not r.failed() and not r.failed() and r.failed()


def test_a_leader_under_another_name_is_kept_until_it_fails() -> None:
    r = calls.Route(["http://a", "http://b"])
    r.answered("http://leader:8080/v1/kv/k?x=1")
    assert r.base() == "http://leader:8080"
    # Failing there is no candidate of ours failing: back to the list, no round counted.
    assert not r.failed() and r.base() == "http://a"
    assert not r.failed() and r.failed()


def test_the_default_budget_outlasts_a_failover_of_the_default_lease() -> None:
    assert HA_LEASE_TTL_S == DEFAULT_TTL_S  # the SDK's copy of the server's default
    assert DEFAULT_BUDGET_S >= DEFAULT_TTL_S + 2
    # Past its 6 tries the default policy goes on while the waits are under the budget...
    assert DEFAULT_POLICY.wait(20, {"Retry-After": "1"}, lambda: 0.0, waited=12.0) == 1.0
    assert DEFAULT_POLICY.wait(20, {}, lambda: 0.0, waited=DEFAULT_BUDGET_S) is None
    # ... a policy given without one stops at its tries, and 1 try is no retry at all.
    assert RetryPolicy(attempts=3).wait(2, {}, lambda: 0.0, waited=0.0) is None
    assert RetryPolicy(attempts=1, budget_s=60).wait(0, {}, lambda: 0.0) is None
