"""Failpoints at I/O seams, for fault tests.

``MERCURY_FAILPOINTS="name1=kill,name2=exit"`` makes `hit("name1")` SIGKILL the process (or
exit 3 without cleanup for ``exit``) at that point. Unset, `hit` is one dict lookup.
"""

from __future__ import annotations

import os
import signal


def _parse(spec: str) -> dict[str, str]:
    out = {}
    for part in spec.split(","):
        name, _, action = part.strip().partition("=")
        if name:
            out[name] = action or "kill"
    return out


_ACTIVE = _parse(os.environ.get("MERCURY_FAILPOINTS", ""))


def hit(name: str) -> None:
    """Trigger failpoint `name` if the environment armed it."""
    action = _ACTIVE.get(name)
    if action is None:
        return
    if action == "exit":
        os._exit(3)
    os.kill(os.getpid(), signal.SIGKILL)
