"""Stopping a task for sure.

Python 3.11's `asyncio.wait_for` can swallow a cancellation that arrives as the awaited
operation completes (it then returns or raises that operation's outcome instead): a retry
loop built on it, such as a replica's reconnect loop, then carries on as if never
cancelled, and whoever awaits it after `cancel()` waits for ever. A replica worker whose
parent had died was found still reconnecting an hour later that way. `cancel_and_wait`
cancels again until the task is done; a second cancellation is delivered at its next
`await`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(
    task: asyncio.Task[Any] | asyncio.Future[Any], every_s: float = 1.0
) -> None:
    """Cancel `task` and wait until it is done, cancelling it again every `every_s` while
    it runs on. Its outcome (result, error or cancellation) is not raised here."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=every_s)
    with contextlib.suppress(BaseException):
        task.result()


def cancelling() -> bool:
    """Whether the current task has been asked to cancel (a retry loop checks it after an
    error that may have swallowed the cancellation)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
