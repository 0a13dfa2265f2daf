"""Start and stop real `mercury` processes on 127.0.0.1 (tests and benchmarks).

Every process is started with its own process group and stopped by its PID; a test that
forgets one still has it killed by the `procs` fixture's teardown.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from testkit import procstat

REPO = Path(__file__).resolve().parents[1]


# Ports handed to the processes a test starts. Not bind(0): the kernel takes those from the
# ephemeral range, where any outgoing connection (of this run or another xdist worker) may
# grab the port between our probe and the server's bind, and the server then fails to
# start (uvicorn exits 3). Below the ephemeral range (32768+ on Linux), each xdist worker
# walks its own slice, so two workers never hand out the same port. Every port stays below
# 32768, which Kyoto Tycoon's address parser needs too; a test must take all its ports from
# here (a random pick below 32768 lands in some worker's slice).
_PORT_BASE = 20_000
_PORT_SLICE = 1_500
_next_port: list[int] = []


def _worker_index() -> int:
    w = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(w[2:]) if w[2:].isdigit() else 0


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie does not; `procstat.running`)."""
    return procstat.running(pid)


def free_port() -> int:
    """A TCP port on 127.0.0.1, free now and handed out by no other call of this test run."""
    lo = _PORT_BASE + (_worker_index() % 8) * _PORT_SLICE
    if not _next_port:
        # Start each process's walk somewhere new, so a rerun soon after does not meet
        # sockets of the last run's processes still in TIME_WAIT on the same ports.
        _next_port.append(lo + (os.getpid() * 97) % _PORT_SLICE)
    for _ in range(_PORT_SLICE):
        port = _next_port[0]
        _next_port[0] = lo + (port - lo + 1) % _PORT_SLICE
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (or lingering): try the next one
            return port
    raise RuntimeError(f"no free port in {lo}..{lo + _PORT_SLICE - 1}")


def wait_port(
    port: int, timeout: float = 60.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Wait until something accepts TCP connections on 127.0.0.1:`port`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until GET `url` answers 200. The bound is generous: it catches a server that
    never comes up, not a slow one (a loaded 2-core machine can take seconds to start one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before serving {url}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=0.5).status_code == 200:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer 200 after {timeout}s")


def mercury_cmd(*args: str) -> list[str]:
    """argv that runs the `mercury` CLI with this interpreter."""
    return [sys.executable, "-m", "mercury", *args]


def run_mercury(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run a short `mercury` command to completion and capture its output."""
    return subprocess.run(
        mercury_cmd(*args), capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


class Procs:
    """Tracks processes a test started; `stop_all` ends the ones still running."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, argv: Sequence[str], name: str = "proc") -> subprocess.Popen[bytes]:
        """Start `argv` in its own process group, output to a log file in the temp dir."""
        log = open(self.log_dir / f"{name}-{len(self.started)}.log", "wb")  # noqa: SIM115
        p = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )
        log.close()
        self.started.append(p)
        return p

    def start_mercury(self, *args: str, name: str = "mercury") -> subprocess.Popen[bytes]:
        """Start a `mercury` command (root, replica, ...)."""
        return self.start(mercury_cmd(*args), name=name)

    @staticmethod
    def kill(p: subprocess.Popen[bytes]) -> None:
        """SIGKILL `p` by its PID and reap it."""
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
        p.wait(10)

    @staticmethod
    def terminate(p: subprocess.Popen[bytes], timeout: float = 20.0) -> int:
        """SIGTERM `p` by its PID; SIGKILL it if it has not exited after `timeout`."""
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
            try:
                return p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
        return p.wait(10)

    def logs(self) -> str:
        """Everything the started processes printed (for assertion messages)."""
        return "\n".join(
            f"--- {f.name}\n{f.read_text(errors='replace')[-4000:]}"
            for f in sorted(self.log_dir.glob("*.log"))
        )

    def stop_all(self) -> None:
        """Stop every process still running: SIGTERM, then SIGKILL."""
        for p in self.started:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
                p.wait(10)


def anon_rss_mb(pid: int) -> float:
    """A process's anonymous resident memory (its heap and buffers; not the store's map
    or other files), MB."""
    return procstat.anon_rss_bytes(pid) / (1 << 20)
