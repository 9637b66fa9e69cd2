"""Quota recommendations as the API's JSON and as metric families.

The metric's labels are the queue, its team, the kind and the reason: all from bounded sets
(queues x 5 kinds x 7 reasons, and the advisor gives at most one per queue and kind). The
sentence and the evidence stay in the JSON, never in labels.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from exporter.cluster.model import ClusterModel
from exporter.cluster.objects import GPU_RESOURCE
from exporter.cluster.quota.advisor import KINDS, REASONS, Recommendation
from exporter.core.exposition import GAUGE, Family


def recommendations_view(recs: Iterable[Recommendation]) -> list[dict[str, Any]]:
    """For /api/v1/quota/recommendations: one JSON object per recommendation."""
    return [
        {
            "cluster_queue": r.cluster_queue,
            "team": r.team,
            "kind": r.kind,
            "flavor": r.flavor,
            "resource": r.resource,
            "level": r.level,
            "current": r.current,
            "recommended": r.recommended,
            "reason": r.reason,
            "detail": r.detail,
            "evidence": dict(r.evidence),
        }
        for r in recs
    ]


def recommendation_from_view(item: Mapping[str, Any]) -> Recommendation | None:
    """The inverse, for a CLI reading a service's answer; None for an entry it cannot use."""
    try:
        kind = item["kind"]
        current = item.get("current")
        if kind not in KINDS or not isinstance(item["cluster_queue"], str):
            return None
        if current is not None and not isinstance(current, int):
            return None
        recommended = item["recommended"]
        if not isinstance(recommended, int) or isinstance(recommended, bool):
            return None
        evidence = item.get("evidence") or {}
        return Recommendation(
            cluster_queue=item["cluster_queue"],
            team=str(item.get("team") or ""),
            kind=kind,
            current=current,
            recommended=recommended,
            reason=str(item.get("reason") or ""),
            detail=str(item.get("detail") or ""),
            evidence={str(k): float(v) for k, v in evidence.items()},
            flavor=str(item.get("flavor") or ""),
            level=str(item.get("level") or ""),
            resource=str(item.get("resource") or GPU_RESOURCE),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def quota_families(recs: Iterable[Recommendation], model: ClusterModel) -> list[Family]:
    """`topowatch_quota_recommended_gpus` and `topowatch_quota_current_gpus` per queue and kind
    (GPU advice), and `topowatch_quota_recommended` per queue, kind, flavor and resource.

    `model` is accepted so the service can pass what it renders everything else from; the
    figures come from the recommendations alone."""
    del model
    recommended = Family(
        "topowatch_quota_recommended_gpus",
        GAUGE,
        "GPUs the quota advisor recommends, per ClusterQueue and kind (nominal, borrowing_limit, "
        "lending_limit: the quota field; topology_fit: the most one domain holds; "
        "topology_mode: GPUs left waiting on topology under a preferred request).",
    )
    current = Family(
        "topowatch_quota_current_gpus",
        GAUGE,
        "The current value the quota advisor compares against, per ClusterQueue and kind "
        "(absent for a limit that is not set).",
    )
    amount = Family(
        "topowatch_quota_recommended",
        GAUGE,
        "What the quota advisor recommends for a quota field (nominal, borrowing_limit, "
        "lending_limit), per ClusterQueue, flavor and resource, in base units (cpu in cores, "
        "memory in bytes, GPUs as a count): cpu and memory advice lives here only.",
    )
    seen: set[tuple[str, str]] = set()
    seen_amounts: set[tuple[str, str, str, str]] = set()
    for rec in recs:
        if rec.reason not in REASONS:
            continue
        if rec.flavor and rec.kind in ("nominal", "borrowing_limit", "lending_limit"):
            key4 = (rec.cluster_queue, rec.kind, rec.flavor, rec.resource)
            if key4 not in seen_amounts:
                seen_amounts.add(key4)
                scale = 1000.0 if rec.resource == "cpu" else 1.0
                amount.add(
                    [
                        ("cluster_queue", rec.cluster_queue),
                        ("team", rec.team),
                        ("kind", rec.kind),
                        ("reason", rec.reason),
                        ("flavor", rec.flavor),
                        ("resource", rec.resource),
                    ],
                    rec.recommended / scale,
                )
        if rec.resource != GPU_RESOURCE:
            continue  # the two families below count GPUs
        key = (rec.cluster_queue, rec.kind)
        if key in seen:
            continue
        seen.add(key)
        base = [("cluster_queue", rec.cluster_queue), ("team", rec.team), ("kind", rec.kind)]
        recommended.add([*base, ("reason", rec.reason)], rec.recommended)
        if rec.current is not None:
            current.add(base, rec.current)
    return [recommended, current, amount]
