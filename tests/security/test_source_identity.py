"""A replica never follows a source that welcomes it with another store's db id, even when
that source (lying, or misconfigured) accepted the replica's HELLO: a real
`ReplicaClient` against a fake source on a real socket."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from replicator import frames, wire
from replicator.client import ReplicaClient
from replicator.heartbeat import RelayedHeartbeat
from replicator.selection import Selector
from replicator.status import StatusBoard
from store.store import Store
from testkit.wait import wait_until_async


async def _lying_source(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Accept any HELLO with a WELCOME naming a db id of its own, then stay silent until
    the replica hangs up."""
    try:
        await wire.read_frame(reader)
        welcome = frames.Welcome(
            frames.PROTOCOL_VERSION, uuid.uuid4().bytes, uuid.uuid4().bytes, 10, 1, 1000
        )
        await wire.send(writer, frames.encode_welcome(welcome))
        async with asyncio.timeout(30):
            await reader.read()  # silent: the next thing is the replica's close
    finally:
        await wire.close(writer)


def test_a_welcome_with_another_db_id_is_refused(tmp_path: Path) -> None:
    store = Store.create(str(tmp_path / "replica"), sync=False)

    async def run() -> StatusBoard:
        server = await asyncio.start_server(_lying_source, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        board = StatusBoard(str(tmp_path / "replica"))
        states: list[str] = []
        update = board.update

        def spy(**changes: object) -> None:
            if "state" in changes:
                states.append(str(changes["state"]))
            update(**changes)

        board.update = spy  # type: ignore[method-assign]
        client = ReplicaClient(
            store,
            Selector([("127.0.0.1", port)]),
            node_id=uuid.uuid4().bytes,
            board=board,
            relay=RelayedHeartbeat(),
        )
        task = asyncio.create_task(client.run())
        # Refused twice: after the first refusal it came back, and was refused again.
        await wait_until_async(
            lambda: board.status.errors.get("refused", 0) >= 2, 30, "two refusals"
        )
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        server.close()
        await server.wait_closed()
        assert "streaming" not in states, states
        return board

    try:
        board = asyncio.run(run())
        assert board.status.errors.get("refused", 0) >= 2, board.status.errors
        assert "not following it" in (board.status.error or "")
        assert store.last_seq() == 0
    finally:
        store.close()
