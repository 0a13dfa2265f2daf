"""`make run`: a working local deployment on loopback.

Initialises `var/root` on first use, starts the root and one replica (`mercury/topology.py`)
with every listener, creates the demo producer and a token for it, prints an example command
for each protocol, and runs until Ctrl-C / SIGTERM, then stops both processes by PID.

Every port is a flag (``python -m mercury.devrun --root-port 9080``) or an environment
variable (``MERCURY_ROOT_PORT=9080 make run``); a flag wins over the environment, which
wins over the default of `topology.Ports`. ``--var`` (``MERCURY_VAR``) moves the stores
and logs out of ``var/``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from types import FrameType

import httpx

from mercury.topology import DEMO_KEYSPACE, DEMO_PRODUCER, Node, Ports, local

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: Sequence[str] | None, env: Mapping[str, str]) -> argparse.Namespace:
    """Ports and the var directory: each flag defaults to its environment variable
    (``--root-repl-port`` <- ``MERCURY_ROOT_REPL_PORT``), then to `Ports`' default."""
    p = argparse.ArgumentParser(prog="python -m mercury.devrun", description=__doc__)
    for f in fields(Ports):
        env_name = f"MERCURY_{f.name.upper()}_PORT"
        default = int(env.get(env_name, str(f.default)))
        p.add_argument(
            f"--{f.name.replace('_', '-')}-port",
            dest=f.name,
            type=int,
            default=default,
            help=f"(env {env_name}, default {f.default})",
        )
    p.add_argument("--var", default=env.get("MERCURY_VAR", "var"), help="stores and logs")
    return p.parse_args(argv)


def _mercury(*args: str) -> list[str]:
    return [sys.executable, "-m", "mercury", *args]


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"process for {url} exited with {proc.returncode}; see its log")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"{url} did not come up within {timeout:.0f}s; see its log")


def _demo_token(base: str, admin_token: str) -> str:
    """Create (or update) the demo producer and issue a token for it."""
    h = {"Authorization": f"Bearer {admin_token}"}
    r = httpx.put(
        f"{base}/v1/admin/producers/{DEMO_PRODUCER}",
        json={"keyspaces": [DEMO_KEYSPACE], "quota": {"ops_per_s": 1000, "burst": 2000}},
        headers=h,
    )
    r.raise_for_status()
    r = httpx.post(f"{base}/v1/admin/producers/{DEMO_PRODUCER}/tokens", headers=h)
    r.raise_for_status()
    return str(r.json()["token"])


def _examples(token: str, ROOT: Node, REPLICA: Node, var: str) -> str:
    gw = f"http://{ROOT.flag('--listen')}"
    rd = f"http://{REPLICA.flag('--listen')}"
    kt = REPLICA.flag("--kt-listen")
    mc_host, mc_port = REPLICA.flag("--memcached-listen").split(":")
    return f"""
Mercury is running (root + replica on loopback).
Demo producer '{DEMO_PRODUCER}' owns keyspace '{DEMO_KEYSPACE}'.
Its token is in {var}/demo.token; the admin token in {ROOT.data_dir}/admin.token.

  # write through the gateway (acknowledged after the durable commit of its batch)
  curl -X PUT -H "Authorization: Bearer {token}" --data-binary 'hello world' {gw}/v1/kv/demo/hello
  curl -X POST -H "Authorization: Bearer {token}" -H 'Content-Type: application/json' \\
       -d '{{"ops":[{{"op":"set","key":"demo/a","value":"1"}},
                    {{"op":"set","key":"demo/b","value":"2"}}]}}' {gw}/v1/batch
  # read from the replica (HTTP): point, bulk, range
  curl -i {rd}/v1/kv/demo/hello
  curl -X POST -H 'Content-Type: application/json' \\
       -d '{{"keys":["demo/a","demo/b"]}}' {rd}/v1/get_bulk
  curl '{rd}/v1/range?prefix=demo/&limit=100'
  curl -H 'Accept: application/x-ndjson' '{rd}/v1/range?prefix=demo/'
  curl {rd}/v1/status; curl -s {rd}/metrics | grep mercury_replication
  # Kyoto Tycoon protocol (RESTful and TSV-RPC)
  curl http://{kt}/demo%2Fhello        # KT REST: a '/' in a key travels as %2F
  curl -X POST -H 'Content-Type: text/tab-separated-values' --data-binary $'prefix\\tdemo/' http://{kt}/rpc/match_prefix
  # memcached text protocol
  .venv/bin/python -c "from pymemcache.client.base import Client; \\
      print(Client(('{mc_host}', {mc_port})).get_many(['demo/hello', 'demo/a']))"
  # operators
  .venv/bin/mercury usage --url {gw} --admin-token-file {ROOT.data_dir}/admin.token
  .venv/bin/mercury status {ROOT.data_dir}

Ctrl-C stops both processes.
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the local deployment until interrupted."""
    args = parse_args(argv, os.environ)
    ports = Ports(**{f.name: getattr(args, f.name) for f in fields(Ports)})
    var = args.var
    ROOT, REPLICA = local(ports, var)
    os.chdir(REPO)
    Path(var).mkdir(parents=True, exist_ok=True)
    if not Path(ROOT.data_dir, "data.mdb").exists():
        subprocess.run(_mercury("init", ROOT.data_dir), check=True)
    procs: list[subprocess.Popen[bytes]] = []
    stopping = False

    def stop(_sig: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        for node in (ROOT, REPLICA):
            log = open(f"{var}/{node.name}.log", "ab")  # noqa: SIM115 - handed to the child
            procs.append(subprocess.Popen(_mercury(*node.argv()), stdout=log, stderr=log))
            log.close()
            _wait_http(f"http://{node.flag('--listen')}/healthz", procs[-1])
        admin = Path(ROOT.data_dir, "admin.token").read_text().strip()
        token = _demo_token(f"http://{ROOT.flag('--listen')}", admin)
        fd = os.open(f"{var}/demo.token", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        print(_examples(token, ROOT, REPLICA, var), flush=True)
        while not stopping and all(p.poll() is None for p in procs):
            time.sleep(0.5)
        for p in procs:
            if p.poll() is not None and not stopping:
                print(f"a process exited with {p.returncode}; see its log", file=sys.stderr)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
