#!/usr/bin/env bash
# Install what topowatch's run and test commands need, and nothing twice. Safe to run
# repeatedly; quick when nothing changed.
#
#   scripts/bootstrap.sh          everything the tests use: Debian packages (real Prometheus
#                                 tooling, node_exporter, Slurm, Chromium, PostgreSQL...), a
#                                 virtualenv, the package and its dev dependencies
#   scripts/bootstrap.sh demo     only what `topowatch demo` uses: Prometheus (its dashboards'
#                                 and alerts' data) and the package with its runtime dependencies
#
# Each step says what it does before it starts: on a fresh machine the installs take minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

profile="${1:-test}"
case "$profile" in
  demo) DEBIAN_PACKAGES=(prometheus) ;;
  test) DEBIAN_PACKAGES=(prometheus prometheus-node-exporter openssl slurmctld slurmd slurm-client chromium systemd-journal-remote postgresql) ;;
  *) echo "bootstrap: unknown profile '$profile' (demo or test)" >&2; exit 2 ;;
esac

# Run "$@" showing only its lines that match $1 (progress); on failure show all it said.
progress() {
  local pattern=$1; shift
  local log; log=$(mktemp)
  set +e
  "$@" 2>&1 | tee "$log" | grep --line-buffered -E "$pattern" | sed -u 's/^/bootstrap:   /' >&2
  local rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -ne 0 ]; then
    cat "$log" >&2; rm -f "$log"
    echo "bootstrap: failed ($rc): $*" >&2
    exit 2
  fi
  rm -f "$log"
}

missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "bootstrap: [apt] refreshing the package index" >&2
  $SUDO apt-get update -qq
  # policy-rc.d keeps the packages' services from starting: tests start their own on loopback.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  echo "bootstrap: [apt] installing ${missing[*]}" >&2
  # One line a package as apt unpacks and sets it up: progress without apt's whole chatter.
  progress '^(Unpacking|Setting up) ' \
    env DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  for pkg in "${missing[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
      || { echo "bootstrap: Debian package $pkg did not install (run: apt-get install $pkg)" >&2; exit 2; }
  done
fi

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: [python] creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
# The dev install includes the runtime one: either stamp, newer than pyproject.toml, will do
# for the demo; the tests need the dev stamp.
dev_stamp=.venv/.topowatch-installed
run_stamp=.venv/.topowatch-runtime-installed
fresh() { [ -f "$1" ] && [ ! pyproject.toml -nt "$1" ]; }
if [ "$profile" = demo ]; then
  if ! fresh "$dev_stamp" && ! fresh "$run_stamp"; then
    echo "bootstrap: [python] installing topowatch and its runtime dependencies into .venv" >&2
    .venv/bin/python -m pip install -q --upgrade pip
    progress '^(Collecting|Successfully installed) ' .venv/bin/python -m pip install --progress-bar off -e .
    touch "$run_stamp"
  fi
elif ! fresh "$dev_stamp"; then
  echo "bootstrap: [python] installing topowatch and its dev dependencies into .venv" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  progress '^(Collecting|Successfully installed) ' .venv/bin/python -m pip install --progress-bar off -e '.[dev]'
  touch "$dev_stamp"
fi
