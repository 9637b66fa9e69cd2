#!/usr/bin/env bash
# Install the topowatch node agent on a Slurm host as a systemd service; meant for a HyperPod
# lifecycle script (runs as root on every node) and safe to run again (idempotent: a re-run
# upgrades the package, refreshes the token and topology copies given, keeps node.yaml).
#
#   install-node.sh --wheel /fsx/topowatch/topowatch-0.1.0-py3-none-any.whl \
#       --token-file /fsx/topowatch/health-token --topology-file /fsx/topowatch/topology.conf
#
# On the head node, --controller installs `topowatch slurm-controller` instead of the agent
# (--controller --also-agent: both), with the same venv, user, token and topology logic.
#
# What it does:
#   - a system user `topowatch` (no login shell), unless --no-systemd or not root;
#   - a virtual environment (/opt/topowatch/venv) with topowatch from --wheel, --source or
#     --package (pip); with none of them the existing venv is kept as it is;
#   - /etc/topowatch/health-token (0640 root:topowatch): a copy of --token-file (the head
#     node's controller must use the same token: keep one on shared storage), else a random one
#     when none exists yet;
#   - /etc/topowatch/topology.conf|.json: a copy of --topology-file (a local copy, so the agent
#     starts before /fsx is mounted);
#   - /etc/topowatch/node.yaml, only when absent (yours to edit afterwards);
#   - the unit topowatch-node.service, enabled and (re)started, unless --no-systemd;
#   - with --controller, instead: /etc/topowatch/slurm-controller.yaml, only when absent (from
#     slurm-controller.yaml here: observe mode; its topology_file set to the copy, its agent port
#     to --listen's), and the unit topowatch-slurm-controller.service (runs as the SlurmUser
#     `slurm`, which must exist; in group topowatch for the token); --also-agent: both.
# --prefix DIR puts every path under DIR (tests, image builds); --dry-run prints what it would do.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: install-node.sh [--wheel FILE | --source DIR | --package SPEC] [--venv DIR]
                       [--python BIN] [--pip-arg ARG]... [--token-file FILE]
                       [--topology-file FILE] [--listen HOST:PORT] [--prefix DIR]
                       [--controller [--also-agent]] [--no-systemd] [--dry-run]
USAGE
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
prefix=""
install_from=""
venv=""
python=python3
pip_args=()
token_src=""
topology_src=""
listen="0.0.0.0:9402"
systemd=1
dry_run=0
controller=0
agent=1
also_agent=0

while [[ $# -gt 0 ]]; do
    case "$1" in
    --wheel | --source | --package)
        if [[ -n "$install_from" ]]; then
            echo "install-node.sh: give one of --wheel, --source, --package" >&2
            exit 2
        fi
        install_from="$2"
        shift 2
        ;;
    --venv) venv="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    --pip-arg) pip_args+=("$2"); shift 2 ;;
    --token-file) token_src="$2"; shift 2 ;;
    --topology-file) topology_src="$2"; shift 2 ;;
    --listen) listen="$2"; shift 2 ;;
    --prefix) prefix="${2%/}"; shift 2 ;;
    --controller) controller=1; shift ;;
    --also-agent) also_agent=1; shift ;;
    --no-systemd) systemd=0; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "install-node.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

if ((also_agent && !controller)); then
    echo "install-node.sh: --also-agent goes with --controller" >&2
    exit 2
fi
if ((controller && !also_agent)); then agent=0; fi
venv="${venv:-$prefix/opt/topowatch/venv}"
etc="$prefix/etc/topowatch"
state="$prefix/var/lib/topowatch"
# The controller's StateDirectory: not the agent's, which systemd chowns to user topowatch.
controller_state="$prefix/var/lib/topowatch-slurm-controller"
unit_dir="$prefix/etc/systemd/system"
units=()
if ((agent)); then units+=(topowatch-node.service); fi
if ((controller)); then units+=(topowatch-slurm-controller.service); fi
is_root=0
[[ $(id -u) -eq 0 ]] && is_root=1
# The user exists only where the service will run as it: a real install, as root.
manage_user=$((systemd && is_root))

run() {
    if ((dry_run)); then
        printf '+'
        printf ' %q' "$@"
        printf '\n'
    else
        "$@"
    fi
}

# write_file DEST MODE: stdin to DEST through a temporary file renamed into place, so a reader
# never sees half a file; nothing happens when DEST already holds exactly that content.
write_file() {
    local dest=$1 mode=$2 tmp
    if ((dry_run)); then
        echo "+ write $dest (mode $mode)"
        cat >/dev/null
        return
    fi
    tmp=$(mktemp "$dest.XXXXXX")
    cat >"$tmp"
    chmod "$mode" "$tmp"
    if [[ -f "$dest" ]] && cmp -s "$tmp" "$dest"; then
        rm -f "$tmp"
        chmod "$mode" "$dest"
    else
        mv -f "$tmp" "$dest"
    fi
}

# Readable by the agent's group only: the token guards the health API.
own_by_agent_group() {
    if ((manage_user)); then
        run chown root:topowatch "$1"
    fi
}

for file in "$token_src" "$topology_src"; do
    if [[ -n "$file" && ! -r "$file" ]]; then
        echo "install-node.sh: cannot read $file" >&2
        exit 2
    fi
done
templates=("${units[@]}")
if ((controller)); then templates+=(slurm-controller.yaml); fi
for template in "${templates[@]}"; do
    if [[ ! -r "$here/$template" ]]; then
        echo "install-node.sh: $template is missing next to this script ($here)" >&2
        exit 2
    fi
done

# 1. the user
if ((manage_user)) && ! getent passwd topowatch >/dev/null; then
    nologin=$(command -v nologin || echo /usr/sbin/nologin)
    run useradd --system --user-group --no-create-home --home-dir /var/lib/topowatch \
        --shell "$nologin" --comment "topowatch node agent" topowatch
fi
if ((controller && manage_user)) && ! getent passwd slurm >/dev/null; then
    echo "install-node.sh: no user slurm here; topowatch-slurm-controller.service runs as the" \
        "SlurmUser: edit its User= (a user with AdminLevel=Admin) before it can start" >&2
fi

# 2. the package
if [[ -n "$install_from" ]]; then
    [[ -x "$venv/bin/python" ]] || run "$python" -m venv "$venv"
    run "$venv/bin/python" -m pip install --quiet --upgrade ${pip_args[@]+"${pip_args[@]}"} "$install_from"
elif [[ ! -x "$venv/bin/topowatch" ]] && ((!dry_run)); then
    echo "install-node.sh: no topowatch in $venv; give --wheel, --source or --package" >&2
    exit 2
fi

# 3. configuration
run mkdir -p "$etc"
if ((agent)); then run mkdir -p "$state"; fi
run chmod 0755 "$etc"
token="$etc/health-token"
if [[ -n "$token_src" ]]; then
    write_file "$token" 0640 <"$token_src"
    own_by_agent_group "$token"
elif [[ ! -s "$token" ]]; then
    # 32 random bytes in hex; never printed.
    (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' | write_file "$token" 0640)
    own_by_agent_group "$token"
    echo "install-node.sh: a new health token in $token; the head node's controller needs" \
        "the same one (give every node one shared file with --token-file)" >&2
fi
topology=""
if [[ -n "$topology_src" ]]; then
    case "$topology_src" in
    *.json) topology="$etc/topology.json" ;;
    *) topology="$etc/topology.conf" ;;
    esac
    write_file "$topology" 0644 <"$topology_src"
fi
config="$etc/node.yaml"
if ((!agent)); then
    : # --controller alone: no agent settings
elif [[ ! -e "$config" ]]; then
    {
        echo "# topowatch node agent settings: long options of \`topowatch node\` (see --help)."
        echo "# Written once by install-node.sh; a re-run keeps your edits."
        echo "listen: \"$listen\""
        echo "health-token-file: $token"
        echo "kernel-log-state: $state"
        if [[ -n "$topology" ]]; then echo "topology-file: $topology"; fi
    } | write_file "$config" 0644
elif [[ -n "$topology" ]] && ! grep -q '^topology-file:' "$config"; then
    echo "install-node.sh: $config exists and names no topology-file; add" \
        "\`topology-file: $topology\` to use the copy" >&2
fi

controller_config="$etc/slurm-controller.yaml"
if ((!controller)); then
    : # the agent alone
elif [[ ! -e "$controller_config" ]]; then
    # The example, its paths moved under --prefix, the agents' port from --listen.
    edits=(-e "s#/etc/topowatch#$etc#g"
        -e "s#/var/lib/topowatch-slurm-controller#$controller_state#g"
        -e "s#^  port: 9402\$#  port: ${listen##*:}#")
    if [[ -n "$topology" ]]; then edits+=(-e "s|^# topology_file: .*|topology_file: $topology|"); fi
    sed "${edits[@]}" "$here/slurm-controller.yaml" | write_file "$controller_config" 0644
elif [[ -n "$topology" ]] && ! grep -q '^topology_file:' "$controller_config"; then
    echo "install-node.sh: $controller_config exists and names no topology_file; add" \
        "\`topology_file: $topology\` to use the copy" >&2
fi

# 4. the units: the templates' paths moved under --prefix and to the venv used
run mkdir -p "$unit_dir"
for unit in "${units[@]}"; do
    sed -e "s#/opt/topowatch/venv#$venv#g" -e "s#/etc/topowatch#$etc#g" "$here/$unit" |
        write_file "$unit_dir/$unit" 0644
done
if ((systemd)); then
    run systemctl daemon-reload
    run systemctl enable "${units[@]}"
    run systemctl restart "${units[@]}"
fi
if ((agent)); then
    echo "install-node.sh: topowatch node agent installed ($venv, $etc)" >&2
fi
if ((controller)); then
    echo "install-node.sh: topowatch slurm-controller installed ($venv, $controller_config;" \
        "observe mode unless it says act)" >&2
fi
