"""Read listeners a node runs beside its HTTP server.

The root runs a KT listener for point reads only (`--kt-listen`); a replica or consumer
node runs KT (`--kt-listen`) and memcached (`--memcached-listen`) listeners with every read.
Each is absent when its option is None or missing. The listeners are asyncio servers on the
caller's event loop: start them from the process's lifespan, stop them before closing the
store.
"""

from __future__ import annotations

import argparse

from core.addr import parse_hostport
from core.service import Service
from reads.kt_server import kt_service
from reads.memcached_server import memcached_service
from reads.tcp import listener_limits
from store.store import Store


def root_services(store: Store, args: argparse.Namespace) -> list[Service]:
    """Read listeners the root runs beside the gateway (`--kt-listen`: point reads only)."""
    out: list[Service] = []
    kt = getattr(args, "kt_listen", None)
    if kt:
        out.append(
            kt_service(
                store,
                *parse_hostport(kt, "--kt-listen"),
                point_only=True,
                limits=listener_limits(args),
            )
        )
    return out


def replica_services(store: Store, args: argparse.Namespace) -> list[Service]:
    """Read listeners of a replica or consumer node (`--kt-listen`, `--memcached-listen`)."""
    out: list[Service] = []
    kt = getattr(args, "kt_listen", None)
    if kt:
        out.append(
            kt_service(store, *parse_hostport(kt, "--kt-listen"), limits=listener_limits(args))
        )
    mc = getattr(args, "memcached_listen", None)
    if mc:
        out.append(
            memcached_service(
                store, *parse_hostport(mc, "--memcached-listen"), limits=listener_limits(args)
            )
        )
    return out
