"""The one reader of process and memory counters for benches and tests: CPU time, page
faults, I/O calls and bytes, context switches, child processes, threads, a process's state
and anonymous memory, the page cache's unwritten bytes and a socket's unread bytes.

Why one: a figure in docs/ names what it was read from (`/proc/PID/stat`, `/proc/PID/io`,
...), and each bench parsing `/proc` itself let the same name drift between benches (a
process's CPU with or without its children, a thread list read one way here and another
there). Everything here is psutil, which reads the same `/proc` files; the few counters
psutil lacks are read from `/proc` here and nowhere else:

- minor page faults (`/proc/PID/stat` ``minflt``; psutil has none);
- context switches of every thread (`/proc/PID/task/*/status`; psutil's
  `num_ctx_switches` counts the main thread's only);
- dirty and writeback page cache (`/proc/meminfo`; psutil's `virtual_memory` has neither);
- a thread's raw `stat` fields (its nice value, the CPU it last ran on);
- the kernel's account of bytes queued on loopback TCP connections (`/proc/net/tcp`).

Every per-process function raises an OSError when the process is gone or may not be read
(psutil's own errors become ProcessLookupError and PermissionError), as reading `/proc`
directly does, so a bench's ``except OSError`` holds whichever way a counter is read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psutil  # type: ignore[import-untyped]  # (no stubs; typed by the functions here)


@contextlib.contextmanager
def _as_oserror(pid: int) -> Iterator[None]:
    """psutil's errors as the OSErrors `/proc` raises (see the module docstring)."""
    try:
        yield
    except psutil.NoSuchProcess as err:  # a zombie psutil cannot read is gone too
        raise ProcessLookupError(f"process {pid} is gone") from err
    except psutil.AccessDenied as err:
        raise PermissionError(f"process {pid} may not be read") from err


def _process(pid: int) -> psutil.Process:
    with _as_oserror(pid):
        return psutil.Process(pid)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (all its threads, those that
    ended included; not its children); OSError when it is gone. `/proc/PID/stat`'s clock
    ticks, so it moves in steps of 10 ms."""
    p = _process(pid)
    with _as_oserror(pid):
        t = p.cpu_times()
    return float(t.user + t.system)


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` and of its descendants alive now (a
    server that forks its workers); a process gone meanwhile counts nothing, so 0.0 when
    `pid` itself is gone. Children already exited and reaped are not counted: measure
    around a phase in which none exits."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def children(pid: int) -> list[int]:
    """The PIDs of the child processes of `pid` now (not grandchildren), ascending;
    OSError when it is gone."""
    p = _process(pid)
    with _as_oserror(pid):
        return [c.pid for c in p.children()]


def threads(pid: int) -> list[int]:
    """The thread ids of process `pid` now; OSError when it is gone."""
    p = _process(pid)
    with _as_oserror(pid):
        return [t.id for t in p.threads()]


def environ(pid: int) -> dict[str, str]:
    """The environment process `pid` started with; OSError when it is gone."""
    p = _process(pid)
    with _as_oserror(pid):
        return dict(p.environ())


def minor_faults(pid: int) -> int:
    """Minor page faults of process `pid` so far (all its threads: the kernel folds exited
    threads in); OSError when it is gone. A fault on fresh anonymous memory costs the
    faulting thread microseconds of CPU, so memory a process hands back and takes again
    shows up here."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name (field 2) may hold spaces and parentheses: split after its end.
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[7])  # field 10, minflt


def read_calls(pid: int) -> int:
    """Read-family system calls of process `pid` so far (`/proc/PID/io` ``syscr``, all its
    threads); OSError when it is gone. A stream reader woken for each piece of a frame
    shows up here as more calls per MB."""
    p = _process(pid)
    with _as_oserror(pid):
        return int(p.io_counters().read_count)


def write_bytes(pid: int) -> int:
    """Bytes process `pid` has caused to be written to storage so far (`/proc/PID/io`
    ``write_bytes``: what reaches the disk, not what it wrote into the page cache);
    OSError when it is gone."""
    p = _process(pid)
    with _as_oserror(pid):
        return int(p.io_counters().write_bytes)


def context_switches(pid: int) -> int:
    """Context switches, voluntary and not, of the live threads of process `pid` so far
    (`/proc/PID/task/*/status`); OSError when it is gone. A thread that sleeps until the
    next record and is woken for it switches twice per record."""
    total = 0
    for tid in threads(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if "ctxt_switches:" in line:  # voluntary_ and nonvoluntary_
                        total += int(line.split()[1])
        except FileNotFoundError:  # the thread ended meanwhile
            continue
    return total


def free_memory() -> int:
    """Memory no one uses, not even the page cache (`/proc/meminfo` ``MemFree``), bytes."""
    return int(psutil.virtual_memory().free)


def unwritten_page_cache() -> int:
    """Page cache not yet on disk: dirty plus under writeback (`/proc/meminfo` ``Dirty``
    + ``Writeback``), bytes."""
    total = 0
    with open("/proc/meminfo") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Dirty", "Writeback"):
                total += int(rest.split()[0]) * 1024  # kB
    return total


def stat_fields(pid: int) -> list[str]:
    """The fields of `/proc/<pid>/stat` (or `/proc/<pid>/task/<tid>/stat` given as
    ``"<pid>/task/<tid>"``) after the command name: field 3, the state, is index 0.
    OSError when the process is gone."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def running(pid: int) -> bool:
    """Whether process `pid` still runs. A zombie does not: it holds no lock, descriptor
    or memory any more (an orphan's zombie waits for PID 1, which can take seconds)."""
    try:
        with _as_oserror(pid):
            return bool(_process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD))
    except OSError:
        return False


def rss_bytes(pid: int) -> int:
    """A process's resident memory, bytes."""
    with _as_oserror(pid):
        return int(_process(pid).memory_info().rss)


def anon_rss_bytes(pid: int) -> int:
    """A process's anonymous resident memory (heap and buffers; not the store's map or
    other files): resident minus resident-shared, which is `RssAnon` on Linux."""
    with _as_oserror(pid):
        m = _process(pid).memory_info()
    return int(m.rss - m.shared)


def unread_bytes(port: int, client_ports: set[int]) -> int:
    """Bytes clients on `client_ports` sent to the local server on `port` that it has not
    read yet: their send queues plus the server side's receive queues, the kernel's own
    account (`/proc/net/tcp`; IPv4 loopback only)."""
    total = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            field = line.split()
            local = int(field[1].split(":")[1], 16)
            remote = int(field[2].split(":")[1], 16)
            tx, rx = (int(x, 16) for x in field[4].split(":"))
            if local == port and remote in client_ports:
                total += rx  # received by the server's kernel, not read by the server
            elif local in client_ports and remote == port:
                total += tx  # not yet taken by the server's kernel
    return total
