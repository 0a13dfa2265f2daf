"""What every Mercury process shares: `--log-level` on every command, `--version`, JSON log
lines (the replica's replication worker included) with start and stop events, and one
`/healthz` shape on the root and on replicas. Real processes on loopback."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx

from mercury.cli import COMMAND_MODULES, COMMANDS, build_parser
from testkit.procs import REPO, Procs, free_port, run_mercury, wait_http


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[Any]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(path, parser)]
    out = []
    for action in subs:
        for name, child in action.choices.items():
            out += _leaves(child, (*path, name))
    return out


def test_every_command_has_log_level_in_its_help() -> None:
    leaves = _leaves(build_parser())
    assert len(leaves) >= 6  # root, replica, init, acl apply, usage, ...
    for path, parser in leaves:
        assert "--log-level" in parser.format_help(), " ".join(path)
    # and on a real command line, one of them end to end
    out = run_mercury("acl", "apply", "--help")
    assert out.returncode == 0 and "--log-level" in out.stdout


def test_each_command_parses_alike_from_its_own_module_alone(tmp_path: Path) -> None:
    """A run builds its parser from its command's module alone (`COMMANDS`): the map names
    every command of every module, and each command's leaves and help equal the full
    parser's; a short command then imports none of the daemons' web stack."""
    registered: dict[str, str] = {}
    for module in COMMAND_MODULES:
        sub = argparse.ArgumentParser(prog="mercury").add_subparsers()
        importlib.import_module(module).register(sub)
        registered.update(dict.fromkeys(sub.choices, module))
    assert registered == COMMANDS, "name every command of COMMAND_MODULES in mercury.cli.COMMANDS"
    full = {path: p.format_help() for path, p in _leaves(build_parser())}
    for command in COMMANDS:
        alone = {path: p.format_help() for path, p in _leaves(build_parser(command))}
        mine = {c for c, m in COMMANDS.items() if m == COMMANDS[command]}
        assert alone == {path: h for path, h in full.items() if path[0] in mine}, command
    probe = (
        "import sys; from mercury.cli import main; status = main(['init', sys.argv[1]]); "
        "print(status, sorted(m for m in ('fastapi', 'uvicorn', 'reads') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "store")],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert out.stdout.splitlines()[-1:] == ["0 []"], out.stdout + out.stderr


def test_version_prints_the_package_version() -> None:
    out = run_mercury("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"mercury {version('mercury')}"


def _json_lines(text: str) -> list[dict[str, Any]]:
    """Every non-empty line, each of which must be one JSON object."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    docs = []
    for ln in lines:
        doc = json.loads(ln)  # raises on any line that is not JSON
        assert isinstance(doc, dict) and {"ts", "level", "logger"} <= set(doc), ln
        docs.append(doc)
    return docs


def _wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_root_replica_and_worker_log_json_and_share_the_healthz_shape(
    tmp_path: Path, procs: Procs
) -> None:
    assert run_mercury("init", str(tmp_path / "root")).returncode == 0
    token = (tmp_path / "root" / "admin.token").read_text().strip()
    gw, repl, http = free_port(), free_port(), free_port()
    root = procs.start_mercury(
        "root",
        str(tmp_path / "root"),
        "--listen",
        f"127.0.0.1:{gw}",
        "--repl-listen",
        f"127.0.0.1:{repl}",
        "--batch-window-ms",
        "10",
        name="root",
    )
    wait_http(f"http://127.0.0.1:{gw}/healthz", proc=root)
    replica = procs.start_mercury(
        "replica",
        str(tmp_path / "rep"),
        "--source",
        f"127.0.0.1:{repl}",
        "--listen",
        f"127.0.0.1:{http}",
        name="replica",
    )
    wait_http(f"http://127.0.0.1:{http}/healthz", timeout=60, proc=replica)

    base = f"http://127.0.0.1:{gw}"
    admin = {"Authorization": f"Bearer {token}"}
    # A producer whose second write in a second is refused (429, no hold).
    quota = {"ops_per_s": 1, "burst": 1, "max_delay_ms": 0}
    r = httpx.put(
        f"{base}/v1/admin/producers/p", json={"keyspaces": ["p/"], "quota": quota}, headers=admin
    )
    assert r.status_code in (200, 201), r.text
    ptoken = httpx.post(f"{base}/v1/admin/producers/p/tokens", headers=admin).json()["token"]
    producer = {"Authorization": f"Bearer {ptoken}"}
    assert httpx.put(f"{base}/v1/kv/p/a", content=b"1", headers=producer).status_code == 200
    refused = [
        httpx.put(f"{base}/v1/kv/p/b{i}", content=b"2", headers=producer).status_code
        for i in range(3)
    ]
    assert 429 in refused, refused

    root_health = httpx.get(f"{base}/healthz").json()
    _wait(
        lambda: httpx.get(f"http://127.0.0.1:{http}/healthz").json()["seq"] >= root_health["seq"],
        30,
        "the replica to apply the root's write",
    )
    rep_health = httpx.get(f"http://127.0.0.1:{http}/healthz").json()
    assert set(root_health) == set(rep_health) == {"status", "role", "seq"}
    assert root_health["status"] == rep_health["status"] == "ok"
    assert (root_health["role"], rep_health["role"]) == ("root", "replica")
    assert rep_health["seq"] >= root_health["seq"] >= 1  # (the root may log documents since)

    assert procs.terminate(replica) == 0
    assert procs.terminate(root) in (0, -15)  # uvicorn re-raises SIGTERM after shutdown
    logs = {f.name.split("-")[0]: f.read_text() for f in procs.log_dir.glob("*.log")}
    root_lines = _json_lines(logs["root"])
    rep_lines = _json_lines(logs["replica"])  # the parent's and its worker's lines

    def events(lines: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
        return [d for d in lines if d.get("event") == name]

    (start,) = events(root_lines, "start")
    assert start["version"] == version("mercury") and start["db_id"]
    assert start["listen"] == f"127.0.0.1:{gw}" and start["repl_listen"] == f"127.0.0.1:{repl}"
    assert events(root_lines, "stop"), logs["root"]
    rep_starts = {d["logger"]: d for d in events(rep_lines, "start")}
    assert rep_starts["mercury.replica"]["db_id"] == start["db_id"]
    assert rep_starts["mercury.replica"]["listen"] == f"127.0.0.1:{http}"
    assert rep_starts["mercury.replication.worker"]["version"] == version("mercury")
    assert {d["logger"] for d in events(rep_lines, "stop")} >= {
        "mercury.replica",
        "mercury.replication.worker",
    }
    # the worker's own loggers write JSON lines too (not only its start/stop events)
    assert any(
        d["logger"].startswith("mercury.replication") and "event" not in d for d in rep_lines
    ), logs["replica"]
    # 429s commit throttle counters but are not batches: no empty batch line
    batches = events(root_lines, "batch")
    assert batches and all(b["requests"] > 0 for b in batches), batches
