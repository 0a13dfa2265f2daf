"""CPU time, page faults, read calls and context switches of a process from `/proc`, as
the benchmarks read them around a phase."""

from __future__ import annotations

import os

from testkit.procs import stat_fields


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


def read_calls(pid: int) -> int:
    """Read-family system calls of process `pid` so far (`/proc/PID/io` ``syscr``, all its
    threads); OSError when it is gone. A stream reader woken for each piece of a frame
    shows up here as more calls per MB."""
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("syscr:"):
                return int(line.split()[1])
    raise OSError(f"no syscr in /proc/{pid}/io")


def context_switches(pid: int) -> int:
    """Context switches, voluntary and not, of the live threads of process `pid` so far
    (`/proc/PID/task/*/status`); OSError when it is gone. A thread that sleeps until the
    next record and is woken for it switches twice per record."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    if "ctxt_switches:" in line:  # voluntary_ and nonvoluntary_
                        total += int(line.split()[1])
        except FileNotFoundError:  # the thread ended meanwhile
            continue
    return total
