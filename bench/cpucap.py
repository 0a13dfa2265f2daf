"""A CPU-bandwidth cap for one process, as a cgroup: a fraction of a core, or of several.

Why: scaling from one reader process to two cannot be read off a two-core machine by
giving each reader a whole core — the load generator needs one too. Capping each process
to the same fraction of a core (CFS bandwidth: `quota` µs of CPU per `period` µs) keeps
every process's capacity fixed and leaves the rest of the cores to the load generator, so
N capped processes against one capped process shows whether anything they share (a lock,
a cache line, the kernel's spreading of connections) costs throughput. It does not show
what a whole second core adds (memory bandwidth, a second L2): that needs a machine with
a core more than the readers.

Works on the cgroup v1 `cpu` controller (`/sys/fs/cgroup/cpu`) and on cgroup v2 (a
`cpu.max` file, the controller enabled for the root's children). Needs root. Every group
this module makes is removed by `remove` (its processes moved back to the root first).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from testkit import procstat

V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")

#: CFS period (µs): short, so a capped process is throttled in small slices and its
#: throughput is smooth over a run of seconds (the kernel's default is 100 ms).
PERIOD_US = 10_000
#: The smallest quota the kernel takes (1 ms): 0.1 of a core at this period.
MIN_QUOTA_US = 1_000


class Unavailable(RuntimeError):
    """No writable cgroup CPU controller here (not root, or none mounted)."""


def _layout() -> tuple[Path, bool]:
    """(the cpu hierarchy's root, whether it is cgroup v2)."""
    if (V1 / "cpu.cfs_quota_us").exists():
        return V1, False
    controllers = V2 / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        subtree = V2 / "cgroup.subtree_control"
        if "cpu" not in subtree.read_text().split():
            try:
                subtree.write_text("+cpu")
            except OSError as err:
                raise Unavailable(f"cannot enable the cpu controller: {err}") from err
        return V2, True
    raise Unavailable("no cgroup cpu controller (v1 /sys/fs/cgroup/cpu or v2 cpu.max)")


class CpuCap:
    """One cgroup holding processes to `cores` of CPU time (e.g. 0.4: 40 % of one core)."""

    def __init__(self, name: str, cores: float) -> None:
        ncpu = os.cpu_count() or 1
        if not MIN_QUOTA_US / PERIOD_US <= cores <= ncpu:
            raise ValueError(f"cores must be {MIN_QUOTA_US / PERIOD_US} to {ncpu}, got {cores}")
        self.root, self.v2 = _layout()
        self.path = self.root / f"mercury-bench-{name}-{os.getpid()}"
        try:
            self.path.mkdir()
        except OSError as err:
            raise Unavailable(f"cannot make {self.path}: {err}") from err
        quota = round(cores * PERIOD_US)
        try:
            if self.v2:
                (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            else:
                (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        except OSError:
            self.remove()
            raise
        self.cores = quota / PERIOD_US

    def add(self, pid: int) -> None:
        """Move process `pid`, all its threads, into the group."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def throttled_s(self) -> float:
        """Seconds the group's processes were held back by the cap so far."""
        for line in (self.path / "cpu.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "throttled_usec":
                return int(value) / 1e6
            if name == "throttled_time":  # v1: nanoseconds
                return int(value) / 1e9
        return 0.0

    def remove(self) -> None:
        """Move any process left back to the root group and delete the group."""
        with contextlib.suppress(OSError):
            procs = (self.path / "cgroup.procs").read_text().split()
            for pid in procs:
                with contextlib.suppress(OSError):
                    (self.root / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of process `pid` to `cpus` (threads it starts later inherit it)."""
    for tid in procstat.threads(pid):
        with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
            os.sched_setaffinity(tid, cpus)
