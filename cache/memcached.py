"""The cache node's memcached text protocol listener (`mercury cache --memcached-listen`).

The same answers as a replica's memcached listener for what a read-only node serves (`get`,
`gets`, `version`, `stats`, `verbosity`, `quit`; every write refused), over the same
bounded TCP server (`net.tcp`: connection cap, deadlines, back-pressure). A `get` whose keys
the cache does not all hold waits for their fetch without holding the event loop
(`net.tcp.wait_for`); when the source cannot answer it replies
``SERVER_ERROR source unavailable`` (the protocol has no Retry-After; the client retries).
"""

from __future__ import annotations

from collections.abc import Generator

from cache.node import CacheNode, TooLarge, Unavailable
from core.errors import ReadProtocolError
from memcached import protocol as mc
from memcached.server import BUSY, VERSION
from net.tcp import ListenerLimits, Run, TcpService, wait_for
from replicator.invalidation import MAX_FETCH_KEYS

UNAVAILABLE = b"SERVER_ERROR source unavailable; retry\r\n"


class CacheMemcached:
    """A `net.tcp.Session` over a `CacheNode` (stateless: one for every connection)."""

    def __init__(self, node: CacheNode) -> None:
        self.node = node

    def phase(self, buf: bytearray) -> str:
        return "header"

    def run(self, buf: bytearray) -> Run:
        while buf:
            try:
                got = mc.parse_command(buf)
            except ReadProtocolError as err:
                buf.clear()
                yield mc.client_error(err.message)
                return True
            if got is None:
                return False
            cmd, n = got
            del buf[:n]
            if cmd.reply is not None:
                yield cmd.reply
                if cmd.close:
                    buf.clear()
                    return True
            elif cmd.name in (b"get", b"gets"):
                yield (yield from self._get(cmd.keys, cmd.name == b"gets"))
            elif cmd.name == b"quit":
                return True
            elif cmd.name == b"version":
                yield b"VERSION " + VERSION.encode() + b"\r\n"
            elif cmd.name == b"stats":
                st = self.node.status()
                stats: list[tuple[str, str | int]] = [
                    (k, str(st[k])) for k in ("seq", "entries", "bytes", "hits", "misses")
                ]
                yield mc.ERROR if cmd.args else mc.encode_stats(stats)
            elif cmd.name == b"verbosity":
                yield b"OK\r\n"
            elif not cmd.noreply:
                yield mc.READ_ONLY
        return False

    def _get(self, keys: list[bytes], with_cas: bool) -> Generator[bytes, None, bytes]:
        if len(keys) > MAX_FETCH_KEYS:
            return mc.client_error(f"at most {MAX_FETCH_KEYS} keys per get on a cache node")
        try:
            answers = yield from wait_for(self.node.get(keys))
        except Unavailable:
            return UNAVAILABLE
        except TooLarge:
            return b"SERVER_ERROR reply too large; ask for fewer keys\r\n"
        hits = [
            (k, a.value, a.version)
            for k, a in zip(keys, answers, strict=True)
            if a.value is not None
        ]
        return mc.encode_values(hits, with_cas)


def cache_memcached_service(
    node: CacheNode, host: str, port: int, limits: ListenerLimits | None = None
) -> TcpService:
    session = CacheMemcached(node)
    return TcpService("memcached", host, port, lambda: session, limits=limits, busy_reply=BUSY)
