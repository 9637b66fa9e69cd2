"""The topology.conf we write is loaded by a real slurmctld (topology/tree, Slurm 22.05).

slurmctld runs alone on loopback (auth/none, cred/none, every node at 127.0.0.1, no slurmd):
enough for it to parse topology.conf and answer `scontrol show topology`, which prints each
switch's level (0 at the leaves, height above them otherwise), child switches and every node
below it. That is compared with the tree we built from EC2's answer.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from exporter.topology.ec2 import Switch, Topology, instances_from_pages, load_name_map, load_pages
from exporter.topology.hostlist import compress, expand
from exporter.topology.writers import slurm_tree
from tests.conftest import reference

FIXTURES = Path(__file__).parent / "fixtures" / "ec2"
START_TIMEOUT_S = 10.0

pytestmark = pytest.mark.real_component


def _binary(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if path is None:
        pytest.fail(f"{name} missing: run scripts/bootstrap.sh (Debian slurmctld slurm-client)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _slurm_conf(tmp: Path, nodes: list[str]) -> str:
    return "\n".join(
        [
            "ClusterName=topowatch",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "AuthType=auth/none",
            "CredType=cred/none",
            f"SlurmUser={getpass.getuser()}",
            f"StateSaveLocation={tmp / 'state'}",
            f"SlurmdSpoolDir={tmp / 'spool'}",
            f"SlurmctldPidFile={tmp / 'slurmctld.pid'}",
            f"SlurmctldLogFile={tmp / 'slurmctld.log'}",
            "TopologyPlugin=topology/tree",
            "SelectType=select/cons_tres",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            f"NodeName={compress(nodes)} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN",
            "PartitionName=all Nodes=ALL Default=YES State=UP",
            "",
        ]
    )


@contextmanager
def _show_topology(topology: Topology, tmp: Path) -> Iterator[str]:
    """Start slurmctld on `topology`'s tree, yield `scontrol show topology`, stop it."""
    slurmctld, scontrol = _binary("slurmctld"), _binary("scontrol")
    for directory in ("state", "spool"):
        (tmp / directory).mkdir()
    names = [topology.name_of(i) for i in topology.placed]
    (tmp / "slurm.conf").write_text(_slurm_conf(tmp, names))
    (tmp / "topology.conf").write_text(slurm_tree(topology).text)
    env = {**os.environ, "SLURM_CONF": str(tmp / "slurm.conf")}
    process = subprocess.Popen(
        [slurmctld, "-D", "-f", str(tmp / "slurm.conf")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        output = ""
        while time.monotonic() < deadline:
            if process.poll() is not None:
                log = (
                    (tmp / "slurmctld.log").read_text() if (tmp / "slurmctld.log").exists() else ""
                )
                pytest.fail(f"slurmctld exited {process.returncode}:\n{log[-3000:]}")
            shown = subprocess.run(
                [scontrol, "show", "topology"], env=env, capture_output=True, text=True, timeout=5
            )
            if shown.returncode == 0 and shown.stdout.strip():
                output = shown.stdout
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"slurmctld did not answer within {START_TIMEOUT_S} s")
        yield output
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _parse_show_topology(text: str) -> dict[str, dict[str, str]]:
    switches: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        fields = dict(token.split("=", 1) for token in line.split() if "=" in token)
        if "SwitchName" in fields:
            switches[fields["SwitchName"]] = fields
    return switches


def _expected(topology: Topology) -> dict[str, tuple[int, set[str], set[str]]]:
    """Per switch: Slurm's level (height above the leaves), child switches, nodes below."""
    switches, _ = topology.switches()

    def walk(switch: Switch) -> tuple[int, set[str]]:
        nodes = {topology.name_of(i) for i in switch.instances}
        level = 0
        for child in switch.switches:
            child_level, child_nodes = walk(switches[child])
            level = max(level, child_level + 1)
            nodes |= child_nodes
        return level, nodes

    expected = {}
    for switch in switches.values():
        level, nodes = walk(switch)
        expected[switch.id] = (level, set(switch.switches), nodes)
    return expected


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ("reference-p5", None),  # depth 3, Slurm node names = instance ids
        ("depth4-mixed-pages.json", "depth4-mixed-names.json"),  # depth 3 and 4, ip-... names
    ],
)
def test_slurmctld_loads_our_tree(tmp_path: Path, source: str, names: str | None) -> None:
    path = (
        reference("aws/describe-instance-topology-p5.json")
        if source == "reference-p5"
        else FIXTURES / source
    )
    topology = Topology(
        instances_from_pages(load_pages(path)),
        load_name_map(FIXTURES / names) if names else {},
    )
    with _show_topology(topology, tmp_path) as output:
        shown = _parse_show_topology(output)
    expected = _expected(topology)
    assert set(shown) == set(expected)
    for switch_id, (level, children, nodes) in expected.items():
        fields = shown[switch_id]
        assert int(fields["Level"]) == level, switch_id
        assert set(expand(fields.get("Switches", ""))) == children, switch_id
        assert set(expand(fields["Nodes"])) == nodes, switch_id
    assert any(level >= 2 for level, _, _ in expected.values())
