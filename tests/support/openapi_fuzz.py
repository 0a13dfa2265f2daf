"""Running schemathesis (its CLI, as a user would) against a live node's OpenAPI document."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.procs import REPO

#: Run together on every generated request (one run: the same time as the first alone).
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
)


def run(
    url: str, examples: int, *, token: str | None = None, exclude: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """schemathesis over `url`/openapi.json: every phase, `examples` per operation, with
    `token` as the bearer token; `exclude`: paths left out."""
    exe = Path(sys.executable).parent / "schemathesis"
    if shutil.which("schemathesis", path=str(exe.parent)) is None:
        pytest.fail("schemathesis is a dev dependency and must be installed")
    argv = [str(exe), "run", url + "/openapi.json", "--checks", ",".join(CHECKS)]
    argv += ["--max-examples", str(examples), "--seed", "7", "--workers", "1"]
    argv += ["--phases", "examples,coverage,fuzzing"]
    if token is not None:
        argv += ["--header", f"Authorization: Bearer {token}"]
    for path in exclude:
        argv += ["--exclude-path", path]
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO)
