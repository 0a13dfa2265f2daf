"""Waiting for a condition instead of sleeping for it (tests and benches).

A fixed sleep is either too short on a loaded machine (the test then checks something
that has not happened yet, or passes for the wrong reason) or too long everywhere else.
These helpers poll the condition itself, bounded in time, and name it when it never
comes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: Seconds between two polls: short against the waits tests make (tens of ms and up),
#: long enough not to load the 2 shared cores with polling.
INTERVAL = 0.02
#: A wait that has lasted this long polls every `SLOW_INTERVAL` from then on. Most
#: predicates are an HTTP request to a process under test (about 1.5 ms of its CPU and as
#: much of the test's), so 50 polls a second through a long wait (a replica catching up, a
#: timeout running out) took a tenth of a core from a CPU-bound run; a condition that came
#: after a second of waiting is seen at most 0.1 s later.
SETTLE = 1.0
SLOW_INTERVAL = 0.1


def pause(started: float, interval: float | None = None) -> float:
    """Seconds to sleep before the next poll of a wait that began at `started`
    (`time.monotonic()`): `interval` when the caller chose one, else `INTERVAL` for the
    first `SETTLE` seconds and `SLOW_INTERVAL` after."""
    if interval is not None:
        return interval
    return INTERVAL if time.monotonic() - started < SETTLE else SLOW_INTERVAL


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float = 30.0,
    what: str = "condition",
    *,
    ignore: tuple[type[BaseException], ...] = (),
    interval: float | None = None,
) -> T:
    """Poll `predicate` until it returns something truthy (None and False are "not
    yet"), and return that.

    `ignore`: exceptions that count as "not yet" (a server still starting refuses
    connections); any other one fails the wait at once. TimeoutError naming `what` (and
    the last ignored exception) after `timeout` seconds.
    """
    started = time.monotonic()
    deadline = started + timeout
    last: BaseException | None = None
    while True:
        try:
            got = predicate()
        except ignore as e:
            last = e
        else:
            if got:
                return got
        if time.monotonic() >= deadline:
            detail = f" (last: {last!r})" if last is not None else ""
            raise TimeoutError(f"{what} not reached after {timeout}s{detail}")
        time.sleep(pause(started, interval))


async def wait_until_async(
    predicate: Callable[[], T | Awaitable[T | None] | None],
    timeout: float = 30.0,
    what: str = "condition",
    *,
    interval: float | None = None,
) -> T:
    """`wait_until` inside an event loop: polls without blocking it; `predicate` may be a
    plain function or a coroutine function."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        got = predicate()
        if isinstance(got, Awaitable):
            got = await got
        if got:
            return got
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached after {timeout}s")
        await asyncio.sleep(pause(started, interval))
