"""What every `make run` topology shares: owning its state directory (one run at a time,
one topology per directory), starting and stopping its processes by PID, waiting for a node
to answer and for a replica to stream, and the demo producer's and consumer's tokens."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
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

#: The state directory's lock and the PID of the run holding it.
RUN_PID = "run.pid"
#: The topology a state directory was made for (`claim_state`).
TOPOLOGY_FILE = "topology"
#: Longest wait for a replica to stream from its source once it serves.
STREAM_TIMEOUT_S = 60.0

# The lock's descriptor, open for the life of the process: the kernel releases the lock
# when the process exits, however it exits, so no stale lock outlives a crashed run.
_held: list[int] = []


def claim_state(state: Path, topology: str) -> None:
    """Make `state` this run's own, or refuse (SystemExit, nothing started or changed):
    another run holds it (an exclusive `flock` on ``state/run.pid``, whose text names that
    run's PID), or it holds the state of another `topology` (its stores would belong to
    other databases: a replica the root refuses forever, while it serves old data)."""
    state.mkdir(parents=True, exist_ok=True)
    fd = os.open(state / RUN_PID, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise SystemExit(
            f"make run is already running on {state} (PID {pid}); stop it first "
            f"(Ctrl-C where it runs, or kill {pid})"
        ) from None
    recorded = state / TOPOLOGY_FILE
    if recorded.exists():
        was = recorded.read_text().strip()
        if was != topology:
            os.close(fd)
            raise SystemExit(
                f"{state} holds the state of another topology ({was}), not of this one "
                f"({topology}); reset it with: rm -rf {state}"
            )
    else:
        others = sorted(p.name for p in state.iterdir() if p.name != RUN_PID)
        if others:
            os.close(fd)
            raise SystemExit(
                f"{state} holds state no make run recorded ({', '.join(others)}); "
                f"reset it with: rm -rf {state}"
            )
        recorded.write_text(topology + "\n")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held.append(fd)


def ports_in_use(listens: Sequence[str]) -> list[str]:
    """Those of `listens` (``HOST:PORT``) something already listens on: checked before
    anything starts, so a clash is named at once, not found in a node's log."""
    busy = []
    for hp in listens:
        host, port = hp.rsplit(":", 1)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the nodes bind
            try:
                s.bind((host, int(port)))
            except OSError:
                busy.append(hp)
    return busy


def wait_streaming(
    replica_url: str,
    source_db_id: str,
    proc: subprocess.Popen[bytes],
    verify: ssl.SSLContext | bool,
    reset: str,
) -> None:
    """Wait until the replica at `replica_url` streams the database `source_db_id`; else
    SystemExit naming what it reports (a store of another database, an error). `reset`
    is the command that resets its store."""
    deadline = time.monotonic() + STREAM_TIMEOUT_S
    st: dict[str, object] = {}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the replica exited with {proc.returncode}; see its log")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = httpx.get(f"{replica_url}/v1/status", timeout=2, verify=verify)
            st = r.json() if r.status_code == 200 else {}
        db_id = st.get("db_id")
        state = st.get("replication_state")
        if db_id not in (None, "", source_db_id) and st.get("seq") and state != "bootstrapping":
            raise SystemExit(
                f"the replica's store belongs to another database ({db_id}, the root's is "
                f"{source_db_id}): its source refuses it. Reset it with: {reset}"
            )
        if state == "streaming" and db_id == source_db_id:
            return
        time.sleep(0.2)
    raise SystemExit(
        f"the replica did not stream from its source within {STREAM_TIMEOUT_S:.0f}s: "
        f"state {st.get('replication_state')!r}, error {st.get('replication_error')!r}; "
        f"see its log (reset its store with: {reset})"
    )


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
