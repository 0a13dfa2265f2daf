"""docker-compose.yml validates with a real Compose implementation and runs the same
commands as the secure `make run` (mercury/dev/topology.py): every node with its certificate
from the one-shot `certs` service, read tokens on, token-less listeners beyond loopback
only where --allow-unauthenticated-reads says so; Prometheus scrapes every node over
HTTPS; the Grafana dashboard charts the metrics of docs/api.md."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import ssl
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from mercury import tls
from mercury.dev.topology import SECURE_REPLICA, SECURE_ROOT
from testkit.compose import compose_config
from testkit.procs import Procs, free_port, run_mercury
from testkit.wait import wait_until

REPO = Path(__file__).resolve().parents[1]
MERCURY_SERVICES = {"root", "replica-tier1", "replica-tier2", "consumer-node"}
#: Services that are not long-running Mercury nodes.
OTHER_SERVICES = {"certs", "prometheus", "grafana"}


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return compose_config()


def _argv(service: dict[str, Any]) -> list[str]:
    cmd = service["command"]
    if (service.get("entrypoint") or [None])[0] == "/bin/sh":
        # `... ; exec mercury root /data ...`: the mercury part of the shell line
        line: str = cmd[0].split("exec mercury", 1)[1]
        return line.split()
    return list(cmd)


def _flags(argv: list[str]) -> dict[str, list[str]]:
    """Flag -> its values ("" for a flag without a value, such as --read-auth)."""
    out: dict[str, list[str]] = {}
    for flag, value in itertools.pairwise([*argv, "--"]):
        if flag.startswith("--") and flag != "--":
            out.setdefault(flag, []).append("" if value.startswith("--") else value)
    return out


def test_services(config: dict[str, Any]) -> None:
    assert set(config["services"]) == MERCURY_SERVICES | OTHER_SERVICES


def test_root_runs_the_same_command_as_make_run(config: dict[str, Any]) -> None:
    argv = _argv(config["services"]["root"])
    assert argv[0] == SECURE_ROOT.command
    assert set(_flags(argv)) == {f for f, _ in SECURE_ROOT.flags}
    assert "mercury init /data" in config["services"]["root"]["command"][0]


@pytest.mark.parametrize("name", ["replica-tier1", "replica-tier2"])
def test_replicas_run_the_same_command_as_make_run(config: dict[str, Any], name: str) -> None:
    argv = _argv(config["services"][name])
    assert argv[0] == SECURE_REPLICA.command
    assert set(_flags(argv)) == {f for f, _ in SECURE_REPLICA.flags}


def test_every_node_has_its_certificate_and_read_tokens(config: dict[str, Any]) -> None:
    s = config["services"]
    certs = s["certs"]["command"]
    assert certs[:2] == ["certs", "/certs"]
    made = set(_flags(certs)["--node"])
    ca_key = _flags(certs)["--ca-key-dir"][0]
    assert made == MERCURY_SERVICES
    for name in MERCURY_SERVICES:
        flags = _flags(_argv(s[name]))
        assert flags["--tls-cert"] == [f"/certs/{name}.crt"], name
        assert flags["--tls-key"] == [f"/certs/{name}.key"], name
        assert flags["--tls-ca"] == ["/certs/ca.crt"], name
        assert "--read-auth" in flags, name
        mounts = {v["target"]: v for v in s[name]["volumes"]}
        assert mounts["/certs"]["source"] == "certs" and mounts["/certs"].get("read_only"), name
        assert ca_key not in mounts, f"{name} must not see the CA's key"
        ready = s[name]["depends_on"]["certs"]["condition"]
        assert ready == "service_completed_successfully", name
    root_check = " ".join(s["root"]["healthcheck"]["test"])
    assert "https://" in root_check and "/certs/ca.crt" in root_check


def test_tokenless_listeners_open_only_where_allowed(config: dict[str, Any]) -> None:
    """KT and memcached carry no token: a node may bind them beyond loopback only with
    --allow-unauthenticated-reads (else it would refuse to start)."""
    opened = set()
    for name in MERCURY_SERVICES:
        flags = _flags(_argv(config["services"][name]))
        for listener in ("--kt-listen", "--memcached-listen"):
            for addr in flags.get(listener, []):
                if not tls.is_loopback(addr.rsplit(":", 1)[0]):
                    assert "--allow-unauthenticated-reads" in flags, (name, listener)
                    opened.add(name)
    assert opened == {"consumer-node"}  # the one documented exception


def test_the_tree_is_root_tier1_tier2(config: dict[str, Any]) -> None:
    s = config["services"]
    root_repl = _flags(_argv(s["root"]))["--repl-listen"][0].split(":")[1]
    t1 = _flags(_argv(s["replica-tier1"]))
    assert t1["--source"] == [f"root:{root_repl}"]
    t1_repl = t1["--repl-listen"][0].split(":")[1]
    assert _flags(_argv(s["replica-tier2"]))["--source"][0] == f"replica-tier1:{t1_repl}"
    assert _flags(_argv(s["consumer-node"]))["--source"][0] == f"replica-tier1:{t1_repl}"


def test_prometheus_scrapes_every_node(config: dict[str, Any]) -> None:
    prom = yaml.safe_load((REPO / "deploy/prometheus.yml").read_text())
    for sc in prom["scrape_configs"]:  # the nodes serve HTTPS with the deployment's CA
        assert sc["scheme"] == "https" and sc["tls_config"]["ca_file"] == "/certs/ca.crt"
    mounts = {v["target"] for v in config["services"]["prometheus"]["volumes"]}
    assert "/certs" in mounts
    targets = {
        t.split(":")[0]
        for sc in prom["scrape_configs"]
        for g in sc.get("static_configs", [])
        for t in g["targets"]
    }
    assert targets == MERCURY_SERVICES
    # the HA profile's candidates, found by DNS (no target without the profile), scraped
    # by service name (their certificates name it) on their gateway port
    (ha,) = [sc for sc in prom["scrape_configs"] if "dns_sd_configs" in sc]
    (sd,) = ha["dns_sd_configs"]
    ha_config = compose_config("--profile", "ha")["services"]
    candidates = {n for n, svc in ha_config.items() if "--ha-etcd" in str(svc.get("command"))}
    assert set(sd["names"]) == candidates == {"root-a", "root-b", "root-c"}
    for name in candidates:
        assert f"--listen 0.0.0.0:{sd['port']}" in " ".join(ha_config[name]["command"])
    address = [r for r in ha["relabel_configs"] if r.get("target_label") == "__address__"]
    assert address == [
        {
            "source_labels": ["__meta_dns_name"],
            "target_label": "__address__",
            "replacement": f"${{1}}:{sd['port']}",
        }
    ]


def test_dashboard_charts_the_spec_metrics() -> None:
    dash = json.loads((REPO / "deploy/grafana/dashboards/mercury.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for metric in (
        "mercury_write_ops_total",
        "mercury_batch_ops",
        "mercury_write_ack_seconds",
        "mercury_quota_delay_seconds",
        "mercury_replication_lag_seconds",
        "mercury_read_seconds",
        "mercury_usage_bytes",
        "mercury_replication_worker_cpu_seconds_total",
        "mercury_replication_apply_commits_total",
    ):
        assert metric in exprs, f"dashboard has no panel for {metric}"
    code = " ".join(
        f.read_text()
        for pkg in ("gateway", "reads", "replicator", "store")
        for f in (REPO / pkg).rglob("*.py")
    )
    for name in set(re.findall(r"mercury_[a-z_]+", exprs)):
        base = name.removesuffix("_bucket")
        # a counter declared by its family name is exported with "_total" added
        declared = {base, base.removesuffix("_total")} if base.endswith("_total") else {base}
        assert any(f'"{n}"' in code for n in declared), (
            f"dashboard uses {name}, which no component exports"
        )


def _localise(
    argv: list[str], tmp: Path, service: str, ports: dict[tuple[str, str], int]
) -> list[str]:
    """A service's command for this machine: its volumes under `tmp`, every listener on
    127.0.0.1 at the port `ports` gives it, every source at the port of the service named."""
    out = []
    for arg in argv:
        for vol, local in (
            ("/data", tmp / service),
            ("/certs", tmp / "certs"),
            ("/ca", tmp / "ca"),
        ):
            if arg == vol or arg.startswith(vol + "/"):
                arg = str(local) + arg[len(vol) :]
        out.append(arg)
    for i, (flag, value) in enumerate(itertools.pairwise(list(out))):
        if flag in ("--listen", "--repl-listen", "--kt-listen", "--memcached-listen"):
            out[i + 1] = f"127.0.0.1:{ports[(service, value.rsplit(':', 1)[1])]}"
        elif flag == "--source":
            host, port = value.rsplit(":", 1)
            out[i + 1] = f"127.0.0.1:{ports[(host, port)]}"
    return out


def wait_https(url: str, ca: ssl.SSLContext, proc: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the process for {url} exited"
        try:
            if httpx.get(url, verify=ca, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


def test_the_compose_commands_run_a_secure_tree(
    config: dict[str, Any], tmp_path: Path, procs: Procs
) -> None:
    """No Docker here: the compose services' own commands run as local processes (volumes
    as directories, each service's ports on 127.0.0.1), in compose's order: the certs
    service, the root, the tier-1 replica, then the tier-2 replica and the consumer node.
    A producer's write is read back over HTTPS with a consumer's read token from the
    farthest nodes, which refuse a read without it."""
    s = config["services"]
    ports: dict[tuple[str, str], int] = {}
    for name in MERCURY_SERVICES:
        for flag, values in _flags(_argv(s[name])).items():
            if flag.endswith("listen"):
                ports[(name, values[0].rsplit(":", 1)[1])] = free_port()
    certs = _localise(list(s["certs"]["command"]), tmp_path, "certs", ports)
    assert run_mercury(*certs).returncode == 0
    ca = ssl.create_default_context(cafile=str(tmp_path / "certs" / "ca.crt"))
    assert run_mercury("init", str(tmp_path / "root")).returncode == 0  # the root's `test -f`
    url: dict[str, str] = {}
    for name in ("root", "replica-tier1", "replica-tier2", "consumer-node"):
        argv = _localise(_argv(s[name]), tmp_path, name, ports)
        p = procs.start_mercury(*argv, name=name)
        url[name] = f"https://{_flags(argv)['--listen'][0]}"
        wait_https(f"{url[name]}/healthz", ca, p)
    admin = {"Authorization": f"Bearer {(tmp_path / 'root' / 'admin.token').read_text().strip()}"}
    with httpx.Client(verify=ca, timeout=10) as c:
        r = c.put(
            f"{url['root']}/v1/admin/producers/app", json={"keyspaces": ["app/"]}, headers=admin
        )
        assert r.status_code in (200, 201), r.text
        writer = c.post(f"{url['root']}/v1/admin/producers/app/tokens", headers=admin).json()[
            "token"
        ]
        r = c.put(
            f"{url['root']}/v1/admin/consumers/edge", json={"keyspaces": ["app/"]}, headers=admin
        )
        assert r.status_code in (200, 201), r.text
        reader = c.post(f"{url['root']}/v1/admin/consumers/edge/tokens", headers=admin).json()[
            "token"
        ]
        r = c.put(
            f"{url['root']}/v1/kv/app/x",
            content=b"42",
            headers={"Authorization": f"Bearer {writer}"},
        )
        assert r.status_code == 200, r.text
        for name in ("replica-tier2", "consumer-node"):

            def read(name: str = name) -> httpx.Response:
                return c.get(
                    f"{url[name]}/v1/kv/app/x", headers={"Authorization": f"Bearer {reader}"}
                )

            with contextlib.suppress(TimeoutError):
                wait_until(lambda: read().status_code == 200, 120, f"the write on {name}")
            assert read().content == b"42", name
            assert c.get(f"{url[name]}/v1/kv/app/x").status_code == 401, name
