"""`MERCURY_HA=1 make run` (mercury/dev/run_ha.py), end to end on free ports: a local etcd,
three root candidates and a replica come up; a write sent to the standby is redirected to
the leader and reaches the replica; after the leader's SIGKILL the other candidate leads,
writes are acknowledged again, the killed one is started again as a standby; SIGTERM
stops every process."""

from __future__ import annotations

import os
import re
import signal
import sys
from dataclasses import fields
from pathlib import Path

import httpx
import pytest

from mercury.dev.run import main, parse_args
from mercury.dev.topology import Ports
from testkit.procs import Procs, free_port, run_mercury
from testkit.replication import wait_for

DEADLINE_S = 120.0


def _status(port: int) -> dict[str, object]:
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/v1/status", timeout=2)
        return dict(r.json()) if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}


def _put(port: int, token: str, key: str, value: bytes) -> int:
    """PUT through candidate `port`, following a standby's 307 by hand (with the token)."""
    h = {"Authorization": f"Bearer {token}"}
    url = f"http://127.0.0.1:{port}/v1/kv/{key}"
    try:
        r = httpx.put(url, content=value, headers=h, timeout=10)
        if r.status_code == 307:
            r = httpx.put(r.headers["location"], content=value, headers=h, timeout=10)
        return r.status_code
    except httpx.HTTPError:
        return 0


def test_ha_flag_and_environment() -> None:
    assert not parse_args([], {}).ha
    assert parse_args([], {"MERCURY_HA": "1"}).ha and parse_args(["--ha"], {}).ha


def test_ha_with_secure_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--ha", "--secure", "--var", str(tmp_path / "var")]) == 2
    assert "docker compose --profile ha" in capsys.readouterr().err
    assert not (tmp_path / "var").exists()


def test_ha_make_run_fails_over_and_stops(tmp_path: Path, procs: Procs) -> None:
    ports = {f.name: free_port() for f in fields(Ports)}
    var = tmp_path / "var"
    argv = [sys.executable, "-m", "mercury.dev", "--ha", "--var", str(var)]
    for name, port in ports.items():
        argv += [f"--{name.replace('_', '-')}-port", str(port)]
    run = procs.start(argv, name="devrun")
    log = next(procs.log_dir.glob("devrun-*.log"))
    wait_for(lambda: "Mercury is running" in log.read_text(), DEADLINE_S, "make run's examples")
    text = log.read_text()
    m = re.search(r"^(root-[abc]) leads now", text, re.M)
    assert m, text
    leader = m.group(1)
    cport = {"root-a": ports["root"], "root-b": ports["root_b"], "root-c": ports["root_c"]}
    standby = "root-b" if leader == "root-a" else "root-a"
    assert "three root candidates" in text
    assert "--location-trusted" in text and f"{var}/{leader}.pid" in text
    token = (var / "demo.token").read_text().strip()

    # Through the standby: 307 to the leader, acknowledged there, served by the replica.
    assert _put(cport[standby], token, "demo/hello", b"one") == 200
    replica = f"http://127.0.0.1:{ports['replica']}/v1/kv/demo/hello"
    wait_for(
        lambda: httpx.get(replica, timeout=2).content == b"one",
        DEADLINE_S,
        "the write on the replica",
    )

    urls = ",".join(f"http://127.0.0.1:{cport[c]}" for c in ("root-a", "root-b", "root-c"))
    assert f"--url {urls}" in text

    os.kill(int((var / f"{leader}.pid").read_text()), signal.SIGKILL)
    # The printed CLI command, given every candidate, rides the failover by itself.
    cli = run_mercury(
        "kv", "put", "--url", urls, "--token-file", str(var / "demo.token"), "demo/cli", "hi"
    )
    assert cli.returncode == 0, cli.stderr
    others = [c for c in cport if c != leader]
    wait_for(
        lambda: any(_status(cport[c]).get("role") == "leader" for c in others),
        DEADLINE_S,
        "another candidate leads",
    )
    new = next(c for c in others if _status(cport[c]).get("role") == "leader")
    wait_for(
        lambda: _put(cport[new], token, "demo/hello", b"two") == 200,
        DEADLINE_S,
        "a write acknowledged again",
    )
    wait_for(
        lambda: _status(cport[leader]).get("role") == "standby", DEADLINE_S, f"{leader} rejoined"
    )
    wait_for(
        lambda: httpx.get(replica, timeout=2).content == b"two",
        DEADLINE_S,
        "the replica follows the new leader",
    )

    assert procs.terminate(run, timeout=60) == 0
    for p in ("root", "root_b", "root_c", "replica", "etcd"):
        try:
            httpx.get(f"http://127.0.0.1:{ports[p]}/healthz", timeout=1)
        except httpx.TransportError:
            continue
        raise AssertionError(f"something still serves on {p}'s port after make run stopped")
