"""The component boundaries are contracts `make lint` enforces: prove a forbidden import fails.

The packages are copied into a temp dir with one planted import, and `lint-imports` runs there
with the repo's own `pyproject.toml`; the clean copy passes, each planted import fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ["core", "store", "acl", "gateway", "replicator", "reads", "migrations", "ha", "mercury"]
LINT = Path(sys.executable).with_name("lint-imports")


def _copy_tree(dst: Path) -> None:
    shutil.copy(REPO / "pyproject.toml", dst / "pyproject.toml")
    for pkg in PACKAGES:
        shutil.copytree(
            REPO / pkg, dst / pkg, ignore=shutil.ignore_patterns("*.so", "*.c", "__pycache__")
        )


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        ("store/_planted.py", "import gateway.batcher", "the store imports no other component"),
        ("store/_planted.py", "import mercury.cli", "the store imports no other component"),
        ("acl/_planted.py", "import fastapi", "acl knows no HTTP"),
        ("gateway/_planted.py", "import replicator.frames", "never import each other"),
        ("reads/_planted.py", "import gateway.quota", "reads never imports gateway"),
        ("core/_planted.py", "import store.format", "core is a leaf"),
        ("ha/_planted.py", "import replicator.frames", "ha is election and fencing logic"),
    ],
)
def test_lint_fails_on_a_forbidden_import(
    tmp_path: Path, module: str, planted: str, contract: str
) -> None:
    _copy_tree(tmp_path)
    (tmp_path / module).write_text(planted + "\n")
    res = _lint(tmp_path)
    assert res.returncode != 0, res.stdout
    assert contract in res.stdout
    assert "BROKEN" in res.stdout


def test_lint_passes_on_the_tree_as_it_is(tmp_path: Path) -> None:
    _copy_tree(tmp_path)
    res = _lint(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
