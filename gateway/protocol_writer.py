"""The gateway's write path as the root KT listener's `KtWriter` (`--kt-producer NAME`),
and the memcached listener's (`--memcached-producer NAME`).

Composition only: the KT listener (`reads/`) may not import the gateway, so the root
hands it this adapter. Each KT write becomes one gateway request of producer NAME — the
same size checks as the HTTP bodies, then `Gateway.write` (ACL, guards, storage quota,
rate quota, batching, durable commit) — and its per-op results come back to the listener.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from acl.model import Producer
from core.errors import ConfigError, NotFoundError, ShuttingDownError, TooLargeError
from gateway.answers import Answer
from gateway.bodies import check_key
from gateway.writes import Gateway
from store.ops import Op, Result


class GatewayKtWriter:
    """Writes as producer `name` through the gateway on ``app.state.gw`` (set once the
    app's lifespan has built it: `app` is bound after `create_app`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.app: Any = None

    @property
    def producer(self) -> str:
        return self.name

    def _gw(self) -> Gateway:
        gw = getattr(getattr(self.app, "state", None), "gw", None)
        if gw is None:
            raise ShuttingDownError("the gateway is not running")
        assert isinstance(gw, Gateway)
        return gw

    def _producer(self, gw: Gateway) -> Producer:
        p = gw.acl.producers.get(self.name)
        if p is None:
            raise NotFoundError(
                f"no producer {self.name!r} (--kt-producer)",
                hint="create it with the admin API or `mercury acl apply`",
            )
        return p

    def keyspaces(self) -> tuple[bytes, ...]:
        return self._producer(self._gw()).prefixes()

    async def write(self, ops: list[Op], nbytes: int) -> list[Result]:
        gw = self._gw()
        p = self._producer(gw)
        s = gw.settings
        if len(ops) > s.max_batch_ops:
            raise TooLargeError(f"{len(ops)} ops; at most {s.max_batch_ops} per request")
        for op in ops:
            check_key(op.key, s.max_key)
            if len(op.value) > s.max_value:
                raise TooLargeError(
                    f"value of {len(op.value)} bytes; values are at most {s.max_value} bytes"
                )
        results: list[Result] = []

        def answer(res: list[Result]) -> Answer:
            results[:] = res
            return Answer(200, {}, {})

        await gw.write(p, [op._replace(owner=p.name) for op in ops], nbytes, answer)
        return results


def kt_writer_for(
    producer: str | None,
    kt_listen: tuple[str, int] | None,
    *,
    flag: str = "--kt-producer",
    listen_flag: str = "--kt-listen",
    protocol: str = "KT",
) -> GatewayKtWriter | None:
    """The root's KT (or memcached: `flag`, `listen_flag`, `protocol`) writer for
    `--kt-producer` (None without it). The flag needs its listener on a loopback address:
    KT and memcached carry no credentials, so whoever reaches the port writes as the
    producer; beyond loopback that would be an unauthenticated write path, which no flag
    allows."""
    if producer is None:
        return None
    if kt_listen is None:
        raise ConfigError(f"{flag} needs {listen_flag}", hint=f"add {listen_flag} H:P")
    if not _loopback(kt_listen[0]):
        raise ConfigError(
            f"{flag} needs a loopback {listen_flag}, got {kt_listen[0]!r}: {protocol} carries "
            "no credentials, so anyone reaching the port would write as the producer",
            hint=f"listen on 127.0.0.1 and run the {protocol} clients on the root's machine"
            + (", or follow a ktserver with mercury kt-bridge" if protocol == "KT" else ""),
        )
    return GatewayKtWriter(producer)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
