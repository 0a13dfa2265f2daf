"""`core.eventloop`: the loop every process entry point installs.

Run in a child interpreter: installing changes the process's event loop policy, which the
rest of this test process must keep.
"""

from __future__ import annotations

import subprocess
import sys

from testkit.procs import REPO

PROBE = """
import asyncio
from core import eventloop
family = eventloop.install()
loop = asyncio.new_event_loop()
print(family, type(loop).__module__)
loop.close()
"""


def test_install_makes_new_loops_uvloop() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["uvloop", "uvloop"]


def test_without_uvloop_asyncio_runs() -> None:
    # A platform without uvloop: the import fails and the default loop stays.
    probe = "import sys; sys.modules['uvloop'] = None\n" + PROBE
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    family, module = out.stdout.split()
    assert family == "asyncio" and module.startswith("asyncio")
