"""`MERCURY_HA=1 make run` (``python -m mercury.dev --ha``): the local topology with three
root candidates (the production shape) elected through a local etcd member
(`topology.local_ha`).

It starts etcd (its data in ``var/etcd``), initialises ``var/root-a`` on first use
(``root-b`` and ``root-c`` start empty and bootstrap a snapshot from whichever candidate
leads), starts the candidates, waits for a leader, creates the demo producer through it, starts the
replica (it streams from whichever candidate leads) and prints example commands, among
them how to kill the leader and watch the other take over. Like the compose topology's
restart policy, a candidate that exits is started again (once another one leads) and
rejoins as a standby: with ``--sync-standbys 1`` (the default in HA mode) a leader
acknowledges writes only while a standby confirms them; with three candidates the one left
standing after a failover confirms them. Each process's PID is in ``var/<name>.pid``.
Ctrl-C or SIGTERM stops every process by PID.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from mercury.dev.common import (
    demo_token,
    mercury_argv,
    stop_all,
    stop_requested,
    wait_http,
    wait_streaming,
    write_secret,
)
from mercury.dev.topology import DEMO_KEYSPACE, DEMO_PRODUCER, Node, Ports, local_ha
from testkit.etcdbin import etcd_binary

#: A candidate that exits this many times within `RESTART_WINDOW_S` is not started again
#: (a configuration error, not a failover to demonstrate): the run stops with an error.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
#: A dead candidate is started again at the latest this long after its death, whether or
#: not another candidate leads by then.
REJOIN_AFTER_S = 15.0
#: Longest wait for etcd, a leader, and each process to serve.
START_TIMEOUT_S = 120.0


def _status(node: Node) -> dict[str, object]:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        r = httpx.get(f"http://{node.flag('--listen')}/v1/status", timeout=1)
        if r.status_code == 200:
            body = r.json()
            if isinstance(body, dict):
                return body
    return {}


def _wait_leader(candidates: list[Node]) -> Node:
    """The leader, once one leads with a standby in sync (a write before that would wait
    for one and could be answered 503 `not-in-sync`)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for node in candidates:
            st = _status(node)
            in_sync = st.get("standbys_in_sync")
            if st.get("role") == "leader" and isinstance(in_sync, int) and in_sync >= 1:
                return node
        time.sleep(0.2)
    raise SystemExit(
        f"no candidate led with a standby in sync within {START_TIMEOUT_S:.0f}s; see their logs"
    )


class _Supervisor:
    """The run's processes: started with their logs in `var`, restarted (candidates) or
    reported (the others) when they exit, stopped by PID in reverse order."""

    def __init__(self, var: str) -> None:
        self.var = var
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: dict[str, list[float]] = {}
        self.dead_since: dict[str, float] = {}

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(f"{self.var}/{name}.log", "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(argv, stdout=log, stderr=log)
        log.close()
        self.procs[name] = proc
        write_secret(f"{self.var}/{name}.pid", str(proc.pid))
        return proc

    def check(self, candidates: dict[str, Node], stopping: Callable[[], bool]) -> str | None:
        """Restart candidates that exited (not once the run is stopping); the reason to stop
        the run, if any. A dead candidate is started again once another one leads (or
        `REJOIN_AFTER_S` after its death): started at once, it would wait out its own old
        lease and might win again, and the demo is of the standby taking over."""
        for name, proc in list(self.procs.items()):
            if proc.poll() is None:
                self.dead_since.pop(name, None)
                continue
            if name not in candidates:
                return f"{name} exited with {proc.returncode}; see {self.var}/{name}.log"
            now = time.monotonic()
            died = self.dead_since.setdefault(name, now)
            others_lead = any(
                _status(node).get("role") == "leader" for n, node in candidates.items() if n != name
            )
            if not others_lead and now - died < REJOIN_AFTER_S:
                continue
            recent = [t for t in self.restarts.get(name, []) if now - t < RESTART_WINDOW_S]
            if len(recent) >= MAX_RESTARTS:
                return f"{name} keeps exiting ({proc.returncode}); see {self.var}/{name}.log"
            self.restarts[name] = [*recent, now]
            if stopping():
                return None
            print(f"{name} exited ({proc.returncode}); starting it again", flush=True)
            self.start(name, mercury_argv(*candidates[name].argv()))
        return None

    def stop(self) -> None:
        stop_all(list(self.procs.values()))


def _examples(token: str, cands: tuple[Node, ...], replica: Node, leader: Node, var: str) -> str:
    a = cands[0]
    ua = f"http://{a.flag('--listen')}"
    standby = next(c for c in cands if c is not leader)
    ub = f"http://{standby.flag('--listen')}"
    rd = f"http://{replica.flag('--listen')}"
    standbys = ", ".join(c.name for c in cands if c is not leader)
    urls = ",".join(f"http://{c.flag('--listen')}" for c in cands)
    return f"""
Mercury is running: three root candidates elected through a local etcd, and a replica.
{leader.name} leads now ({leader.flag("--advertise-url")}); {standbys} are its standbys.
Demo producer '{DEMO_PRODUCER}' owns keyspace '{DEMO_KEYSPACE}'; its token is in
{var}/demo.token, the admin token in {a.data_dir}/admin.token.

  # who leads: role, term and the leader's URL, from any candidate
  curl {ua}/v1/status; echo; curl {ub}/v1/status
  # write with every candidate's URL: the CLI and the SDK find the leader, and go on
  # through a failover (Client([...]) in Python)
  .venv/bin/mercury kv put --url {urls} --token-file {var}/demo.token demo/cli 'hi'
  # write through a standby: it answers 307 to the leader (--location-trusted
  # follows it with the token; plain -L would drop the Authorization header)
  curl --location-trusted -X PUT -H "Authorization: Bearer {token}" --data-binary 'hello world' \\
       {ub}/v1/kv/demo/hello
  # read from the replica (it streams from whichever candidate leads)
  curl -i {rd}/v1/kv/demo/hello
  curl {rd}/v1/status
  # fail over: kill the leader's process. A standby wins once the lease expires (~5 s)
  # and continues the same seq and hash chain; this run then starts the killed candidate
  # again and it rejoins as a standby (the third candidate confirms writes meanwhile).
  kill -9 $(cat {var}/{leader.name}.pid)
  curl {ua}/v1/status; echo; curl {ub}/v1/status

Ctrl-C stops every process (etcd included).
"""


def run(ports: Ports, var: str) -> int:
    """Run the HA variant until interrupted (see the module doc)."""
    cands, replica = local_ha(ports, var)
    a = cands[0]
    Path(var).mkdir(parents=True, exist_ok=True)
    if not Path(a.data_dir, "data.mdb").exists():
        # A new database: the other candidates' and the replica's stores, and the election
        # state in etcd, are left from another one (they would be refused, or lead it).
        for stale in (*(c.data_dir for c in cands[1:]), replica.data_dir, f"{var}/etcd"):
            shutil.rmtree(stale, ignore_errors=True)
        subprocess.run(mercury_argv("init", a.data_dir), check=True)
    etcd_url = f"http://127.0.0.1:{ports.etcd}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    etcd_argv = [
        etcd_binary(),
        "--name", "local",
        "--data-dir", f"{var}/etcd",
        "--listen-client-urls", etcd_url,
        "--advertise-client-urls", etcd_url,
        "--listen-peer-urls", peer,
        "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"local={peer}",
        "--log-level", "warn",
    ]  # fmt: skip
    candidates = {node.name: node for node in cands}
    stopping = stop_requested()
    sup = _Supervisor(var)
    try:
        etcd = sup.start("etcd", etcd_argv)
        wait_http(f"{etcd_url}/health", etcd, True, START_TIMEOUT_S)
        for node in cands:
            sup.start(node.name, mercury_argv(*node.argv()))
        leader = _wait_leader(list(cands))
        admin = Path(a.data_dir, "admin.token").read_text().strip()
        token = demo_token(f"http://{leader.flag('--listen')}", admin)
        write_secret(f"{var}/demo.token", token)
        rep = sup.start(replica.name, mercury_argv(*replica.argv()))
        wait_http(f"http://{replica.flag('--listen')}/healthz", rep, True, START_TIMEOUT_S)
        # The banner says the replica streams: checked (a store of another database would
        # be refused by every candidate while it served its old data).
        rd, db_id = f"http://{replica.flag('--listen')}", str(_status(leader).get("db_id"))
        wait_streaming(rd, db_id, rep, True, f"rm -rf {replica.data_dir}")
        print(_examples(token, cands, replica, leader, var), flush=True)
        while not stopping():
            problem = sup.check(candidates, stopping)
            if problem is not None and not stopping():
                print(problem, file=sys.stderr)
                return 1
            time.sleep(0.5)
    finally:
        sup.stop()
    return 0
