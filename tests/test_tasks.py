"""`core.tasks.cancel_and_wait` stops a task that swallowed a cancellation (what Python
3.11's `asyncio.wait_for` does when the cancellation races with its operation's end)."""

from __future__ import annotations

import asyncio

from core.tasks import cancel_and_wait, cancelling


def test_a_task_that_swallows_one_cancellation_is_still_stopped() -> None:
    swallowed = 0
    seen_cancelling: list[bool] = []
    running = asyncio.Event()

    async def stubborn() -> None:
        nonlocal swallowed
        running.set()
        while True:
            try:
                await asyncio.sleep(0.01)  # its operation
            except asyncio.CancelledError:
                swallowed += 1
                seen_cancelling.append(cancelling())
                if swallowed > 1:
                    raise
                # like wait_for on 3.11: the outcome of the operation instead

    async def main() -> None:
        task = asyncio.ensure_future(stubborn())
        await running.wait()  # inside its operation: a cancellation now is one it swallows
        await asyncio.wait_for(cancel_and_wait(task, every_s=0.05), 5)
        assert task.done() and task.cancelled()

    asyncio.run(main())
    assert swallowed == 2
    assert seen_cancelling[0] is True  # a retry loop can tell it was asked to stop


def test_a_finished_task_is_left_alone() -> None:
    async def main() -> None:
        task = asyncio.ensure_future(asyncio.sleep(0, result=7))
        await task
        await cancel_and_wait(task)
        assert task.result() == 7

    asyncio.run(main())
