"""docker-compose.yml's HA profile: three etcd members and three root candidates, validated
by a real Compose implementation; without the profile the topology keeps one root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mercury.cli import build_parser
from testkit.compose import compose_config

REPO = Path(__file__).resolve().parents[2]
HA = {"etcd-1", "etcd-2", "etcd-3", "certs-ha", "root-a", "root-b", "root-c"}
ETCD = ["etcd-1", "etcd-2", "etcd-3"]


def _config(*profile: str) -> dict[str, Any]:
    return compose_config(*profile)


def _flags(argv: list[str]) -> dict[str, str]:
    return {a: b for a, b in zip(argv, [*argv[1:], ""], strict=True) if a.startswith("--")}


def _candidate_argv(service: dict[str, Any]) -> list[str]:
    line: str = service["command"][0].split("exec mercury", 1)[1]
    return line.split()


def test_make_run_topology_stays_single_root() -> None:
    assert not HA & set(_config()["services"])


def test_ha_profile_etcd_and_three_candidates() -> None:
    s = _config("--profile", "ha")["services"]
    assert set(s) >= HA
    for name in ETCD:
        f = _flags(s[name]["command"])
        assert f["--name"] == name
        assert f["--advertise-client-urls"] == f"http://{name}:2379"
        assert f["--initial-cluster"] == ",".join(f"{m}=http://{m}:2380" for m in ETCD)
    certs = s["certs-ha"]["command"]
    assert certs[:2] == ["certs", "/certs"]
    made = {certs[i + 1] for i, a in enumerate(certs) if a == "--node"}
    assert made == {"root-a", "root-b", "root-c"}
    groups = set()
    for name in ("root-a", "root-b", "root-c"):
        argv = _candidate_argv(s[name])
        args = build_parser().parse_args(argv)  # `mercury root` accepts every flag
        assert args.ha_etcd == ",".join(f"http://{m}:2379" for m in ETCD)
        assert args.advertise_url == f"https://{name}:{args.listen.rsplit(':', 1)[1]}"
        assert args.advertise_repl == f"{name}:{args.repl_listen.rsplit(':', 1)[1]}"
        assert args.tls_cert == f"/certs/{name}.crt" and args.tls_key == f"/certs/{name}.key"
        assert args.sync_standbys is None  # the HA default: one synchronous standby
        groups.add(args.ha_group)
        assert set(s[name]["depends_on"]) >= {"certs-ha", *ETCD}
    assert len(groups) == 1
    assert "mercury init /data" in s["root-a"]["command"][0]
    for name in ("root-b", "root-c"):
        assert "mercury init" not in s[name]["command"][0]  # bootstraps from the leader
