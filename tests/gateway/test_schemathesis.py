"""Schemathesis over the root's /openapi.json: no generated input produces a 5xx, and every
answer is one the document declares (status, content type, headers, body schema)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.conftest import Root
from tests.support.procs import REPO

#: Run together on every generated request (one run: the same time as the first alone).
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
)


def _run(root: Root, token: str, examples: int) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "schemathesis"
    return subprocess.run(
        [
            str(exe),
            "run",
            root.url + "/openapi.json",
            "--checks",
            ",".join(CHECKS),
            "--max-examples",
            str(examples),
            "--seed",
            "7",
            "--header",
            f"Authorization: Bearer {token}",
            "--phases",
            "examples,coverage,fuzzing",
            "--workers",
            "1",
            # Rotating the admin token would refuse every later call of the admin run
            # (401), leaving the admin routes after it unexercised; it takes no input and
            # has its own tests (test_admin_token.py).
            "--exclude-path",
            "/v1/admin/token",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )


@pytest.mark.parametrize("who", ["producer", "admin"])
def test_no_generated_request_gets_a_5xx_or_an_undeclared_answer(
    root_factory: Any, who: str
) -> None:
    if shutil.which("schemathesis", path=str(Path(sys.executable).parent)) is None:
        pytest.fail("schemathesis is a dev dependency and must be installed")
    root: Root = root_factory()
    _, tok = root.producer(keyspaces=["a", "b", "0", "x", "-", "%", "/"])
    r = _run(root, tok if who == "producer" else root.admin_token, 12)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    # the root is still healthy afterwards
    assert root.client().get("/healthz").status_code == 200
