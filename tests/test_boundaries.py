"""The package boundaries are contracts `make lint` enforces: prove each one fails when broken.

The packages are copied into a temp dir with one planted import, and `lint-imports` runs
there with the repo's own `pyproject.toml`: the clean copy keeps every contract, and each
planted import breaks the contract it is planted against (named by its id), with the
planted module in the chain lint-imports reports. A contract no plant breaks is an error
too, so a contract added without a plant here fails this test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
PACKAGES: list[str] = CONFIG["root_packages"]
CONTRACTS: dict[str, str] = {c["id"]: c["name"] for c in CONFIG["contracts"]}
LINT = Path(sys.executable).with_name("lint-imports")

#: contract id -> (file in the copy, line appended to it). An existing module is appended
#: to where the contract names modules rather than a package (the HA rules).
PLANTS: dict[str, tuple[str, str]] = {
    "core-leaf": ("core/_planted.py", "import prometheus_client"),
    "net-core": ("net/_planted.py", "import store.format"),
    "store-core": ("store/_planted.py", "import net.tcp"),
    "acl-pure": ("acl/_planted.py", "import httpx"),
    "gateway-replicator": ("gateway/_planted.py", "import replicator.frames"),
    "reads-no-writes": ("reads/_planted.py", "import gateway.quota"),
    "protocols-narrow": ("kt/_planted.py", "import gateway.writes"),
    "ha-rules-pure": ("ha/syncack.py", "import asyncio"),
    "cache-rules-pure": ("cache/rules.py", "import lmdb"),
    "nothing-imports-mercury": ("ha/_planted.py", "import mercury.cli"),
    "sdk-alone": ("mercury_client/_planted.py", "import core.errors"),
    "bench-no-tests": ("bench/_planted.py", "import tests.conftest"),
    "sim-apart": ("replicator/_planted.py", "import sim.run"),
    "sim-rules-pure": ("sim/invariants.py", "import asyncio"),
}


def _copy_tree(dst: Path) -> None:
    shutil.copy(REPO / "pyproject.toml", dst / "pyproject.toml")
    skip = shutil.ignore_patterns("*.so", "*.c", "__pycache__", "data")
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg.replace(".", "/"), dst / pkg.replace(".", "/"), ignore=skip)


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


def test_every_contract_has_a_plant() -> None:
    assert set(PLANTS) == set(CONTRACTS)


@pytest.mark.parametrize("contract", sorted(PLANTS))
def test_lint_fails_on_a_forbidden_import(tmp_path: Path, contract: str) -> None:
    _copy_tree(tmp_path)
    path, line = PLANTS[contract]
    target = tmp_path / path
    before = target.read_text() if target.exists() else ""
    target.write_text(before + line + "\n")
    res = _lint(tmp_path)
    assert res.returncode != 0, res.stdout
    broken = res.stdout.split("Broken contracts", 1)[-1]
    name = CONTRACTS[contract]
    # lint-imports folds long names across lines in its summary; the broken section's
    # heading keeps the name's first words on one line.
    assert name.split(":")[0][:40] in broken, res.stdout
    planted_module = path.removesuffix(".py").replace("/", ".")
    assert planted_module in broken, res.stdout


def test_lint_passes_on_the_tree_as_it_is(tmp_path: Path) -> None:
    _copy_tree(tmp_path)
    res = _lint(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(CONTRACTS)} kept, 0 broken" in res.stdout, res.stdout
