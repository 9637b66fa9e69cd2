#!/usr/bin/env python3
"""Copy the dashboards and alert rules into the Helm chart.

Helm reads only files inside a chart, so charts/topowatch carries copies of dashboards/*.json
and rules/topowatch-alerts.yaml. The sources stay the truth: this script makes the copies equal
them (and removes copies whose source is gone); `--check` only reports drift, for tests and CI.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHART = Path("charts/topowatch")


def planned_copies(repo: Path) -> dict[Path, Path]:
    """Each chart copy (relative to repo) mapped to its source (relative to repo)."""
    plan: dict[Path, Path] = {}
    for source in sorted((repo / "dashboards").glob("*.json")):
        relative = source.relative_to(repo)
        plan[CHART / "dashboards" / source.name] = relative
    rules = Path("rules/topowatch-alerts.yaml")
    if (repo / rules).is_file():
        plan[CHART / rules] = rules
    return plan


def existing_copies(repo: Path) -> list[Path]:
    """The copies the chart holds now (relative to repo)."""
    chart = repo / CHART
    found = [*chart.glob("dashboards/*.json"), *chart.glob("rules/*.yaml")]
    return sorted(path.relative_to(repo) for path in found)


def drift(repo: Path) -> list[str]:
    """What differs between the chart's copies and their sources, one line each ([] if none)."""
    plan = planned_copies(repo)
    problems = []
    for copy, source in plan.items():
        target = repo / copy
        if not target.is_file():
            problems.append(f"missing: {copy} (from {source})")
        elif target.read_bytes() != (repo / source).read_bytes():
            problems.append(f"out of date: {copy} (from {source})")
    problems.extend(
        f"stale: {copy} (no source)" for copy in existing_copies(repo) if copy not in plan
    )
    return problems


def sync(repo: Path) -> list[str]:
    """Make the chart's copies equal their sources; return what changed."""
    changes = drift(repo)
    plan = planned_copies(repo)
    for copy, source in plan.items():
        target = repo / copy
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(repo / source, target)
    for copy in existing_copies(repo):
        if copy not in plan:
            (repo / copy).unlink()
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="report drift, change nothing")
    parser.add_argument("--repo", type=Path, default=REPO, help="repository root")
    args = parser.parse_args(argv)
    changes = drift(args.repo) if args.check else sync(args.repo)
    for line in changes:
        print(line)
    if args.check and changes:
        print("run scripts/sync_chart_assets.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
