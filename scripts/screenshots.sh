#!/usr/bin/env bash
# Refresh the pictures in docs/images/ from the real thing: start `topowatch demo` with a GPU
# fallen off the bus on one node (and remediation acting), wait for the simulated Kueue's first
# preemption, and capture the cluster service's pages with headless Chromium.
#
#   scripts/screenshots.sh            # about 2-4 minutes; needs .venv (scripts/bootstrap.sh)
#
# Not run by the tests or CI: the PNGs are committed. Environment: CHROMIUM (default: chromium),
# PORT (the demo's cluster service, default 19403, away from a demo you may be running on 9403),
# WAIT (seconds to wait for a preemption, default 300).
set -euo pipefail
cd "$(dirname "$0")/.."

CHROMIUM=${CHROMIUM:-chromium}
PORT=${PORT:-19403}
WAIT=${WAIT:-300}
OUT=docs/images
BASE="http://127.0.0.1:$PORT"
LOG=$(mktemp -t topowatch-screenshots.XXXXXX.log)

command -v "$CHROMIUM" >/dev/null || { echo "screenshots.sh: no $CHROMIUM (apt-get install chromium)" >&2; exit 2; }
[ -x .venv/bin/topowatch ] || { echo "screenshots.sh: no .venv; run scripts/bootstrap.sh" >&2; exit 2; }
mkdir -p "$OUT"

# The node to break: the simulation's first p5 node (node names follow the seed; 0 is the demo's).
NODE=$(.venv/bin/python - <<'EOF'
import time

from exporter.sim.cluster import SimulatedCluster
from exporter.sim.kubeapi.server import ObjectStore

cluster = SimulatedCluster(ObjectStore(clock=time.time), seed=0)
cluster.bootstrap()
print(next(n.name for n in cluster.nodes() if "p5" in n.instance_type))
EOF
)
echo "== demo on $BASE, XID 79 on GPU 3 of $NODE (log: $LOG)"
.venv/bin/topowatch demo --listen "127.0.0.1:$PORT" --node-port-base 0 --prometheus-port 0 \
    --duration $((WAIT + 300)) --remediate --fault "node=$NODE:xid=79@gpu3" >"$LOG" 2>&1 &
DEMO=$!
trap 'kill "$DEMO" 2>/dev/null || true; wait "$DEMO" 2>/dev/null || true' EXIT

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit=$1 what=$2
    shift 2
    for _ in $(seq "$limit"); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        kill -0 "$DEMO" 2>/dev/null || { echo "screenshots.sh: the demo stopped:" >&2; tail -20 "$LOG" >&2; exit 1; }
        sleep 1
    done
    echo "screenshots.sh: no $what after ${limit}s" >&2
    exit 1
}
preempted() { [ "$(curl -sf "$BASE/api/v1/preemptions" | jq 'length')" -gt 0 ]; }
rebooting() { curl -sf "$BASE/api/v1/remediation" | jq -e --arg n "$NODE" '.nodes[] | select(.node == $n and .state.outcome == "done")'; }

wait_for 180 "ready cluster service" curl -sf "$BASE/readyz"
echo "== ready; waiting for the remediation of $NODE and a preemption (up to ${WAIT}s)"
wait_for 120 "remediation of $NODE" rebooting
wait_for "$WAIT" "preemption" preempted

VICTIM=$(curl -sf "$BASE/api/v1/preemptions" | jq -r '.[0].victim')
AFFECTED=""  # a workload with pods on the broken node
for w in $(curl -sf "$BASE/api/v1/workloads" | jq -r '.[] | .namespace + "/" + .name'); do
    if curl -sf "$BASE/api/v1/workloads/$w" | grep -q "\"$NODE\""; then AFFECTED=$w; break; fi
done
echo "== preempted: $VICTIM; on $NODE: ${AFFECTED:-none}"

shot() {  # shot FILE WIDTHxHEIGHT PATH
    local file=$1 size=$2 path=$3
    "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=1 \
        --window-size="${size/x/,}" --screenshot="$OUT/$file" "$BASE$path" >/dev/null 2>&1
    echo "   $OUT/$file <- $path"
}
shot topology.png 1400x1400 /ui/topology
shot preemptions.png 1400x700 /ui/preemptions
shot workload.png 1400x1100 "/ui/workloads/$VICTIM"
if [ -n "$AFFECTED" ]; then
    shot bad-node.png 1400x1300 "/ui/topology?workload=$(jq -rn --arg w "$AFFECTED" '$w | @uri')"
else
    shot bad-node.png 1400x1300 /ui/topology
fi
if curl -sf -o /dev/null "$BASE/ui/goodput"; then
    shot goodput.png 1400x1100 /ui/goodput
fi
echo "== done; review and commit docs/images/*.png"
