"""The event loop every Mercury process runs: uvloop's where it is installed, else asyncio's.

uvloop arrives with ``uvicorn[standard]``; a platform without it still runs, with slower
socket I/O. Each process entry point calls `install` once, before its ``asyncio.run``.
"""

from __future__ import annotations


def install() -> str:
    """Make the loops ``asyncio.run`` creates from now on uvloop's, when uvloop is present.

    Returns the loop family in use, ``"uvloop"`` or ``"asyncio"``.
    """
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    uvloop.install()
    return "uvloop"
