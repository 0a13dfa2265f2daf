"""`make run`: a working local deployment on loopback.

Initialises `var/plain/root` on first use, starts the root and one replica
(`mercury/dev/topology.py`) with every listener, creates the demo producer and a token for
it, checks that the replica streams the root's database, prints an example command for each
protocol and what came up, and runs until Ctrl-C / SIGTERM, then stops both processes by PID.

The run owns its state directory (``var/<mode>``: each mode its own, so switching modes
never mixes databases): one run at a time (a second refuses at once, naming the PID that
holds ``run.pid``), one topology per directory (a directory another topology made is
refused with the command that resets it). It exits non-zero when anything did not come up,
a port is taken, or a process exits under it.

Every port is a flag (``python -m mercury.dev --root-port 9080``) or an environment
variable (``MERCURY_ROOT_PORT=9080 make run``); a flag wins over the environment, which
wins over the default of `topology.Ports`. ``--var`` (``MERCURY_VAR``) moves the stores
and logs out of ``var/<mode>``.

``--secure`` (``MERCURY_SECURE=1 make run``) runs the secure variant of the topology: it
makes a CA and the nodes' certificates (`mercury certs`, under ``var/certs``, the CA's key
in ``var/ca``), serves HTTPS, replicates over mutual TLS, asks every read for a token
(``--read-auth``), and creates the demo consumer and its read token. Without it, the
printed examples end with the commands of that secure setup.

``--ha`` (``MERCURY_HA=1 make run``) runs two root candidates on a local etcd instead of
the one root (`mercury/dev/run_ha.py`).

``--cache`` (``MERCURY_CACHE=1 make run``, plain mode) adds a cache node
(`topology.cache_node`, ``mercury cache``) following the replica, then the root; it is not
part of the topology a state directory records, so it can be added to a run and left out
of the next.

``--filtered PREFIX`` (``MERCURY_FILTERED=demo/a make run``, plain mode) adds a filtered
replica holding the keys under PREFIX (`topology.filtered_replica`), following the replica,
then the root; like the cache node, not part of the recorded topology. Its store is
``var/plain/filtered``: delete it before running with another PREFIX (a store never widens).
"""

from __future__ import annotations

import argparse
import os
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path

import httpx

from mercury.dev import run_ha
from mercury.dev.common import (
    REPO,
    claim_state,
    demo_token,
    mercury_argv,
    ports_in_use,
    reader_token,
    stop_all,
    stop_requested,
    wait_http,
    wait_streaming,
    write_secret,
)
from mercury.dev.topology import (
    DEMO_CONSUMER,
    DEMO_KEYSPACE,
    DEMO_PRODUCER,
    Node,
    Ports,
    cache_node,
    filtered_replica,
    local,
    local_ha,
)


def parse_args(argv: Sequence[str] | None, env: Mapping[str, str]) -> argparse.Namespace:
    """Ports and the var directory: each flag defaults to its environment variable
    (``--root-repl-port`` <- ``MERCURY_ROOT_REPL_PORT``), then to `Ports`' default."""
    p = argparse.ArgumentParser(prog="python -m mercury.dev", description=__doc__)
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
    p.add_argument(
        "--var",
        default=env.get("MERCURY_VAR") or None,
        help="the state directory: stores, logs, tokens (env MERCURY_VAR; default "
        "var/<mode>: var/plain, var/secure or var/ha, one topology each)",
    )
    p.add_argument(
        "--secure",
        action="store_true",
        default=env.get("MERCURY_SECURE", "") not in ("", "0"),
        help="TLS, mutual-TLS replication and read tokens (env MERCURY_SECURE=1)",
    )
    p.add_argument(
        "--ha",
        action="store_true",
        default=env.get("MERCURY_HA", "") not in ("", "0"),
        help="two root candidates elected through a local etcd (env MERCURY_HA=1; "
        "mercury/dev/run_ha.py)",
    )
    p.add_argument(
        "--cache",
        dest="with_cache",  # `cache` is the cache node's port (`Ports.cache`)
        action="store_true",
        default=env.get("MERCURY_CACHE", "") not in ("", "0"),
        help="also run a cache node following the replica (env MERCURY_CACHE=1; plain mode)",
    )
    p.add_argument(
        "--filtered",
        dest="filtered_prefix",  # `filtered` is its port (`Ports.filtered`)
        metavar="PREFIX",
        default=env.get("MERCURY_FILTERED") or None,
        help="also run a filtered replica holding the keys under PREFIX (env "
        "MERCURY_FILTERED=PREFIX, e.g. demo/a; plain mode)",
    )
    return p.parse_args(argv)


def _secure_setup(var: str, root: Node, replica: Node) -> str:
    """The commands of the secure setup, as `--secure` runs them."""
    gw = f"https://{root.flag('--listen')}"
    rd = f"https://{replica.flag('--listen')}"
    admin = f"{root.data_dir}/admin.token"
    sroot, srep = local(Ports(), var, secure=True)
    tls_root = " ".join(sroot.argv()[len(root.argv()) :])
    tls_rep = " ".join(srep.argv()[len(replica.argv()) :])
    return f"""
Secure setup (MERCURY_SECURE=1 make run does all of this):
  # a CA and one certificate per node (the CA's key stays in {var}/ca)
  .venv/bin/mercury certs {var}/certs --ca-key-dir {var}/ca \\
       --node root --role root --node replica --role replica
  # each node with its certificate (HTTPS, mutual-TLS replication) and read tokens
  .venv/bin/mercury {" ".join(root.argv())} {tls_root}
  .venv/bin/mercury {" ".join(replica.argv())} {tls_rep}
  # a consumer for the demo keyspace, and a read token for it (shown once)
  curl --cacert {var}/certs/ca.crt -X PUT -H "Authorization: Bearer $(cat {admin})" \\
       -d '{{"keyspaces":["{DEMO_KEYSPACE}"]}}' {gw}/v1/admin/consumers/{DEMO_CONSUMER}
  READ_TOKEN=$(.venv/bin/mercury acl token create {DEMO_CONSUMER} --consumer \\
       --label laptop --url {gw} --admin-token-file {admin} --ca {var}/certs/ca.crt)
  # read with it (401 without, 403 outside {DEMO_KEYSPACE})
  curl --cacert {var}/certs/ca.crt -H "Authorization: Bearer $READ_TOKEN" {rd}/v1/kv/demo/hello
"""


def _cli(gw: str, rd: str, var: str) -> str:
    """The same writes and reads through `mercury kv` (the plain mode's: docs/client.md)."""
    return f"""  # the command line (docs/client.md): writes to MERCURY_URL, reads MERCURY_READ_URL
  export MERCURY_URL={gw} MERCURY_READ_URL={rd} MERCURY_TOKEN_FILE={var}/demo.token
  .venv/bin/mercury kv put demo/cli 'from the CLI'
  .venv/bin/mercury kv get demo/cli; echo; .venv/bin/mercury kv ls demo/ -o table
"""


def _examples(token: str, ROOT: Node, REPLICA: Node, var: str, reader: str | None = None) -> str:
    gw = f"{ROOT.scheme}://{ROOT.flag('--listen')}"
    rd = f"{REPLICA.scheme}://{REPLICA.flag('--listen')}"
    kt = REPLICA.flag("--kt-listen")
    mc_host, mc_port = REPLICA.flag("--memcached-listen").split(":")
    # Secure: curl trusts the deployment's CA, and reads carry the demo consumer's token.
    curl = f"curl --cacert {var}/certs/ca.crt" if reader else "curl"
    rcurl = f'{curl} -H "Authorization: Bearer {reader}"' if reader else curl
    ca_env = f"SSL_CERT_FILE={var}/certs/ca.crt " if reader else ""
    mode = (
        f"""HTTPS and mutual-TLS replication (certificates in {var}/certs), read tokens on.
Demo consumer '{DEMO_CONSUMER}' reads '{DEMO_KEYSPACE}'; its token is in {var}/reader.token."""
        if reader
        else "plain HTTP on loopback."
    )
    return f"""
Mercury is running (root + replica on loopback), {mode}
Demo producer '{DEMO_PRODUCER}' owns keyspace '{DEMO_KEYSPACE}'.
Its token is in {var}/demo.token; the admin token in {ROOT.data_dir}/admin.token.

  # write through the gateway (acknowledged after the durable commit of its batch)
  {curl} -X PUT -H "Authorization: Bearer {token}" --data-binary 'hello world' {gw}/v1/kv/demo/hello
  {curl} -X POST -H "Authorization: Bearer {token}" -H 'Content-Type: application/json' \\
       -d '{{"ops":[{{"op":"set","key":"demo/a","value":"1"}},
                    {{"op":"set","key":"demo/b","value":"2"}}]}}' {gw}/v1/batch
  # read from the replica (HTTP): point, bulk, range
  {rcurl} -i {rd}/v1/kv/demo/hello
  {rcurl} -X POST -H 'Content-Type: application/json' \\
       -d '{{"keys":["demo/a","demo/b"]}}' {rd}/v1/get_bulk
  {rcurl} '{rd}/v1/range?prefix=demo/&limit=100'
  {rcurl} -H 'Accept: application/x-ndjson' '{rd}/v1/range?prefix=demo/'
  {curl} {rd}/v1/status; {curl} -s {rd}/metrics | grep mercury_replication
  # Kyoto Tycoon protocol (RESTful and TSV-RPC)
  curl http://{kt}/demo%2Fhello        # KT REST: a '/' in a key travels as %2F
  curl -X POST -H 'Content-Type: text/tab-separated-values' --data-binary $'prefix\\tdemo/' http://{kt}/rpc/match_prefix
  # memcached text protocol (over a plain socket: make run installs no memcached client)
  .venv/bin/python -c "import socket; s = socket.create_connection(('{mc_host}', {mc_port})); \\
      s.sendall(b'get demo/hello demo/a\\r\\n'); print(s.recv(65536).decode())"
{"" if reader else _cli(gw, rd, var)}  # operators
  {ca_env}.venv/bin/mercury usage --url {gw} --admin-token-file {ROOT.data_dir}/admin.token
  .venv/bin/mercury status {ROOT.data_dir}
{"" if reader else _secure_setup(var, ROOT, REPLICA)}
Ctrl-C stops both processes.
"""


def _listens(nodes: Sequence[Node]) -> list[str]:
    """Every ``HOST:PORT`` the nodes listen on (their `--*listen` flags)."""
    return [v for n in nodes for f, v in n.flags if f.endswith("listen") and v is not None]


def _topology(mode: str, nodes: Sequence[Node]) -> str:
    """What `claim_state` records: the mode and its nodes' names."""
    return f"{mode}: {' '.join(n.name for n in nodes)}"


def _flat(nodes: Sequence[object]) -> list[Node]:
    """The nodes of `topology.local_ha` (nodes, or tuples of them), in order."""
    out: list[Node] = []
    for n in nodes:
        out += [n] if isinstance(n, Node) else _flat(n)  # type: ignore[arg-type]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the local deployment until interrupted; non-zero when it could not start (or
    refused to: another run holds the state, another topology made it, a port is taken)
    or a process exited under it."""
    args = parse_args(argv, os.environ)
    ports = Ports(**{f.name: getattr(args, f.name) for f in fields(Ports)})
    mode = "ha" if args.ha else "secure" if args.secure else "plain"
    if args.ha and args.secure:
        print(
            "--ha runs plain HTTP on loopback; `docker compose --profile ha up` runs "
            "candidates with TLS (docs/ha.md)",
            file=sys.stderr,
        )
        return 2
    if args.with_cache and (args.ha or args.secure):
        print(
            "--cache runs in the plain mode only (the secure mode asks every read for a "
            "token, which a cache node does not check yet)",
            file=sys.stderr,
        )
        return 2
    if args.filtered_prefix and (args.ha or args.secure):
        print("--filtered runs in the plain mode only", file=sys.stderr)
        return 2
    os.chdir(REPO)
    # One topology per state directory: each mode has its own by default (var/plain,
    # var/secure, var/ha), so switching modes never mixes databases.
    var = args.var or f"var/{mode}"
    nodes = _flat(local_ha(ports, var)) if args.ha else list(local(ports, var, secure=args.secure))
    try:
        claim_state(Path(var), _topology(mode, nodes))
        cache = cache_node(ports, var) if args.with_cache else None
        prefix = args.filtered_prefix
        filtered = filtered_replica(ports, var, prefix) if prefix else None
        extra = [n for n in (cache, filtered) if n is not None]
        busy = ports_in_use(_listens([*nodes, *extra]))
        if busy:
            raise SystemExit(
                f"already in use: {', '.join(busy)} (another make run, or another service); "
                "choose other ports with the flags or variables of `python -m mercury.dev -h`"
            )
    except SystemExit as refused:
        print(refused, file=sys.stderr)
        return 1
    if args.ha:
        return run_ha.run(ports, var)
    return _run(
        var, args.secure, *local(ports, var, secure=args.secure), cache=cache, filtered=filtered
    )


def _run(
    var: str,
    secure: bool,
    ROOT: Node,
    REPLICA: Node,
    cache: Node | None = None,
    filtered: Node | None = None,
) -> int:
    """The root and its replica (`main` owns `var`): 0 once stopped as asked, 1 when
    something did not come up or exited under it (said on stderr)."""
    if not Path(ROOT.data_dir, "data.mdb").exists():
        subprocess.run(mercury_argv("init", ROOT.data_dir), check=True)
        # A replica store left from an earlier root mirrors another database: that root's
        # successor would refuse it forever while it kept serving the old data.
        shutil.rmtree(REPLICA.data_dir, ignore_errors=True)
    verify: ssl.SSLContext | bool = True
    if secure:
        certs = ["certs", f"{var}/certs", "--ca-key-dir", f"{var}/ca"]
        nodes = ["--node", ROOT.name, "--role", "root", "--node", REPLICA.name, "--role", "replica"]
        subprocess.run(mercury_argv(*certs, *nodes), check=True)
        verify = ssl.create_default_context(cafile=f"{var}/certs/ca.crt")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    stopping = stop_requested()
    try:
        for node in (ROOT, REPLICA):
            log = open(f"{var}/{node.name}.log", "ab")  # noqa: SIM115 - handed to the child
            procs[node.name] = subprocess.Popen(mercury_argv(*node.argv()), stdout=log, stderr=log)
            log.close()
            try:
                wait_http(
                    f"{node.scheme}://{node.flag('--listen')}/healthz", procs[node.name], verify
                )
            except SystemExit as err:
                raise SystemExit(f"{node.name}: {err} ({var}/{node.name}.log)") from None
        admin = Path(ROOT.data_dir, "admin.token").read_text().strip()
        gw = f"{ROOT.scheme}://{ROOT.flag('--listen')}"
        token = demo_token(gw, admin, verify)
        write_secret(f"{var}/demo.token", token)
        reader = None
        if secure:
            reader = reader_token(gw, admin, verify)
            write_secret(f"{var}/reader.token", reader)
        db_id = str(httpx.get(f"{gw}/v1/status", verify=verify, timeout=5).json()["db_id"])
        rd = f"{REPLICA.scheme}://{REPLICA.flag('--listen')}"
        wait_streaming(rd, db_id, procs[REPLICA.name], verify, f"rm -rf {REPLICA.data_dir}")
        if cache is not None:
            _start_cache(cache, var, procs)
        if filtered is not None:
            _start_cache(filtered, var, procs)  # started and waited for the same way
        print(_came_up(procs, var, db_id), flush=True)
        print(_examples(token, ROOT, REPLICA, var, reader), flush=True)
        if cache is not None:
            print(_cache_examples(cache), flush=True)
        if filtered is not None:
            print(_filtered_examples(filtered), flush=True)
        while not stopping() and all(p.poll() is None for p in procs.values()):
            time.sleep(0.5)
        if stopping():
            return 0
        for name, p in procs.items():
            if p.poll() is not None:
                print(f"{name} exited with {p.returncode}; see {var}/{name}.log", file=sys.stderr)
        return 1
    except SystemExit as failed:
        print(f"make run failed: {failed}", file=sys.stderr)
        return 1
    finally:
        stop_all(list(procs.values()))


def _start_cache(cache: Node, var: str, procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """Start the cache node and wait until it serves (its stream connects on its own)."""
    log = open(f"{var}/{cache.name}.log", "ab")  # noqa: SIM115 - handed to the child
    procs[cache.name] = subprocess.Popen(mercury_argv(*cache.argv()), stdout=log, stderr=log)
    log.close()
    try:
        wait_http(f"http://{cache.flag('--listen')}/healthz", procs[cache.name], True)
    except SystemExit as err:
        raise SystemExit(f"{cache.name}: {err} ({var}/{cache.name}.log)") from None


def _cache_examples(cache: Node) -> str:
    c = f"http://{cache.flag('--listen')}"
    return f"""Cache node (holds only what is read; docs/replication.md, "Cache nodes"):
  curl -i {c}/v1/kv/demo/hello      # X-Mercury-Cache: miss, then hit
  curl -i http://{cache.flag("--kt-listen")}/demo%2Fhello      # the same through KT's REST
  curl -s {c}/v1/status; curl -s {c}/metrics | grep mercury_cache
"""


def _filtered_examples(node: Node) -> str:
    f = f"http://{node.flag('--listen')}"
    return f"""Filtered replica (holds only keys under {node.flag("--keyspace")!r}; \
docs/replication.md, "Filtered replicas"):
  curl -s {f}/v1/status                 # "keyspaces"
  curl -i {f}/v1/kv/demo/hello          # outside its keyspace: 421 naming its sources
"""


def _came_up(procs: Mapping[str, subprocess.Popen[bytes]], var: str, db_id: str) -> str:
    """The banner's last lines: each process as it really is, checked just before."""
    lines = [f"  {n}: PID {p.pid}, log {var}/{n}.log" for n, p in procs.items()]
    return "\n".join(
        [f"Up and checked (database {db_id}; the replica streams from the root):", *lines]
    )


if __name__ == "__main__":
    sys.exit(main())
