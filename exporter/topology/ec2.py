"""EC2 DescribeInstanceTopology responses -> a normalized network tree of named instances.

The AWS CLI prints one JSON document per page when asked for several (`--no-paginate` off and
`--output json` with a page size), people save lists of pages, and our own live calls return a
list of pages, so the parser accepts one document, a JSON list of pages, or documents written
one after another. Shape errors raise TopologyInputError naming the page and entry: a saved file
that is wrong should be fixed, not half-used. Instances with no network nodes (stopped, still
pending) are kept, because reports must say they were left out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from exporter.topology.labels import Placement

__all__ = [
    "Instance",
    "Switch",
    "Topology",
    "TopologyInputError",
    "instances_from_pages",
    "load_name_map",
    "load_pages",
    "named_topology",
    "parse_documents",
]


class TopologyInputError(ValueError):
    """A topology input (saved response, name map) that cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class Instance:
    """One instance as DescribeInstanceTopology reports it; absent strings are ""."""

    instance_id: str
    instance_type: str
    network_nodes: tuple[str, ...]  # layer-1 first, the instance's own (leaf) network node last
    availability_zone: str = ""
    zone_id: str = ""
    group_name: str = ""
    capacity_block_id: str = ""  # set for UltraServer instances: the UltraServer's domain

    @property
    def ultraserver(self) -> str:
        return self.capacity_block_id

    def placement(self, hostname: str = "") -> Placement:
        """The same view node labels give, so label-based code works on EC2 data unchanged."""
        return Placement(
            region="",
            zone=self.availability_zone,
            layers=self.network_nodes,
            ultraserver=self.ultraserver,
            instance_type=self.instance_type,
            hostname=hostname,
        )


@dataclass(slots=True)
class Switch:
    """A network node: its layer (1 = top), parent id ("" at layer 1), children and instances."""

    id: str
    layer: int
    parent: str
    switches: list[str] = field(default_factory=list)
    instances: list[Instance] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Topology:
    """Instances plus the Slurm/Kubernetes node name of each (instance id when unnamed)."""

    instances: tuple[Instance, ...]
    names: Mapping[str, str] = field(default_factory=dict)

    def name_of(self, instance: Instance) -> str:
        return self.names.get(instance.instance_id) or instance.instance_id

    def describe(self, instance: Instance) -> str:
        """`name (instance id)`, or the id alone when it is the name: for messages."""
        name = self.name_of(instance)
        return name if name == instance.instance_id else f"{name} ({instance.instance_id})"

    @property
    def placed(self) -> tuple[Instance, ...]:
        return tuple(i for i in self.instances if i.network_nodes)

    @property
    def unplaced(self) -> tuple[Instance, ...]:
        return tuple(i for i in self.instances if not i.network_nodes)

    @property
    def depth(self) -> int:
        return max((len(i.network_nodes) for i in self.instances), default=0)

    def switches(self) -> tuple[dict[str, Switch], list[str]]:
        """Every network node, in first-seen order, and notes on disagreements.

        A network node id names one physical node, so it has one layer and one parent; when
        instances disagree (a corrupted or hand-edited input), the first answer wins and a
        note says so rather than the tree silently growing a second parent.
        """
        switches: dict[str, Switch] = {}
        notes: list[str] = []
        for instance in self.placed:
            parent = ""
            for depth, node_id in enumerate(instance.network_nodes, start=1):
                switch = switches.get(node_id)
                if switch is None:
                    switch = switches[node_id] = Switch(node_id, depth, parent)
                    if parent:
                        switches[parent].switches.append(node_id)
                elif switch.layer != depth or switch.parent != parent:
                    notes.append(
                        f"{instance.instance_id}: network node {node_id} at layer {depth} under"
                        f" {parent or 'the top'}, but seen before at layer {switch.layer} under"
                        f" {switch.parent or 'the top'}; keeping the first"
                    )
                parent = node_id
            switches[instance.network_nodes[-1]].instances.append(instance)
        return switches, notes


def parse_documents(text: str) -> list[object]:
    """JSON documents of `text`: one, or several written one after another."""
    decoder = json.JSONDecoder()
    documents: list[object] = []
    position = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position >= len(text):
            break
        try:
            document, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as e:
            raise TopologyInputError(f"not JSON: {e}") from None
        documents.append(document)
    if not documents:
        raise TopologyInputError("empty input: expected DescribeInstanceTopology JSON")
    return documents


def load_pages(path: Path) -> list[object]:
    """The response pages saved in `path` (a single page, a list of pages, or concatenated)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TopologyInputError(f"cannot read {path}: {e}") from None
    pages: list[object] = []
    for document in parse_documents(text):
        if isinstance(document, list):
            pages.extend(document)
        else:
            pages.append(document)
    return pages


def instances_from_pages(pages: Iterable[object]) -> tuple[Instance, ...]:
    """Instances of all pages in order; a repeated instance id keeps its last report."""
    found: dict[str, Instance] = {}
    for page_number, page in enumerate(pages, start=1):
        if not isinstance(page, Mapping) or not isinstance(page.get("Instances", []), list):
            raise TopologyInputError(
                f"page {page_number}: expected an object with an 'Instances' list"
                f" (DescribeInstanceTopology output), got {_kind(page)}"
            )
        for index, entry in enumerate(page.get("Instances", [])):
            instance = _instance(entry, f"page {page_number}, Instances[{index}]")
            found.pop(instance.instance_id, None)
            found[instance.instance_id] = instance
    return tuple(found.values())


def _instance(entry: object, where: str) -> Instance:
    if not isinstance(entry, Mapping):
        raise TopologyInputError(f"{where}: expected an object, got {_kind(entry)}")
    instance_id = entry.get("InstanceId")
    if not isinstance(instance_id, str) or not instance_id:
        raise TopologyInputError(f"{where}: missing InstanceId")
    nodes = entry.get("NetworkNodes", [])
    if not isinstance(nodes, list) or not all(isinstance(n, str) and n for n in nodes):
        raise TopologyInputError(
            f"{where} ({instance_id}): NetworkNodes must be a list of network node ids"
        )
    strings: dict[str, str] = {}
    for key in ("InstanceType", "AvailabilityZone", "ZoneId", "GroupName", "CapacityBlockId"):
        value = entry.get(key, "")
        if not isinstance(value, str):
            raise TopologyInputError(f"{where} ({instance_id}): {key} must be a string")
        strings[key] = value
    return Instance(
        instance_id=instance_id,
        instance_type=strings["InstanceType"],
        network_nodes=tuple(nodes),
        availability_zone=strings["AvailabilityZone"],
        zone_id=strings["ZoneId"],
        group_name=strings["GroupName"],
        capacity_block_id=strings["CapacityBlockId"],
    )


def load_name_map(path: Path) -> dict[str, str]:
    """instance id -> node name from a JSON object or two-column text (`# comments` allowed)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TopologyInputError(f"cannot read name map {path}: {e}") from None
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise TopologyInputError(f"name map {path}: not JSON: {e}") from None
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in data.items()
        ):
            raise TopologyInputError(f"name map {path}: values must be non-empty strings")
        return dict(data)
    names: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 2:
            raise TopologyInputError(
                f"name map {path}, line {number}: expected 'INSTANCE-ID NAME', got {line.strip()!r}"
            )
        names[fields[0]] = fields[1]
    return names


def named_topology(instances: Sequence[Instance], names: Mapping[str, str]) -> Topology:
    """A Topology whose names are checked: two instances must not share one node name."""
    topology = Topology(tuple(instances), dict(names))
    seen: dict[str, str] = {}
    for instance in topology.instances:
        name = topology.name_of(instance)
        if name in seen:
            raise TopologyInputError(
                f"instances {seen[name]} and {instance.instance_id} both map to node name {name!r}"
            )
        seen[name] = instance.instance_id
    return topology


def _kind(value: object) -> str:
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return "a string" if isinstance(value, str) else type(value).__name__
