"""`make run` (mercury/devrun.py): every port from a flag or the environment; a real run on
free ports in a temporary var directory comes up, prints its examples and stops both
processes on SIGTERM."""

from __future__ import annotations

import sys
import time
from dataclasses import fields
from pathlib import Path

import httpx

from mercury.devrun import parse_args
from mercury.topology import Ports, local
from tests.support.procs import Procs, free_port, wait_http


def test_flags_win_over_environment_over_defaults() -> None:
    args = parse_args(
        ["--root-port", "9080"], {"MERCURY_ROOT_PORT": "9999", "MERCURY_REPLICA_KT_PORT": "2979"}
    )
    assert (args.root, args.replica_kt, args.replica) == (9080, 2979, 8081)
    assert args.var == "var"
    assert parse_args([], {"MERCURY_VAR": "/tmp/x"}).var == "/tmp/x"


def test_the_topology_uses_the_given_ports() -> None:
    root, replica = local(Ports(root=1, root_repl=2, replica_memcached=3), "v")
    assert root.flag("--listen") == "127.0.0.1:1" and root.data_dir == "v/root"
    assert replica.flag("--source") == "127.0.0.1:2"
    assert replica.flag("--memcached-listen") == "127.0.0.1:3"


def test_make_run_on_other_ports(tmp_path: Path, procs: Procs) -> None:
    ports = {f.name: free_port() for f in fields(Ports)}
    argv = [sys.executable, "-m", "mercury.devrun", "--var", str(tmp_path / "var")]
    for name, port in ports.items():
        argv += [f"--{name.replace('_', '-')}-port", str(port)]
    run = procs.start(argv, name="devrun")
    wait_http(f"http://127.0.0.1:{ports['root']}/healthz", timeout=120, proc=run)
    wait_http(f"http://127.0.0.1:{ports['replica']}/healthz", timeout=120, proc=run)
    log = next(procs.log_dir.glob("devrun-*.log"))
    deadline = time.monotonic() + 60
    while "Mercury is running" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    text = log.read_text()
    assert f"http://127.0.0.1:{ports['root']}/v1/kv/demo/hello" in text, text
    assert f"('127.0.0.1', {ports['replica_memcached']})" in text
    assert (tmp_path / "var" / "demo.token").exists()
    assert procs.terminate(run, timeout=60) == 0
    for port in (ports["root"], ports["replica"]):
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
        except httpx.TransportError:
            continue
        raise AssertionError(f"something still serves on {port} after make run stopped")
