"""Audit records of admin changes: who, when, what and the diff (pure, no I/O).

Each admin change (producers, consumers, keyspaces, quotas, tokens, the whole document)
is stored as one replicated document ``audit/<time µs, 20 digits>-<8 hex>`` in the same
transaction as the ACL it changed (`store/docs.py`), so every replica holds the history
and the names sort by time. The seq of the log entry that wrote a record is its ``seq``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from core.errors import BadRequestError

PREFIX = "audit/"


def name(time_us: int, suffix: str) -> str:
    """The document name of a record made at `time_us` (`suffix`: a few random hex digits
    keeping two records of one microsecond apart)."""
    return f"{PREFIX}{time_us:020d}-{suffix}"


def record(who: str, action: str, target: str, diff: list[str], time_us: int) -> bytes:
    """The stored bytes of one audit record."""
    return orjson.dumps(
        {"time_us": time_us, "who": who, "action": action, "target": target, "diff": diff}
    )


def rfc3339(time_us: int) -> str:
    """`time_us` as an RFC 3339 UTC time with microseconds."""
    return datetime.fromtimestamp(time_us / 1e6, UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Since:
    """Where a listing starts: after log seq `seq`, or at time `time_us` (inclusive)."""

    seq: int = 0
    time_us: int = 0


def parse_since(text: str | None) -> Since:
    """``since=`` of ``GET /v1/admin/audit``: a seq (digits) or an RFC 3339 time."""
    if not text:
        return Since()
    if text.isdigit():
        return Since(seq=int(text))
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as err:
        raise BadRequestError(
            f"since must be a seq or an RFC 3339 time, got {text!r}",
            hint="e.g. since=1200 or since=2026-01-31T12:00:00Z",
        ) from err
    if t.tzinfo is None:
        raise BadRequestError("since: an RFC 3339 time needs its offset (Z or +hh:mm)")
    return Since(time_us=int(t.timestamp() * 1_000_000))


def view(seq: int, body: bytes) -> dict[str, Any]:
    """A stored record as `GET /v1/admin/audit` lists it."""
    d: dict[str, Any] = orjson.loads(body)
    return {"seq": seq, "time": rfc3339(int(d["time_us"])), **d}


def selected(seq: int, body: bytes, since: Since) -> bool:
    """Whether a record belongs to a listing that starts at `since`."""
    if since.seq and seq <= since.seq:
        return False
    return not since.time_us or int(orjson.loads(body)["time_us"]) >= since.time_us
