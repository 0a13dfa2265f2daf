"""The examples of docs/client.md run as written: every fenced block marked ```python run```
or ```sh run```, in order, against a real root and replica, for a producer owning `app/`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.procs import REPO
from tests.client.conftest import Cluster

DOC = REPO / "docs" / "client.md"
BLOCK = re.compile(r"^```(python|sh) run\n(.*?)^```", re.S | re.M)


def blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(DOC.read_text())]


def test_the_doc_has_runnable_examples() -> None:
    kinds = [k for k, _ in blocks()]
    assert kinds.count("python") >= 4 and kinds.count("sh") >= 2


@pytest.fixture(scope="module")
def env(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    _name, token = cluster.root.producer(["app/"])
    d = tmp_path_factory.mktemp("docs")
    (d / "token").write_text(token + "\n")
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
        "MERCURY_URL": cluster.root.url,
        "MERCURY_READ_URL": cluster.read_url,
        "MERCURY_TOKEN": token,
        "MERCURY_TOKEN_FILE": str(d / "token"),
        "WORKDIR": str(d),
    }


@pytest.mark.parametrize(("i", "kind", "code"), [(i, k, c) for i, (k, c) in enumerate(blocks())])
def test_example_runs(env: dict[str, str], i: int, kind: str, code: str) -> None:
    argv = (
        [sys.executable, "-c", code]
        if kind == "python"
        else ["bash", "-euo", "pipefail", "-c", code]
    )
    r = subprocess.run(
        argv, env=env, cwd=env["WORKDIR"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, f"example {i} ({kind}) failed:\n{code}\n{r.stdout}\n{r.stderr}"
