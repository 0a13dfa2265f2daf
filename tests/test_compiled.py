"""The compiled-or-pure loader (`core/compiled.py`): one registry naming every compiled
module of the tree, built by setup.py, and one switch moving every user of one to its
pure twin.

The switch is read at import, so each case runs in a fresh interpreter with the
environment it is about."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from core import compiled

ROOT = Path(__file__).resolve().parent.parent

# What each twin's user has bound, as the modules the bound objects come from (None: no
# compiled object, the user's reference path serves). Printed as JSON by a child process.
OBSERVE = """
import json
from gateway import bodies, usage_series
from net import fastconn
from reads import fastget
from store import codec

def mod(x):
    return None if x is None else x.__module__

print(json.dumps({
    "store._codec": [
        codec._impl.__name__, mod(codec.encode_record), mod(codec.scan_entries),
        mod(codec.apply_entries), mod(codec.apply_ops),
    ],
    "gateway._jsonops": [mod(bodies._fast_json)],
    "gateway._usagecount": [mod(usage_series._fast_count)],
    "reads._fastget": [fastget.IMPL.__name__, mod(fastget.MC_GET), mod(fastget.HTTP_GET)],
    "net._fastconn": [fastconn.BASE.__module__],
}))
"""


def _env(**extra: str) -> dict[str, str]:
    """This environment without the loader's variables (the suite's pure pass sets
    MERCURY_PURE), plus `extra`."""
    env = {
        k: v for k, v in os.environ.items() if k not in (compiled.PURE_ENV, compiled.REQUIRE_ENV)
    }
    env.update(extra)
    return env


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _observe(env: dict[str, str]) -> dict[str, list[str | None]]:
    done = _python(OBSERVE, env)
    assert done.returncode == 0, done.stderr
    seen: dict[str, list[str | None]] = json.loads(done.stdout)
    assert set(seen) == set(compiled.TWINS), "OBSERVE must look at every registered twin"
    return seen


def test_the_registry_setup_py_and_the_tree_name_the_same_compiled_modules() -> None:
    registered = set(compiled.TWINS)
    built = set(runpy.run_path(str(ROOT / "setup.py"), run_name="listing")["EXTENSIONS"])
    in_tree = {
        p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
        for p in ROOT.glob("*/_*.pyx")
    }
    assert registered == built == in_tree
    for twin in compiled.TWINS.values():
        assert (ROOT / twin.source).is_file()
        for name in (*twin.pure, twin.user):
            assert (ROOT / (name.replace(".", "/") + ".py")).is_file(), name


def test_pure_gives_every_user_its_pure_twin() -> None:
    seen = _observe(_env(MERCURY_PURE="1", MERCURY_REQUIRE_CYTHON="1"))
    for name, twin in compiled.TWINS.items():
        for got in seen[name]:
            assert got is None or got in twin.pure, (name, seen[name])


def test_by_default_every_user_runs_its_compiled_module() -> None:
    seen = _observe(_env(MERCURY_REQUIRE_CYTHON="1"))
    for name in compiled.TWINS:
        assert seen[name] == [name] * len(seen[name]), (name, seen[name])


# A child in which every compiled module fails to import (as if never built): a None in
# sys.modules makes importing that name raise ImportError.
_UNBUILT = """
import sys
from core import compiled
for name in compiled.TWINS:
    sys.modules[name] = None
"""


def test_a_missing_build_is_an_error_naming_it_only_when_required() -> None:
    code = (
        _UNBUILT
        + """
import importlib, json
out = {}
for name, twin in compiled.TWINS.items():
    try:
        got = compiled.load(name)
        out[name] = ["loaded", None if got is None else got.__name__]
    except compiled.MissingBuildError as err:
        out[name] = ["error", str(err)]
print(json.dumps(out))
"""
    )
    for required in (False, True):
        env = _env(MERCURY_REQUIRE_CYTHON="1") if required else _env()
        done = _python(code, env)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        for name, twin in compiled.TWINS.items():
            if required:
                assert out[name][0] == "error", out[name]
                assert name in out[name][1] and twin.source in out[name][1]
            else:
                assert out[name] == ["loaded", None]


def test_a_user_module_refuses_to_import_without_its_required_build() -> None:
    """The users go through the loader: importing one with its build missing and required
    fails naming the compiled module."""
    for name, twin in compiled.TWINS.items():
        code = f"import sys\nsys.modules[{name!r}] = None\nimport {twin.user}\n"
        done = _python(code, _env(MERCURY_REQUIRE_CYTHON="1"))
        assert done.returncode != 0, name
        assert f"MissingBuildError: compiled module {name} " in done.stderr, done.stderr
        fine = _python(code, _env())
        assert fine.returncode == 0, fine.stderr


def test_the_build_check_passes_on_this_build_and_names_what_is_missing() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "core.compiled", "--check"],
        cwd=ROOT,
        env=_env(MERCURY_PURE="1"),  # the check is of the build, whatever the switch says
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    one = "gateway._usagecount"
    code = f"import sys\nsys.modules[{one!r}] = None\nfrom core import compiled\n"
    code += "sys.exit(compiled.main(['--check']))\n"
    bad = _python(code, _env())
    assert bad.returncode == 1
    assert one in bad.stderr and compiled.TWINS[one].source in bad.stderr
    assert sum(name in bad.stderr for name in compiled.TWINS) == 1, bad.stderr


def test_the_build_check_refuses_an_unregistered_source(tmp_path: Path) -> None:
    for twin in compiled.TWINS.values():
        (tmp_path / twin.source).parent.mkdir(exist_ok=True)
        (tmp_path / twin.source).touch()
    assert compiled.sources(tmp_path) == {t.source for t in compiled.TWINS.values()}
    (tmp_path / "store" / "_new.pyx").touch()
    (tmp_path / "net" / "_fastconn.pyx").unlink()
    problems = compiled.check(tmp_path)
    assert any("store/_new.pyx is not registered" in p for p in problems), problems
    assert any("net/_fastconn.pyx is registered" in p for p in problems), problems


def test_load_refuses_an_unregistered_name() -> None:
    with pytest.raises(KeyError, match="not a registered compiled module"):
        compiled.load("store._nothing")
