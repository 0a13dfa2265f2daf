"""Listening sockets that outlive a process: hand-over to a successor, systemd activation.

Every listener of a node (the HTTP API, KT, memcached, the replication source) takes its
socket from `SOCKETS` by a name (`HTTP`, `KT`, `MEMCACHED`, `REPL`). A socket the process
inherited under that name is used as it is; otherwise one is bound. Either way the socket
is recorded, so that an upgrade (`kill -USR2 PID`) can pass every one of them to the new
executable (`Successor`): the new process listens on the very same sockets (one accept
queue, the same open file), so no port is ever closed and no connection waiting in a
queue is refused or reset while the two processes switch.

Two ways in, one table (`parse_handover_fds`, `parse_listen_fds`, pure):

* ``MERCURY_HANDOVER_FDS="http=3,kt=4"``: set by the old process for its successor.
* systemd socket activation: ``LISTEN_PID``, ``LISTEN_FDS`` and ``LISTEN_FDNAMES`` (the
  socket units' ``FileDescriptorName=``); descriptors start at 3 (sd_listen_fds(3)).

The successor reports its progress on a pipe (``MERCURY_HANDOVER_PIPE``: one line per
stage, `PREPARED` then `READY`, or `FAILED why`) and to systemd (`sd_notify`:
``MAINPID=`` and ``READY=1``, so the unit follows the new process). The old process stops
accepting only once the successor said READY (a replica) or PREPARED (a root: it cannot be
ready before it holds the writer lock the old one gives up; `docs/operations.md`).

Reader processes (`--read-workers`) each own their sockets; at a hand-over their reader 0
fetches copies over a socket pair (`fetch_sockets`, `serve_channel`: SCM_RIGHTS) and
passes them on as ``NAME#index``; the new reader 0 starts each reader on its own
(`Sockets.take_group`). The successor starts `STARTUP_NICE` nicer and returns to the old
niceness once ready (`restore_priority`), so its start does not slow the old one serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence

from core import failpoints
from core.addr import UnixAddr

log = logging.getLogger("mercury.handover")

HANDOVER_FDS_ENV = "MERCURY_HANDOVER_FDS"
HANDOVER_PIPE_ENV = "MERCURY_HANDOVER_PIPE"
#: The niceness the successor returns to once ready (it starts `STARTUP_NICE` above it).
HANDOVER_NICE_ENV = "MERCURY_HANDOVER_NICE"
#: The successor's interpreter starts (imports, opens, builds its app: seconds of CPU)
#: this much nicer than the old process, which serves meanwhile on the same cores.
STARTUP_NICE = 10
#: A reader process's end of the channel its reader 0 asks for its sockets on.
READER_CHANNEL_ENV = "MERCURY_READER_CHANNEL"
#: systemd's first passed descriptor (SD_LISTEN_FDS_START).
SD_LISTEN_FDS_START = 3

HTTP = "http"
KT = "kt"
MEMCACHED = "memcached"
REPL = "repl"

#: The successor's stages, one line each on the pipe.
PREPARED = "PREPARED"
READY = "READY"
FAILED = "FAILED"


class HandoverError(Exception):
    """The successor did not become ready (the old process keeps serving)."""


# -- the environment's tables (pure) ----------------------------------------------------


def format_handover_fds(named: Mapping[str, int]) -> str:
    """``name=fd,...`` for `HANDOVER_FDS_ENV`."""
    for name in named:
        if not name or "," in name or "=" in name:
            raise ValueError(f"bad socket name {name!r}")
    return ",".join(f"{name}={fd}" for name, fd in named.items())


def parse_handover_fds(raw: str) -> dict[str, int]:
    """The table `format_handover_fds` wrote; ValueError on anything else."""
    out: dict[str, int] = {}
    for part in raw.split(","):
        if not part:
            continue
        name, sep, fd = part.partition("=")
        if not sep or not name or not fd.isdigit():
            raise ValueError(f"{HANDOVER_FDS_ENV}: bad entry {part!r} (want name=fd)")
        out[name] = int(fd)
    return out


def parse_listen_fds(env: Mapping[str, str], pid: int) -> dict[str, int]:
    """systemd's passed sockets by name (sd_listen_fds(3)); empty when they are not for
    `pid` (inherited from a parent they were meant for). A socket without a name (systemd
    says ``unknown``) is `HTTP` when it is the only one, else an error."""
    if env.get("LISTEN_PID", "") != str(pid):
        return {}
    count = env.get("LISTEN_FDS", "0")
    if not count.isdigit():
        raise ValueError(f"LISTEN_FDS={count!r} is not a count")
    n = int(count)
    names = [x for x in env.get("LISTEN_FDNAMES", "").split(":") if x] if n else []
    if len(names) not in (0, n):
        raise ValueError(f"LISTEN_FDNAMES names {len(names)} sockets, LISTEN_FDS says {n}")
    if not names:
        names = ["unknown"] * n
    if n == 1 and names == ["unknown"]:
        names = [HTTP]
    if "unknown" in names:
        raise ValueError("several sockets passed without names: set FileDescriptorName= in each")
    out: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in out:
            raise ValueError(f"two sockets named {name!r}")
        out[name] = SD_LISTEN_FDS_START + i
    return out


def stage_line(stage: str, why: str = "") -> bytes:
    """One progress line on the pipe."""
    text = f"{stage} {why}".strip().replace("\n", " ")
    return (text + "\n").encode()


def parse_stage(line: bytes) -> tuple[str, str]:
    """(stage, why) of one progress line."""
    stage, _, why = line.decode(errors="replace").strip().partition(" ")
    return stage, why


# -- the process's sockets ----------------------------------------------------------------


class Sockets:
    """The process's listening sockets by name: inherited ones first (`take`), every one
    bound or taken recorded for a hand-over (`active`)."""

    def __init__(self, inherited: Mapping[str, int] | None = None) -> None:
        self._inherited = dict(inherited or {})
        self.active: dict[str, socket.socket] = {}
        #: How this process's sockets came: "handover", "systemd" or "" (bound here).
        self.source = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, pid: int | None = None) -> Sockets:
        """The sockets `env` says this process inherited (and scrubs those variables from
        `os.environ`, so that a child never takes them for its own)."""
        env = os.environ if env is None else env
        pid = os.getpid() if pid is None else pid
        table = parse_handover_fds(env.get(HANDOVER_FDS_ENV, ""))
        source = "handover" if table else ""
        if not table:
            table = parse_listen_fds(env, pid)
            source = "systemd" if table else ""
        if env is os.environ:
            for var in (HANDOVER_FDS_ENV, "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
                os.environ.pop(var, None)
        out = cls(table)
        out.source = source
        return out

    @property
    def inherited(self) -> bool:
        """Whether this process was started with sockets to serve."""
        return bool(self._inherited)

    def take(self, name: str) -> socket.socket | None:
        """The inherited socket `name` (each once), non-blocking, or None."""
        fd = self._inherited.pop(name, None)
        if fd is None:
            return None
        os.set_inheritable(fd, False)
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        self.active[name] = sock
        return sock

    def listen(
        self,
        name: str,
        addr: tuple[str, int] | UnixAddr,
        *,
        reuse_port: bool = False,
        backlog: int = 2048,
    ) -> socket.socket:
        """The socket `name`: inherited, else bound on `addr` and listening. A port of 0
        binds any free port (tests)."""
        sock = self.take(name)
        if sock is None:
            sock = (
                bind_unix(addr, backlog)
                if isinstance(addr, UnixAddr)
                else bind_tcp(addr, reuse_port=reuse_port, backlog=backlog)
            )
            self.active[name] = sock
        return sock

    def take_group(self, index: int) -> dict[str, socket.socket]:
        """The inherited sockets of reader `index` (named ``NAME#index``), by NAME, not
        recorded as this process's: its reader pool hands them to that reader."""
        out: dict[str, socket.socket] = {}
        suffix = f"#{index}"
        for name in [n for n in self._inherited if n.endswith(suffix)]:
            fd = self._inherited.pop(name)
            os.set_inheritable(fd, False)
            out[name[: -len(suffix)]] = socket.socket(fileno=fd)
        return out

    def leftovers(self) -> list[str]:
        """Inherited sockets no listener took (a flag removed between versions)."""
        return sorted(self._inherited)

    def close_leftovers(self) -> None:
        """Close inherited sockets no listener took: nobody accepts on them."""
        for name in self.leftovers():
            with contextlib.suppress(OSError):
                os.close(self._inherited.pop(name))


def bind_tcp(addr: tuple[str, int], *, reuse_port: bool, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on `addr`; with `reuse_port`, one of a group other processes
    bind to the same address (SO_REUSEPORT: the kernel balances connections)."""
    host, port = addr
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as err:
        sock.close()
        # The address in the message: "Address already in use" alone does not say which
        # of a node's listeners (--listen, --repl-listen, --kt-listen...) collided.
        raise OSError(err.errno, f"cannot listen on {host}:{port}: {err.strerror}") from err
    return sock


def bind_unix(addr: UnixAddr, backlog: int = 2048) -> socket.socket:
    """A listening unix socket at `addr.path` with file mode `addr.mode`. A stale socket
    file (nobody listening) is replaced; any other file there is an error."""
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(addr.path)
        if not stat.S_ISSOCK(st.st_mode):
            raise OSError(f"{addr.path} exists and is not a socket")
        if _unix_live(addr.path):
            raise OSError(f"{addr.path}: another process listens there")
        os.unlink(addr.path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # Bound under a umask that lets nobody in, then opened to `mode`: no moment where
        # the socket is wider than the operator asked.
        old = os.umask(0o177)
        try:
            sock.bind(addr.path)
        finally:
            os.umask(old)
        os.chmod(addr.path, addr.mode)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as err:
        sock.close()
        raise OSError(err.errno, f"cannot listen on {addr.path}: {err.strerror}") from err
    return sock


def _unix_live(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
        return True


def describe(sock: socket.socket) -> str:
    """``host:port`` or ``unix:/path`` of a listening socket (for logs)."""
    name = sock.getsockname()
    if isinstance(name, tuple):
        return f"{name[0]}:{name[1]}"
    return f"unix:{name.decode() if isinstance(name, bytes) else name}"


SOCKETS = Sockets.from_env()


def _take_pipe() -> int:
    # Taken out of the environment at once: a child of this process (a reader, the
    # replication worker) inherits the variable but not the descriptor.
    raw = os.environ.pop(HANDOVER_PIPE_ENV, "")
    return int(raw) if raw.isdigit() else -1


_PIPE = [_take_pipe()]


def _take_channel() -> socket.socket | None:
    raw = os.environ.pop(READER_CHANNEL_ENV, "")
    if not raw.isdigit():
        return None
    os.set_inheritable(int(raw), False)
    return socket.socket(fileno=int(raw))


_CHANNEL = [_take_channel()]


def channel_pair() -> tuple[socket.socket, socket.socket]:
    """(reader 0's end, the reader's end) of a reader's socket channel."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def fetch_sockets(channel: socket.socket, timeout: float) -> dict[str, socket.socket]:
    """Blocking: the listening sockets of the reader at the other end of `channel` (copies
    of its descriptors, SCM_RIGHTS), by name."""
    channel.settimeout(timeout)
    channel.sendall(b"give\n")
    msg, fds, _flags, _addr = socket.recv_fds(channel, 4096, 16)
    names = [n for n in msg.decode().split(",") if n and n != "-"]
    if len(names) != len(fds):
        for fd in fds:
            os.close(fd)
        raise OSError(f"reader sent {len(fds)} sockets for {len(names)} names")
    return {name: socket.socket(fileno=fd) for name, fd in zip(names, fds, strict=True)}


async def serve_channel(sockets: Sockets) -> None:
    """In a reader process: hand this process's listening sockets to its reader 0 whenever
    it asks (a hand-over passes them on to the new executable's readers)."""
    ch = _CHANNEL[0]
    if ch is None:
        return
    ch.setblocking(False)
    loop = asyncio.get_running_loop()
    while True:
        if not await loop.sock_recv(ch, 64):
            return  # reader 0 is gone
        names = list(sockets.active)
        fds = [sockets.active[n].fileno() for n in names]
        socket.send_fds(ch, [(",".join(names) or "-").encode()], fds)


# -- the successor's side -------------------------------------------------------------------


def report(stage: str, why: str = "") -> None:
    """Tell the process that started this one (a hand-over) and systemd about `stage`."""
    fd = _PIPE[0]
    if fd >= 0:
        # Fault tests make a new process die here: `handover-before-ready` (or -prepared).
        failpoints.hit(f"handover-before-{stage.lower()}")
        try:
            os.write(fd, stage_line(stage, why))
        except OSError as err:
            log.warning("hand-over: cannot report %s to the old process: %s", stage, err)
        if stage in (READY, FAILED):
            with contextlib.suppress(OSError):
                os.close(fd)
            _PIPE[0] = -1
    # MAINPID: after a hand-over systemd follows the new process (NotifyAccess=all). A new
    # root says so at PREPARED already: the old one exits before this one is READY, and
    # systemd would take the main process's exit for the service's end.
    if stage == PREPARED:
        # A root's startup from here on (the store, its app) is the write gap: at full speed.
        restore_priority()
        sd_notify(f"MAINPID={os.getpid()}")
    elif stage == READY:
        restore_priority()
        sd_notify(f"MAINPID={os.getpid()}\nREADY=1")


def restore_priority() -> None:
    """Back to the old process's niceness after a startup at `STARTUP_NICE` (every thread:
    Linux keeps a niceness per thread). Children started meanwhile (reader processes) call
    it themselves once they serve."""
    raw = os.environ.get(HANDOVER_NICE_ENV, "")
    if not raw.lstrip("-").isdigit():
        return
    for tid in _threads():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, int(raw))
        except OSError as err:
            log.warning("hand-over: cannot return to niceness %s: %s", raw, err)
            return


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _can_renice(now: int) -> bool:
    """Whether a process of ours may return from `now + STARTUP_NICE` to `now` (lowering a
    niceness takes CAP_SYS_NICE, or an RLIMIT_NICE that allows it)."""
    if os.geteuid() == 0:
        return True
    soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
    return soft == resource.RLIM_INFINITY or soft >= 20 - now


def sd_notify(message: str, env: Mapping[str, str] | None = None) -> bool:
    """Send `message` to systemd's notification socket, if this process has one."""
    path = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
    if not path:
        return False
    if path.startswith("@"):
        path = "\0" + path[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(path)
            s.sendall(message.encode())
    except OSError as err:
        log.warning("sd_notify failed: %s", err)
        return False
    return True


def handed_over() -> bool:
    """Whether this process was started by a hand-over (it reports to a pipe)."""
    return _PIPE[0] >= 0 or SOCKETS.source == "handover"


# -- the old process's side -----------------------------------------------------------------


class Successor:
    """The new executable started with this process's arguments and sockets."""

    def __init__(self, proc: subprocess.Popen[bytes], pipe: int) -> None:
        self.proc = proc
        self._pipe = pipe
        self._buf = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        sockets: Mapping[str, socket.socket],
        *,
        extra_env: Mapping[str, str] | None = None,
    ) -> Successor:
        """Start `argv` with `sockets` (by name) and a pipe to report on."""
        r, w = os.pipe()
        fds = {name: s.fileno() for name, s in sockets.items()}
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("LISTEN_PID", "LISTEN_FDS", HANDOVER_NICE_ENV)
        }
        env.update(extra_env or {})
        env[HANDOVER_FDS_ENV] = format_handover_fds(fds)
        env[HANDOVER_PIPE_ENV] = str(w)
        argv = list(argv)
        now = os.getpriority(os.PRIO_PROCESS, 0)
        nice = shutil.which("nice")
        if nice is not None and _can_renice(now):
            # `nice` execs the command: the PID stays the successor's.
            argv = [nice, "-n", str(STARTUP_NICE), *argv]
            env[HANDOVER_NICE_ENV] = str(now)
        try:
            proc = subprocess.Popen(argv, env=env, pass_fds=(*fds.values(), w))
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
        os.set_blocking(r, False)
        return cls(proc, r)

    async def wait_for(self, stage: str, timeout: float) -> None:
        """Return once the successor reported `stage`; HandoverError when it failed,
        exited or took longer than `timeout` seconds."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        while True:
            for line in self._lines():
                got, why = parse_stage(line)
                if got == stage:
                    return
                if got == FAILED:
                    raise HandoverError(f"the new process failed: {why}")
            code = self.proc.poll()
            if code is not None:
                raise HandoverError(f"the new process exited with {code} before {stage}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise HandoverError(f"the new process was not {stage} within {timeout:g} s")
            ready = loop.create_future()
            loop.add_reader(self._pipe, _wake, ready)
            try:
                # Woken by the pipe; polled for the process's exit every 50 ms meanwhile.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ready, min(left, 0.05))
            finally:
                loop.remove_reader(self._pipe)

    def _lines(self) -> Iterable[bytes]:
        while True:
            try:
                chunk = os.read(self._pipe, 4096)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        return lines

    def abandon(self, timeout: float = 10.0) -> int | None:
        """Stop the successor that failed (SIGTERM, then SIGKILL), by its PID."""
        self.close()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def close(self) -> None:
        """Stop listening to its progress."""
        if self._pipe >= 0:
            with contextlib.suppress(OSError):
                os.close(self._pipe)
            self._pipe = -1


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def successor_argv() -> list[str]:
    """This process's command again: the executable on disk now (the upgraded one)."""
    return [sys.executable, "-m", "mercury", *sys.argv[1:]]


# -- the sequence every node kind runs on SIGUSR2 ---------------------------------------


def _event(name: str, **fields: object) -> None:
    """One structured lifecycle line (``{"event": name, ...}``), as the nodes' others."""
    log.info(json.dumps({"event": name, **fields}, default=str))


async def hand_over(
    role: str,
    sockets: Mapping[str, socket.socket],
    *,
    wait_for: str,
    timeout: float,
    keep: Collection[str] = (),
) -> Successor | None:
    """Start the new executable with `sockets` and wait until it reports `wait_for`
    (READY on a replica or a standby candidate, PREPARED on a root). The sockets not named
    in `keep` are copies, closed once the new process holds them. None when it did not get
    there: why is logged, the new process is stopped, and this one keeps serving."""
    named = {k: describe(s) for k, s in sockets.items()}
    try:
        succ = Successor.start(successor_argv(), dict(sockets))
    finally:
        for k, s in sockets.items():
            if k not in keep:
                s.close()
    _event("handover-start", role=role, new_pid=succ.pid, sockets=named)
    try:
        await succ.wait_for(wait_for, timeout)
    except HandoverError as err:
        _event("handover-failed", role=role, new_pid=succ.pid, why=str(err))
        code = await asyncio.to_thread(succ.abandon)
        log.warning("hand-over abandoned (new process exit %s); still serving", code)
        return None
    _event("handover", role=role, new_pid=succ.pid, stage=wait_for)
    return succ


class Upgrader:
    """SIGUSR2 on the running loop of a root or a replica: one hand-over at a time, of
    every socket this process listens on (`SOCKETS`, and `extra_sockets`: its readers')."""

    def __init__(
        self,
        role: str,
        *,
        wait_for: str,
        on_go: Callable[[Successor], Awaitable[None]],
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
        self.handed_to: Successor | None = None

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
            sockets = dict(SOCKETS.active)
            if self.extra_sockets is not None:
                sockets.update(await self.extra_sockets())
            succ = await hand_over(
                self.role,
                sockets,
                wait_for=self.wait_for,
                timeout=self.timeout,
                keep=SOCKETS.active.keys(),  # a reader's copies are closed; ours serve on
            )
            if succ is None:
                return
            self.handed_to = succ
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
    report(READY)


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
