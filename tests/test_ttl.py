"""The TTL rules every write path shares (`core/ttl.py`): durations, RFC 3339, the bounds."""

from __future__ import annotations

import pytest

from core import ttl
from core.errors import BadRequestError

NOW = 1_800_000_000_000_000  # µs


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("5m", 300),
        ("1h", 3600),
        ("1h30m", 5400),
        ("2d", 172800),
        ("45", 45),
        ("1.5", 1.5),
        ("1500ms", 1.5),
        (" 10S ", 10),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert ttl.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "s", "5x", "1h-2m", "m5", "1 h", "-5", "5m1"])
def test_what_is_no_duration_is_refused(text: str) -> None:
    with pytest.raises(BadRequestError, match="not a duration"):
        ttl.parse_duration(text)


def test_the_bounds_are_named() -> None:
    assert ttl.deadline_of("1s", None, NOW) == NOW + 1_000_000
    assert ttl.deadline_of(365 * 86400, None, NOW) == NOW + 365 * 86400 * 1_000_000
    with pytest.raises(BadRequestError, match="minimum of 1 s"):
        ttl.deadline_of("999ms", None, NOW)
    with pytest.raises(BadRequestError, match="maximum of 31536000 s"):
        ttl.deadline_of(365 * 86400 + 1, None, NOW)
    with pytest.raises(BadRequestError, match="not both"):
        ttl.deadline_of("5s", "2030-01-01T00:00:00Z", NOW)
    with pytest.raises(BadRequestError, match="ttl must be"):
        ttl.deadline_of(True, None, NOW)
    assert ttl.deadline_of(None, None, NOW) == 0


def test_expires_at_round_trips_and_is_bounded() -> None:
    at = "2027-01-15T08:00:00Z"
    us = ttl.parse_rfc3339(at)
    assert ttl.rfc3339(us) == at
    assert ttl.parse_rfc3339("2027-01-15T09:00:00+01:00") == us
    assert ttl.rfc3339(us + 5) == "2027-01-15T08:00:00.000005Z"
    assert ttl.deadline_of(None, at, us - 10_000_000) == us
    with pytest.raises(BadRequestError, match="minimum"):
        ttl.deadline_of(None, at, us)  # now: not 1 s ahead
    with pytest.raises(BadRequestError, match="no UTC offset"):
        ttl.parse_rfc3339("2027-01-15T08:00:00")
    with pytest.raises(BadRequestError, match="RFC 3339"):
        ttl.parse_rfc3339("tomorrow")


def test_headers_round_down_to_the_second() -> None:
    us = ttl.parse_rfc3339("2027-01-15T08:00:00Z") + 999_999
    h = ttl.headers(us)
    assert h["Expires"] == "Fri, 15 Jan 2027 08:00:00 GMT"
    assert h["X-Mercury-Expires-At"] == "2027-01-15T08:00:00.999999Z"
    assert ttl.headers(0) == {}


def test_memcached_exptime() -> None:
    assert ttl.memcached_deadline(0, NOW) == 0
    assert ttl.memcached_deadline(-1, NOW) == ttl.EXPIRED_NOW
    assert ttl.memcached_deadline(60, NOW) == NOW + 60_000_000  # relative up to 30 days
    assert ttl.memcached_deadline(30 * 86400, NOW) == NOW + 30 * 86400 * 1_000_000
    unix = NOW // 1_000_000 + 3600  # beyond 30 days: a Unix time
    assert ttl.memcached_deadline(unix, NOW) == unix * 1_000_000
    assert ttl.memcached_deadline(NOW // 1_000_000 - 5, NOW) == ttl.EXPIRED_NOW
    with pytest.raises(BadRequestError, match="maximum"):
        ttl.memcached_deadline(NOW // 1_000_000 + 400 * 86400, NOW)


def test_the_bridge_carries_kt_expiry_within_the_bounds() -> None:
    none = (1 << 40) - 1
    s = NOW // 1_000_000
    assert ttl.bridge_expiry(none, none, NOW) == 0
    assert ttl.bridge_expiry(s - 1, none, NOW) == ttl.EXPIRED_NOW
    assert ttl.bridge_expiry(s + 60, none, NOW) == (s + 60) * 1_000_000
    assert ttl.bridge_expiry(s + 1, none, NOW) == NOW + 2_000_000  # moved to what is taken
    assert ttl.bridge_expiry(s + 400 * 86400, none, NOW) == 0  # past the bound: none


def test_kt_xt() -> None:
    assert ttl.kt_deadline(None, NOW) == 0
    assert ttl.kt_deadline(b"60", NOW) == NOW + 60_000_000  # relative seconds
    at = NOW // 1_000_000 + 3600
    assert ttl.kt_deadline(b"-%d" % at, NOW) == at * 1_000_000  # negative: a Unix time
    assert ttl.kt_deadline(b"-5", NOW) == ttl.EXPIRED_NOW
    with pytest.raises(BadRequestError, match="not an integer"):
        ttl.kt_deadline(b"1.5", NOW)
    with pytest.raises(BadRequestError, match="minimum"):
        ttl.kt_deadline(b"0", NOW)
