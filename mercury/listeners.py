"""Read listeners a node runs beside its HTTP server.

The root runs a KT listener for point reads only and a memcached listener (each taking
writes as one producer when configured); a replica or consumer node runs KT and
memcached listeners with every read. Each is absent when its address is None. The
listeners are asyncio servers on the caller's event loop: start them from the process's
lifespan, stop them before closing the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.addr import UnixAddr
from core.service import Service
from kt.server import kt_service
from kt.write_handler import kt_write_service
from kt.writes import KtWriter
from memcached.server import memcached_service
from memcached.writes import memcached_write_service
from net.tcp import ListenerLimits, TcpService
from store.store import Store


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    """Addresses of a node's protocol listeners (None: not started)."""

    kt: tuple[str, int] | None = None
    #: H:P, or a unix socket for local consumers (`--memcached-listen unix:/path`).
    memcached: tuple[str, int] | UnixAddr | None = None
    #: Connection cap and timeouts of every listener (`--listener-*` flags).
    limits: ListenerLimits = field(default_factory=ListenerLimits)
    #: KT database names accepted besides `0` and the store directory's (`--kt-db-alias`).
    kt_db_aliases: tuple[bytes, ...] = ()
    #: memcached flags are the value's last 4 bytes, KT's `opts=f` (`--memcached-flags`).
    memcached_flags: bool = False
    #: Listen with SO_REUSEPORT beside other reader processes (`--read-workers`).
    reuse_port: bool = False


def root_services(
    store: Store,
    settings: ListenerSettings,
    kt_writer: KtWriter | None = None,
    memcached_writer: KtWriter | None = None,
) -> list[Service]:
    """Listeners the root runs beside the gateway: KT with point and bulk reads, and with
    writes through `kt_writer` when given (`--kt-producer`); memcached, with writes through
    `memcached_writer` when given (`--memcached-producer`). Their bulk work gives way to
    the store's commits (`TcpService.yield_to`): a heavy read never delays a write's ack."""
    out = _root_services(store, settings, kt_writer, memcached_writer)
    for svc in out:
        if isinstance(svc, TcpService):
            svc.yield_to = store.commit_gate
    return out


def _root_services(
    store: Store,
    settings: ListenerSettings,
    kt_writer: KtWriter | None,
    memcached_writer: KtWriter | None,
) -> list[Service]:
    out: list[Service] = []
    if settings.memcached is not None:
        host, port = _tcp(settings.memcached)
        if memcached_writer is not None:
            mc = memcached_write_service(
                store,
                host,
                port,
                memcached_writer,
                limits=settings.limits,
                flags_in_value=settings.memcached_flags,
            )
        else:
            mc = memcached_service(
                store,
                host,
                port,
                limits=settings.limits,
                flags_in_value=settings.memcached_flags,
            )
        out.append(_on_unix(mc, settings.memcached))
    if settings.kt is None:
        return out
    if kt_writer is not None:
        return [
            *out,
            kt_write_service(
                store,
                *settings.kt,
                kt_writer,
                limits=settings.limits,
                db_aliases=settings.kt_db_aliases,
            ),
        ]
    return [
        *out,
        kt_service(
            store,
            *settings.kt,
            point_only=True,
            limits=settings.limits,
            db_aliases=settings.kt_db_aliases,
        ),
    ]


def replica_services(store: Store, settings: ListenerSettings) -> list[Service]:
    """Read listeners of a replica or consumer node (KT, memcached)."""
    out: list[TcpService] = []
    if settings.kt is not None:
        out.append(
            kt_service(
                store, *settings.kt, limits=settings.limits, db_aliases=settings.kt_db_aliases
            )
        )
    if settings.memcached is not None:
        host, port = _tcp(settings.memcached)
        mc = memcached_service(
            store, host, port, limits=settings.limits, flags_in_value=settings.memcached_flags
        )
        out.append(_on_unix(mc, settings.memcached))
    for svc in out:
        svc.reuse_port = settings.reuse_port
    return list(out)


def _tcp(addr: tuple[str, int] | UnixAddr) -> tuple[str, int]:
    """host, port of a TCP listener; a unix one is named by its `TcpService.unix`."""
    return ("unix", 0) if isinstance(addr, UnixAddr) else addr


def _on_unix(svc: TcpService, addr: tuple[str, int] | UnixAddr) -> TcpService:
    if isinstance(addr, UnixAddr):
        svc.unix = addr
    return svc
