"""systemd socket activation without systemd: `systemd-socket-activate` binds the ports,
waits for a first connection and execs `mercury root` with LISTEN_FDS/LISTEN_FDNAMES. The
root serves on those sockets (a bind of its own would fail: the port is taken), tells
NOTIFY_SOCKET READY=1, and after a hand-over the new process names itself MAINPID."""

from __future__ import annotations

import os
import shutil
import signal
import socket
from pathlib import Path

import httpx
import pytest

from store.lock import holder_pid
from testkit.procs import Procs, alive, free_port, mercury_cmd
from testkit.wait import wait_until
from tests.gateway.conftest import init_store

ACTIVATE = shutil.which("systemd-socket-activate")


class Notifications:
    """A NOTIFY_SOCKET: the datagrams a service sends to systemd."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)
        self.got: list[str] = []

    def poll(self) -> list[str]:
        while True:
            try:
                self.got.append(self.sock.recv(4096).decode())
            except BlockingIOError:
                return self.got

    def close(self) -> None:
        self.sock.close()


@pytest.mark.skipif(ACTIVATE is None, reason="systemd-socket-activate is not installed")
def test_a_socket_activated_root_serves_notifies_and_hands_over(
    tmp_path: Path, procs: Procs
) -> None:
    assert ACTIVATE is not None
    data = tmp_path / "root"
    token = init_store(data)
    port, rport = free_port(), free_port()
    notes = Notifications(tmp_path / "notify")
    p = procs.start(
        [
            ACTIVATE,
            "-l",
            f"127.0.0.1:{port}",
            "-l",
            f"127.0.0.1:{rport}",
            "--fdname=http:repl",
            "-E",
            f"NOTIFY_SOCKET={notes.path}",
            *mercury_cmd(
                "root",
                str(data),
                "--listen",
                f"127.0.0.1:{port}",
                "--repl-listen",
                f"127.0.0.1:{rport}",
                "--batch-window-ms",
                "20",
            ),
        ],
        name="root",
    )
    new = 0
    try:
        # The first connection is what starts it (the activator waits for one): it waits
        # in the socket's queue meanwhile and is answered.
        with httpx.Client(timeout=60) as c:

            def first_answer() -> bool:
                # Refused only until the activator has bound the socket (it starts as a
                # process like any other); once a connection is queued it is answered.
                try:
                    return c.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
                except httpx.ConnectError:
                    return False

            wait_until(first_answer, 30, "the activator listens and the root answers")
            wait_until(lambda: any("READY=1" in m for m in notes.poll()), 30, "READY=1")
            assert f"MAINPID={p.pid}" in "".join(notes.got)
            assert holder_pid(str(data)) == p.pid  # the activator exec'd into the root
            # The replication port is the passed one too: it accepts.
            socket.create_connection(("127.0.0.1", rport), timeout=10).close()

            notes.got.clear()
            os.kill(p.pid, signal.SIGUSR2)
            assert p.wait(60) == 0, procs.logs()
            new = wait_until(
                lambda: holder_pid(str(data)) != p.pid and holder_pid(str(data)),
                30,
                "new lock holder",
            )
            wait_until(lambda: any("READY=1" in m for m in notes.poll()), 30, "new READY=1")
            assert f"MAINPID={new}" in "".join(notes.got)
            r = c.get(
                f"http://127.0.0.1:{port}/v1/status", headers={"Authorization": f"Bearer {token}"}
            )
            assert r.status_code == 200, r.text
    finally:
        notes.close()
        if new and alive(new):
            os.kill(new, signal.SIGTERM)
            wait_until(lambda: not alive(new), 30, "new root stopped")
