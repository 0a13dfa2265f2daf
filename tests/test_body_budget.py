"""`net.asgibody`'s body budget: a body takes each piece from the process's budget as it
arrives and gives it all back whatever way its reading ends; a piece the budget cannot
take now refuses its body with a retryable 503, a Content-Length that could never fit is a
413."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest

from core.errors import OverloadedError, RequestTimeoutError, TooLargeError
from net import asgibody
from net.asgibody import read_body


@pytest.fixture
def budget() -> Iterator[asgibody.BodyBudget]:
    saved = asgibody.BODIES.limit
    asgibody.BODIES.limit = 1000
    assert asgibody.BODIES.held == 0
    try:
        yield asgibody.BODIES
    finally:
        asgibody.BODIES.limit = saved


def _pieces(*chunks: bytes, stall: bool = False) -> Any:
    it = iter(chunks)

    async def receive() -> MutableMapping[str, Any]:
        try:
            chunk = next(it)
        except StopIteration:
            if stall:
                await asyncio.sleep(60)  # the client goes silent (the idle timeout ends it)
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": chunk, "more_body": True}

    return receive


def _whole(body: bytes) -> Any:
    async def receive() -> MutableMapping[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def test_a_body_holds_what_has_arrived_and_gives_it_back(
    budget: asgibody.BodyBudget,
) -> None:
    async def main() -> None:
        gate = asyncio.Event()
        sent = [b"x" * 600]

        async def receive() -> MutableMapping[str, Any]:
            if sent:  # 600 bytes arrive, then the client pauses
                return {"type": "http.request", "body": sent.pop(), "more_body": True}
            await gate.wait()
            return {"type": "http.request", "body": b"", "more_body": False}

        first = asyncio.create_task(read_body(receive, "600", 10_000, "body"))
        await asyncio.sleep(0)  # one loop turn: it takes the 600 bytes and waits for more
        assert budget.held == 600  # what arrived
        # A head announcing 600 more takes nothing; its bytes find the budget short.
        with pytest.raises(OverloadedError) as err:  # 600 + 600 > 1000: retry later
            await read_body(_whole(b"y" * 600), "600", 10_000, "body")
        assert err.value.retryable and err.value.fields["headers"] == {"Retry-After": "1"}
        assert budget.held == 600
        assert await read_body(_whole(b"z" * 400), "400", 10_000, "body") == b"z" * 400
        gate.set()
        assert await first == b"x" * 600
        assert budget.held == 0

    asyncio.run(main())


def test_a_head_alone_takes_nothing(budget: asgibody.BodyBudget) -> None:
    async def main() -> None:
        async def never() -> MutableMapping[str, Any]:
            await asyncio.sleep(60)  # a client that sends nothing (cancelled below)
            raise AssertionError("not reached")

        # Announcing the whole budget and sending nothing holds nothing: others are served.
        waiting = asyncio.create_task(read_body(never, "1000", 10_000, "body"))
        await asyncio.sleep(0)  # one loop turn: it has the head and waits for a body
        assert budget.held == 0
        assert await read_body(_whole(b"w" * 1000), "1000", 10_000, "body") == b"w" * 1000
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert budget.held == 0

    asyncio.run(main())


def test_chunked_pieces_are_taken_as_they_come(budget: asgibody.BodyBudget) -> None:
    async def main() -> None:
        budget.take(300, "another body")  # another body holds 300
        try:
            with pytest.raises(OverloadedError):  # 300 + 600 + 200 > 1000
                await read_body(_pieces(b"a" * 600, b"b" * 200), None, 10_000, "body")
        finally:
            budget.give(300)
        assert budget.held == 0

    asyncio.run(main())


def test_every_other_ending_gives_the_bytes_back(budget: asgibody.BodyBudget) -> None:
    async def main() -> None:
        with pytest.raises(RequestTimeoutError):
            await read_body(_pieces(b"a" * 100, stall=True), "900", 10_000, "b", idle_timeout_s=0.1)
        assert budget.held == 0
        with pytest.raises(Exception, match="disconnected"):
            await read_body(_pieces(b"a" * 100), "900", 10_000, "body")
        assert budget.held == 0
        with pytest.raises(TooLargeError, match="exceeds 500"):  # the body's own bound
            await read_body(_pieces(b"a" * 600), None, 500, "body")
        assert budget.held == 0

    asyncio.run(main())


def test_a_body_larger_than_the_whole_budget_is_413_not_retryable(
    budget: asgibody.BodyBudget,
) -> None:
    async def main() -> None:
        with pytest.raises(TooLargeError, match="at most 1000 bytes of request bodies"):
            await read_body(_whole(b""), "1001", 10_000, "body")
        assert budget.held == 0
        # Chunked, no length announced: 413 as it passes the whole budget, never a 503
        # that no retry could turn into a success.
        with pytest.raises(TooLargeError, match="exceeds 1000 bytes"):
            await read_body(_pieces(b"a" * 600, b"b" * 600), None, 10_000, "body")
        assert budget.held == 0

    asyncio.run(main())
