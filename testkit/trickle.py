"""A hostile client for tests and benches: many connections, each sending a request head
and then its body a byte at a time, reconnecting whenever the server closes one — the
red team's trickled-body attack on a connection cap, bounded in connections and time.

`Trickler` runs in one thread over non-blocking sockets (a selector): `start()`, then
`stop()`; `opened`, `closed` count connections opened and closed by the server."""

from __future__ import annotations

import selectors
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Trickler:
    """`conns` connections to 127.0.0.1:`port`, each sending `head` (a request head that
    announces a body) and then one byte of body every `every_s` seconds, for at most
    `max_s` seconds. `ctx`: TLS. `reconnect`: open a new connection for each one the
    server closes (the attack persists)."""

    port: int
    head: bytes
    conns: int
    every_s: float = 0.5
    max_s: float = 120.0
    ctx: ssl.SSLContext | None = None
    reconnect: bool = True
    opened: int = 0
    closed: int = 0
    refused: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _live: dict[socket.socket, float] = field(default_factory=dict)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="trickler")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    @property
    def open_now(self) -> int:
        return len(self._live)

    def _connect(self) -> socket.socket | None:
        try:
            raw = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            s = raw if self.ctx is None else self.ctx.wrap_socket(raw, server_hostname="r")
            s.sendall(self.head)
        except OSError:
            self.refused += 1
            return None
        s.setblocking(False)
        self.opened += 1
        return s

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        end = time.monotonic() + self.max_s
        for _ in range(self.conns):
            if self._stop.is_set():
                break
            s = self._connect()
            if s is not None:
                self._live[s] = time.monotonic()
                sel.register(s, selectors.EVENT_READ)
        try:
            while not self._stop.is_set() and time.monotonic() < end:
                for key, _ in sel.select(timeout=0.05):
                    r = key.fileobj
                    assert isinstance(r, socket.socket)
                    s = r
                    try:
                        data = s.recv(65536)
                    except (BlockingIOError, ssl.SSLWantReadError):
                        continue
                    except OSError:
                        data = b""
                    if not data:  # closed by the server (after a 408, or evicted)
                        self._drop(sel, s)
                now = time.monotonic()
                for s, at in list(self._live.items()):
                    if now - at >= self.every_s:
                        try:
                            s.send(b"x")
                            self._live[s] = now
                        except (BlockingIOError, ssl.SSLWantWriteError):
                            pass
                        except OSError:
                            self._drop(sel, s)
                while self.reconnect and len(self._live) < self.conns and not self._stop.is_set():
                    s = self._connect()
                    if s is None:
                        break
                    self._live[s] = time.monotonic()
                    sel.register(s, selectors.EVENT_READ)
        finally:
            for s in list(self._live):
                sel.unregister(s)
                s.close()
            self._live.clear()
            sel.close()

    def _drop(self, sel: selectors.BaseSelector, s: socket.socket) -> None:
        if s in self._live:
            del self._live[s]
            self.closed += 1
            sel.unregister(s)
            s.close()


def put_head(path: str, token: str | None, length: int = 100_000) -> bytes:
    """A PUT's head announcing a `length`-byte body (its bytes never all come)."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return f"PUT {path} HTTP/1.1\r\nHost: m\r\n{auth}Content-Length: {length}\r\n\r\n".encode()


def post_head(path: str, token: str | None, length: int = 100_000) -> bytes:
    """A POST's head announcing a `length`-byte JSON body (its bytes never all come)."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: m\r\n{auth}Content-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def main(argv: list[str] | None = None) -> None:
    """``python -m testkit.trickle PORT HEAD_HEX CONNS EVERY_S MAX_S``: the attack in a
    process of its own (a test's threads would share its interpreter lock with the client
    they measure, slowing that client's side of each exchange). Runs `max_s` seconds."""
    import sys

    port, head, conns, every, max_s = (argv if argv is not None else sys.argv[1:])[:5]
    t = Trickler(int(port), bytes.fromhex(head), int(conns), float(every), float(max_s))
    t.start()
    time.sleep(float(max_s))
    t.stop()


if __name__ == "__main__":
    main()
