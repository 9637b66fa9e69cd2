#!/usr/bin/env bash
# The main job on its embedded default: `topowatch demo`, the whole system on the simulation
# (a simulated HyperPod cluster behind a list/watch API server, a node agent per node, the
# cluster service). Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh demo
exec .venv/bin/topowatch demo --listen "${TOPOWATCH_LISTEN:-127.0.0.1:9403}" "$@"
