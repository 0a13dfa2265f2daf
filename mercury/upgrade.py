"""Wiring of the hand-over upgrade (`kill -USR2 PID`) and of readiness reports.

The rules and the mechanics live in `net/handover.py`; this module only holds the flags
and the one sequence every node kind runs on SIGUSR2: start the new executable with this
process's sockets, wait for it (READY on a replica, PREPARED on a root), then hand over
(`on_go`); when the new process fails, log why, stop it, and keep serving.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
from collections.abc import Awaitable, Callable

from mercury import logsetup
from net import handover

log = logging.getLogger("mercury.upgrade")

#: How long the new process may take to be ready (`--handover-timeout-s`).
HANDOVER_TIMEOUT_S = 60.0
#: Bound on the old process's drain after the hand-over (`--drain-s`).
DRAIN_S = 10.0
#: A root's idle keep-alive connection gets this long for one last request while the old
#: root drains (a replica's gets the whole `--drain-s`: nothing waits for its drain).
ROOT_IDLE_GRACE_S = 0.1


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The hand-over flags (root and replica)."""
    p.add_argument(
        "--handover-timeout-s",
        type=float,
        default=HANDOVER_TIMEOUT_S,
        metavar="S",
        help="on SIGUSR2, how long the new executable may take to be ready before the "
        f"hand-over is abandoned and this process keeps serving (default {HANDOVER_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--drain-s",
        type=float,
        default=DRAIN_S,
        metavar="S",
        help="after a hand-over, how long this process may take to finish the requests in "
        f"flight before it exits anyway (default {DRAIN_S:g})",
    )


class Upgrader:
    """SIGUSR2 on the running loop: one hand-over at a time."""

    def __init__(
        self,
        role: str,
        *,
        wait_for: str,
        on_go: Callable[[handover.Successor], Awaitable[None]],
        timeout: float,
        extra_sockets: Callable[[], Awaitable[dict[str, socket.socket]]] | None = None,
    ) -> None:
        self.extra_sockets = extra_sockets
        self.role = role
        self.wait_for = wait_for
        self.on_go = on_go
        self.timeout = timeout
        self.running = False
        #: The successor this process handed over to (then it drains and exits).
        self.handed_to: handover.Successor | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_signal_handler(signal.SIGUSR2, self._signalled)

    def _signalled(self) -> None:
        if self.running or self.handed_to is not None:
            log.warning("SIGUSR2: a hand-over is already under way; ignored")
            return
        self.running = True
        asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        """Start the successor and hand over to it, or keep serving."""
        try:
            sockets = dict(handover.SOCKETS.active)
            if self.extra_sockets is not None:
                sockets.update(await self.extra_sockets())
            named = {k: handover.describe(s) for k, s in sockets.items()}
            try:
                succ = handover.Successor.start(handover.successor_argv(), sockets)
            finally:
                for k, s in sockets.items():
                    if k not in handover.SOCKETS.active:
                        s.close()  # copies of a reader's: it and the new process hold them
            logsetup.event(
                log,
                "handover-start",
                role=self.role,
                new_pid=succ.pid,
                sockets=named,
            )
            try:
                await succ.wait_for(self.wait_for, self.timeout)
            except handover.HandoverError as err:
                why = str(err)
                logsetup.event(log, "handover-failed", role=self.role, new_pid=succ.pid, why=why)
                code = await asyncio.to_thread(succ.abandon)
                log.warning("hand-over abandoned (new process exit %s); still serving", code)
                return
            self.handed_to = succ
            logsetup.event(log, "handover", role=self.role, new_pid=succ.pid, stage=self.wait_for)
            await self.on_go(succ)
        except Exception:
            log.exception("hand-over failed; still serving")
        finally:
            self.running = False


def refuse_handover(loop: asyncio.AbstractEventLoop, why: str) -> None:
    """SIGUSR2 logged and ignored (its default action would end the process)."""
    loop.add_signal_handler(
        signal.SIGUSR2, lambda: log.warning("SIGUSR2: no hand-over for %s; ignored", why)
    )


def report_ready() -> None:
    """This process serves: tell the old process (after a hand-over) and systemd."""
    handover.report(handover.READY)


async def report_when_serving(
    server: object, stop: asyncio.Event, then: Callable[[], None] | None = None
) -> None:
    """`report_ready` (and `then`) once uvicorn's `server.started` (its sockets accept)."""
    while not getattr(server, "started", False):
        if stop.is_set():
            return
        await asyncio.sleep(0.005)
    if then is not None:
        then()
    report_ready()
