"""Reader worker processes: one node's read path on N processes (`--read-workers N`).

A read server is one event loop, so it uses one core. With `--read-workers N` the process
that serves reads (reader 0) starts N-1 more readers; each opens the same LMDB environment
read-only and listens on the same addresses with `SO_REUSEPORT`, and the kernel spreads new
connections across the listening sockets by a hash of their addresses. No reader shares
anything with another at run time: LMDB readers take no lock the others or the writer
hold (each read transaction has its own reader slot; `store/layout.py` sizes the slot
table), and each process has its own event loop, GIL and connections.

Why it holds to 64 cores: the only shared structures are the kernel's listening socket
group (per-socket accept queues, no lock among processes) and LMDB's reader table (one
slot per open read transaction: a reader process holds at most one at a time, since every
request reads in one short transaction on its loop thread, so 64 readers need 64 of the
table's slots, far below `max_readers`). Memory grows by one interpreter per reader; the
data pages are the shared page cache of the one memory map.

`ReaderPool` starts the other readers with a given command line and environment
(`READ_WORKER_ENV` = the reader's index), restarts one that dies with bounded backoff
(the other readers keep serving; the kernel stops sending connections to a closed
socket), and stops them by PID. A reader exits by itself when its parent is gone
(`exit_with_parent`). Each reader's metrics carry a `worker` label; every reader writes
its own to `metrics_dir` so that any of them answers `/metrics` for all (`reads/
workermetrics.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Sequence

from net import handover

log = logging.getLogger("mercury.reads.workers")

#: Environment variable naming a reader process's index (absent in reader 0).
READ_WORKER_ENV = "MERCURY_READ_WORKER"
RESTART_BASE = 0.5
RESTART_CAP = 10.0
#: A reader that ran this long resets the restart backoff.
RESTART_RESET_AFTER = 60.0
#: How often a reader checks that its parent is alive.
PARENT_CHECK_S = 1.0
#: Linux >= 5.14: 1 hands the connections waiting in a closed listener's accept queue to
#: another socket of its SO_REUSEPORT group instead of resetting them.
MIGRATE_REQ = "/proc/sys/net/ipv4/tcp_migrate_req"


def migrate_req(path: str = MIGRATE_REQ) -> bool | None:
    """Whether the kernel migrates a dead reader's waiting connections to another reader
    (None: this kernel cannot, or the setting cannot be read)."""
    try:
        with open(path) as f:
            return f.read().strip() != "0"
    except (OSError, ValueError):
        return None


def worker_index() -> int:
    """This process's reader index: 0 unless started by a `ReaderPool`."""
    raw = os.environ.get(READ_WORKER_ENV, "0")
    return int(raw) if raw.isdigit() else 0


def listen_socket(host: str, port: int, *, reuse_port: bool, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on host:port; with `reuse_port`, one of a group that other
    processes bind to the same address (SO_REUSEPORT: the kernel balances connections)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class ReaderPool:
    """Readers 1..n-1 of a node: started with `argv` and the parent's environment plus
    `READ_WORKER_ENV`, restarted when they die, stopped by PID (module docstring)."""

    def __init__(
        self,
        argv: Sequence[str],
        n: int,
        *,
        stop_timeout: float = 10.0,
        first_sockets: dict[int, dict[str, socket.socket]] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.n = n
        self.stop_timeout = stop_timeout
        #: Sockets each reader is started with the first time (a hand-over's, by name).
        self.first_sockets = dict(first_sockets or {})
        #: Each reader's channel (`net.handover`): asked for its sockets at a hand-over.
        self.channels: dict[int, socket.socket] = {}
        self._drained = False
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.restarts = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self) -> None:
        """Start every reader's watchdog (each starts its reader at once)."""
        if self.n > 1 and migrate_req() is False:
            log.warning(
                "net.ipv4.tcp_migrate_req is 0: connections waiting in a reader's accept "
                "queue are reset when that reader dies; set it to 1 to have the kernel hand "
                "them to another reader"
            )
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._watch(i)) for i in range(1, self.n)]

    @property
    def pids(self) -> list[int]:
        """PIDs of the readers running now."""
        return [p.pid for p in self.procs.values() if p.returncode is None]

    async def _watch(self, index: int) -> None:
        delay = RESTART_BASE
        while not self._stopping:
            started = time.monotonic()
            proc = await self._spawn(index)
            self.procs[index] = proc
            code = await proc.wait()
            if self._stopping:
                return
            self.restarts += 1
            if time.monotonic() - started > RESTART_RESET_AFTER:
                delay = RESTART_BASE
            log.warning("reader %d exited with %s; restarting in %.1fs", index, code, delay)
            await asyncio.sleep(delay)
            delay = min(RESTART_CAP, delay * 2)

    async def _spawn(self, index: int) -> asyncio.subprocess.Process:
        env = {**os.environ, READ_WORKER_ENV: str(index)}
        mine, theirs = handover.channel_pair()
        first = self.first_sockets.pop(index, {})
        env[handover.READER_CHANNEL_ENV] = str(theirs.fileno())
        if first:
            # Its listening sockets as the old process's reader `index` had them: no
            # connection waiting in their queues is lost across a hand-over.
            env[handover.HANDOVER_FDS_ENV] = handover.format_handover_fds(
                {name: s.fileno() for name, s in first.items()}
            )
        try:
            return await asyncio.create_subprocess_exec(
                *self.argv,
                env=env,
                pass_fds=(theirs.fileno(), *(s.fileno() for s in first.values())),
            )
        finally:
            theirs.close()
            for s in first.values():
                s.close()  # the reader's now: a socket held here would keep its queue
            old = self.channels.pop(index, None)
            if old is not None:
                old.close()
            self.channels[index] = mine

    async def collect_sockets(self, timeout: float = 5.0) -> dict[str, socket.socket]:
        """Every running reader's listening sockets, named ``NAME#index`` (a hand-over
        passes them to the new executable, whose pool starts its readers on them)."""
        out: dict[str, socket.socket] = {}
        for index, ch in sorted(self.channels.items()):
            p = self.procs.get(index)
            if p is None or p.returncode is not None:
                continue
            try:
                got = await asyncio.to_thread(handover.fetch_sockets, ch, timeout)
            except OSError as err:
                log.warning("reader %d did not hand its sockets over: %s", index, err)
                continue
            out.update({f"{name}#{index}": s for name, s in got.items()})
        return out

    def drain(self, sig: int) -> None:
        """Stop restarting readers and send each `sig` (a hand-over: each drains its
        connections and exits; `stop` then waits for them)."""
        self._stopping = True
        self._drained = True
        self.signal(sig)

    def signal(self, sig: int) -> None:
        """Send `sig` to every running reader (by PID)."""
        for p in self.procs.values():
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(sig)

    async def stop(self) -> None:
        """SIGTERM every reader, SIGKILL those still running after `stop_timeout`."""
        self._stopping = True
        if not self._drained:
            self.signal(signal.SIGTERM)
        for p in list(self.procs.values()):
            if p.returncode is None:
                try:
                    await asyncio.wait_for(p.wait(), self.stop_timeout)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        p.kill()
                    await p.wait()
        for t in self._tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for ch in self.channels.values():
            ch.close()
        self.channels.clear()


async def exit_with_parent(stop: asyncio.Event) -> None:
    """In a reader 1..n-1: set `stop` once the process that started it is gone (so a
    killed parent never leaves readers holding its ports)."""
    parent = os.getppid()
    while not stop.is_set():
        await asyncio.sleep(PARENT_CHECK_S)
        if os.getppid() != parent:
            log.warning("reader %d: parent %d is gone; stopping", worker_index(), parent)
            stop.set()
