"""`mercury kt-bridge` whose ktserver is not there: a daemon, it keeps waiting, and its log
says what for: the address, the error and the retry interval (then a reminder a minute, not
one line a second)."""

from __future__ import annotations

from pathlib import Path

from testkit.procs import Procs, free_port
from testkit.wait import wait_until


def test_a_bridge_without_its_ktserver_says_what_it_waits_for(tmp_path: Path) -> None:
    kt, gateway = free_port(), free_port()  # nothing listens on either
    token = tmp_path / "token"
    token.write_text("mct_x\n")
    procs = Procs(tmp_path)
    try:
        p = procs.start_mercury(
            "kt-bridge",
            "--kt",
            f"127.0.0.1:{kt}",
            "--url",
            f"http://127.0.0.1:{gateway}",
            "--token-file",
            str(token),
            "--state",
            str(tmp_path / "state"),
            name="kt-bridge",
        )
        log = tmp_path / "kt-bridge-0.log"
        want = f"cannot reach the ktserver at 127.0.0.1:{kt} ("
        wait_until(lambda: log.exists() and want in log.read_text(), 30, "the waiting line")
        line = next(x for x in log.read_text().splitlines() if want in x)
        assert "refused" in line and "retrying every 1 s" in line, line
        assert p.poll() is None  # a daemon: it goes on waiting
    finally:
        procs.stop_all()
