"""The uvicorn seam (`net/uvicorn_http.py`) refuses to load under a uvicorn outside the
range its use of uvicorn's internals was tested with, naming that range; the installed
uvicorn is inside it. And only that module reaches into uvicorn's protocol internals."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import uvicorn

from net import uvicorn_http
from net.uvicorn_http import TESTED_RANGE, UnsupportedUvicorn, check_version

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_uvicorn_is_in_the_tested_range() -> None:
    check_version(uvicorn.__version__)


@pytest.mark.parametrize("version", ["0.55.0", "0.55.7", "0.55.1rc1", "0.55.0.dev3"])
def test_versions_in_the_range_pass(version: str) -> None:
    check_version(version)


@pytest.mark.parametrize("version", ["0.54.9", "0.56.0", "0.29.0", "1.0.0", "0.5.5", "", "x"])
def test_other_versions_are_refused_naming_the_tested_range(version: str) -> None:
    with pytest.raises(UnsupportedUvicorn) as err:
        check_version(version)
    text = str(err.value)
    assert TESTED_RANGE in text and f"uvicorn {version} is installed" in text
    assert isinstance(err.value, ImportError)  # what an import of the module raises


def test_importing_the_seam_under_another_uvicorn_fails_loudly() -> None:
    """A fresh interpreter whose uvicorn says it is 0.56.0: importing the seam (and so any
    HTTP listener) fails at once with the message, before touching any internal."""
    code = (
        "import uvicorn; uvicorn.__version__ = '0.56.0'\n"
        "try:\n"
        "    import net.http_bounds\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, e)\n"
        "else:\n"
        "    print('imported')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("UnsupportedUvicorn "), out.stdout
    assert TESTED_RANGE in out.stdout and "0.56.0" in out.stdout


def test_pyproject_pins_the_tested_range() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert f'"uvicorn[standard]{TESTED_RANGE}"' in text


def test_no_other_module_reaches_into_uvicorn() -> None:
    """`uvicorn.protocols` (the private httptools protocol) is imported, and
    `uvicorn.Server` subclassed, by the seam only (elsewhere `net.uvicorn_http.Server`)."""
    offenders = []
    for pkg in ("core", "net", "reads", "mercury", "gateway", "kt", "memcached", "ha"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path == Path(uvicorn_http.__file__):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names: list[str] = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ClassDef):
                    names = [ast.unparse(b) for b in node.bases]
                if any(n.startswith("uvicorn.protocols") or n == "uvicorn.Server" for n in names):
                    offenders.append(f"{path.relative_to(ROOT)}: {ast.unparse(node)[:80]}")
    assert offenders == []
