"""Kernel scheduling hints: readers that preempt the applier at once, an applier that yields.

Why: on a node that serves reads and applies a heavy stream on the same core, a read that
arrives while the applier runs waits for the applier's time slice to end (3-5 ms with the
default slices) — that wait *is* the read tail under writes. Two hints, both best effort:

- `request_slice(tid, ns)`: Linux >= 6.12 (EEVDF) lets a fair-class task ask for a shorter
  slice (``sched_attr.sched_runtime``, 0.1-100 ms). A task with a short slice gets an early
  virtual deadline, so when it wakes it preempts a task running a longer slice instead of
  waiting for it. The read server's threads ask for one.
- `set_batch(tid)`: SCHED_BATCH for the applier: the kernel treats it as a CPU-bound
  background task (it never wakeup-preempts others; its share of the CPU is unchanged,
  unlike a high nice level that starves it).

Older kernels ignore or refuse the request: every function returns False then and the
caller carries on (the system works without the hint, only with a longer read tail).

On a machine with cores to spare, the hints give way to a guarantee: `--applier-cpus`
pins the applier to its own CPUs and the read server to the rest (`split_cpus`, `pin`),
so a read never waits behind the applier, not even behind its system calls (a commit's
`writev` of dirty pages runs in the kernel, where a kernel without full preemption does
not preempt it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import platform

#: The applier's and the readers' slice requests need Linux's sched_setattr (x86-64, arm64).
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}
SCHED_NORMAL = 0
SCHED_BATCH = 3
#: Shortest slice the kernel accepts (it clamps to 0.1 ms .. 100 ms).
MIN_SLICE_NS = 100_000


class _SchedAttr(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("sched_policy", ctypes.c_uint32),
        ("sched_flags", ctypes.c_uint64),
        ("sched_nice", ctypes.c_int32),
        ("sched_priority", ctypes.c_uint32),
        ("sched_runtime", ctypes.c_uint64),
        ("sched_deadline", ctypes.c_uint64),
        ("sched_period", ctypes.c_uint64),
        ("sched_util_min", ctypes.c_uint32),
        ("sched_util_max", ctypes.c_uint32),
    ]


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    return ctypes.CDLL(name, use_errno=True)


_LIBC = _libc()


def get_attr(tid: int) -> tuple[int, int, int] | None:
    """(policy, nice, slice in ns) of thread `tid` (0 = the calling thread); None when the
    kernel or platform has no sched_getattr."""
    nums = _SYSCALLS.get(platform.machine())
    if _LIBC is None or nums is None:
        return None
    attr = _SchedAttr()
    if _LIBC.syscall(nums[1], tid, ctypes.byref(attr), ctypes.sizeof(attr), 0) != 0:
        return None
    return int(attr.sched_policy), int(attr.sched_nice), int(attr.sched_runtime)


def _set(tid: int, policy: int, slice_ns: int) -> bool:
    nums = _SYSCALLS.get(platform.machine())
    if _LIBC is None or nums is None:
        return False
    current = get_attr(tid)
    if current is None:
        return False
    attr = _SchedAttr()
    attr.size = ctypes.sizeof(attr)
    attr.sched_policy = policy
    attr.sched_nice = current[1]  # sched_setattr sets the nice level too: keep it
    attr.sched_runtime = slice_ns
    return bool(_LIBC.syscall(nums[0], tid, ctypes.byref(attr), 0) == 0)


def request_slice(tid: int, slice_ns: int) -> bool:
    """Ask for a `slice_ns` time slice for thread `tid` (0 = the caller), keeping its policy
    and nice level. True when the kernel took it (it reports the slice back)."""
    current = get_attr(tid)
    if current is None or current[0] not in (SCHED_NORMAL, SCHED_BATCH):
        return False
    if not _set(tid, current[0], max(MIN_SLICE_NS, slice_ns)):
        return False
    after = get_attr(tid)
    return after is not None and after[2] == max(MIN_SLICE_NS, slice_ns)


def set_batch(tid: int) -> bool:
    """Move thread `tid` (0 = the caller) to SCHED_BATCH, keeping its nice level."""
    return _set(tid, SCHED_BATCH, 0)


def threads(pid: int) -> list[int]:
    """Thread ids of process `pid` (Linux /proc; empty elsewhere)."""
    with contextlib.suppress(OSError):
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    return []


def request_slice_all(pid: int, slice_ns: int) -> bool:
    """`request_slice` for every current thread of process `pid` (threads started later
    inherit it from the thread that starts them). True when every one took it."""
    tids = threads(pid)
    return bool(tids) and all([request_slice(t, slice_ns) for t in tids])


#: The read servers' slice request: short enough that a read waking up runs at once.
READ_SLICE_NS = MIN_SLICE_NS


def favour_reads() -> bool:
    """For the read-serving process, before it starts other threads and processes (they
    inherit it): short slices, so a waking read preempts the applier."""
    return request_slice_all(os.getpid(), READ_SLICE_NS)


def background_applier() -> bool:
    """For the applier process at its start: SCHED_BATCH and the kernel's default slice
    (not the short one inherited from the read server), at its nice level."""
    return all([set_batch(t) for t in threads(os.getpid())])


def reset(tid: int) -> bool:
    """Thread `tid` back to SCHED_NORMAL and the default slice (benchmarks compare)."""
    return _set(tid, SCHED_NORMAL, 0)


#: One more than the highest CPU number Linux builds for (NR_CPUS at most 8192): a list
#: beyond it is a typo, and a range to it stays small.
MAX_CPUS = 8192


def parse_cpus(text: str) -> frozenset[int]:
    """A CPU list as `taskset -c` and `/proc/*/status` write it (``3``, ``2-3``, ``0,4-7``)
    -> its CPU numbers. ValueError for anything else."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not _number(lo) or (sep and not _number(hi)):
            raise ValueError(f"CPU list {text!r}: {part.strip()!r} is not N or N-M")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"CPU list {text!r}: range {part.strip()!r} runs backwards")
        if last >= MAX_CPUS:
            raise ValueError(f"CPU list {text!r}: CPU {last} is past the largest, {MAX_CPUS - 1}")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def _number(s: str) -> bool:
    return s.isascii() and s.isdigit() and len(s) <= 5


def split_cpus(allowed: frozenset[int], applier: frozenset[int]) -> frozenset[int]:
    """The read server's CPUs when the applier takes `applier` out of `allowed` (this
    process's). ValueError when the applier names a CPU the process may not use, or
    leaves the read server none."""
    outside = applier - allowed
    if outside:
        raise ValueError(
            f"CPUs {sorted(outside)} are not among this process's ({_cpu_text(allowed)})"
        )
    readers = allowed - applier
    if not readers:
        raise ValueError(
            f"the applier would take every CPU this process may use ({_cpu_text(allowed)}), "
            "leaving the read server none"
        )
    return readers


def _cpu_text(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def pin(pid: int, cpus: frozenset[int]) -> None:
    """Every current thread of process `pid` onto `cpus` (threads started later inherit
    the mask of the thread that starts them, processes of the one that forks them)."""
    for tid in threads(pid) or [pid]:
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(tid, cpus)
