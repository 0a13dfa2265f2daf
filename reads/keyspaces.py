"""A filtered replica's reads outside its keyspaces: 421 problem+json naming where they
are served.

A replica started with ``--keyspace`` holds only the keys under its prefixes
(`replicator/filter.py`); a key outside them is not "missing", it is not held here, so a
404 would lie. Point gets (a miss only: a key outside is never stored, so a hit costs
nothing more), get_bulk, range reads and watches outside get a 421 whose problem document
names this node's keyspaces and its replication sources (`sources`: the addresses of the
nodes it follows, each of which holds every key it does and more).
Each reader process sets them once at start (`configure`).
"""

from __future__ import annotations

from collections.abc import Iterable

from core.errors import OutsideKeyspaceError
from reads.problems import problem_body
from store.filtered import holds_range

#: This node's prefixes (None: every key) and its replication sources (`--source`).
_held: tuple[bytes, ...] | None = None
_sources: tuple[str, ...] = ()

TITLE = "Not held by this filtered replica"


def configure(held: tuple[bytes, ...] | None, sources: Iterable[str]) -> None:
    """Set this process's keyspaces (None: a full node) and its replication sources."""
    global _held, _sources
    _held = held
    _sources = tuple(sources)


def held() -> tuple[bytes, ...] | None:
    """This node's prefixes (None: every key)."""
    return _held


def _names(prefixes: Iterable[bytes]) -> list[str]:
    return [p.decode("utf-8", "backslashreplace") for p in prefixes]


def _detail(what: str) -> tuple[str, str]:
    assert _held is not None
    detail = (
        f"{what} outside this filtered replica's keyspaces "
        f"({', '.join(repr(p) for p in _names(_held))})"
    )
    hint = (
        f"read it from the node this replica follows (replication source "
        f"{', '.join(_sources)}) or any full replica"
        if _sources
        else "read it from a full replica"
    )
    return detail, hint


def outside_key_body(key: bytes) -> bytes | None:
    """The 421 problem body for a point get of `key` when it lies outside (None: inside,
    or a full node)."""
    if _held is None or key.startswith(_held):
        return None
    detail, hint = _detail(f"key {key.decode('utf-8', 'backslashreplace')!r} is")
    return problem_body(
        421,
        "outside-keyspace",
        detail,
        title=TITLE,
        hint=hint,
        keyspaces=_names(_held),
        sources=list(_sources),
    )


def _error(what: str) -> OutsideKeyspaceError:
    detail, hint = _detail(what)
    return OutsideKeyspaceError(detail, hint=hint)


def check_keys(keys: Iterable[bytes]) -> None:
    """Raise OutsideKeyspaceError (421) when any of `keys` lies outside."""
    if _held is None:
        return
    outside = [k for k in keys if not k.startswith(_held)]
    if outside:
        names = ", ".join(repr(k.decode("utf-8", "backslashreplace")) for k in outside[:5])
        more = f" and {len(outside) - 5} more" if len(outside) > 5 else ""
        raise _error(f"keys {names}{more} are")


def check_range(start: bytes, end: bytes | None) -> None:
    """Raise OutsideKeyspaceError (421) unless every key of [start, end) is held."""
    if not holds_range(_held, start, end):
        raise _error("this range reaches")


def outside_message(keys: Iterable[bytes]) -> str | None:
    """One line saying the first of `keys` outside is not held here and where to read it
    (None: every key inside, or a full node): for protocols with no problem document."""
    if _held is None:
        return None
    outside = next((k for k in keys if not k.startswith(_held)), None)
    if outside is None:
        return None
    detail, hint = _detail(f"key {outside.decode('ascii', 'backslashreplace')!r} is")
    return f"{detail}; {hint}".replace("\r", " ").replace("\n", " ")


def memcached_refusal(keys: Iterable[bytes]) -> bytes | None:
    """The memcached answer to a get naming a key outside (None: every key inside, or a
    full node): a SERVER_ERROR line, not the END of a miss, which would deny the key."""
    message = outside_message(keys)
    if message is None:
        return None
    return b"SERVER_ERROR " + message.encode("ascii", "backslashreplace") + b"\r\n"


def holds_prefix(prefix: bytes) -> bool:
    """Whether every key under `prefix` is held (an empty prefix: every key)."""
    return _held is None or (bool(prefix) and prefix.startswith(_held))


def check_prefixes(prefixes: Iterable[bytes]) -> None:
    """Raise OutsideKeyspaceError (421) unless every key under `prefixes` is held (a
    watch)."""
    if _held is None:
        return
    outside = [p for p in prefixes if not p.startswith(_held)]
    if outside:
        raise _error(f"prefixes {', '.join(repr(p) for p in _names(outside))} reach")
