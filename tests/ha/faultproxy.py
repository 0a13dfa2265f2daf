"""A TCP proxy between one candidate and etcd that can black-hole the link on demand.

While cut, open connections are closed and new ones are accepted but never answered (the
client's calls time out, as across a network partition); `heal` forwards again.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class FaultProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`target_port` until cut."""

    def __init__(self, port: int, target_port: int) -> None:
        self.port = port
        self.target_port = target_port
        self._cut = threading.Event()
        self._socks: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._srv = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self._srv.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Black-hole: close every open connection, leave new ones unanswered."""
        self._cut.set()
        with self._lock:
            for s in list(self._socks):
                with contextlib.suppress(OSError):
                    s.close()
            self._socks.clear()

    def heal(self) -> None:
        """Forward again (new connections)."""
        self._cut.clear()

    def close(self) -> None:
        self._stop.set()
        self.cut()
        self._thread.join(5)
        self._srv.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._socks.add(client)
            if self._cut.is_set():
                continue  # held open, never answered (closed at the next cut or close)
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), 2)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks.add(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self._cut.is_set():
                data = src.recv(65536)
                if not data or self._cut.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()
