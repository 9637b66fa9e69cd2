"""HyperPod provider: set the node-health label; HyperPod's own agent then reboots or replaces.

A merge patch touches only that label, so concurrent edits to other labels are never lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exporter.topology.labels import HEALTH_STATUS_KEY as HYPERPOD_HEALTH
from healthcheck.remediation.providers.base import ActionRequest, ActionResult

LABEL_VALUE = {"reboot": "UnschedulablePendingReboot", "replace": "UnschedulablePendingReplacement"}
MERGE_PATCH = "application/merge-patch+json"


class HyperPodLabeler:
    name = "hyperpod"
    # HyperPod's label knows no GPU reset.
    actions: frozenset[str] = frozenset({"reboot", "replace"})

    def __init__(self, core_v1: Any) -> None:
        self.core_v1 = core_v1  # kubernetes.client.CoreV1Api

    def execute(self, requests: Sequence[ActionRequest]) -> list[ActionResult]:
        results = []
        for request in requests:
            value = LABEL_VALUE[request.action]
            body = {"metadata": {"labels": {HYPERPOD_HEALTH: value}}}
            try:
                self.core_v1.patch_node(request.node, body, _content_type=MERGE_PATCH)
            except Exception as exc:  # ApiException, connection errors: a per-node failure
                results.append(ActionResult(request.node, False, f"label patch failed: {exc}"))
            else:
                results.append(ActionResult(request.node, True, f"{HYPERPOD_HEALTH}={value}"))
        return results
