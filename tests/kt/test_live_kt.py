"""`mercury kt-bridge` against a real ktserver (runs only when `ktserver` is on PATH):
import an existing database, then follow its update log (sets, removes, a clear, a write
made while the bridge was down) into a real root."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from testkit.procs import Procs, free_port, run_mercury, wait_port
from testkit.wait import wait_until
from tests.client.conftest import Cluster
from tests.kt.conftest import producer_token_file

pytestmark = pytest.mark.skipif(
    shutil.which("ktserver") is None,
    reason="ktserver is not on PATH (the live Kyoto Tycoon test needs a real server)",
)


def kt_port() -> int:
    """A free port KT accepts: its address parser takes ports up to 32767 only. Taken from
    this worker's own slice like every other test's port: a port picked at random below
    32768 lands in another xdist worker's slice, where that worker may have just probed it
    for a process it is starting (which then fails to bind)."""
    port = free_port()
    assert port <= 32767, port
    return port


def start_kt(
    procs: Procs, tmp: Path, port: int | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """A ktserver on 127.0.0.1 with an update log (sid 1) and one hash database in `tmp`
    (kept across restarts)."""
    port = port or kt_port()
    (tmp / "ulog").mkdir(exist_ok=True)
    p = procs.start(
        [
            "ktserver",
            "-host",
            "127.0.0.1",
            "-port",
            str(port),
            "-ulog",
            str(tmp / "ulog"),
            "-sid",
            "1",
            "-log",
            str(tmp / "kt.log"),
            str(tmp / "casket.kch"),
        ],
        name="ktserver",
    )
    wait_port(port, proc=p)
    return p, port


def kt_rpc(port: int, proc: str, **params: str) -> int:
    r = httpx.post(f"http://127.0.0.1:{port}/rpc/{proc}", data=params, timeout=10)
    return r.status_code


def under(c: Cluster, prefix: str) -> dict[str, str]:
    c.caught_up()
    r = httpx.get(f"{c.read_url}/v1/range", params={"prefix": prefix, "limit": 1000}, timeout=10)
    assert r.status_code == 200, r.text
    return {it["key"]: it["value"] for it in r.json()["items"]}


def eventually(c: Cluster, prefix: str, want: dict[str, str], timeout: float = 30.0) -> None:
    seen: list[dict[str, str]] = []

    def same() -> bool:
        seen.append(under(c, prefix))
        return seen[-1] == want

    try:
        wait_until(same, timeout, f"{prefix} as the ktserver has it", interval=0.1)
    except TimeoutError:
        assert seen[-1] == want  # the difference, shown


def test_import_then_follow_a_real_ktserver(
    kt_cluster: tuple[Cluster, Procs], tmp_path: Path
) -> None:
    c, procs = kt_cluster
    _, token = producer_token_file(c, tmp_path, "live/")
    kt, port = start_kt(procs, tmp_path)
    for i in range(50):
        assert kt_rpc(port, "set", key=f"k{i:02d}", value=f"v{i}") == 200
    state = tmp_path / "bridge.state"
    common = [
        "--kt",
        f"127.0.0.1:{port}",
        "--url",
        c.root.url,
        "--token-file",
        str(token),
        "--state",
        str(state),
        "--prefix",
        "live/",
    ]
    r = run_mercury("kt-bridge", *common, "--import", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "imported 50 records" in r.stdout
    want = {f"live/k{i:02d}": f"v{i}" for i in range(50)}
    eventually(c, "live/", want)

    # follow: the entries logged before and during the import are replayed (no change),
    # then new writes arrive
    bridge = procs.start_mercury(
        "kt-bridge", *common, "--read-url", c.read_url, "--window-ms", "50", name="kt-bridge"
    )
    assert kt_rpc(port, "set", key="k00", value="new") == 200
    assert kt_rpc(port, "remove", key="k01") == 200
    assert kt_rpc(port, "set", key="bin\x01", value="x") == 200
    want.update({"live/k00": "new", "live/bin\x01": "x"})
    del want["live/k01"]
    eventually(c, "live/", want)

    # a write made while the bridge is down arrives after its restart
    procs.terminate(bridge)
    assert kt_rpc(port, "set", key="k02", value="while down") == 200
    bridge = procs.start_mercury(
        "kt-bridge", *common, "--read-url", c.read_url, "--window-ms", "50", name="kt-bridge"
    )
    want["live/k02"] = "while down"
    eventually(c, "live/", want)

    # the master restarts (same update log): the bridge reconnects and resumes
    procs.terminate(kt)
    kt, _ = start_kt(procs, tmp_path, port=port)
    assert kt_rpc(port, "set", key="k03", value="after restart") == 200
    want["live/k03"] = "after restart"
    eventually(c, "live/", want)

    # KT's clear deletes every key under the prefix; later sets still arrive
    assert kt_rpc(port, "clear") == 200
    assert kt_rpc(port, "set", key="after", value="clear") == 200
    eventually(c, "live/", {"live/after": "clear"})
    procs.terminate(bridge)
    procs.terminate(kt)
