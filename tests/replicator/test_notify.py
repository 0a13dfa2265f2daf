"""Cross-process commit wake-up: a commit in another process wakes a source here."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from replicator import notify
from testkit.procs import REPO


def test_ping_from_another_process_wakes_the_listener(tmp_path: Path) -> None:
    async def scenario() -> int:
        woke = asyncio.Event()
        listener = notify.WakeListener(str(tmp_path), woke.set)
        listener.start()
        try:
            code = f"from replicator import notify; notify.ping_all({str(tmp_path)!r})"
            proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, cwd=REPO)
            assert await proc.wait() == 0
            await asyncio.wait_for(woke.wait(), 10)
            return len(list((tmp_path / "notify").iterdir()))
        finally:
            listener.stop()

    assert asyncio.run(scenario()) == 1
    assert list((tmp_path / "notify").iterdir()) == []  # marker removed on stop


def test_stale_marker_is_removed_by_the_next_ping(tmp_path: Path) -> None:
    d = tmp_path / "notify"
    d.mkdir()
    (d / "mercury-999999-deadbeef").touch()  # a source that died without cleaning up
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"from replicator import notify; notify.ping_all({str(tmp_path)!r})",
        ],
        cwd=REPO,
        check=True,
    )
    assert list(d.iterdir()) == []
