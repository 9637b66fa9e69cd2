"""UltraServer verdicts as views: the topology page's badges and explain's "waits" line.

A pending workload on an UltraServer flavor (a ResourceFlavor whose nodes carry
`topology.k8s.aws/ultraserver-id`) waits for an NVLink domain. When the domain Kueue's
topology assignment would choose, or any UltraServer of the flavor, is not healthy, explain
says so: "waits: its UltraServer us-... is degraded, 14 of 18 nodes healthy".
"""

from __future__ import annotations

from typing import Any

from exporter.cluster.analysis import PendingCause
from exporter.cluster.model import ClusterModel
from exporter.cluster.ultraserver import verdicts
from exporter.core.ultraserver import UltraServerVerdict
from exporter.topology.labels import ULTRASERVER, ULTRASERVER_KEY

# Exclusions that say a node is not the flavor's at all (rather than not usable now).
_NOT_OF_FLAVOR = frozenset({"flavor", "topology-label"})


def verdict_view(v: UltraServerVerdict) -> dict[str, Any]:
    return {**v.as_dict(), "summary": v.summary()}


def ultraservers_view(model: ClusterModel) -> list[dict[str, Any]]:
    """Every UltraServer's verdict, by id."""
    return [verdict_view(v) for v in verdicts(model.nodes).values()]


def flavor_ultraservers(model: ClusterModel, flavor: str) -> list[str]:
    """The UltraServers holding nodes of ResourceFlavor `flavor`, usable now or not; none for
    a flavor the model cannot describe (it would select every node: no claim is made)."""
    if model.flavor_spec(flavor) is None:
        return []
    eligibility = model.eligibility(flavor)
    names = set(eligibility.nodes)
    names |= {e.node for e in eligibility.excluded if e.cause not in _NOT_OF_FLAVOR}
    found = {model.nodes[n].label(ULTRASERVER_KEY) for n in names if n in model.nodes}
    return sorted(found - {""})


def ultraserver_waits(model: ClusterModel, pending: PendingCause | None) -> list[dict[str, Any]]:
    """For a pending workload on an UltraServer flavor: each UltraServer it waits for that is
    not healthy, with the words explain prints. The domain the topology fit names when it is
    an UltraServer; else every UltraServer of the flavor. [] when none is relevant."""
    if pending is None or not pending.flavor:
        return []
    ids = flavor_ultraservers(model, pending.flavor)
    if not ids:
        return []
    fit = pending.fit
    if fit is not None and fit.level == ULTRASERVER and fit.domain in ids:
        ids = [fit.domain]
    judged = verdicts(
        {n: node for n, node in model.nodes.items() if node.label(ULTRASERVER_KEY) in ids}
    )
    whose = "its UltraServer" if len(ids) == 1 else "UltraServer"
    mine = " of its flavor" if len(ids) > 1 else ""
    out = []
    for us in ids:
        v = judged.get(us)
        if v is None or v.verdict == "healthy":
            continue
        out.append(
            {
                **verdict_view(v),
                "words": f"{whose} {us}{mine} is {v.summary()}",
            }
        )
    return out
