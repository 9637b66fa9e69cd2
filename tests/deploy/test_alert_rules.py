"""The alert rules load in Prometheus' own tooling, every alert both fires and stays quiet in
promtool unit tests, every name they use is one topowatch really exposes, and every alert links
to a runbook section that exists.

promtool is the judge of syntax and semantics (it is what Prometheus runs); the Python checks
here cover what promtool cannot know: our metric names, our labels, our runbook.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.expositions import exposed_metric_names, expositions

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "rules" / "topowatch-alerts.yaml"
RULE_TESTS = sorted((REPO / "rules" / "tests").glob("*.yaml"))
RUNBOOK = REPO / "docs" / "runbook.md"
RUNBOOK_BASE = "https://github.com/topowatch/topowatch/blob/main/docs/runbook.md#"
SEVERITIES = frozenset({"critical", "warning", "info"})
# Prometheus synthesises `up` per scrape target and adds job/instance to every scraped series.
PROMETHEUS_SERIES = frozenset({"up"})
SCRAPE_LABELS = frozenset({"job", "instance"})
SERIES = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"(?:[^"\\]|\\.)*"')


def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool missing: run scripts/bootstrap.sh (Debian package prometheus)")
    return binary


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=60, cwd=REPO, check=False
    )


@cache
def alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


@cache
def labels_by_metric() -> dict[str, frozenset[str]]:
    """Sample name -> every label name it carries in some exposition."""
    found: dict[str, set[str]] = defaultdict(set)
    for text in expositions().values():
        for family in text_string_to_metric_families(text.decode()):
            for sample in family.samples:
                found[sample.name].update(sample.labels)
    return {name: frozenset(labels) for name, labels in found.items()}


def selectors(expr: str) -> list[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(promql_parser.parse(expr), pre_visit=visit)
    return found


def github_anchor(heading: str) -> str:
    """The id GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    kept = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return kept.replace(" ", "-")


def runbook_anchors() -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", RUNBOOK.read_text(), flags=re.MULTILINE)
    return {github_anchor(h) for h in headings}


def unit_test_cases() -> list[tuple[str, str, bool]]:
    """(file, alertname, expects it firing) for every alert_rule_test case."""
    cases = []
    for path in RULE_TESTS:
        doc = yaml.safe_load(path.read_text())
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                cases.append((path.name, case["alertname"], bool(case.get("exp_alerts"))))
    return cases


def input_series() -> list[tuple[str, str]]:
    """(file, series selector) of every input series in the unit tests."""
    return [
        (path.name, series["series"])
        for path in RULE_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for series in test.get("input_series", [])
    ]


def test_rules_file_is_a_plain_prometheus_rules_file() -> None:
    doc = yaml.safe_load(RULES.read_text())
    assert set(doc) == {"groups"}, "the chart wraps this file in a PrometheusRule: keep it plain"
    names = [group["name"] for group in doc["groups"]]
    assert len(names) == len(set(names))
    alert_names = [rule["alert"] for rule in alerts()]
    assert len(alert_names) == len(set(alert_names)), "alert names must be unique"


def test_promtool_check_rules_is_clean() -> None:
    result = run_promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    assert "WARNING" not in result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    assert RULE_TESTS, "rules/tests/*.yaml missing"
    result = run_promtool("test", "rules", *(str(p) for p in RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS)


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    cases = unit_test_cases()
    for alert in alerts():
        name = alert["alert"]
        outcomes = {fires for _, alertname, fires in cases if alertname == name}
        assert True in outcomes, f"{name}: no unit test where it fires"
        assert False in outcomes, f"{name}: no unit test where it stays quiet"
    known = {alert["alert"] for alert in alerts()}
    unknown = {alertname for _, alertname, _ in cases} - known
    assert not unknown, f"unit tests name alerts that do not exist: {unknown}"


def test_every_alert_carries_severity_summary_description_and_runbook() -> None:
    for alert in alerts():
        name = alert["alert"]
        assert alert.get("labels", {}).get("severity") in SEVERITIES, name
        annotations = alert.get("annotations", {})
        assert annotations.get("summary", "").strip(), f"{name}: no summary"
        assert len(annotations.get("description", "")) > 40, f"{name}: no real description"
        assert annotations.get("runbook_url", "").startswith(RUNBOOK_BASE), name


def test_every_runbook_url_points_at_a_runbook_section() -> None:
    anchors = runbook_anchors()
    missing = [
        alert["alert"]
        for alert in alerts()
        if alert["annotations"]["runbook_url"].removeprefix(RUNBOOK_BASE) not in anchors
    ]
    assert not missing, f"no runbook section for: {missing}"


def test_github_anchor_matches_githubs_slugs() -> None:
    assert github_anchor("TopowatchNvlinkDown") == "topowatchnvlinkdown"
    assert github_anchor("How to confirm: `up`") == "how-to-confirm-up"


def test_rules_use_only_metrics_and_labels_topowatch_exposes() -> None:
    exposed = exposed_metric_names()
    labels = labels_by_metric()
    problems = []
    for alert in alerts():
        for selector in selectors(alert["expr"]):
            name = selector.name
            if name in PROMETHEUS_SERIES:
                continue
            if name not in exposed:
                problems.append(f"{alert['alert']}: {name} is in no exposition")
                continue
            for matcher in selector.matchers.matchers:
                if matcher.name not in labels[name] | SCRAPE_LABELS:
                    problems.append(f"{alert['alert']}: {name} has no label {matcher.name}")
    assert not problems, "\n".join(problems)


def test_unit_test_series_are_shaped_like_real_expositions() -> None:
    exposed = exposed_metric_names()
    labels = labels_by_metric()
    problems = []
    for file, series in input_series():
        match = SERIES.match(series)
        assert match, f"{file}: cannot read series {series!r}"
        name, body = match.group(1), match.group(2) or ""
        if name in PROMETHEUS_SERIES:
            continue
        if name not in exposed:
            problems.append(f"{file}: {name} is in no exposition")
            continue
        used = set(LABEL.findall(body))
        extra = used - labels[name] - SCRAPE_LABELS
        lacking = labels[name] - used
        if extra or lacking:
            problems.append(f"{file}: {name} adds {sorted(extra)}, lacks {sorted(lacking)}")
    assert not problems, "\n".join(problems)


def test_the_checks_above_catch_an_invented_metric() -> None:
    """Guard against a vacuous pass: a made-up name and label must be reported."""
    exposed = exposed_metric_names()
    (selector,) = selectors('topowatch_gpu_up{colour="red"} == 0')
    assert selector.name in exposed
    assert "colour" not in labels_by_metric()[selector.name]
    assert "topowatch_gpu_vibes_total" not in exposed


# Series that cannot change on real hardware: the efa driver hard-codes every port's state to
# ACTIVE/LinkUp (efa_query_port in efa_verbs.c), so an alert on them could never fire.
CONSTANT_SERIES = frozenset({"topowatch_efa_port_up", "topowatch_efa_port_info"})


def test_no_alert_reads_a_series_the_hardware_never_changes() -> None:
    used = {
        f"{alert['alert']}: {selector.name}"
        for alert in alerts()
        for selector in selectors(alert["expr"])
        if selector.name in CONSTANT_SERIES
    }
    assert not used, f"alerts that can never fire on real hardware: {sorted(used)}"
