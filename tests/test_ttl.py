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
