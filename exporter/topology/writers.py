"""Render a Topology for its consumers: Slurm (tree, block), Kubernetes labels, Mermaid, JSON.

Each writer is pure and returns a Rendered: the text to print, notes worth telling the user
(instances left out and why), and errors that make the output unusable as it stands (broken
topology/block rules), so the command can print the text yet exit non-zero.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from exporter.topology.ec2 import Instance, Switch, Topology
from exporter.topology.hostlist import compress
from exporter.topology.labels import LAYER_KEYS, ULTRASERVER_KEY

__all__ = [
    "FORMATS",
    "Rendered",
    "block_rule_violations",
    "k8s_labels",
    "mermaid",
    "node_labels",
    "render",
    "slurm_block",
    "slurm_tree",
    "topology_json",
]


@dataclass(frozen=True, slots=True)
class Rendered:
    text: str
    notes: tuple[str, ...] = ()
    errors: tuple[str, ...] = field(default=())


def _unplaced_notes(topology: Topology) -> list[str]:
    return [
        f"{topology.describe(i)}: no network nodes reported (stopped or not yet running); left out"
        for i in topology.unplaced
    ]


def slurm_tree(topology: Topology) -> Rendered:
    """topology.conf for topology/tree: top switches first, then each layer down to the leaves.

    Switches= lists child switch ids plainly (network node ids share no numeric pattern, so
    ranges would only obscure them); Nodes= is hostlist-compressed as Slurm writes it itself.
    """
    switches, notes = topology.switches()
    lines = [
        "# topology.conf for TopologyPlugin=topology/tree, from EC2 DescribeInstanceTopology",
    ]
    for layer in range(1, topology.depth + 1):
        for switch in switches.values():
            if switch.layer != layer:
                continue
            parts = [f"SwitchName={switch.id}"]
            if switch.switches:
                parts.append("Switches=" + ",".join(switch.switches))
            if switch.instances:
                parts.append("Nodes=" + compress(topology.name_of(i) for i in switch.instances))
            lines.append(" ".join(parts))
    return Rendered("\n".join(lines) + "\n", tuple(notes + _unplaced_notes(topology)))


def block_rule_violations(block_nodes: dict[str, int], sizes: Sequence[int]) -> list[str]:
    """Where blocks and BlockSizes break topology/block's rules (empty when fine).

    The first size is the planning base block size: every block needs at least that many
    nodes, and every larger size must be the base times a power of two, ascending.
    """
    problems: list[str] = []
    if not sizes:
        return ["BlockSizes is empty"]
    base = sizes[0]
    if base < 1:
        problems.append(f"base block size {base} must be positive")
        return problems
    previous = 0
    for size in sizes:
        ratio, remainder = divmod(size, base)
        if size <= previous:
            problems.append(f"BlockSizes must ascend: {size} after {previous}")
        if remainder or ratio & (ratio - 1):
            problems.append(f"block size {size} is not {base} times a power of two")
        previous = size
    for block, count in block_nodes.items():
        if count < base:
            problems.append(
                f"block {block} has {count} node(s), fewer than the base block size {base};"
                " Slurm cannot place a base-size job in it"
            )
    return problems


def slurm_block(topology: Topology, sizes: Sequence[int] | None = None) -> Rendered:
    """topology.conf for topology/block: one BlockName per UltraServer (CapacityBlockId).

    Without explicit sizes the base is the smallest block, which always satisfies the size
    rule; callers pick sizes (e.g. 16,32 for GB200 NVL72 jobs of 16 nodes) to have them checked.
    Slurm 22.05 has no topology/block, so nothing here was loaded by a real controller.
    """
    blocks: dict[str, list[Instance]] = {}
    notes: list[str] = []
    for instance in topology.instances:
        if instance.ultraserver:
            blocks.setdefault(instance.ultraserver, []).append(instance)
        else:
            notes.append(
                f"{topology.describe(instance)}: no CapacityBlockId"
                " (not an UltraServer instance); left out"
            )
    if not blocks:
        return Rendered("", tuple(notes), ("no instance has a CapacityBlockId: no blocks",))
    counts = {block: len(members) for block, members in blocks.items()}
    chosen = list(sizes) if sizes else [min(counts.values())]
    lines = ["# topology.conf for TopologyPlugin=topology/block, one block per UltraServer"]
    for block, members in blocks.items():
        lines.append(f"BlockName={block} Nodes=" + compress(topology.name_of(i) for i in members))
    lines.append("BlockSizes=" + ",".join(str(size) for size in chosen))
    errors = tuple(block_rule_violations(counts, chosen))
    return Rendered("\n".join(lines) + "\n", tuple(notes), errors)


def node_labels(instance: Instance) -> dict[str, str]:
    """The labels EKS puts on a node of this instance (network layers, UltraServer)."""
    labels = dict(zip(LAYER_KEYS, instance.network_nodes, strict=False))
    if instance.ultraserver:
        labels[ULTRASERVER_KEY] = instance.ultraserver
    return labels


def k8s_labels(topology: Topology) -> Rendered:
    """Per node a JSON patch (RFC 6902, `kubectl patch --type=json`) and a `kubectl label`."""
    nodes = []
    for instance in topology.placed:
        name = topology.name_of(instance)
        labels = node_labels(instance)
        patch = [
            {"op": "add", "path": "/metadata/labels/" + _pointer(key), "value": value}
            for key, value in labels.items()
        ]
        command = ["kubectl", "label", "node", name, "--overwrite"]
        command += [f"{key}={value}" for key, value in labels.items()]
        nodes.append(
            {
                "node": name,
                "instance_id": instance.instance_id,
                "patch": patch,
                "kubectl": shlex.join(command),
            }
        )
    text = json.dumps({"nodes": nodes}, indent=2) + "\n"
    return Rendered(text, tuple(_unplaced_notes(topology)))


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def mermaid(topology: Topology) -> Rendered:
    """`flowchart TD` from layer-1 down to instances; ids are generated, labels are real."""
    switches, notes = topology.switches()
    ids: dict[str, str] = {}
    lines = ["flowchart TD"]
    for switch in switches.values():
        ids[switch.id] = f"n{len(ids)}"
        lines.append(f'  {ids[switch.id]}["{switch.id}"]')
    edges: list[str] = []
    instance_count = 0
    for switch in switches.values():
        for child in switch.switches:
            edges.append(f"  {ids[switch.id]} --> {ids[child]}")
        for instance in switch.instances:
            node_id = f"i{instance_count}"
            instance_count += 1
            name = topology.name_of(instance)
            label = name if name == instance.instance_id else f"{name}<br/>{instance.instance_id}"
            if instance.instance_type:
                label += f"<br/>{instance.instance_type}"
            lines.append(f'  {node_id}("{label}")')
            edges.append(f"  {ids[switch.id]} --> {node_id}")
    return Rendered("\n".join(lines + edges) + "\n", tuple(notes + _unplaced_notes(topology)))


def topology_json(topology: Topology) -> Rendered:
    """The normalized tree: network nodes with their children, and every instance."""
    switches, notes = topology.switches()

    def tree(switch: Switch) -> dict[str, object]:
        return {
            "id": switch.id,
            "layer": switch.layer,
            "switches": [tree(switches[child]) for child in switch.switches],
            "nodes": [topology.name_of(i) for i in switch.instances],
        }

    document = {
        "layers": topology.depth,
        "tree": [tree(s) for s in switches.values() if s.layer == 1],
        "instances": [
            {
                "name": topology.name_of(i),
                "instance_id": i.instance_id,
                "instance_type": i.instance_type,
                "availability_zone": i.availability_zone,
                "zone_id": i.zone_id,
                "group_name": i.group_name,
                "ultraserver": i.ultraserver,
                "network_nodes": list(i.network_nodes),
            }
            for i in topology.instances
        ],
    }
    return Rendered(json.dumps(document, indent=2) + "\n", tuple(notes))


FORMATS = ("slurm-tree", "slurm-block", "k8s-labels", "mermaid", "json")


def render(topology: Topology, fmt: str, block_sizes: Sequence[int] | None = None) -> Rendered:
    if fmt == "slurm-tree":
        return slurm_tree(topology)
    if fmt == "slurm-block":
        return slurm_block(topology, block_sizes)
    if fmt == "k8s-labels":
        return k8s_labels(topology)
    if fmt == "mermaid":
        return mermaid(topology)
    if fmt == "json":
        return topology_json(topology)
    raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
