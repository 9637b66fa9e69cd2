"""The head node's packaging: install-node.sh --controller, its unit, its example config and the
Prometheus scrape config that reads the controller's file_sd targets.

The unit, the config and the snippet name the same paths (state directory, file_sd file, port);
the tests check that they agree, that what the script installs is what `topowatch
slurm-controller` starts with, and that systemd and promtool accept the files.
"""

from __future__ import annotations

import configparser
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from exporter.slurm.settings import (
    _AGENT_KEYS,
    _PROMETHEUS_KEYS,
    _REMEDIATION_KEYS,
    _SECTIONS,
    _SLURM_KEYS,
    Settings,
    load_settings,
    settings_from_mapping,
)
from tests.conftest import systemd_verify

REPO = Path(__file__).resolve().parents[2]
SLURM = REPO / "packaging" / "slurm"
INSTALL = SLURM / "install-node.sh"
UNIT = SLURM / "topowatch-slurm-controller.service"
EXAMPLE = SLURM / "slurm-controller.yaml"
SNIPPET = SLURM / "prometheus-file-sd.yml"
TOKEN = "tok-5c2e9b1d7a4f3e80"
STATE_DIR = "/var/lib/topowatch-slurm-controller"


def install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(INSTALL), *args], capture_output=True, text=True, timeout=120, check=False
    )


def read_unit(text: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(text)
    return unit


def shared_files(tmp_path: Path) -> list[str]:
    shared = tmp_path / "fsx"
    shared.mkdir()
    (shared / "health-token").write_text(TOKEN + "\n")
    (shared / "topology.conf").write_text("SwitchName=sw-1 Nodes=gpu-[1-2]\n")
    return [
        *("--token-file", str(shared / "health-token")),
        *("--topology-file", str(shared / "topology.conf")),
    ]


def common(prefix: Path) -> list[str]:
    venv = Path(sys.executable).parent.parent
    return ["--prefix", str(prefix), "--no-systemd", "--venv", str(venv)]


# --- the example config ----------------------------------------------------------------------


def test_the_example_config_parses_in_observe_mode_and_shows_every_setting() -> None:
    raw = yaml.safe_load(EXAMPLE.read_text())
    settings = settings_from_mapping(raw)
    assert settings.policy.mode == "observe"
    assert set(raw) == _SECTIONS - {"topology_file"}  # commented out: the file may not exist
    assert "# topology_file:" in EXAMPLE.read_text()
    assert set(raw["agents"]) == _AGENT_KEYS and set(raw["slurm"]) == _SLURM_KEYS
    assert set(raw["prometheus"]) == _PROMETHEUS_KEYS
    assert set(raw["remediation"]) == _REMEDIATION_KEYS - {"admin_token_file"}  # ditto
    # Every value shown is the default, but file_sd (off by default) in the state directory.
    differ = {
        name for name in Settings.__slots__ if getattr(settings, name) != getattr(Settings(), name)
    }
    assert differ == {"file_sd"}
    assert settings.state_file.parent == Path(STATE_DIR)
    assert settings.file_sd is not None and settings.file_sd.is_relative_to(STATE_DIR)


def test_every_setting_of_the_example_is_commented() -> None:
    """A comment right above each key; a section's opening line needs none, and the keys of
    policy.budget and policy.breaker (indented 6) share the one above their first key."""
    lines = EXAMPLE.read_text().splitlines()
    for number, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#") or line.rstrip().endswith(":"):
            continue
        above = lines[number - 1]
        shared = line.startswith(" " * 6) and above.startswith(" " * 6)
        assert above.lstrip().startswith("#") or shared, f"line {number + 1}: {line}"


# --- the unit ----------------------------------------------------------------------------------


def test_the_unit_runs_the_controller_as_the_slurm_user_confined() -> None:
    unit = read_unit(UNIT.read_text())
    service = unit["Service"]
    assert service["ExecStart"] == (
        "/opt/topowatch/venv/bin/topowatch slurm-controller"
        " --config /etc/topowatch/slurm-controller.yaml"
    )
    assert service["User"] == "slurm"
    assert "topowatch" in service["SupplementaryGroups"].split()  # the token's group
    assert service["NoNewPrivileges"] == "yes" and service["PrivateTmp"] == "yes"
    assert service["ProtectSystem"] == "strict" and service["ProtectHome"] == "yes"
    assert service["CapabilityBoundingSet"] == service["AmbientCapabilities"] == ""
    assert service["ReadOnlyPaths"] == "/etc/topowatch"
    assert f"/var/lib/{service['StateDirectory']}" == STATE_DIR
    assert service["Restart"] == "on-failure"
    # munge's socket and slurmctld stay reachable
    assert "PrivateNetwork" not in service
    assert "AF_UNIX" in service["RestrictAddressFamilies"].split()
    assert "slurmctld.service" in unit["Unit"]["After"].split()
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    # The agent's state directory is another unit's: systemd chowns a StateDirectory to its
    # unit's user, so the two units must not share one.
    node = read_unit((SLURM / "topowatch-node.service").read_text())
    assert node["Service"]["StateDirectory"] != service["StateDirectory"]


# --- the install -------------------------------------------------------------------------------


def test_the_install_script_parses() -> None:
    assert subprocess.run(["bash", "-n", str(INSTALL)], check=False).returncode == 0


def test_install_controller_writes_unit_and_config_and_is_idempotent(tmp_path: Path) -> None:
    prefix = tmp_path / "root"
    args = [*common(prefix), *shared_files(tmp_path), "--controller", "--listen", "[::]:9502"]
    dry = install(*args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert not prefix.exists()
    done = install(*args)
    assert done.returncode == 0, done.stderr
    assert TOKEN not in done.stdout + done.stderr
    etc = prefix / "etc" / "topowatch"
    units = prefix / "etc" / "systemd" / "system"
    assert sorted(p.name for p in units.iterdir()) == ["topowatch-slurm-controller.service"]
    assert not (etc / "node.yaml").exists()  # no agent asked for
    token = etc / "health-token"
    assert token.read_text().strip() == TOKEN and token.stat().st_mode & 0o777 == 0o640
    venv = Path(sys.executable).parent.parent
    unit = read_unit((units / "topowatch-slurm-controller.service").read_text())
    assert unit["Service"]["ExecStart"] == (
        f"{venv}/bin/topowatch slurm-controller --config {etc}/slurm-controller.yaml"
    )
    assert unit["Service"]["ReadOnlyPaths"] == str(etc)

    settings = load_settings(etc / "slurm-controller.yaml")
    assert settings.policy.mode == "observe"
    assert settings.token_file == token
    assert settings.topology_file == etc / "topology.conf"
    assert settings.agent_port == 9502  # the agents' --listen
    assert settings.state_file.is_relative_to(prefix / STATE_DIR.lstrip("/"))
    assert settings.file_sd is not None
    assert settings.file_sd.is_relative_to(prefix / STATE_DIR.lstrip("/"))

    config = etc / "slurm-controller.yaml"
    edited = config.read_text().replace("mode: observe", "mode: act")  # an admin's edit
    config.write_text(edited)
    again = install(*args)
    assert again.returncode == 0, again.stderr
    assert config.read_text() == edited

    both = install(*args, "--also-agent")
    assert both.returncode == 0, both.stderr
    assert sorted(p.name for p in units.iterdir()) == [
        "topowatch-node.service",
        "topowatch-slurm-controller.service",
    ]
    assert f"topology-file: {etc / 'topology.conf'}" in (etc / "node.yaml").read_text()
    assert config.read_text() == edited


def test_install_refuses_also_agent_without_controller(tmp_path: Path) -> None:
    refused = install(*common(tmp_path / "root"), "--also-agent")
    assert refused.returncode == 2 and "--also-agent goes with --controller" in refused.stderr
    assert not (tmp_path / "root").exists()


def test_the_installed_unit_starts_the_controller_which_writes_file_sd(tmp_path: Path) -> None:
    """The ExecStart the script installed, with its config, one cycle: a stub sinfo/scontrol
    lists two nodes, their file_sd targets land where the Prometheus snippet reads them."""
    prefix = tmp_path / "root"
    done = install(*common(prefix), *shared_files(tmp_path), "--controller")
    assert done.returncode == 0, done.stderr
    stubs = tmp_path / "slurm-bin"
    stubs.mkdir()
    nodes = {
        "nodes": [
            {"name": n, "address": "127.0.0.1", "state": "idle", "partitions": ["gpu"]}
            for n in ("gpu-1", "gpu-2")
        ]
    }
    (stubs / "scontrol").write_text(
        f"#!/bin/sh\ncase \"$*\" in 'show nodes --json') echo '{json.dumps(nodes)}';;"
        " *) exit 1;; esac\n"
    )
    (stubs / "squeue").write_text("#!/bin/sh\necho '{\"jobs\": []}'\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    config = prefix / "etc" / "topowatch" / "slurm-controller.yaml"
    text = config.read_text().replace('listen: "0.0.0.0:9404"', 'listen: "127.0.0.1:0"')
    config.write_text(text.replace("  bin_dir: null", f"  bin_dir: {stubs}"))
    unit = read_unit((prefix / "etc/systemd/system/topowatch-slurm-controller.service").read_text())
    ran = subprocess.run(
        [*shlex.split(unit["Service"]["ExecStart"]), "--once"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    file_sd = prefix / STATE_DIR.lstrip("/") / "file_sd" / "topowatch-nodes.json"
    groups = json.loads(file_sd.read_text())
    assert [(g["targets"], g["labels"]["node"]) for g in groups] == [
        (["127.0.0.1:9402"], "gpu-1"),
        (["127.0.0.1:9402"], "gpu-2"),
    ]
    assert TOKEN not in ran.stdout + ran.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_accepts_the_installed_controller_unit(tmp_path: Path) -> None:
    prefix = tmp_path / "root"
    done = install(*common(prefix), "--controller")
    assert done.returncode == 0, done.stderr
    installed = prefix / "etc" / "systemd" / "system" / "topowatch-slurm-controller.service"
    assert systemd_verify(installed) == ""


# --- Prometheus --------------------------------------------------------------------------------


def test_the_scrape_config_reads_the_controllers_file_sd_and_scrapes_the_controller() -> None:
    jobs = {job["job_name"]: job for job in yaml.safe_load(SNIPPET.read_text())["scrape_configs"]}
    settings = settings_from_mapping(yaml.safe_load(EXAMPLE.read_text()))
    (sd,) = jobs["topowatch-node"]["file_sd_configs"]
    assert sd["files"] == [str(settings.file_sd)]
    (static,) = jobs["topowatch-slurm-controller"]["static_configs"]
    assert static["targets"] == [f"localhost:{settings.listen_port}"]


@pytest.mark.real_component
def test_promtool_accepts_a_prometheus_yml_built_from_the_snippet(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: run scripts/bootstrap.sh (Debian package prometheus)")
    prometheus_yml = tmp_path / "prometheus.yml"
    prometheus_yml.write_text(
        "global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n" + SNIPPET.read_text()
    )
    check = subprocess.run(
        [promtool, "check", "config", str(prometheus_yml)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
