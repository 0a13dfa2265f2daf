"""A child process that must not outlive its parent: the kernel SIGKILLs it when the parent
dies (Linux `PR_SET_PDEATHSIG`), with no wait for an EOF the child may only notice later.

Why SIGKILL and not a clean stop: a parent killed is a node killed. Its child (a replica's
replication worker, a candidate's leading root) going on for even a moment keeps writing a
store that the operator, or the parent's restart, now considers stopped, and keeps holding
its writer lock. Everything these children write is crash-safe (LMDB commits), so dying
mid-step loses nothing that was committed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def kill_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux only; a no-op
    elsewhere, where the caller's other signs of a dead parent still hold).

    Safe in a `preexec_fn` (it only calls prctl) and preserved across exec.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def bind_to_parent(parent_pid: int) -> None:
    """`kill_with_parent` from inside the child, closing the race where the parent died
    before the request was made: then the child exits at once."""
    kill_with_parent()
    if os.getppid() != parent_pid:
        os._exit(1)
