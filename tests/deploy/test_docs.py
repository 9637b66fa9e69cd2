"""The documentation agrees with the code, as kube-state-metrics keeps docs/metrics/: the metrics
reference and the dashboard pages are generated (a stale page fails, printing the command that
rewrites it), every family name the code spells appears in the reference, the health config
defaults documented are the code's, and the README's links land on pages that exist.

`mkdocs build --strict` (scripts/test.sh) checks the links, anchors and nav of docs/ itself.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import re
import sys
from pathlib import Path

import yaml

from healthcheck.detection.config import HealthConfig, config_from_mapping

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
sys.path.insert(0, str(REPO / "scripts"))

import dashboards_reference  # noqa: E402
import metrics_reference  # noqa: E402

# String constants in the code shaped like a family name that are not one.
NOT_FAMILIES = {
    # a Slurm node feature: keeps remediation off the node (exporter/slurm, docs/slurm.md)
    "topowatch_remediation_disabled",
}
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def stale_message(page: str, command: str, want: str, have: str) -> str:
    diff = difflib.unified_diff(
        have.splitlines(), want.splitlines(), "committed", "from the code", lineterm="", n=0
    )
    shown = "\n".join(list(diff)[:40])
    return f"{page} is stale: run `{command}` and commit it.\n{shown}"


def test_the_metrics_reference_is_the_codes() -> None:
    want = metrics_reference.render(metrics_reference.observe())
    have = metrics_reference.OUT.read_text(encoding="utf-8")
    assert have == want, stale_message("docs/metrics.md", metrics_reference.COMMAND, want, have)


def family_names_in_code() -> set[str]:
    """Every string constant in exporter/ and healthcheck/ shaped like one of our family names
    (dynamic names, such as the EFA counters', are covered by the runs alone)."""
    names: set[str] = set()
    for root in ("exporter", "healthcheck"):
        for path in (REPO / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                value = node.value if isinstance(node, ast.Constant) else None
                if isinstance(value, str) and re.fullmatch(r"topowatch_[a-z0-9_]*[a-z0-9]", value):
                    names.add(value)
    return names - NOT_FAMILIES


def test_every_family_the_code_names_is_in_the_reference() -> None:
    """A family the generator's runs never build (a new component, an unexercised path) would
    be missing from the page without a word: the code's literal names catch that."""
    page = metrics_reference.OUT.read_text(encoding="utf-8")
    documented = {
        re.sub(r"_(total|info)$", "", name) for name in re.findall(r"`(topowatch_\w+)`", page)
    } | set(re.findall(r"`(topowatch_\w+)`", page))
    missing = sorted(family_names_in_code() - documented)
    assert not missing, (
        f"families in the code but not in docs/metrics.md: {missing}; make a run in"
        " scripts/metrics_reference.py build them (or list a non-family string in NOT_FAMILIES),"
        f" then `{metrics_reference.COMMAND}`"
    )


def test_the_dashboard_pages_are_the_dashboards() -> None:
    problems = dashboards_reference.stale()
    assert not problems, "\n".join([*problems, f"run `{dashboards_reference.COMMAND}`"])


def test_the_documented_health_config_is_every_default() -> None:
    """docs/configuration.md's health config block names every key with the code's default."""
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", page, re.S) if "damping:" in b]
    data = yaml.safe_load(block)
    assert config_from_mapping(data) == HealthConfig()
    default = HealthConfig()
    assert set(data) == {f.name for f in dataclasses.fields(default)}
    for section, value in data.items():
        field = getattr(default, section)
        if dataclasses.is_dataclass(field):
            assert set(value) == {f.name for f in dataclasses.fields(field)}, section


def test_the_readme_links_land_on_pages_and_pictures_that_exist() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    links = [link for link in _LINK.findall(readme) if "://" not in link]
    assert any(link.startswith("docs/images/") for link in links)
    for link in links:
        path, _, anchor = link.partition("#")
        target = REPO / path
        assert target.exists(), f"README.md links to {link}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(encoding="utf-8"), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
            assert anchor in slugs, f"README.md links to {link}: no such heading"


def test_every_docs_page_is_in_the_nav() -> None:
    """mkdocs only notes a page left out of the nav; a generated dashboard page must be in it."""
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    for page in sorted(DOCS.rglob("*.md")):
        name = page.relative_to(DOCS).as_posix()
        assert name in nav, f"docs/{name} is in no nav entry of mkdocs.yml"
