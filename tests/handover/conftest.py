"""Every process a hand-over started is stopped at the end of its test, whatever failed:
the old process logs each one's PID (``handover-start``) to the log the test reads."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.procs import alive
from testkit.wait import wait_until


@pytest.fixture(autouse=True)
def stop_successors(tmp_path: Path) -> Iterator[None]:
    yield
    pids: set[int] = set()
    for log in (tmp_path / "logs").glob("*.log"):
        pids |= {int(p) for p in re.findall(r'"new_pid":(\d+)', log.read_text(errors="replace"))}
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGTERM)
    for pid in pids:
        try:
            wait_until(_gone(pid), 20, f"successor {pid} stopped")
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)


def _gone(pid: int) -> Callable[[], bool]:
    return lambda: not alive(pid)
