"""Prometheus families for UltraServers, each judged as one NVLink domain
(exporter/cluster/ultraserver.py, exporter/core/ultraserver.py).

One series set per `topology.k8s.aws/ultraserver-id`: a cluster of 2,000 nodes holds at most
a few hundred UltraServers of up to 18 nodes, so the cardinality is bounded by the hardware.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from exporter.cluster.model import ClusterModel
from exporter.cluster.ultraserver import verdicts
from exporter.core.exposition import GAUGE, Family
from exporter.core.ultraserver import VERDICTS, UltraServerVerdict


def render(model: ClusterModel) -> Iterable[Family]:
    return families(verdicts(model.nodes))


def families(judged: Mapping[str, UltraServerVerdict]) -> list[Family]:
    nodes = Family(
        "topowatch_ultraserver_nodes",
        GAUGE,
        "Nodes of each UltraServer (one NVLink domain) by state: healthy (usable for new work "
        "and in the domain's agreed fabric clique) or unhealthy.",
    )
    gpus = Family("topowatch_ultraserver_gpus", GAUGE, "Allocatable GPUs of each UltraServer.")
    usable = Family(
        "topowatch_ultraserver_usable_gpus",
        GAUGE,
        "GPUs of each UltraServer on its healthy nodes: usable inside its NVLink domain.",
    )
    verdict = Family(
        "topowatch_ultraserver_verdict",
        GAUGE,
        "1 for each UltraServer's current verdict (healthy, degraded, failed), 0 for the others.",
    )
    agreed = Family(
        "topowatch_ultraserver_fabric_agreed",
        GAUGE,
        "1 when every node of the UltraServer that reports its NVLink fabric has all GPUs "
        "registered (COMPLETED, success, clean health mask) in one clique of one cluster; "
        "absent when no node reports a fabric.",
    )
    for us, v in sorted(judged.items()):
        base = [("ultraserver", us)]
        nodes.add([*base, ("state", "healthy")], v.nodes_healthy)
        nodes.add([*base, ("state", "unhealthy")], v.nodes_total - v.nodes_healthy)
        gpus.add(base, v.gpus_total)
        usable.add(base, v.gpus_usable)
        for name in VERDICTS:
            verdict.add([*base, ("verdict", name)], 1.0 if v.verdict == name else 0.0)
        if v.fabric_agreed is not None:
            agreed.add(base, 1.0 if v.fabric_agreed else 0.0)
    return [nodes, gpus, usable, verdict, agreed]
