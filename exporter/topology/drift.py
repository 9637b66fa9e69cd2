"""Compare a Slurm topology.conf (topology/tree) with what EC2 reports now.

Instances get replaced and re-placed; a topology.conf written once goes stale and Slurm then
packs jobs by a network that no longer exists. The check answers three questions per node:
is it in the conf at all (missing), under the leaf switch EC2 says (moved), and does EC2 still
know it (stale). Network node ids are EC2's, so a conf written by anything else (switch names
of its own) shows every node as moved, which is the honest answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.topology.ec2 import Topology
from exporter.topology.hostlist import HostlistError, expand

__all__ = ["ConfSwitch", "Drift", "SlurmTopologyError", "compare", "parse_topology_conf"]


class SlurmTopologyError(ValueError):
    """A topology.conf line that cannot be read; the message names the line."""


@dataclass(frozen=True, slots=True)
class ConfSwitch:
    name: str
    switches: tuple[str, ...]
    nodes: tuple[str, ...]


def parse_topology_conf(text: str) -> dict[str, ConfSwitch]:
    """SwitchName lines of a topology.conf, hostlists expanded; keys are case-insensitive."""
    switches: dict[str, ConfSwitch] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields: dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if not sep:
                raise SlurmTopologyError(f"line {number}: expected KEY=VALUE, got {token!r}")
            fields[key.lower()] = value
        name = fields.get("switchname")
        if not name:
            if "blockname" in fields or "blocksizes" in fields:
                raise SlurmTopologyError(
                    f"line {number}: a topology/block line; only topology/tree confs are checked"
                )
            raise SlurmTopologyError(f"line {number}: no SwitchName: {raw.strip()!r}")
        try:
            children = tuple(expand(fields.get("switches", "")))
            nodes = tuple(expand(fields.get("nodes", "")))
        except HostlistError as e:
            raise SlurmTopologyError(f"line {number}: {e}") from None
        if name in switches:
            raise SlurmTopologyError(f"line {number}: switch {name} defined twice")
        switches[name] = ConfSwitch(name, children, nodes)
    return switches


@dataclass(frozen=True, slots=True)
class Drift:
    """Differences, each a sorted list; `clean` when there is nothing to fix."""

    missing: tuple[tuple[str, str], ...] = ()  # (node, the leaf EC2 says)
    moved: tuple[tuple[str, str, str], ...] = ()  # (node, leaf in conf, leaf EC2 says)
    stale: tuple[tuple[str, str], ...] = ()  # (node, leaf in conf)
    unplaced: tuple[str, ...] = ()  # EC2 knows the node but reports no network nodes
    notes: tuple[str, ...] = field(default=())

    @property
    def clean(self) -> bool:
        return not (self.missing or self.moved or self.stale)

    def report(self) -> str:
        lines: list[str] = []
        for node, leaf in self.missing:
            lines.append(f"missing: {node} is not in topology.conf; EC2 places it under {leaf}")
        for node, old, new in self.moved:
            lines.append(f"moved:   {node} is under {old} in topology.conf; EC2 says {new}")
        for node, leaf in self.stale:
            lines.append(f"stale:   {node} (under {leaf}) is not an instance EC2 reports")
        for node in self.unplaced:
            lines.append(f"note:    {node} has no network nodes in EC2 (stopped?); not checked")
        lines.extend(f"note:    {note}" for note in self.notes)
        verdict = (
            "topology.conf matches EC2"
            if self.clean
            else f"drift: {len(self.missing)} missing, {len(self.moved)} moved,"
            f" {len(self.stale)} stale"
        )
        return "\n".join([*lines, verdict]) + "\n"


def compare(conf: dict[str, ConfSwitch], topology: Topology) -> Drift:
    """Drift of `conf` against `topology`, by node name (names as the writer would use)."""
    conf_leaf: dict[str, str] = {}
    notes: list[str] = []
    for switch in conf.values():
        for node in switch.nodes:
            if node in conf_leaf and conf_leaf[node] != switch.name:
                notes.append(f"{node} is listed under both {conf_leaf[node]} and {switch.name}")
                continue
            conf_leaf[node] = switch.name
    ec2_leaf: dict[str, str] = {}
    unplaced: list[str] = []
    for instance in topology.instances:
        name = topology.name_of(instance)
        if instance.network_nodes:
            ec2_leaf[name] = instance.network_nodes[-1]
        else:
            unplaced.append(name)
    missing = [(n, leaf) for n, leaf in ec2_leaf.items() if n not in conf_leaf]
    moved = [
        (n, conf_leaf[n], leaf)
        for n, leaf in ec2_leaf.items()
        if n in conf_leaf and conf_leaf[n] != leaf
    ]
    known = set(ec2_leaf) | set(unplaced)
    stale = [(n, leaf) for n, leaf in conf_leaf.items() if n not in known]
    notes.extend(_structure_notes(conf, topology))
    return Drift(
        missing=tuple(sorted(missing)),
        moved=tuple(sorted(moved)),
        stale=tuple(sorted(stale)),
        unplaced=tuple(sorted(n for n in unplaced if n in conf_leaf)),
        notes=tuple(notes),
    )


def _structure_notes(conf: dict[str, ConfSwitch], topology: Topology) -> list[str]:
    """Switches whose parent in the conf differs from EC2's (nodes may still sit right)."""
    conf_parent = {child: s.name for s in conf.values() for child in s.switches}
    switches, _ = topology.switches()
    notes = []
    for switch in switches.values():
        if switch.id in conf and switch.parent and conf_parent.get(switch.id) != switch.parent:
            notes.append(
                f"switch {switch.id} is under {conf_parent.get(switch.id) or 'nothing'} in"
                f" topology.conf; EC2 says {switch.parent}"
            )
    return notes
