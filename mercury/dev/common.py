"""What every `make run` topology shares: starting and stopping its processes by PID,
waiting for a node to answer, and the demo producer's and consumer's tokens."""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

import httpx

from mercury.dev.topology import DEMO_CONSUMER, DEMO_KEYSPACE, DEMO_PRODUCER

#: The checkout `make run` runs from (processes start with it as their working directory).
REPO = Path(__file__).resolve().parents[2]


def stop_requested() -> Callable[[], bool]:
    """Take SIGTERM and SIGINT (Ctrl-C) as a request to stop; the returned function says
    whether one came (the run then stops its processes by PID)."""
    asked = False

    def stop(_sig: int, _frame: FrameType | None) -> None:
        nonlocal asked
        asked = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return lambda: asked


def stop_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Stop `procs` by PID, the last started first: SIGTERM, then SIGKILL to any still
    running 20 s later."""
    for p in reversed(procs):
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(5)


def mercury_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "mercury", *args]


def wait_http(
    url: str, proc: subprocess.Popen[bytes], verify: ssl.SSLContext | bool, timeout: float = 60.0
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"process for {url} exited with {proc.returncode}; see its log")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1, verify=verify).status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"{url} did not come up within {timeout:.0f}s; see its log")


def demo_token(base: str, admin_token: str, verify: ssl.SSLContext | bool = True) -> str:
    """Create (or update) the demo producer and issue a token for it."""
    h = {"Authorization": f"Bearer {admin_token}"}
    r = httpx.put(
        f"{base}/v1/admin/producers/{DEMO_PRODUCER}",
        json={"keyspaces": [DEMO_KEYSPACE], "quota": {"ops_per_s": 1000, "burst": 2000}},
        headers=h,
        verify=verify,
    )
    r.raise_for_status()
    r = httpx.post(f"{base}/v1/admin/producers/{DEMO_PRODUCER}/tokens", headers=h, verify=verify)
    r.raise_for_status()
    return str(r.json()["token"])


def reader_token(base: str, admin_token: str, verify: ssl.SSLContext | bool) -> str:
    """Create (or update) the demo consumer and issue a read token for it."""
    h = {"Authorization": f"Bearer {admin_token}"}
    r = httpx.put(
        f"{base}/v1/admin/consumers/{DEMO_CONSUMER}",
        json={"keyspaces": [DEMO_KEYSPACE]},
        headers=h,
        verify=verify,
    )
    r.raise_for_status()
    r = httpx.post(
        f"{base}/v1/admin/consumers/{DEMO_CONSUMER}/tokens",
        json={"label": "make run"},
        headers=h,
        verify=verify,
    )
    r.raise_for_status()
    return str(r.json()["token"])


def write_secret(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
