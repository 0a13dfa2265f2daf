"""Compiled or pure: every Cython module of the tree, its pure-Python twin, and the one
switch between them.

Each hot path compiled with Cython (a ``_name.pyx`` beside the Python it speeds up) has a
pure-Python reference doing the same thing, which the property tests
(``tests/property/test_*_agree.py``) prove it agrees with. One module of the tree, the
twin's `user`, picks between them at import and everything else goes through it; every
user asks `load` here, so the choice is made by one rule for the whole process:

- ``MERCURY_PURE=1``: every user runs its pure twin (the test suite's second pass runs
  the whole node on the references; child processes inherit the variable).
- ``MERCURY_REQUIRE_CYTHON=1``: a compiled module that cannot be imported is an error
  naming it (`MissingBuildError`), never a silent fall back to the slower reference.
- otherwise the compiled module when it is built, else the pure twin (a checkout before
  `make build` still runs, slower).

`TWINS` is the registry: `make build` runs ``python -m core.compiled --check``, which
imports every compiled module it names and refuses a ``_*.pyx`` of the tree it does not
name, so an extension setup.py forgot, or a build that failed, stops the build instead of
leaving that path on its reference unnoticed.

core is the leaf package: this imports nothing of Mercury's, and the compiled modules only
by name, when asked.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

PURE_ENV = "MERCURY_PURE"
REQUIRE_ENV = "MERCURY_REQUIRE_CYTHON"

#: The project's root (the directory holding each package), where the ``.pyx`` sources are.
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Twin:
    """One compiled module and its pure twin.

    `compiled` is the Cython module's dotted name (built from `source`); `pure` names the
    modules holding the reference it must agree with; `user` is the module that loads one
    or the other, the only one the rest of the tree calls."""

    compiled: str
    pure: tuple[str, ...]
    user: str

    @property
    def source(self) -> str:
        """The ``.pyx`` file, relative to `ROOT`."""
        return self.compiled.replace(".", "/") + ".pyx"


#: Every compiled module of the tree, by dotted name.
TWINS: dict[str, Twin] = {
    t.compiled: t
    for t in (
        # The store codec: records, entries, chain, CRC and the root's and a replica's
        # apply loops.
        Twin(
            "store._codec",
            ("store.format", "store.crccombine", "store.applyloop", "store.replay"),
            "store.codec",
        ),
        # The decoder of common JSON batch bodies.
        Twin("gateway._jsonops", ("gateway.bodies",), "gateway.bodies"),
        # The usage series' per-request counting.
        Twin("gateway._usagecount", ("gateway.usage_series",), "gateway.usage_series"),
        # Point reads answered from the stored record (memcached get, HTTP GET).
        Twin("reads._fastget", ("reads.fastget",), "reads.fastget"),
        # A listener connection's per-segment entry point.
        Twin("net._fastconn", ("net.fastconn",), "net.fastconn"),
    )
}


class MissingBuildError(ImportError):
    """A compiled module is not built (or does not import) where it is required."""


def pure() -> bool:
    """Whether this process runs every pure twin (``MERCURY_PURE=1``)."""
    return os.environ.get(PURE_ENV) == "1"


def require(name: str) -> ModuleType:
    """The compiled module `name` (a key of `TWINS`), whatever ``MERCURY_PURE`` says;
    `MissingBuildError` naming it and its source when it does not import."""
    twin = TWINS[name]  # KeyError: a compiled module nobody registered
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise MissingBuildError(
            f"compiled module {name} ({twin.source}) does not import: {err}; "
            "run `make build` (its pure twin is "
            f"{', '.join(twin.pure)})",
            name=name,
        ) from err


def load(name: str) -> ModuleType | None:
    """The compiled module `name` (a key of `TWINS`) to run, or None where its pure twin
    serves: under ``MERCURY_PURE=1``, and when it is not built unless
    ``MERCURY_REQUIRE_CYTHON=1`` (then `MissingBuildError`)."""
    if name not in TWINS:
        raise KeyError(f"{name} is not a registered compiled module (core.compiled.TWINS)")
    if pure():
        return None
    try:
        return require(name)
    except MissingBuildError:
        if os.environ.get(REQUIRE_ENV) == "1":
            raise
        return None  # not built (`make build`): the reference serves, slower


def sources(root: Path = ROOT) -> set[str]:
    """The ``_*.pyx`` files of the tree's packages, relative to `root`."""
    return {p.relative_to(root).as_posix() for p in root.glob("*/_*.pyx")}


def check(root: Path = ROOT) -> list[str]:
    """What is wrong with the build of the tree at `root`: each registered compiled module
    that does not import or is not the one built there, each ``.pyx`` of the tree not
    registered (and so never built nor checked), each registered one whose source is gone.
    Empty when every twin is built."""
    problems = []
    registered = {t.source for t in TWINS.values()}
    for src in sorted(sources(root) - registered):
        problems.append(f"{src} is not registered in core.compiled.TWINS")
    for src in sorted(registered - sources(root)):
        problems.append(f"{src} is registered in core.compiled.TWINS but not in the tree")
    for name in sorted(TWINS):
        try:
            module = require(name)
        except MissingBuildError as err:
            problems.append(str(err))
            continue
        # Found elsewhere (an older install earlier on the path): not this tree's build.
        where = Path(module.__file__ or "").resolve().parent
        if where != (root / TWINS[name].source).parent:
            problems.append(f"compiled module {name} is imported from {where}, not built in {root}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m core.compiled", description="The compiled modules and their twins."
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="import every compiled module; exit 1 naming each one missing",
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for p in problems:
            print(f"core.compiled: {p}", file=sys.stderr)
        return 1 if problems else 0
    for t in TWINS.values():
        print(f"{t.compiled:<22} {t.source:<24} pure: {', '.join(t.pure)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
