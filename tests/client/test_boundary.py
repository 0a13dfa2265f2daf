"""The SDK's import contract holds, and a planted server import breaks it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_boundaries import CONTRACTS, _copy_tree, _lint

CONTRACT = CONTRACTS["sdk-alone"]


@pytest.mark.parametrize(
    "planted", ["import store.format", "import gateway.quota", "import core", "import mercury"]
)
def test_lint_fails_when_the_sdk_imports_the_server(tmp_path: Path, planted: str) -> None:
    _copy_tree(tmp_path)
    (tmp_path / "mercury_client" / "_planted.py").write_text(planted + "\n")
    res = _lint(tmp_path)
    assert res.returncode != 0, res.stdout
    assert CONTRACT.split("(")[0].strip() in res.stdout
    assert "mercury_client._planted" in res.stdout
    assert "BROKEN" in res.stdout
