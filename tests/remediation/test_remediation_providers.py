"""Each provider against the real thing it talks to: the simulated API server through the official
client, botocore's Stubber (validates requests against the SageMaker model), a real slurmctld,
a local HTTP server. Per-node failures must come back as results, never as exceptions."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import boto3
import kubernetes
import pytest
from botocore.stub import Stubber

from exporter.cluster.run import kube_api_client
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from healthcheck.remediation.providers.base import (
    ActionRequest,
    ActionResult,
    Provider,
    executable,
    provider_actions,
)
from healthcheck.remediation.providers.hyperpod import HyperPodLabeler
from healthcheck.remediation.providers.kubernetes import TAINT_KEY, Cordoner
from healthcheck.remediation.providers.sagemaker import SageMakerNodes, instance_id_of
from healthcheck.remediation.providers.slurm import SlurmNodes
from healthcheck.remediation.providers.webhook import WebhookNotifier
from tests.slurm_harness import binary, running_slurmctld

HEALTH = "sagemaker.amazonaws.com/node-health-status"


def node(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {HEALTH: "Schedulable", "team": "a"}},
        "spec": {"taints": [{"key": "other", "effect": "NoExecute"}], **extra},
    }


@pytest.fixture
def kube() -> Iterator[tuple[ObjectStore, Any]]:
    store = ObjectStore()
    for name in ("n1", "n2"):
        store.upsert("nodes", node(name))
    with FakeApiServer(store) as server:
        yield store, kubernetes.client.CoreV1Api(kube_api_client(server.url))


def test_hyperpod_label_patch_sets_health_and_keeps_other_labels(
    kube: tuple[ObjectStore, Any],
) -> None:
    store, api = kube
    results = HyperPodLabeler(api).execute(
        [
            ActionRequest("n1", "reboot"),
            ActionRequest("n2", "replace"),
            ActionRequest("nx", "reboot"),
        ]
    )
    assert [(r.node, r.ok) for r in results] == [("n1", True), ("n2", True), ("nx", False)]
    assert "404" in results[2].detail or "Not Found" in results[2].detail
    labels1 = store.get("nodes", "", "n1")["metadata"]["labels"]  # type: ignore[index]
    labels2 = store.get("nodes", "", "n2")["metadata"]["labels"]  # type: ignore[index]
    assert labels1 == {HEALTH: "UnschedulablePendingReboot", "team": "a"}
    assert labels2[HEALTH] == "UnschedulablePendingReplacement"


def test_cordon_sets_unschedulable_and_adds_taint_once(kube: tuple[ObjectStore, Any]) -> None:
    store, api = kube
    cordoner = Cordoner(api)
    for _ in range(2):
        [result] = cordoner.execute([ActionRequest("n1", "replace")])
        assert result.ok, result.detail
    spec = store.get("nodes", "", "n1")["spec"]  # type: ignore[index]
    assert spec["unschedulable"] is True
    assert sorted(t["key"] for t in spec["taints"]) == ["other", TAINT_KEY]
    ours = next(t for t in spec["taints"] if t["key"] == TAINT_KEY)
    assert ours["effect"] == "NoSchedule"
    [missing] = cordoner.execute([ActionRequest("nx", "reboot")])
    assert not missing.ok


# --- SageMaker ------------------------------------------------------------------------------


def ids(n: int) -> list[str]:
    return [f"i-{i:017x}" for i in range(n)]


def sm_request(instance: str) -> ActionRequest:
    obj = {"spec": {"providerID": f"aws:///us-east-1a/{instance}"}}
    return ActionRequest(f"node-{instance}", "replace", obj)


@pytest.fixture
def sagemaker() -> Iterator[tuple[Any, Stubber]]:
    client = boto3.client(
        "sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def test_instance_ids_come_from_provider_id_or_hyperpod_name() -> None:
    assert instance_id_of({"spec": {"providerID": "aws:///us-east-1a/i-0abc12345678def90"}}, "x")
    assert instance_id_of({}, "hyperpod-i-0123456789abcdef0") == "i-0123456789abcdef0"
    assert instance_id_of({"spec": {"providerID": "kind://x/y"}}, "worker-1") is None
    assert instance_id_of({"spec": "garbage"}, "worker-1") is None


def test_sagemaker_batches_of_25_and_per_node_failures(sagemaker: tuple[Any, Stubber]) -> None:
    client, stubber = sagemaker
    all_ids = ids(30)
    bad = all_ids[3]
    stubber.add_response(
        "batch_replace_cluster_nodes",
        {
            "Successful": [i for i in all_ids[:25] if i != bad],
            "Failed": [{"NodeId": bad, "ErrorCode": "InstanceIdInUse", "Message": "busy"}],
        },
        {"ClusterName": "ml-cluster", "NodeIds": all_ids[:25]},
    )
    stubber.add_response(
        "batch_replace_cluster_nodes",
        {"Successful": all_ids[25:]},
        {"ClusterName": "ml-cluster", "NodeIds": all_ids[25:]},
    )
    provider = SageMakerNodes(client, "ml-cluster", sleep=lambda _: None)
    results = {r.node: r for r in provider.execute([sm_request(i) for i in all_ids])}
    assert len(results) == 30
    assert not results[f"node-{bad}"].ok and "InstanceIdInUse" in results[f"node-{bad}"].detail
    assert sum(r.ok for r in results.values()) == 29


def test_sagemaker_reboot_retries_throttling_with_backoff(sagemaker: tuple[Any, Stubber]) -> None:
    client, stubber = sagemaker
    [instance] = ids(1)
    expected = {"ClusterName": "ml-cluster", "NodeIds": [instance]}
    for _ in range(2):
        stubber.add_client_error(
            "batch_reboot_cluster_nodes",
            "ThrottlingException",
            "Rate exceeded",
            400,
            expected_params=expected,
        )
    stubber.add_response("batch_reboot_cluster_nodes", {"Successful": [instance]}, expected)
    slept: list[float] = []
    provider = SageMakerNodes(client, "ml-cluster", base_delay_s=0.5, sleep=slept.append)
    request = ActionRequest(f"hyperpod-{instance}", "reboot", {})
    [result] = provider.execute([request])
    assert result.ok, result.detail
    assert slept == [0.5, 1.0]


def test_sagemaker_gives_up_on_other_errors_and_on_endless_throttling(
    sagemaker: tuple[Any, Stubber],
) -> None:
    client, stubber = sagemaker
    [instance] = ids(1)
    stubber.add_client_error("batch_replace_cluster_nodes", "ResourceNotFound", "no cluster")
    for _ in range(3):
        stubber.add_client_error("batch_replace_cluster_nodes", "ThrottlingException", "slow")
    provider = SageMakerNodes(client, "ml-cluster", max_attempts=3, sleep=lambda _: None)
    [first] = provider.execute([sm_request(instance)])
    assert not first.ok and "ResourceNotFound" in first.detail
    [second] = provider.execute([sm_request(instance)])
    assert not second.ok and "ThrottlingException" in second.detail
    [no_id] = provider.execute([ActionRequest("plain-node", "replace", {})])
    assert not no_id.ok and "instance id" in no_id.detail


# --- Slurm ----------------------------------------------------------------------------------


@pytest.mark.real_component
def test_slurm_node_ends_in_fail_with_action_replace(tmp_path: Path) -> None:
    with running_slurmctld(tmp_path, ["gpu-1", "gpu-2", "gpu-3"]) as env:
        provider = SlurmNodes(scontrol=binary("scontrol"), timeout_s=10, env=env)
        results = provider.execute(
            [
                ActionRequest("gpu-1", "replace"),
                ActionRequest("gpu-2", "reboot"),
                ActionRequest("nope-9", "replace"),
            ]
        )
        by_node = {r.node: r for r in results}  # one result per request, in any order
        assert {n: r.ok for n, r in by_node.items()} == {
            "gpu-1": True,
            "gpu-2": True,
            "nope-9": False,
        }, results
        # gpu-1 and nope-9 went in one call; slurmctld refused it, node by node found the bad one
        assert "exited 1" in by_node["nope-9"].detail
        assert "Invalid node name" in by_node["nope-9"].detail

        def show(name: str) -> str:
            return subprocess.run(
                [binary("scontrol"), "show", "node", name],
                env=env,
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
            ).stdout

        shown = show("gpu-1")
        assert "FAIL" in shown.split("State=", 1)[1].split()[0]
        assert "Reason=Action:Replace" in shown
        assert "Reason=Action:Reboot" in show("gpu-2")
        assert "FAIL" not in show("gpu-3").split("State=", 1)[1].split()[0]


def test_slurm_missing_binary_and_bad_names_fail_cleanly(tmp_path: Path) -> None:
    provider = SlurmNodes(scontrol=str(tmp_path / "no-scontrol"))
    [missing] = provider.execute([ActionRequest("gpu-1", "replace")])
    assert not missing.ok and "cannot run" in missing.detail
    [bad] = provider.execute([ActionRequest("gpu-1 state=idle", "replace")])
    assert not bad.ok and "unusable" in bad.detail
    hang = tmp_path / "hang"
    # A shell that forks, as a wrapper does: its process group is killed on the timeout, child
    # and all (the session's process guard fails the test on a `sleep` left behind).
    hang.write_text("#!/bin/sh\nsleep 5 &\nwait\n")
    hang.chmod(0o755)
    [slow] = SlurmNodes(scontrol=str(hang), timeout_s=0.2).execute([ActionRequest("g", "reboot")])
    assert not slow.ok and "timed out" in slow.detail


# --- webhook --------------------------------------------------------------------------------


class _Hook(BaseHTTPRequestHandler):
    received: ClassVar[list[Any]] = []
    status: ClassVar[int] = 200

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        type(self).received.append(json.loads(self.rfile.read(length)))
        self.send_response(type(self).status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, type[_Hook]]]:
    handler = type("Hook", (_Hook,), {"received": [], "status": 200})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/remediate", handler
    server.shutdown()
    server.server_close()


def test_webhook_posts_the_decision_and_non_2xx_is_failure(hook: tuple[str, type[_Hook]]) -> None:
    url, handler = hook
    decision = {"node": "n1", "verdict": "act", "reason": "act"}
    [ok] = WebhookNotifier(url).execute([ActionRequest("n1", "replace", {}, decision)])
    assert ok.ok
    assert handler.received == [{"node": "n1", "action": "replace", "decision": decision}]
    handler.status = 500
    [failed] = WebhookNotifier(url).execute([ActionRequest("n1", "replace")])
    assert not failed.ok and "500" in failed.detail
    [down] = WebhookNotifier("http://127.0.0.1:1/x", timeout_s=1).execute(
        [ActionRequest("n1", "reboot")]
    )
    assert not down.ok and "unreachable" in down.detail
    with pytest.raises(ValueError):
        WebhookNotifier("file:///etc/passwd")


def test_each_provider_says_what_it_can_do_and_a_reset_falls_back_to_a_reboot() -> None:
    """No node API here resets one GPU; a reboot resets them all, so a ladder's reset step is a
    reboot for HyperPod, SageMaker and Slurm, and passes through to cordon and webhook."""
    core: Any = object()
    sagemaker = SageMakerNodes(object(), "c")
    reboot_for_reset: list[Provider] = [HyperPodLabeler(core), sagemaker, SlurmNodes()]
    as_asked: list[Provider] = [Cordoner(core), WebhookNotifier("http://127.0.0.1:9/x")]

    class Unsaid:  # a provider that declares nothing: reboot and replace, as before
        name = "unsaid"

        def execute(self, requests: Sequence[ActionRequest]) -> list[ActionResult]:
            return []

    class ResetOnly:
        name = "reset-only"
        actions = frozenset({"reset"})

        def execute(self, requests: Sequence[ActionRequest]) -> list[ActionResult]:
            return []

    for provider in [*reboot_for_reset, Unsaid()]:
        assert [executable(a, provider) for a in ("reset", "reboot", "replace")] == [
            "reboot",
            "reboot",
            "replace",
        ], provider.name
    for provider in as_asked:
        assert [executable(a, provider) for a in ("reset", "reboot", "replace")] == [
            "reset",
            "reboot",
            "replace",
        ], provider.name
    assert provider_actions(ResetOnly()) == {"reset"}
    assert [executable(a, ResetOnly()) for a in ("reset", "reboot", "replace")] == [
        "reset",
        None,  # never escalated to something stronger than asked
        None,
    ]


def test_cordon_and_webhook_carry_a_reset_as_asked(
    kube: tuple[ObjectStore, Any], hook: tuple[str, type[_Hook]]
) -> None:
    store, api = kube
    [cordoned] = Cordoner(api).execute([ActionRequest("n1", "reset")])
    assert cordoned.ok
    taints = store.get("nodes", "", "n1")["spec"]["taints"]  # type: ignore[index]
    assert {"key": TAINT_KEY, "value": "reset", "effect": "NoSchedule"} in taints
    url, handler = hook
    [posted] = WebhookNotifier(url).execute([ActionRequest("n1", "reset")])
    assert posted.ok and handler.received[-1]["action"] == "reset"
