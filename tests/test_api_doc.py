"""docs/api.md is the full contract: every command and flag `mercury --help` shows, every
route the root's and a replica's OpenAPI documents declare, and every metric their /metrics
expose (or the server packages define) is named in it; and every route it names exists.

Nothing is listed by hand here: the parser, the OpenAPI documents and the metric
registries are read as they are, so a flag, route or metric added without its line in
docs/api.md fails this test.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mercury.cli import build_parser
from testkit.procs import REPO, Procs
from tests.client.conftest import Cluster, make_cluster

DOC = (REPO / "docs" / "api.md").read_text()
METHODS = ("GET", "HEAD", "PUT", "POST", "DELETE", "PATCH")
#: The packages whose metric definitions must be documented (the server, not the CLI).
METRIC_PACKAGES = (
    "core",
    "net",
    "store",
    "gateway",
    "replicator",
    "reads",
    "kt",
    "memcached",
    "ha",
)
METRIC_CLASSES = {
    "Counter",
    "Gauge",
    "Histogram",
    "Summary",
    "CounterMetricFamily",
    "GaugeMetricFamily",
    "HistogramMetricFamily",
}


def named(name: str, text: str = DOC) -> bool:
    """`name` appears in `text` (the doc) as a whole word (`--listen` is not `--listen-x`)."""
    return re.search(re.escape(name) + r"(?![\w-])", text) is not None


def leaf_commands(
    p: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(command path, parser) of every command that runs (`kv put`, `acl token list`...)."""
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, p
        return
    for action in subs:
        seen: set[int] = set()
        for name, child in action.choices.items():
            if id(child) not in seen:  # an alias shares its command's parser
                seen.add(id(child))
                yield from leaf_commands(child, (*path, name))


def test_every_command_and_flag_is_documented() -> None:
    """Every command is named, and every flag it shows in --help is named in the doc's
    section that covers it (the command-line section naming most of its flags): a flag
    documented only for another command, or only in passing elsewhere, does not count."""
    missing: list[str] = []
    commands = list(leaf_commands(build_parser()))
    assert len(commands) > 20
    cli = DOC[DOC.index("## Command line") : DOC.index("## Metrics")]
    sections = re.split(r"^(?=### )", cli, flags=re.M)
    for path, parser in commands:
        cmd = " ".join(path)
        if not re.search(r"(`|mercury )" + re.escape(cmd) + r"(?![\w-])", DOC):
            missing.append(f"command `{cmd}`")
        flags = [
            opt
            for action in parser._actions
            if action.help != argparse.SUPPRESS  # hidden on purpose (internal switches)
            for opt in action.option_strings
            if opt.startswith("--") and opt not in ("--help", "--log-level")
        ]
        home = max(sections, key=lambda s: sum(named(f, s) for f in flags))
        missing += [f"`{cmd}` flag {f}" for f in flags if not named(f, home)]
    assert named("--log-level", cli)  # every command takes it: documented once
    assert not missing, "not in docs/api.md's command-line sections:\n" + "\n".join(missing)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("apidoc")
    (tmp / "logs").mkdir()
    procs = Procs(tmp / "logs")
    try:
        c = make_cluster(procs, tmp)
        yield c
        c.root.close_clients()
    finally:
        procs.stop_all()


def routes(url: str) -> set[tuple[str, str]]:
    spec = httpx.get(url + "/openapi.json", timeout=30).json()
    return {(m.upper(), path) for path, ops in spec["paths"].items() for m in ops}


def test_every_route_is_documented_and_every_documented_route_exists(cluster: Cluster) -> None:
    served = routes(cluster.root.url) | routes(cluster.read_url)
    assert len(served) > 30
    missing = sorted(f"{m} {p}" for m, p in served if f"`{m} {p}" not in DOC)
    assert not missing, "routes not in docs/api.md (write `METHOD /path`):\n" + "\n".join(missing)
    documented = set(re.findall(r"`(" + "|".join(METHODS) + r") (/[^`\s?]*)", DOC))
    # A route outside the OpenAPI documents (the watch stream) must still be served.
    urls = (cluster.root.url, cluster.read_url)
    phantom = sorted(f"{m} {p}" for m, p in documented - served if not answers(urls, m, p))
    assert not phantom, "docs/api.md names routes no node serves:\n" + "\n".join(phantom)


def answers(urls: tuple[str, ...], method: str, path: str) -> bool:
    """Whether some node routes `method path` (its parameters filled in): any answer but
    404 and 405. Streamed, so an endless answer (a watch) is only begun."""
    target = re.sub(r"\{[^}]*\}", "x", path)
    for url in urls:
        with httpx.stream(method, url + target, timeout=30) as r:
            if r.status_code not in (404, 405):
                return True
    return False


def scraped_metrics(url: str) -> set[str]:
    """The metric names a node's /metrics declares (`# TYPE` lines), counters with the
    `_total` their samples carry; the client library's own process and Python metrics and
    the `_created` series aside."""
    names: set[str] = set()
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            if not name.startswith("mercury_") or name.endswith("_created"):
                continue
            names.add(
                name + "_total" if kind == "counter" and not name.endswith("_total") else name
            )
    return names


def defined_metrics() -> set[str]:
    """Metric names the server packages pass as a constant to a metric class (those only
    some roles or configurations export, e.g. on an HA leader, too)."""
    names: set[str] = set()
    for pkg in METRIC_PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not (isinstance(node, ast.Call) and node.args):
                    continue
                f = node.func
                cls = (
                    f.id
                    if isinstance(f, ast.Name)
                    else f.attr
                    if isinstance(f, ast.Attribute)
                    else ""
                )
                arg = node.args[0]
                if cls in METRIC_CLASSES and isinstance(arg, ast.Constant):
                    name = str(arg.value)
                    counter = cls.startswith("Counter") and not name.endswith("_total")
                    names.add(name + "_total" if counter else name)
    return names


def test_every_metric_is_documented(cluster: Cluster) -> None:
    names = scraped_metrics(cluster.root.url) | scraped_metrics(cluster.read_url)
    names |= defined_metrics()
    assert len(names) > 30
    missing = sorted(n for n in names if not named(n))
    assert not missing, "metrics not in docs/api.md:\n" + "\n".join(missing)


def test_the_checks_see_a_missing_entry() -> None:
    # The matching is by whole name: a prefix of a documented name is not documented.
    assert named("--listen") and not named("--liste")
    assert named("mercury_batch_ops") and not named("mercury_batch_op")
    assert Path(__file__).name not in DOC
