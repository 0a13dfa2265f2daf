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


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float = 30.0,
    what: str = "condition",
    *,
    ignore: tuple[type[BaseException], ...] = (),
    interval: float = INTERVAL,
) -> T:
    """Poll `predicate` until it returns something truthy (None and False are "not
    yet"), and return that.

    `ignore`: exceptions that count as "not yet" (a server still starting refuses
    connections); any other one fails the wait at once. TimeoutError naming `what` (and
    the last ignored exception) after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
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
        time.sleep(interval)


async def wait_until_async(
    predicate: Callable[[], T | Awaitable[T | None] | None],
    timeout: float = 30.0,
    what: str = "condition",
    *,
    interval: float = INTERVAL,
) -> T:
    """`wait_until` inside an event loop: polls without blocking it; `predicate` may be a
    plain function or a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if isinstance(got, Awaitable):
            got = await got
        if got:
            return got
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached after {timeout}s")
        await asyncio.sleep(interval)
