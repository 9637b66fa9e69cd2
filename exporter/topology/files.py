"""Node placements from a topology file, for clusters with no Kubernetes labels to read (Slurm).

Two files describe a HyperPod Slurm cluster's network: the JSON `topowatch topology from-ec2
--format json` writes (`writers.topology_json`: instances with `network_nodes`, layer 1
first), and the Slurm topology.conf (topology/tree) that the same command, or an admin, wrote.
Both are read into the `Placement` node labels give, so the node agent's topology labels and
the Slurm controller's placement analyses work unchanged. The format is told by content: JSON
starts with `{`, a topology.conf with `SwitchName=` lines.

A topology.conf knows only switches: a switch's depth below the top switch is its network
layer (top = layer 1) and a node's layers are the switches from the top down to the one listing
it, so zone, UltraServer and instance type stay "". Network node ids are EC2's when
`from-ec2` wrote the conf; switch names of an admin's own are kept as they are.

A file that cannot be used raises `TopologyFileError` naming the file and the line or field:
a placement file that is wrong should be fixed, not half-used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from exporter.topology.drift import ConfSwitch, SlurmTopologyError, parse_topology_conf
from exporter.topology.labels import (
    INSTANCE_TYPE_KEY,
    LABEL_KEY_OF_LEVEL,
    LAYER_KEYS,
    NETWORK_LEVELS,
    REGION_KEY,
    ULTRASERVER_KEY,
    ZONE_KEY,
    Placement,
)

__all__ = [
    "TopologyFileError",
    "load_placements",
    "parse_placements",
    "placement_labels",
    "under_node_labels",
]


class TopologyFileError(ValueError):
    """A topology file that cannot be used; the message names the file and the line or field."""


def load_placements(path: Path) -> dict[str, Placement]:
    """Node name -> placement, from a `from-ec2 --format json` file or a Slurm topology.conf."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TopologyFileError(f"cannot read topology file {path}: {e}") from None
    try:
        return parse_placements(text)
    except TopologyFileError as e:
        raise TopologyFileError(f"{path}: {e}") from None


def parse_placements(text: str) -> dict[str, Placement]:
    """`load_placements` on a file's text (the format told by its first character)."""
    if text.lstrip().startswith("{"):
        return _from_json(text)
    return _from_topology_conf(text)


def placement_labels(placement: Placement) -> dict[str, str]:
    """The Node labels EKS would give this placement (only the non-empty ones), so code reading
    labels (the node agent's `topowatch_node_topology_info`) reads a file's placement alike.
    `Placement.from_labels` inverts it."""
    pairs = [
        (REGION_KEY, placement.region),
        (ZONE_KEY, placement.zone),
        *zip(LAYER_KEYS, placement.layers, strict=False),
        (ULTRASERVER_KEY, placement.ultraserver),
        (INSTANCE_TYPE_KEY, placement.instance_type),
        (LABEL_KEY_OF_LEVEL["node"], placement.hostname),
    ]
    return {key: value for key, value in pairs if value}


def under_node_labels(node: Mapping[str, str], from_file: Mapping[str, str]) -> dict[str, str]:
    """A Node's labels with a topology file's labels beneath: the Node's own win, and a Node
    that carries any network layer keeps its own network placement whole, never mixed with a
    file's layers (which may describe the node before it was re-placed)."""
    if any(key in node for key in LAYER_KEYS):
        return dict(node)
    return {**from_file, **node}


# --- from-ec2 JSON ----------------------------------------------------------------------------


def _from_json(text: str) -> dict[str, Placement]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise TopologyFileError(f"line {e.lineno}: not JSON: {e.msg}") from None
    instances = document.get("instances") if isinstance(document, Mapping) else None
    if not isinstance(instances, list):
        raise TopologyFileError(
            "a JSON topology file needs an 'instances' list"
            " (what `topowatch topology from-ec2 --format json` writes)"
        )
    placements: dict[str, Placement] = {}
    for index, entry in enumerate(instances):
        where = f"instances[{index}]"
        name, placement = _json_instance(entry, where)
        if name in placements:
            raise TopologyFileError(f"{where}: node name {name!r} appears twice")
        placements[name] = placement
    return placements


def _json_instance(entry: object, where: str) -> tuple[str, Placement]:
    if not isinstance(entry, Mapping):
        raise TopologyFileError(f"{where}: expected an object")
    strings: dict[str, str] = {}
    for key in ("name", "instance_id", "instance_type", "availability_zone", "ultraserver"):
        value = entry.get(key, "")
        if not isinstance(value, str):
            raise TopologyFileError(f"{where}.{key}: must be a string")
        strings[key] = value
    name = strings["name"] or strings["instance_id"]
    if not name:
        raise TopologyFileError(f"{where}: has neither 'name' nor 'instance_id'")
    layers = entry.get("network_nodes", [])
    if not isinstance(layers, list) or not all(isinstance(n, str) and n for n in layers):
        raise TopologyFileError(f"{where}.network_nodes ({name}): must be a list of node ids")
    _check_depth(len(layers), f"{where}.network_nodes ({name})")
    return name, Placement(
        region="",
        zone=strings["availability_zone"],
        layers=tuple(layers),
        ultraserver=strings["ultraserver"],
        instance_type=strings["instance_type"],
        hostname=name,
    )


# --- Slurm topology.conf ----------------------------------------------------------------------


def _from_topology_conf(text: str) -> dict[str, Placement]:
    try:
        switches = parse_topology_conf(text)
    except SlurmTopologyError as e:
        raise TopologyFileError(str(e)) from None
    if not switches:
        raise TopologyFileError(
            "neither JSON nor a topology.conf: no SwitchName lines (expected `topowatch topology"
            " from-ec2 --format json` or `--format slurm-tree` output)"
        )
    parents = _parents(switches, text)
    placements: dict[str, Placement] = {}
    for switch in switches.values():
        if not switch.nodes:
            continue
        path = _path_from_top(switch.name, parents, text)
        for node in switch.nodes:
            if node in placements:
                raise TopologyFileError(
                    f"line {_line_of(text, switch.name)}: node {node} is listed under both"
                    f" {placements[node].layers[-1]} and {switch.name}"
                )
            placements[node] = Placement(
                region="", zone="", layers=path, ultraserver="", instance_type="", hostname=node
            )
    return placements


def _parents(switches: Mapping[str, ConfSwitch], text: str) -> dict[str, str]:
    """Child switch -> its parent; every child must be defined and have one parent."""
    parents: dict[str, str] = {}
    for switch in switches.values():
        for child in switch.switches:
            where = f"line {_line_of(text, switch.name)}"
            if child not in switches:
                raise TopologyFileError(f"{where}: switch {switch.name} names {child}, undefined")
            if child in parents:
                raise TopologyFileError(
                    f"{where}: switch {child} is under both {parents[child]} and {switch.name}"
                )
            parents[child] = switch.name
    return parents


def _path_from_top(name: str, parents: Mapping[str, str], text: str) -> tuple[str, ...]:
    """The switches from the top switch down to `name`: the layers of the nodes it lists."""
    path = [name]
    while path[-1] in parents:
        parent = parents[path[-1]]
        if parent in path:
            raise TopologyFileError(f"line {_line_of(text, name)}: switch {parent} is in a loop")
        path.append(parent)
    _check_depth(len(path), f"line {_line_of(text, name)}: switch {name}")
    return tuple(reversed(path))


def _check_depth(depth: int, where: str) -> None:
    if depth > len(NETWORK_LEVELS):
        raise TopologyFileError(
            f"{where}: {depth} network layers; EC2 has at most {len(NETWORK_LEVELS)}"
        )


def _line_of(text: str, switch: str) -> int:
    """The line defining `switch`, for messages about the tree's shape (0 if not found)."""
    wanted = f"switchname={switch}".lower()
    for number, raw in enumerate(text.splitlines(), start=1):
        tokens = raw.split("#", 1)[0].lower().split()
        if wanted in tokens:
            return number
    return 0
