"""Schemathesis over the root's /openapi.json: no generated input produces a 5xx, and every
answer is one the document declares (status, content type, headers, body schema)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests.gateway.conftest import Root
from tests.support import openapi_fuzz


def _run(root: Root, token: str, examples: int) -> subprocess.CompletedProcess[str]:
    # Rotating the admin token would refuse every later call of the admin run (401),
    # leaving the admin routes after it unexercised; it takes no input and has its own
    # tests (test_admin_token.py).
    return openapi_fuzz.run(root.url, examples, token=token, exclude=("/v1/admin/token",))


@pytest.mark.parametrize("who", ["producer", "admin"])
def test_no_generated_request_gets_a_5xx_or_an_undeclared_answer(
    root_factory: Any, who: str
) -> None:
    root: Root = root_factory()
    _, tok = root.producer(keyspaces=["a", "b", "0", "x", "-", "%", "/"])
    r = _run(root, tok if who == "producer" else root.admin_token, 12)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    # the root is still healthy afterwards
    assert root.client().get("/healthz").status_code == 200
