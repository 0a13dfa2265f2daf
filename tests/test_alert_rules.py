"""deploy/prometheus/alerts.yml: valid rules (`promtool check rules`), alerts that fire on
what they describe and not beside it (`promtool test rules` with alerts_test.yml), only
metrics Mercury defines, and a runbook section in docs/operations.md for each."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from testkit.procs import REPO
from tests.test_api_doc import defined_metrics

RULES = REPO / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "alerts_test.yml"
RUNBOOK = REPO / "docs" / "operations.md"
#: Series Prometheus makes itself, not Mercury.
PROMETHEUS_OWN = {"up"}


def _rules() -> list[dict[str, object]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool missing: `make alert-deps` installs Debian's prometheus as root")
    return tool


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    tool = _promtool()
    for argv in ([tool, "check", "rules", str(RULES)], [tool, "test", "rules", RULE_TESTS.name]):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=RULE_TESTS.parent)
        assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_is_unit_tested() -> None:
    tested = {
        t["alertname"]
        for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for t in case["alert_rule_test"]
        if t.get("exp_alerts")
    }
    assert {str(r["alert"]) for r in _rules()} == tested


def test_alerts_name_only_metrics_mercury_defines() -> None:
    defined = defined_metrics()
    for rule in _rules():
        expr = str(rule["expr"])
        # Metric names: identifiers not followed by "(" (functions) nor inside {...} or
        # by/without (...) (labels), nor PromQL keywords.
        bare = re.sub(r"\{[^}]*\}|\b(by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
        names = {
            n
            for n in re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", bare)
            if n not in {"and", "or", "unless", "bool", "offset"} and not n[0].isdigit()
        }
        assert names, rule["alert"]
        unknown = sorted(n for n in names - PROMETHEUS_OWN if n not in defined)
        assert not unknown, f"{rule['alert']} names metrics Mercury does not define: {unknown}"


def _slug(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's rules) gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_alert_links_a_runbook_section() -> None:
    anchors = {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", RUNBOOK.read_text(), re.M)}
    for rule in _rules():
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        url = str(annotations["runbook_url"])
        path, _, anchor = url.partition("#")
        assert path == "docs/operations.md" and anchor in anchors, (rule["alert"], url)
        assert annotations.get("summary"), rule["alert"]
