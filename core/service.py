"""What a process runs beside its main server: a long-lived asyncio service."""

from __future__ import annotations

from typing import Protocol


class Service(Protocol):
    """A background service started and stopped by a process's lifespan.

    `start` returns once the service is listening/running; `stop` returns once it has
    released its sockets and tasks. Both are called on the process's event loop.
    """

    name: str

    async def start(self) -> None:
        """Start serving."""

    async def stop(self) -> None:
        """Stop serving and release resources."""
