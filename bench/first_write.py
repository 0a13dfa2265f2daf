"""A new user's wait: a fresh clone, `make run`, the first write acknowledged (JSON).

Clones this checkout's committed HEAD (`git clone`) into a temporary directory, runs
`make run` there on free ports (``MERCURY_*_PORT``) and times, from the moment `make run`
starts: the banner, and the first ``PUT /v1/kv/demo/first`` answered 200 with the demo
token `make run` wrote. That first run creates the venv, installs the runtime dependencies
and compiles the Cython modules. Then it stops `make run` (its process group, by the PID
this script started) and runs it again in the same clone: the baseline, everything already
built. pip's download cache (``~/.cache/pip``) is the machine's own unless
``--cold-pip-cache`` (then pip downloads every package again: ``PIP_NO_CACHE_DIR``); the
document says which, and the machine's load average when each run started.

``--commit REV`` measures another commit of this repository instead (an earlier one, for a
before/after: its `make run` must write ``var/plain/demo.token`` and print "Up and
checked", as from the commit that added this script on).

Usage: .venv/bin/python bench/first_write.py [--cold-pip-cache] [--keep DIR] [--commit REV]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from testkit.procs import free_port  # noqa: E402

#: Longest wait for one `make run` to take its first write (a loaded 2-core machine
#: compiling the Cython modules takes minutes).
DEADLINE_S = 900.0


def _port_names(clone: Path) -> list[str]:
    """The fields of the clone's own `Ports` dataclass (mercury/dev/topology.py), read as
    source: a bench never imports `mercury` (the `nothing-imports-mercury` contract), and the
    commit benched may name other ports than this checkout does."""
    tree = ast.parse((clone / "mercury" / "dev" / "topology.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Ports":
            return [
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            ]
    raise SystemExit(f"{clone}: mercury/dev/topology.py has no Ports class")


def _first_write(clone: Path, env: dict[str, str], log: Path) -> dict[str, float]:
    """Run `make run` in `clone` until a write is acknowledged; seconds to each step."""
    root = f"http://127.0.0.1:{env['MERCURY_ROOT_PORT']}"
    token_file = clone / "var" / "plain" / "demo.token"
    token_file.unlink(missing_ok=True)
    load = os.getloadavg()[0]
    offset = log.stat().st_size if log.exists() else 0  # this run's part of the log
    cpu0 = _children_cpu()
    with log.open("ab") as out:
        t0 = time.monotonic()
        make = subprocess.Popen(
            ["make", "run"], cwd=clone, env=env, stdout=out, stderr=out, start_new_session=True
        )
    result: dict[str, float] = {}
    try:
        banner = wrote = None
        deadline = t0 + DEADLINE_S
        while banner is None or wrote is None:
            if time.monotonic() > deadline:
                raise SystemExit(f"no write and banner within {DEADLINE_S:.0f}s; see {log}")
            if make.poll() is not None:
                raise SystemExit(f"make run exited with {make.returncode}; see {log}")
            if banner is None and b"Up and checked" in log.read_bytes()[offset:]:
                banner = time.monotonic() - t0
            if wrote is None and token_file.exists():
                token = token_file.read_text().strip()
                with contextlib.suppress(httpx.HTTPError):
                    r = httpx.put(
                        f"{root}/v1/kv/demo/first",
                        content=b"hello",
                        headers={"Authorization": f"Bearer {token}"},
                        timeout=10,
                    )
                    if r.status_code == 200:
                        wrote = time.monotonic() - t0
            time.sleep(0.2)
        result = {
            "seconds_to_first_write": round(wrote, 1),
            "seconds_to_banner": round(banner, 1),
            "loadavg_1m_at_start": round(load, 2),
        }
    finally:
        _stop(make)
    # Every process make run started was waited for: their CPU is this process's children's.
    result["cpu_seconds_until_stopped"] = round(_children_cpu() - cpu0, 1)
    return result


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _stop(make: subprocess.Popen[bytes]) -> None:
    """SIGTERM to make and everything under it (the process group this script started)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(make.pid, signal.SIGTERM)
    try:
        make.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(make.pid, signal.SIGKILL)
        make.wait(10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cold-pip-cache", action="store_true", help="pip downloads everything")
    p.add_argument("--keep", help="clone into this directory and keep it (default: a temp dir)")
    p.add_argument("--commit", default="HEAD", help="the commit to measure (default HEAD)")
    args = p.parse_args()
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", args.commit],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="mercury-fresh-"))
    try:
        clone = tmp / "mercury"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", head], check=True)
        env = dict(os.environ)
        env.pop("VIRTUAL_ENV", None)
        for name in _port_names(clone):
            env[f"MERCURY_{name.upper()}_PORT"] = str(free_port())
        if args.cold_pip_cache:
            env["PIP_NO_CACHE_DIR"] = "1"
        log = tmp / "make-run.log"
        fresh = _first_write(clone, env, log)
        built = _first_write(clone, env, log)
        print(
            json.dumps(
                {
                    "bench": "first_write",
                    "commit": head,
                    "pip_cache": "cold" if args.cold_pip_cache else "warm (~/.cache/pip)",
                    "cpus": os.cpu_count(),
                    "fresh_clone": fresh,
                    "already_built": built,
                    "ratio_fresh_to_built": round(
                        fresh["seconds_to_first_write"] / built["seconds_to_first_write"], 1
                    ),
                },
                indent=2,
            )
        )
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
