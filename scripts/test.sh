#!/usr/bin/env bash
# The whole test suite: lint, types, import contracts, then every test (real promtool/Prometheus where used).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
echo "== ruff" && .venv/bin/ruff check .
echo "== ruff format --check" && .venv/bin/ruff format --check .
echo "== mypy" && .venv/bin/mypy
echo "== lint-imports" && .venv/bin/lint-imports
echo "== mkdocs" && .venv/bin/mkdocs build --strict --site-dir "$(mktemp -d)"
# Two workers: most tests wait on real programs (Prometheus, slurmctld, the demo), so two
# share two cores well; TOPOWATCH_TEST_WORKERS=0 runs them in this process.
echo "== pytest" && .venv/bin/pytest -q -n "${TOPOWATCH_TEST_WORKERS:-2}" "$@"
