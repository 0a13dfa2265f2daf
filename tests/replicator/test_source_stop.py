"""A stopping `ReplicationSource` closes every connection, including ones accepted while it
stops: an HA leader that steps down stops its source and keeps running, so a connection
served after the stop would stream from a node that is no longer the source (and, in
tests, leave a socket for the garbage collector). Real sockets against a real source."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import pytest
import uvloop

from testkit.replication import RootNode


def _read_to_end(s: socket.socket, timeout: float) -> bool:
    """True when the peer closed `s` (EOF or reset) within `timeout` seconds, after one
    byte of a HELLO: a connection the kernel completed but nobody accepted (its accept
    queue was full when the listener closed) learns that only when it sends."""
    deadline = time.monotonic() + timeout
    try:
        s.sendall(b"\x00")
    except (ConnectionResetError, BrokenPipeError):
        return True
    while (left := deadline - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            if not s.recv(65536):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
    return False


async def _other_tasks() -> list[asyncio.Task[object]]:
    me = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t is not me and not t.done()]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_connections_arriving_while_the_source_stops_are_all_closed(
    tmp_path: Path, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if loop == "uvloop":  # the nodes' own loop (`core.eventloop`); the harness's is asyncio's
        monkeypatch.setattr(asyncio, "new_event_loop", uvloop.new_event_loop)
    for attempt in range(3):  # the race is one of timing: give it several chances
        root = RootNode(str(tmp_path / f"root{attempt}"), max_connections=1000)
        socks: list[socket.socket] = []
        lock = threading.Lock()
        done = threading.Event()

        def connect(
            port: int = root.port,
            socks: list[socket.socket] = socks,
            lock: threading.Lock = lock,
            done: threading.Event = done,
        ) -> None:
            # Bounded: until the listener is gone, at most 200 connections per thread.
            for _ in range(200):
                if done.is_set():
                    return
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=2)
                except OSError:
                    return  # the listener is closed
                with lock:
                    socks.append(s)

        threads = [threading.Thread(target=connect) for _ in range(4)]
        try:
            for t in threads:
                t.start()
            time.sleep(0.02 * (attempt + 1))
            root.call(root.source.stop())
            done.set()
            for t in threads:
                t.join(10)
            root.call(asyncio.sleep(0.2))  # handlers that start late run and end
            assert socks, "no connection was made before the stop"
            left = [s.getsockname() for s in socks if not _read_to_end(s, 2.0)]
            assert not left, f"{len(left)} of {len(socks)} connections still open: {left[:5]}"
            assert root.call(_other_tasks()) == []
        finally:
            done.set()
            for s in socks:
                s.close()
            root.close()
