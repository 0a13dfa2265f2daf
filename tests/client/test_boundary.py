"""The SDK's import contract holds, and a planted server import breaks it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_boundaries import _copy_tree, _lint

CONTRACT = "the SDK imports no server component"


@pytest.mark.parametrize("planted", ["import store.format", "import gateway.quota", "import core"])
def test_lint_fails_when_the_sdk_imports_the_server(tmp_path: Path, planted: str) -> None:
    _copy_tree(tmp_path)
    (tmp_path / "mercury" / "client" / "_planted.py").write_text(planted + "\n")
    res = _lint(tmp_path)
    assert res.returncode != 0, res.stdout
    assert CONTRACT in res.stdout
    assert "BROKEN" in res.stdout
