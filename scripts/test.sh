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
echo "== pytest" && .venv/bin/pytest -q "$@"
