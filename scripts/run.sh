#!/usr/bin/env bash
# The main job on its embedded default: the node agent on a simulated p5.48xlarge.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/topowatch node --simulate p5.48xlarge --listen "${TOPOWATCH_LISTEN:-127.0.0.1:9402}" "$@"
