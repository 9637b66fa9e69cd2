"""SageMaker provider: BatchRebootClusterNodes / BatchReplaceClusterNodes for HyperPod clusters,
and StartClusterHealthCheck for the ladder's optional deep-check step.

Node ids are EC2 instance ids, taken from the Node's spec.providerID (`aws:///zone/i-...`) or
from HyperPod's node name (`hyperpod-i-...`). Calls carry at most 25 ids (the API's limit);
each response's Failed list becomes per-node failures. Throttling is retried with exponential
backoff here, not by botocore, so it is bounded, visible and testable with Stubber.

A deep check names the node's instance group (HyperPod's node label
`sagemaker.amazonaws.com/instance-group-name`) and always its instance id: the API checks the
whole instance group when InstanceIds is left out, which would take every node of the group out
of service. All of one round's deep checks go in one call (one configuration per instance
group), since HyperPod runs one on-demand check per cluster at a time; a ConflictException (or
throttling that outlasts the retries) comes back `deferred`, for the controller to ask again
later. `InstanceStress` (the default) runs on one node; `InstanceConnectivity` (multi-node NCCL
all-reduce) needs peers in the same check, which a single suspect node does not have.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from exporter.topology.labels import INSTANCE_GROUP_KEY
from healthcheck.remediation.providers.base import ActionRequest, ActionResult

BATCH_LIMIT = 25
THROTTLING_CODES = frozenset(
    {"ThrottlingException", "Throttling", "TooManyRequestsException", "RequestLimitExceeded"}
)
_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8}(?:[0-9a-f]{9})?$")
_OPERATION = {"reboot": "batch_reboot_cluster_nodes", "replace": "batch_replace_cluster_nodes"}
INSTANCE_GROUP_LABEL = INSTANCE_GROUP_KEY
DEEP_HEALTH_CHECKS = ("InstanceStress", "InstanceConnectivity")  # the model's DeepHealthCheckType
DEFAULT_DEEP_CHECKS = ("InstanceStress",)
# The API's limits: 99 instance groups a call, 500 instance ids a group.
MAX_GROUPS, MAX_IDS_PER_GROUP = 99, 500
# One on-demand deep check per cluster at a time: asked again later, never a failure.
BUSY_CODES = frozenset({"ConflictException", "ResourceInUse"})
_GROUP_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")


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


def instance_group_of(node: dict[str, Any], label: str = INSTANCE_GROUP_LABEL) -> str | None:
    """The HyperPod instance group of a Node, from its label; None when absent or malformed."""
    meta = node.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    value = labels.get(label) if isinstance(labels, dict) else None
    if isinstance(value, str) and len(value) <= 63 and _GROUP_NAME.match(value):
        return value
    return None


class SageMakerNodes:
    name = "sagemaker-api"
    # The API knows no GPU reset; it can run HyperPod's deep health checks.
    actions: frozenset[str] = frozenset({"reboot", "deep-check", "replace"})

    def __init__(
        self,
        client: Any,  # boto3 SageMaker client
        cluster_name: str,
        max_attempts: int = 5,
        base_delay_s: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
        deep_checks: Sequence[str] = DEFAULT_DEEP_CHECKS,
        instance_group_label: str = INSTANCE_GROUP_LABEL,
    ) -> None:
        unknown = [c for c in deep_checks if c not in DEEP_HEALTH_CHECKS]
        if not deep_checks or unknown or len(set(deep_checks)) != len(deep_checks):
            raise ValueError(
                f"deep_checks {list(deep_checks)!r}: one or two of {', '.join(DEEP_HEALTH_CHECKS)}"
            )
        self.client = client
        self.cluster_name = cluster_name
        self.max_attempts = max_attempts
        self.base_delay_s = base_delay_s
        self.sleep = sleep
        self.deep_checks = tuple(deep_checks)
        self.instance_group_label = instance_group_label

    def execute(self, requests: Sequence[ActionRequest]) -> list[ActionResult]:
        results: list[ActionResult] = self._deep_check(
            [r for r in requests if r.action == "deep-check"]
        )
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

    def _deep_check(self, requests: Sequence[ActionRequest]) -> list[ActionResult]:
        """One StartClusterHealthCheck for all nodes asked this round, grouped by instance group."""
        results: list[ActionResult] = []
        groups: dict[str, dict[str, str]] = {}  # group → instance id → node
        for request in requests:
            instance = instance_id_of(request.node_object, request.node)
            group = instance_group_of(request.node_object, self.instance_group_label)
            if instance is None:
                results.append(ActionResult(request.node, False, "no EC2 instance id"))
            elif group is None:
                # Never sent without a group, and never without ids (a whole group's check).
                results.append(
                    ActionResult(request.node, False, f"no {self.instance_group_label} label")
                )
            elif any(instance in ids for ids in groups.values()):
                results.append(ActionResult(request.node, False, f"{instance} asked twice"))
            elif group not in groups and len(groups) >= MAX_GROUPS:
                results.append(ActionResult(request.node, False, "over 99 instance groups"))
            elif len(groups.get(group, {})) >= MAX_IDS_PER_GROUP:
                results.append(ActionResult(request.node, False, f"over 500 ids in {group}"))
            else:
                groups.setdefault(group, {})[instance] = request.node
        if not groups:
            return results
        configurations = [
            {
                "InstanceGroupName": group,
                "InstanceIds": sorted(ids),
                "DeepHealthChecks": list(self.deep_checks),
            }
            for group, ids in sorted(groups.items())
        ]
        asked = [(group, i, node) for group, ids in groups.items() for i, node in ids.items()]
        checks = "+".join(self.deep_checks)
        response, code, error = self._retrying(
            "start_cluster_health_check",
            lambda: self.client.start_cluster_health_check(
                ClusterName=self.cluster_name, DeepHealthCheckConfigurations=configurations
            ),
        )
        if response is not None:
            arn = response.get("ClusterArn", self.cluster_name)
            return results + [
                ActionResult(node, True, f"deep health check {checks} of {i} ({group}) on {arn}")
                for group, i, node in asked
            ]
        later = code in BUSY_CODES or code in THROTTLING_CODES
        if later:
            error += ": the cluster runs one on-demand deep check at a time; asked again later"
        return results + [ActionResult(node, False, error, deferred=later) for _, _, node in asked]

    def _call(self, action: str, ids: list[str], by_id: dict[str, str]) -> list[ActionResult]:
        operation = getattr(self.client, _OPERATION[action])
        response, _, error = self._retrying(
            _OPERATION[action], lambda: operation(ClusterName=self.cluster_name, NodeIds=ids)
        )
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

    def _retrying(
        self, name: str, call: Callable[[], dict[str, Any]]
    ) -> tuple[dict[str, Any] | None, str, str]:
        """`call`, retried with exponential backoff while SageMaker throttles, at most
        `max_attempts` times: (its response, or None; the last error code; the last error)."""
        code, error = "", "not attempted"
        for attempt in range(self.max_attempts):
            try:
                return call(), "", ""
            except Exception as exc:  # botocore ClientError, endpoint errors
                code = _error_code(exc)
                error = f"{name} failed: {code or exc}"
                if code not in THROTTLING_CODES or attempt + 1 == self.max_attempts:
                    break
                self.sleep(self.base_delay_s * (2**attempt))
        return None, code, error


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = (response.get("Error") or {}).get("Code")
        if isinstance(code, str):
            return code
    return ""
