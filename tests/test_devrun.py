"""`make run` (mercury/dev/run.py): every port from a flag or the environment; a real run on
free ports in a temporary var directory comes up, prints its examples and what came up, and
stops both processes on SIGTERM; it owns its state directory (a second run refuses naming
the first one's PID, another topology's directory is refused with the reset command, a
taken port is named); a node that dies under it, or a replica of another database, is reported
and the run exits non-zero; the secure variant runs end to end."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import httpx

from mercury.dev.run import parse_args
from mercury.dev.topology import Ports, cache_node, filtered_replica, local
from testkit.procs import REPO, Procs, free_port, wait_http
from testkit.wait import wait_until


def test_flags_win_over_environment_over_defaults() -> None:
    args = parse_args(
        ["--root-port", "9080"], {"MERCURY_ROOT_PORT": "9999", "MERCURY_REPLICA_KT_PORT": "2979"}
    )
    assert (args.root, args.replica_kt, args.replica) == (9080, 2979, 8081)
    assert args.var is None  # var/<mode>: each mode its own state directory
    assert parse_args([], {"MERCURY_VAR": "/tmp/x"}).var == "/tmp/x"
    assert not args.secure and parse_args([], {"MERCURY_SECURE": "1"}).secure
    assert (
        not parse_args([], {"MERCURY_SECURE": "0"}).secure and parse_args(["--secure"], {}).secure
    )


def test_the_topology_uses_the_given_ports() -> None:
    root, replica = local(Ports(root=1, root_repl=2, replica_memcached=3), "v")
    assert root.flag("--listen") == "127.0.0.1:1" and root.data_dir == "v/root"
    assert replica.flag("--source") == "127.0.0.1:2"
    assert replica.flag("--memcached-listen") == "127.0.0.1:3"
    sroot, sreplica = local(Ports(root=1, root_repl=2, replica_memcached=3), "v", secure=True)
    assert sroot.argv()[: len(root.argv())] == root.argv()  # the same, plus TLS and tokens
    assert sroot.flag("--tls-cert") == "v/certs/root.crt" and sroot.scheme == "https"
    assert sreplica.flag("--tls-key") == "v/certs/replica.key" and root.scheme == "http"
    assert sreplica.argv()[-1] == "--read-auth"


def _argv(var: Path, ports: dict[str, int], *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "mercury.dev", "--var", str(var), *extra]
    for name, port in ports.items():
        argv += [f"--{name.replace('_', '-')}-port", str(port)]
    return argv


def _refused(argv: list[str]) -> str:
    """Stderr of a make run that must refuse at once (exit 1, nothing started)."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Mercury is running" not in done.stdout
    return done.stderr


def test_make_run_on_other_ports(tmp_path: Path, procs: Procs) -> None:
    ports = {f.name: free_port() for f in fields(Ports)}
    var = tmp_path / "var"
    run = procs.start(_argv(var, ports), name="devrun")
    wait_http(f"http://127.0.0.1:{ports['root']}/healthz", timeout=120, proc=run)
    wait_http(f"http://127.0.0.1:{ports['replica']}/healthz", timeout=120, proc=run)
    log = next(procs.log_dir.glob("devrun-*.log"))
    wait_until(lambda: "Up and checked" in log.read_text(), 90, "the banner")
    text = log.read_text()
    assert "Mercury is running" in text
    assert f"http://127.0.0.1:{ports['root']}/v1/kv/demo/hello" in text, text
    assert f"('127.0.0.1', {ports['replica_memcached']})" in text
    token = (var / "demo.token").read_text()
    # The command-line examples it prints work as printed (run from the checkout, as a user
    # does; the replica may apply the put a moment after it is acknowledged: the get waits).
    start = text.index("# the command line")
    cli = text[start : text.index("# operators", start)]
    assert "kv put" in cli and "-o table" in cli, cli

    def cli_ran() -> subprocess.CompletedProcess[str] | None:
        done = subprocess.run(
            ["bash", "-e", "-c", cli], capture_output=True, text=True, timeout=60, cwd=REPO
        )
        return done if done.returncode == 0 else None

    done = wait_until(cli_ran, 30, "the printed mercury kv examples")
    assert "from the CLI" in done.stdout and "| demo/cli" in done.stdout, done.stdout
    # A second run on the same state refuses at once, naming the first; it changes nothing.
    err = _refused(_argv(var, ports))
    assert f"PID {run.pid}" in err and "already running" in err, err
    assert (var / "demo.token").read_text() == token
    assert procs.terminate(run, timeout=60) == 0
    for port in (ports["root"], ports["replica"]):
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
        except httpx.TransportError:
            continue
        raise AssertionError(f"something still serves on {port} after make run stopped")
    # Another topology on this state directory is refused with the command that resets it.
    err = _refused(_argv(var, ports, "--secure"))
    assert f"rm -rf {var}" in err and "plain: root replica" in err, err
    # A port something else holds is named before anything starts.
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports["replica_kt"]))
        s.listen()
        err = _refused(_argv(var, ports))
    assert f"127.0.0.1:{ports['replica_kt']}" in err, err
    # A replica store of another database (here: another run's) is reported, never served
    # as if all were well, and the run exits non-zero.
    other = tmp_path / "other"
    first = procs.start(_argv(other, ports), name="other")
    other_log = next(procs.log_dir.glob("other-*.log"))

    def up() -> str | None:
        text = other_log.read_text()
        return text if "Up and checked" in text else None

    banner = wait_until(up, 120, "the banner")
    # A node that dies under the run is reported, and the run exits non-zero.
    pid = re.search(r"replica: PID (\d+)", banner)
    assert pid, banner
    os.kill(int(pid.group(1)), signal.SIGKILL)
    assert first.wait(60) == 1
    assert "replica exited with -9" in other_log.read_text()
    shutil.rmtree(var / "replica")
    shutil.copytree(other / "replica", var / "replica")
    done = subprocess.run(_argv(var, ports), capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "another database" in done.stderr and f"rm -rf {var}/replica" in done.stderr
    assert "Mercury is running" not in done.stdout


def test_secure_make_run_end_to_end(tmp_path: Path, procs: Procs) -> None:
    """`MERCURY_SECURE=1 make run`: certificates made, HTTPS on both nodes, replication over
    mutual TLS (the replica catches up), and the printed read token reads the demo keyspace
    on the replica (and nothing without it)."""
    ports = {f.name: free_port() for f in fields(Ports)}
    var = tmp_path / "var"
    run = procs.start(_argv(var, ports, "--secure"), name="devrun")

    def banner() -> str | None:
        assert run.poll() is None, "make run exited"
        text = "".join(f.read_text() for f in procs.log_dir.glob("devrun-*.log"))
        return text if "Mercury is running" in text else None

    text = wait_until(banner, 180, "the banner")
    assert "read tokens on" in text and "--cacert" in text, text
    ca = ssl.create_default_context(cafile=str(var / "certs" / "ca.crt"))
    assert (var / "ca" / "ca.key").exists() and not (var / "certs" / "ca.key").exists()
    root = f"https://127.0.0.1:{ports['root']}"
    replica = f"https://127.0.0.1:{ports['replica']}"
    writer = (var / "demo.token").read_text().strip()
    reader = (var / "reader.token").read_text().strip()
    assert reader in text  # the printed read commands carry it

    r = httpx.put(
        f"{root}/v1/kv/demo/hello",
        content=b"hello",
        headers={"Authorization": f"Bearer {writer}"},
        verify=ca,
        timeout=10,
    )
    assert r.status_code == 200, r.text
    auth = {"Authorization": f"Bearer {reader}"}

    def read() -> httpx.Response:
        return httpx.get(f"{replica}/v1/kv/demo/hello", headers=auth, verify=ca, timeout=5)

    # The write reaches the replica over mutual TLS.
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: read().status_code == 200, 60, "the write on the replica")
    assert read().content == b"hello"
    assert httpx.get(f"{replica}/v1/kv/demo/hello", verify=ca, timeout=5).status_code == 401
    assert (
        httpx.get(f"{root}/v1/kv/demo/hello", headers=auth, verify=ca, timeout=5).status_code == 200
    )
    # Plaintext HTTP gets no answer from the HTTPS listener.
    try:
        plain = httpx.get(f"http://127.0.0.1:{ports['replica']}/v1/kv/demo/hello", timeout=5)
    except httpx.TransportError:
        pass
    else:
        assert plain.status_code == 400  # uvicorn's answer to HTTP on a TLS port
    assert procs.terminate(run, timeout=60) == 0


def test_the_cache_node_follows_the_replica_then_the_root() -> None:
    node = cache_node(Ports(replica_repl=5, root_repl=6, cache=7, cache_kt=8), "v")
    assert node.argv()[:2] == ["cache", "v/cache"]
    assert node.flag("--source") == "127.0.0.1:5,127.0.0.1:6"
    assert node.flag("--listen") == "127.0.0.1:7"
    assert node.flag("--kt-listen") == "127.0.0.1:8"
    args = parse_args(["--cache", "--cache-port", "9"], {})
    assert args.with_cache and args.cache == 9


def test_the_filtered_replica_follows_the_replica_then_the_root() -> None:
    node = filtered_replica(Ports(replica_repl=5, root_repl=6, filtered=7), "v", "demo/a")
    assert node.argv()[:2] == ["replica", "v/filtered"]
    assert [v for f, v in node.flags if f == "--source"] == ["127.0.0.1:5", "127.0.0.1:6"]
    assert node.flag("--keyspace") == "demo/a" and node.flag("--listen") == "127.0.0.1:7"
    args = parse_args(["--filtered-port", "9"], {"MERCURY_FILTERED": "demo/a"})
    assert args.filtered_prefix == "demo/a" and args.filtered == 9
