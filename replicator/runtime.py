"""What the replication code takes from its process that a simulation replaces.

A deployed node reads the wall clock for its heartbeats and snapshot ages, and runs its
blocking store work (log reads, snapshots, a replica's applies) in worker threads so that
its event loop never stalls. A simulation (`sim/`) runs a whole tree on one
`memnet.VirtualClockLoop`: there, a thread's work is off the virtual clock (the clock may
jump past every timer while a thread works, and the order of events would depend on the
machine), so the same code runs that work inline on the loop and reads the loop's clock.
`PROCESS` is what every deployed node uses; `simulated()` what a simulation hands in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


def _wall_us() -> int:
    return time.time_ns() // 1000


@dataclass(frozen=True, slots=True)
class Runtime:
    """The clocks and the offloading of one node's replication."""

    #: Wall-clock microseconds (heartbeat times: compared with record commit times).
    now_us: Callable[[], int] = _wall_us
    #: Monotonic seconds (ages of kept snapshots).
    monotonic: Callable[[], float] = time.monotonic
    #: True: blocking store work runs in worker threads; False: inline, on the loop.
    threads: bool = True

    async def offload(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """`fn(*args, **kw)`, off the loop in a worker thread, or inline when simulated."""
        if self.threads:
            return await asyncio.to_thread(fn, *args, **kw)
        return fn(*args, **kw)


#: A deployed node: the wall clock, store work in worker threads.
PROCESS = Runtime()


def simulated(loop: asyncio.AbstractEventLoop, epoch_us: int) -> Runtime:
    """A node of a simulation on `loop`: its clock (wall time is `epoch_us` plus the
    loop's seconds), store work inline."""
    return Runtime(
        now_us=lambda: epoch_us + int(loop.time() * 1_000_000),
        monotonic=loop.time,
        threads=False,
    )
