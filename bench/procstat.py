"""CPU time and page faults of a process from `/proc`, as the benchmarks read them around a
phase."""

from __future__ import annotations

import os

from tests.support.procs import stat_fields


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (all its threads); OSError when it
    is gone."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def minor_faults(pid: int) -> int:
    """Minor page faults of process `pid` so far (all its threads: the kernel folds exited
    threads in); OSError when it is gone. A fault on fresh anonymous memory costs the
    faulting thread microseconds of CPU, so memory a process hands back and takes again
    shows up here."""
    return int(stat_fields(pid)[7])
