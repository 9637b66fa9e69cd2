"""The cluster's UltraServers, each judged as one NVLink domain (exporter/core/ultraserver.py).

A node belongs to the UltraServer its `topology.k8s.aws/ultraserver-id` label names. It counts
as healthy for the domain when new work may land on it: Ready, not cordoned, not marked
Unschedulable* by HyperPod's health agent, no `TopowatchHealthy=False` condition from our node
agent, and no deep health check running or failed on it. Its fabric comes from the agent's
`topowatch.io/nvlink-fabric` annotation (parsed into `Node.fabric`).
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.cluster.objects import Node
from exporter.core.ultraserver import (
    DEFAULT_THRESHOLDS,
    Member,
    Thresholds,
    UltraServerVerdict,
    judge_all,
)
from exporter.topology.labels import ULTRASERVER_KEY

MAX_WHY_CHARS = 160


def member(node: Node) -> Member:
    """A Node as a member of its UltraServer: usable or not, and why not."""
    why = ""
    if node.condition_note:
        why = node.condition_note
    elif node.health.startswith("Unschedulable"):
        why = f"HyperPod {node.health}"
    elif node.cordoned:
        why = "cordoned"
    elif not node.schedulable:
        why = "not Ready"
    elif node.deep_health_blocks:
        why = node.unavailable_detail
    return Member(
        name=node.name,
        gpus=node.allocatable_gpus,
        healthy=not why,
        why=why[:MAX_WHY_CHARS],
        fabric=node.fabric,
    )


def members(nodes: Mapping[str, Node]) -> dict[str, list[Member]]:
    """UltraServer id -> its members, for every node that carries the label."""
    out: dict[str, list[Member]] = {}
    for node in nodes.values():
        us = node.label(ULTRASERVER_KEY)
        if us:
            out.setdefault(us, []).append(member(node))
    return out


def verdicts(
    nodes: Mapping[str, Node], thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> dict[str, UltraServerVerdict]:
    """Each UltraServer's verdict, by id."""
    return judge_all(members(nodes), thresholds)


def ultraserver_of(nodes: Mapping[str, Node], node: str) -> str:
    n = nodes.get(node)
    return n.label(ULTRASERVER_KEY) if n is not None else ""
