"""SageMaker provider: BatchRebootClusterNodes / BatchReplaceClusterNodes for HyperPod clusters.

Node ids are EC2 instance ids, taken from the Node's spec.providerID (`aws:///zone/i-...`) or
from HyperPod's node name (`hyperpod-i-...`). Calls carry at most 25 ids (the API's limit);
each response's Failed list becomes per-node failures. Throttling is retried with exponential
backoff here, not by botocore, so it is bounded, visible and testable with Stubber.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from healthcheck.actions.base import ActionRequest, ActionResult

BATCH_LIMIT = 25
THROTTLING_CODES = frozenset(
    {"ThrottlingException", "Throttling", "TooManyRequestsException", "RequestLimitExceeded"}
)
_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8}(?:[0-9a-f]{9})?$")
_OPERATION = {"reboot": "batch_reboot_cluster_nodes", "replace": "batch_replace_cluster_nodes"}


def instance_id_of(node: dict[str, Any], name: str) -> str | None:
    """The EC2 instance id of a Node: providerID's last segment, else a hyperpod-i-... name."""
    spec = node.get("spec")
    provider_id = spec.get("providerID") if isinstance(spec, dict) else None
    if isinstance(provider_id, str):
        last = provider_id.rstrip("/").rsplit("/", 1)[-1]
        if _INSTANCE_ID.match(last):
            return last
    suffix = name.removeprefix("hyperpod-")
    if suffix != name and _INSTANCE_ID.match(suffix):
        return suffix
    return None


class SageMakerNodes:
    name = "sagemaker-api"
    # The API knows no GPU reset.
    actions: frozenset[str] = frozenset({"reboot", "replace"})

    def __init__(
        self,
        client: Any,  # boto3 SageMaker client
        cluster_name: str,
        max_attempts: int = 5,
        base_delay_s: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.cluster_name = cluster_name
        self.max_attempts = max_attempts
        self.base_delay_s = base_delay_s
        self.sleep = sleep

    def execute(self, requests: Sequence[ActionRequest]) -> list[ActionResult]:
        results: list[ActionResult] = []
        for action in ("replace", "reboot"):
            by_id: dict[str, str] = {}
            for request in requests:
                if request.action != action:
                    continue
                instance = instance_id_of(request.node_object, request.node)
                if instance is None:
                    results.append(ActionResult(request.node, False, "no EC2 instance id"))
                elif instance in by_id:
                    results.append(ActionResult(request.node, False, f"{instance} asked twice"))
                else:
                    by_id[instance] = request.node
            ids = sorted(by_id)
            for start in range(0, len(ids), BATCH_LIMIT):
                results.extend(self._call(action, ids[start : start + BATCH_LIMIT], by_id))
        return results

    def _call(self, action: str, ids: list[str], by_id: dict[str, str]) -> list[ActionResult]:
        operation = getattr(self.client, _OPERATION[action])
        response: dict[str, Any] | None = None
        error = "not attempted"
        for attempt in range(self.max_attempts):
            try:
                response = operation(ClusterName=self.cluster_name, NodeIds=ids)
                break
            except Exception as exc:  # botocore ClientError, endpoint errors
                code = _error_code(exc)
                error = f"{_OPERATION[action]} failed: {code or exc}"
                if code not in THROTTLING_CODES or attempt + 1 == self.max_attempts:
                    break
                self.sleep(self.base_delay_s * (2**attempt))
        if response is None:
            return [ActionResult(by_id[i], False, error) for i in ids]
        failed = {
            f.get("NodeId"): f"{f.get('ErrorCode')}: {f.get('Message')}"
            for f in response.get("Failed") or []
        }
        succeeded = set(response.get("Successful") or [])
        results = []
        for instance in ids:
            node = by_id[instance]
            if instance in failed:
                results.append(ActionResult(node, False, f"{instance} {failed[instance]}"))
            elif instance in succeeded:
                results.append(ActionResult(node, True, f"{action} of {instance} initiated"))
            else:
                results.append(ActionResult(node, False, f"{instance} missing from the response"))
        return results


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = (response.get("Error") or {}).get("Code")
        if isinstance(code, str):
            return code
    return ""
