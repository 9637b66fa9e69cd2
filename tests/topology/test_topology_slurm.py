"""The topology.conf we write is loaded by a real slurmctld (topology/tree, Slurm 22.05).

slurmctld runs alone on loopback (auth/none, cred/none, every node at 127.0.0.1, no slurmd):
enough for it to parse topology.conf and answer `scontrol show topology`, which prints each
switch's level (0 at the leaves, height above them otherwise), child switches and every node
below it. That is compared with the tree we built from EC2's answer.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from exporter.topology.ec2 import Switch, Topology, instances_from_pages, load_name_map, load_pages
from exporter.topology.hostlist import expand
from exporter.topology.writers import slurm_tree
from tests.conftest import reference
from tests.slurm_harness import binary, running_slurmctld

FIXTURES = Path(__file__).parents[1] / "fixtures" / "ec2"

pytestmark = pytest.mark.real_component


@contextmanager
def _show_topology(topology: Topology, tmp: Path) -> Iterator[str]:
    """Start slurmctld on `topology`'s tree, yield `scontrol show topology`, stop it."""
    names = [topology.name_of(i) for i in topology.placed]
    with running_slurmctld(tmp, names, slurm_tree(topology).text, probe="topology") as env:
        shown = subprocess.run(
            [binary("scontrol"), "show", "topology"],
            env=env,
            capture_output=True,
            text=True,
            timeout=5,
        )
        yield shown.stdout


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
