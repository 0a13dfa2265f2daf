"""Time to live: how a write says when its key expires, and the bounds — pure rules.

Every write path (HTTP `?ttl=` / `?expires_at=`, a batch op's ``"ttl"`` / ``"expires_at"``,
KT's ``xt``, memcached's ``exptime``) turns what the client sent into one absolute
deadline in µs since the Unix epoch (`store.ops.Op.deadline`) here, so the bounds and
their messages are the same whatever the protocol. The root alone acts on a deadline
(`gateway/expirer.py`).

Bounds: a deadline at least `MIN_TTL_S` and at most `MAX_TTL_S` after the request; anything
else is refused (400) naming the bound. A duration is ``90s``, ``5m``, ``1h``, ``2d``, a
combination such as ``1h30m``, or a bare number of seconds.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from email.utils import format_datetime, parsedate_to_datetime

from core.errors import BadRequestError

MIN_TTL_S = 1
MAX_TTL_S = 365 * 86400
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def now_us() -> int:
    """The wall clock in µs since the epoch (what deadlines are measured against)."""
    return time.time_ns() // 1000


def parse_duration(text: str) -> float:
    """Seconds of a duration (``90s``, ``5m``, ``1h30m``, ``2d``, or a bare number of
    seconds); BadRequestError when it is none."""
    t = text.strip().lower()
    if _NUMBER.fullmatch(t):
        return float(t)
    pos, total = 0, 0.0
    for m in _PART.finditer(t):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(t) or not t:
        raise BadRequestError(
            f"ttl {text!r} is not a duration",
            hint="give a number of seconds or a duration such as 90s, 5m, 1h, 1h30m, 2d",
        )
    return total


def check_ttl(seconds: float) -> None:
    """Refuse a time to live outside [`MIN_TTL_S`, `MAX_TTL_S`], naming the bound."""
    if seconds < MIN_TTL_S:
        raise BadRequestError(
            f"ttl of {seconds:g} s is below the minimum of {MIN_TTL_S} s",
            hint="keys expire at least 1 s after their write; delete a key to remove it now",
        )
    if seconds > MAX_TTL_S:
        raise BadRequestError(
            f"ttl of {seconds:g} s is above the maximum of {MAX_TTL_S} s (one year)",
            hint="write the key again before the year is out to keep it longer",
        )


def deadline_after(seconds: float, now: int) -> int:
    """The deadline (µs) `seconds` after `now` (µs), bounds checked."""
    check_ttl(seconds)
    return now + round(seconds * 1_000_000)


def parse_rfc3339(text: str) -> int:
    """µs since the epoch of an RFC 3339 timestamp with its offset (``Z`` or ``+hh:mm``)."""
    t = text.strip()
    try:
        dt = datetime.fromisoformat(t[:-1] + "+00:00" if t[-1:] in "zZ" and t else t)
    except ValueError as err:
        raise BadRequestError(
            f"expires_at {text!r} is not an RFC 3339 timestamp",
            hint="e.g. 2027-01-31T18:00:00Z",
        ) from err
    if dt.tzinfo is None:
        raise BadRequestError(
            f"expires_at {text!r} has no UTC offset", hint="end it with Z or +hh:mm"
        )
    return round(dt.timestamp() * 1_000_000)


def deadline_at(expires_us: int, now: int) -> int:
    """An absolute deadline (µs), checked against the same bounds as a ttl."""
    check_ttl((expires_us - now) / 1_000_000)
    return expires_us


def deadline_of(ttl: str | float | None, expires_at: str | None, now: int) -> int:
    """The deadline (µs) a write asked for with `ttl` (a duration, or seconds) or
    `expires_at` (RFC 3339); 0 when neither. Both at once is refused."""
    if ttl is not None and expires_at is not None:
        raise BadRequestError("give ttl or expires_at, not both")
    if ttl is not None:
        if isinstance(ttl, bool) or not isinstance(ttl, (str, int, float)):
            raise BadRequestError("ttl must be a duration string or a number of seconds")
        seconds = parse_duration(ttl) if isinstance(ttl, str) else float(ttl)
        return deadline_after(seconds, now)
    if expires_at is not None:
        if not isinstance(expires_at, str):
            raise BadRequestError("expires_at must be an RFC 3339 string")
        return deadline_at(parse_rfc3339(expires_at), now)
    return 0


def rfc3339(deadline_us: int) -> str:
    """A deadline as RFC 3339 in UTC, to the microsecond when it has any."""
    dt = datetime.fromtimestamp(deadline_us / 1_000_000, UTC)
    return dt.isoformat(timespec="microseconds" if deadline_us % 1_000_000 else "seconds").replace(
        "+00:00", "Z"
    )


def http_date(deadline_us: int) -> str:
    """A deadline as an HTTP date (the ``Expires`` header): whole seconds, rounded down,
    so a cache that honours it never keeps the value past its deadline."""
    return format_datetime(datetime.fromtimestamp(deadline_us // 1_000_000, UTC), usegmt=True)


def ttl_left(deadline_us: int, now: int) -> float:
    """Seconds left until `deadline_us` (0 once due)."""
    return max(0.0, (deadline_us - now) / 1_000_000)


def headers(deadline_us: int) -> dict[str, str]:
    """The response headers of a value whose key expires at `deadline_us` (none when 0):
    ``Expires`` (an HTTP date, whole seconds) and ``X-Mercury-Expires-At`` (RFC 3339, to
    the µs)."""
    if not deadline_us:
        return {}
    return {"Expires": http_date(deadline_us), "X-Mercury-Expires-At": rfc3339(deadline_us)}


#: memcached's cut-off: an exptime up to 30 days is relative seconds, beyond it a Unix time.
MEMCACHED_RELATIVE_MAX = 30 * 86400
#: `memcached_deadline`'s answer for a time already past: the item is gone at once.
EXPIRED_NOW = -1


def memcached_deadline(exptime: int, now: int) -> int:
    """The deadline (µs) of a memcached `exptime`: 0 for none (exptime 0); `EXPIRED_NOW`
    for an item memcached would expire at once (a negative exptime, or a Unix time not
    after now); else relative seconds up to 30 days, a Unix time beyond — within the bounds
    every write path has (BadRequestError naming them)."""
    if exptime == 0:
        return 0
    if exptime < 0:
        return EXPIRED_NOW
    if exptime <= MEMCACHED_RELATIVE_MAX:
        return deadline_after(exptime, now)
    at = exptime * 1_000_000
    if at <= now:
        return EXPIRED_NOW
    return deadline_at(at, now)


def bridge_expiry(xt: int, none: int, now: int) -> int:
    """The deadline (µs) the KT bridge gives a key whose KT expiry is `xt` (absolute
    seconds; `none`: KT's "never"): 0 for none, `EXPIRED_NOW` when already past. KT allows
    what Mercury's bounds do not, and a bridge must not stop on it: a deadline under 2 s
    ahead is moved to 2 s (the least a write may ask, 1 s, with a second for the batch to
    reach the root, which checks it against its own clock), one beyond a year is dropped
    (the key then does not expire: no deadline may lie past the bound)."""
    if xt == none:
        return 0
    at = xt * 1_000_000
    if at <= now:
        return EXPIRED_NOW
    if at - now > MAX_TTL_S * 1_000_000:
        return 0
    return max(at, now + (MIN_TTL_S + 1) * 1_000_000)


def kt_deadline(xt: bytes | None, now: int) -> int:
    """The deadline (µs) of Kyoto Tycoon's `xt` parameter: 0 when absent; seconds from now
    when positive, a Unix time when negative (KT's rule); `EXPIRED_NOW` for a Unix time
    not after now; bounds as for every write (BadRequestError naming them)."""
    if xt is None:
        return 0
    text = xt.strip()
    neg = text[:1] == b"-"
    digits = text[1:] if neg else text
    if not digits.isdigit() or len(digits) > 19:
        raise BadRequestError(f"xt {xt.decode('latin-1')!r} is not an integer")
    n = int(digits)
    if not neg:
        return deadline_after(n, now)
    at = n * 1_000_000
    if at <= now:
        return EXPIRED_NOW
    return deadline_at(at, now)


#: KT's "never" (XTMAX, 40 bits): a binary record's `xt` at or above it sets no deadline
#: (KT clients send INT64_MAX for "no expiry"; KT clamps it to XTMAX).
KT_XT_NEVER = (1 << 40) - 1


def kt_binary_deadline(xt: int, now: int) -> int:
    """The deadline (µs) of a binary set_bulk record's `xt` (signed 64 bits): none when it
    is at or beyond `KT_XT_NEVER` either way (KT clamps a Unix time, `-xt`, there too), else
    KT's rule as for the RPC parameter (`kt_deadline`)."""
    if abs(xt) >= KT_XT_NEVER:
        return 0
    return kt_deadline(b"%d" % xt, now)


def kt_rest_deadline(header: str | None, now: int) -> int:
    """The deadline (µs) of a KT REST `PUT`'s ``X-Kt-Xt``: an absolute time, as KT's own
    clients send it (Unix seconds, or a date: RFC 1123 as in HTTP, or W3CDTF/RFC 3339);
    0 when absent; `EXPIRED_NOW` when not after now; bounds as for every write."""
    if header is None:
        return 0
    text = header.strip()
    if text.isdigit() and len(text) <= 19:
        at = int(text) * 1_000_000
    else:
        try:
            at = int(parsedate_to_datetime(text).timestamp() * 1_000_000)
        except (TypeError, ValueError, IndexError):
            try:
                at = parse_rfc3339(text)
            except BadRequestError:
                raise BadRequestError(
                    f"X-Kt-Xt {text!r} is neither Unix seconds nor a date (RFC 1123, RFC 3339)"
                ) from None
    if at <= now:
        return EXPIRED_NOW
    return deadline_at(at, now)


def kt_xt(deadline_us: int) -> int:
    """The `xt` KT answers for a deadline: Unix seconds, rounded down (as `Expires`: a
    client that honours it never keeps the value past its deadline); `KT_XT_NEVER` for 0."""
    return deadline_us // 1_000_000 if deadline_us else KT_XT_NEVER
