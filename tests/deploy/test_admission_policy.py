"""The chart's ValidatingAdmissionPolicy, evaluated with a CEL library on admission requests.

No API server runs here, so the policy's CEL is run by cel-python the way the API server runs
it (Kubernetes' "Validating Admission Policy" semantics): `object` and `oldObject` are the
Node as plain maps (oldObject null on CREATE), `request` the AdmissionRequest; every match
condition must be true for the policy to apply, and one that errors applies the failure policy
(Fail: denied); variables are lazy (an error only counts where it is used); each validation
must be true, and false or an error denies. The expressions use no Kubernetes-specific
function, only standard CEL and `dyn()`, so cel-python evaluates them as written.

The requests are built the way the API server builds them: the agent's real patch bodies (from
`NodeReporter`, recorded) merged into a realistic Node, with the server's own changes (status
kept on `nodes`, spec kept on `nodes/status`, managedFields updated) before admission.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import cache
from typing import Any

import celpy
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from exporter.core.findings import FINDINGS_ANNOTATION, HEALTH_CONDITION, Finding
from exporter.core.provenance import AGENT_FIELD_MANAGER
from exporter.core.ultraserver import FABRIC_ANNOTATION, NodeFabric
from exporter.sim.kubeapi import managedfields
from exporter.sim.kubeapi.patch import merge_patch
from healthcheck.detection.monitor import HealthReport
from healthcheck.detection.reporter import NodeReporter
from tests.deploy.test_chart import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    Manifest,
    objects,
    render,
    rendered,
)

AGENT = f"system:serviceaccount:{NAMESPACE}:topowatch-node-agent"
CLAIM = "authentication.kubernetes.io/node-name"
HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
T0 = 1_750_000_000.0
XID = Finding("xid", "gpu3", "fatal", "replace", "XID 79", T0, T0, True)


# --- a CEL evaluator with the admission-policy semantics ------------------------------------


@dataclass(frozen=True)
class Verdict:
    matched: bool
    allowed: bool
    messages: tuple[str, ...]


class AdmissionPolicy:
    def __init__(self, policy: Manifest) -> None:
        env = celpy.Environment()
        spec = policy["spec"]
        assert spec["failurePolicy"] == "Fail"

        def program(expression: str) -> Any:
            return env.program(env.compile(expression))

        self.conditions = [(c["name"], program(c["expression"])) for c in spec["matchConditions"]]
        self.variables = [(v["name"], program(v["expression"])) for v in spec["variables"]]
        self.validations = [(program(v["expression"]), v["message"]) for v in spec["validations"]]

    def admit(
        self, request: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None
    ) -> Verdict:
        activation: dict[str, Any] = {
            "request": json_to_cel(request),
            "object": json_to_cel(obj),
            "oldObject": None if old is None else json_to_cel(old),
        }
        for name, prog in self.conditions:
            try:
                matched = prog.evaluate(activation)
            except CELEvalError as e:
                return Verdict(True, False, (f"match condition {name} failed: {e}",))
            assert isinstance(matched, celtypes.BoolType), name
            if not matched:
                return Verdict(False, True, ())
        variables: dict[celtypes.StringType, Any] = {}
        for name, prog in self.variables:
            try:
                value = prog.evaluate({**activation, "variables": celtypes.MapType(variables)})
            except CELEvalError as e:
                value = e  # lazy: an error only where the variable is used
            variables[celtypes.StringType(name)] = value
        activation["variables"] = celtypes.MapType(variables)
        denied: list[str] = []
        for prog, message in self.validations:
            try:
                result = prog.evaluate(activation)
            except CELEvalError as e:
                denied.append(f"error ({e}): {message}")
                continue
            assert isinstance(result, celtypes.BoolType), message
            if not result:
                denied.append(message)
        return Verdict(True, not denied, tuple(denied))


@cache
def policy() -> AdmissionPolicy:
    (manifest,) = objects(rendered("default"), "ValidatingAdmissionPolicy")
    return AdmissionPolicy(manifest)


# --- what the API server hands admission ----------------------------------------------------


def a_node(name: str) -> dict[str, Any]:
    """A p5 Node as a HyperPod cluster's API server stores it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "4242",
            "creationTimestamp": "2025-06-01T00:00:00Z",
            "labels": {
                "kubernetes.io/hostname": name,
                "node.kubernetes.io/instance-type": "ml.p5.48xlarge",
                "topology.k8s.aws/network-node-layer-1": "nn-1",
                HEALTH_LABEL: "Schedulable",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "managedFields": [
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2025-06-01T00:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {"f:kubernetes.io/hostname": {}}}},
                }
            ],
        },
        "spec": {"providerID": f"aws:///us-east-2a/i-{name}"},
        "status": {
            "capacity": {"cpu": "192", "nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"},
            "allocatable": {"cpu": "191", "nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"},
            "conditions": [
                {
                    "type": "MemoryPressure",
                    "status": "False",
                    "reason": "KubeletHasSufficientMemory",
                    "message": "kubelet has sufficient memory available",
                    "lastHeartbeatTime": "2025-06-15T15:00:00Z",
                    "lastTransitionTime": "2025-06-01T00:00:00Z",
                },
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": "2025-06-15T15:00:00Z",
                    "lastTransitionTime": "2025-06-01T00:00:00Z",
                },
            ],
            "addresses": [{"type": "InternalIP", "address": "10.1.2.3"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": "v1.30.4-eks", "architecture": "amd64"},
        },
    }


NODES = {name: a_node(name) for name in ("n1", "n2")}


def user(username: str, node: str | None) -> dict[str, Any]:
    extra: dict[str, list[str]] = {"authentication.kubernetes.io/credential-id": ["JTI=abc"]}
    if node is not None:  # a bound token of a pod on `node` (Kubernetes 1.30+)
        extra |= {
            CLAIM: [node],
            "authentication.kubernetes.io/node-uid": [f"uid-{node}"],
            "authentication.kubernetes.io/pod-name": ["topowatch-node-agent-x7k2p"],
        }
    return {
        "username": username,
        "uid": "u-1",
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
        "extra": extra,
    }


AGENT_ON_N1 = user(AGENT, "n1")


def admit(
    who: dict[str, Any],
    target: str,
    patch: dict[str, Any],
    subresource: str = "",
    manager: str = AGENT_FIELD_MANAGER,
) -> Verdict:
    """A merge patch of Node `target` by `who`, as validating admission sees it."""
    old = NODES[target]
    new = merge_patch(copy.deepcopy(old), patch)
    assert isinstance(new, dict)
    if subresource == "status":
        new["spec"] = copy.deepcopy(old["spec"])  # the status strategy keeps spec
    else:
        new["status"] = copy.deepcopy(old["status"])  # and the main resource keeps status
    new = managedfields.track(old, new, manager, subresource or None, "2025-06-15T15:05:00Z")
    request = {
        "uid": "req-1",
        "kind": {"group": "", "version": "v1", "kind": "Node"},
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "subResource": subresource,
        "name": target,
        "operation": "UPDATE",
        "userInfo": who,
        "dryRun": False,
    }
    return policy().admit(request, new, old)


class RecordingApi:
    """Stands in for KubeApi: records the agent's patches, answers from NODES."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []

    def get(self, path: str, params: Any = None, timeout: float = 10.0) -> dict[str, Any]:
        return copy.deepcopy(NODES[path.rsplit("/", 1)[-1]])

    def patch(self, path: str, body: Any, timeout: float = 10.0, **_: Any) -> dict[str, Any]:
        self.patches.append((path, body))
        return {}

    def post(self, path: str, body: Any, timeout: float = 10.0) -> dict[str, Any]:
        return body  # type: ignore[no-any-return]


def agent_patches(node: str) -> dict[str, dict[str, Any]]:
    """The node agent's own writes for an XID 79 on `node`: "nodes" and "nodes/status"."""
    api = RecordingApi()
    reporter = NodeReporter(api, node, clock=lambda: T0)  # type: ignore[arg-type]
    assert reporter.report(HealthReport(node, T0, (XID,)))
    out: dict[str, dict[str, Any]] = {}
    for path, body in api.patches:
        assert path.endswith(f"?fieldManager={AGENT_FIELD_MANAGER}")
        out["nodes/status" if "/status?" in path else "nodes"] = body
    assert set(out) == {"nodes", "nodes/status"}
    return out


# --- the policy objects -----------------------------------------------------------------------


def test_policy_and_binding_render_and_validate_strictly() -> None:
    manifests = rendered("default")
    (vap,) = objects(manifests, "ValidatingAdmissionPolicy")
    (binding,) = objects(manifests, "ValidatingAdmissionPolicyBinding")
    for manifest in (vap, binding):
        assert manifest["apiVersion"] == "admissionregistration.k8s.io/v1"
        kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}
    rules = vap["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["nodes", "nodes/status"],
        }
    ]
    text = json.dumps(vap["spec"])
    assert FINDINGS_ANNOTATION in text and HEALTH_CONDITION in text and CLAIM in text
    # The user the policy confines is the service account the DaemonSet runs as.
    (daemonset,) = objects(manifests, "DaemonSet")
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    assert f"system:serviceaccount:{NAMESPACE}:{account}" == AGENT
    assert f"'{AGENT}'" in vap["spec"]["variables"][0]["expression"]


def test_strict_validation_would_catch_a_misspelled_policy_field() -> None:
    (vap,) = objects(rendered("default"), "ValidatingAdmissionPolicy")
    broken = copy.deepcopy(vap)
    broken["spec"]["validations"][0]["messsage"] = broken["spec"]["validations"][0].pop("message")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSION, strict=True)


def test_the_policy_follows_the_release_namespace_and_can_be_turned_off() -> None:
    import helm_python as helm

    chart = helm.Chart.load(CHART)
    text = chart.render(None, name="gpu", namespace="observability", is_install=True)
    assert "system:serviceaccount:observability:gpu-topowatch-node-agent" in "".join(text.values())
    off = render(CHART, {"nodeAgent": {"admissionPolicy": {"enabled": False}}})
    assert not [m for m in off if m["kind"].startswith("ValidatingAdmissionPolicy")]
    no_agent = render(CHART, {"nodeAgent": {"enabled": False}})
    assert not [m for m in no_agent if m["kind"].startswith("ValidatingAdmissionPolicy")]


# --- the agent on its own node ------------------------------------------------------------------


def test_the_agents_own_annotation_patch_is_allowed() -> None:
    verdict = admit(AGENT_ON_N1, "n1", agent_patches("n1")["nodes"])
    assert verdict.matched and verdict.allowed, verdict.messages


def test_the_agents_own_condition_write_is_allowed() -> None:
    verdict = admit(AGENT_ON_N1, "n1", agent_patches("n1")["nodes/status"], "status")
    assert verdict.matched and verdict.allowed, verdict.messages


def test_the_agent_may_remove_its_annotation_to_take_ownership_back() -> None:
    NODES["n1"]["metadata"]["annotations"][FINDINGS_ANNOTATION] = "[]"
    try:
        removal = {"metadata": {"annotations": {FINDINGS_ANNOTATION: None}}}
        assert admit(AGENT_ON_N1, "n1", removal).allowed
    finally:
        del NODES["n1"]["metadata"]["annotations"][FINDINGS_ANNOTATION]


# --- and everything else it might try -------------------------------------------------------------


def denied(verdict: Verdict, why: str) -> None:
    assert verdict.matched and not verdict.allowed
    assert any(why in message for message in verdict.messages), verdict.messages


def test_the_agent_cannot_annotate_another_node() -> None:
    verdict = admit(AGENT_ON_N1, "n2", agent_patches("n2")["nodes"])
    denied(verdict, "only the Node named in its token")
    denied(verdict, "with a token bound to this node")


def test_the_agent_cannot_write_status_of_another_node() -> None:
    verdict = admit(AGENT_ON_N1, "n2", agent_patches("n2")["nodes/status"], "status")
    denied(verdict, "only the Node named in its token")


def test_the_agent_cannot_set_hyperpods_health_label_or_any_label() -> None:
    for patch in (
        {"metadata": {"labels": {HEALTH_LABEL: "UnschedulablePendingReplacement"}}},
        {"metadata": {"labels": {HEALTH_LABEL: None}}},
        {"metadata": {"labels": {"topowatch.io/anything": "x"}}},
    ):
        denied(admit(AGENT_ON_N1, "n1", patch), "may not change any label")
    # also not smuggled in beside its own annotation
    both = agent_patches("n1")["nodes"]
    both["metadata"]["labels"] = {HEALTH_LABEL: "UnschedulablePendingReboot"}
    denied(admit(AGENT_ON_N1, "n1", both), "may not change any label")


def test_the_agent_cannot_touch_other_annotations() -> None:
    for patch in (
        {"metadata": {"annotations": {"topowatch.io/remediation": '{"action":"replace"}'}}},
        {"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "30"}}},
        {
            "metadata": {
                "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": None}
            }
        },
    ):
        denied(admit(AGENT_ON_N1, "n1", patch), "no annotation but topowatch.io/findings")


def test_the_agent_cannot_change_spec_metadata_or_other_status() -> None:
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"spec": {"unschedulable": True}}, "", "spec"),
        ({"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}, "", "spec"),
        ({"metadata": {"finalizers": ["topowatch.io/hold"]}}, "", "other metadata"),
        ({"status": {"capacity": {"nvidia.com/gpu": "0"}}}, "status", "no status but"),
        (
            {"status": {"addresses": [{"type": "InternalIP", "address": "6.6.6.6"}]}},
            "status",
            "no status but",
        ),
    ]
    for patch, subresource, why in cases:
        denied(admit(AGENT_ON_N1, "n1", patch, subresource), why)
    ready_false = copy.deepcopy(NODES["n1"]["status"]["conditions"])
    ready_false[1]["status"] = "False"
    denied(
        admit(AGENT_ON_N1, "n1", {"status": {"conditions": ready_false}}, "status"),
        "no status but",
    )


def test_a_token_without_the_node_claim_can_write_nothing() -> None:
    legacy = user(AGENT, None)  # a long-lived Secret token, or the claim switched off
    denied(admit(legacy, "n1", agent_patches("n1")["nodes"]), "only the Node named")
    denied(admit(user(AGENT, "n1 "), "n1", agent_patches("n1")["nodes"]), "only the Node named")


# --- everyone else ---------------------------------------------------------------------------


def test_nobody_else_may_set_the_findings_annotation() -> None:
    forged = {"metadata": {"annotations": {FINDINGS_ANNOTATION: json.dumps([XID.to_dict()])}}}
    for who in (
        user("system:serviceaccount:kube-system:some-controller", None),
        user("kubernetes-admin", None),
        user("system:node:n1", None),
        user("system:serviceaccount:other:topowatch-node-agent", "n1"),  # another release's agent
    ):
        verdict = admit(who, "n1", forged, manager=AGENT_FIELD_MANAGER)  # whatever it claims
        denied(verdict, "may set the topowatch.io/findings annotation")


def test_a_new_node_cannot_arrive_with_findings() -> None:
    node = a_node("n3")
    node["metadata"]["annotations"][FINDINGS_ANNOTATION] = "[]"
    request = {
        "uid": "req-2",
        "name": "n3",
        "operation": "CREATE",
        "subResource": "",
        "userInfo": user("system:node:n3", None),
    }
    verdict = policy().admit(request, node, None)
    assert verdict.matched and not verdict.allowed


def test_other_writers_pass_untouched() -> None:
    NODES["n1"]["metadata"]["annotations"][FINDINGS_ANNOTATION] = "[]"
    try:
        kubelet = user("system:node:n1", None)
        heartbeat = copy.deepcopy(NODES["n1"]["status"]["conditions"])
        heartbeat[1]["lastHeartbeatTime"] = "2025-06-15T15:05:00Z"
        admin = user("kubernetes-admin", None)
        for who, patch, subresource in (
            (kubelet, {"status": {"conditions": heartbeat}}, "status"),
            (
                admin,
                {"metadata": {"labels": {HEALTH_LABEL: "UnschedulablePendingReplacement"}}},
                "",
            ),
            (admin, {"metadata": {"annotations": {"topowatch.io/remediation": "{}"}}}, ""),
            (admin, {"metadata": {"annotations": {FINDINGS_ANNOTATION: None}}}, ""),  # removal
            (admin, {"metadata": {"annotations": {FINDINGS_ANNOTATION: "[]"}}}, ""),  # unchanged
        ):
            verdict = admit(who, "n1", patch, subresource, manager="other")
            assert not verdict.matched and verdict.allowed, (who["username"], patch)
        creation = {"uid": "r", "name": "n9", "operation": "CREATE", "userInfo": kubelet}
        assert not policy().admit(creation, a_node("n9"), None).matched
    finally:
        del NODES["n1"]["metadata"]["annotations"][FINDINGS_ANNOTATION]


def test_match_conditions_never_fail_on_a_bare_node() -> None:
    """An error in a match condition would deny every Node write in the cluster (Fail)."""
    bare: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}
    annotated = {**bare, "metadata": {"name": "n1", "annotations": {"x": "y"}}}
    someone = user("system:node:n1", None)
    for operation, obj, old in (
        ("CREATE", bare, None),
        ("CREATE", annotated, None),
        ("UPDATE", bare, bare),
        ("UPDATE", annotated, bare),
        ("UPDATE", bare, annotated),
    ):
        request = {"uid": "r", "name": "n1", "operation": operation, "userInfo": someone}
        verdict = policy().admit(request, obj, old)
        assert not verdict.matched and verdict.allowed, (operation, verdict.messages)


def test_the_agent_may_write_its_fabric_summary_on_its_own_node_only() -> None:
    """`topowatch.io/nvlink-fabric` (issue 30: the GPUs' NVLink fabric for the UltraServer
    verdict) rides in the agent's annotation patch; it opens no other annotation."""
    fabric = NodeFabric(4, 3, "9c6f5af3-53bf-49b5-a436-b66766c413c3", 32766, problem="GPU 2: x")

    def patch(node: str) -> dict[str, Any]:
        api = RecordingApi()
        reporter = NodeReporter(api, node, clock=lambda: T0)  # type: ignore[arg-type]
        assert reporter.report(HealthReport(node, T0, (XID,), fabric=fabric))
        (body,) = [b for path, b in api.patches if "/status?" not in path]
        assert body["metadata"]["annotations"][FABRIC_ANNOTATION] == fabric.to_json()
        return body

    verdict = admit(AGENT_ON_N1, "n1", patch("n1"))
    assert verdict.matched and verdict.allowed, verdict.messages
    denied(admit(AGENT_ON_N1, "n2", patch("n2")), "only the Node named in its token")
    other = {"metadata": {"annotations": {FABRIC_ANNOTATION: "{}", "topowatch.io/x": "1"}}}
    denied(admit(AGENT_ON_N1, "n1", other), "no annotation but topowatch.io/findings")
