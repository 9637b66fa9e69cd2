"""Kubernetes provider: cordon (spec.unschedulable) and taint `topowatch.io/unhealthy:NoSchedule`.

Taints are a list, which a merge patch replaces whole: the patch carries the resourceVersion it
was built from, so a concurrent taint edit makes it fail with 409 and it is rebuilt, never lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from healthcheck.remediation.providers.base import ActionRequest, ActionResult
from healthcheck.remediation.providers.hyperpod import MERGE_PATCH

TAINT_KEY = "topowatch.io/unhealthy"
CONFLICT_RETRIES = 3


class Cordoner:
    name = "kubernetes"
    # Cordons for any action; the taint's value names it.
    actions: frozenset[str] = frozenset({"reset", "reboot", "replace"})

    def __init__(self, core_v1: Any) -> None:
        self.core_v1 = core_v1  # kubernetes.client.CoreV1Api

    def execute(self, requests: Sequence[ActionRequest]) -> list[ActionResult]:
        return [self._cordon(r) for r in requests]

    def _cordon(self, request: ActionRequest) -> ActionResult:
        detail = "no attempt"
        for _ in range(CONFLICT_RETRIES):
            try:
                node = self.core_v1.api_client.sanitize_for_serialization(
                    self.core_v1.read_node(request.node)
                )
                body = cordon_patch(node, request.action)
                self.core_v1.patch_node(request.node, body, _content_type=MERGE_PATCH)
                return ActionResult(request.node, True, f"cordoned, tainted {TAINT_KEY}")
            except Exception as exc:
                detail = f"cordon failed: {exc}"
                if getattr(exc, "status", None) != 409:
                    break
        return ActionResult(request.node, False, detail)


def cordon_patch(node: dict[str, Any], action: str) -> dict[str, Any]:
    spec = node.get("spec") or {}
    taints = [t for t in spec.get("taints") or [] if t.get("key") != TAINT_KEY]
    taints.append({"key": TAINT_KEY, "value": action, "effect": "NoSchedule"})
    version = (node.get("metadata") or {}).get("resourceVersion")
    return {
        "metadata": {"resourceVersion": version},
        "spec": {"unschedulable": True, "taints": taints},
    }
