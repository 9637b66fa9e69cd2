"""Findings count only when the node's own agent wrote them (exporter/core/provenance.py).

The check reads the Node's managedFields: the findings annotation must be owned by the agent's
field manager alone. Tested on the pure function, through the controller (refused, audited as
a log line, a counter, the trail and an Event; nothing acts), and over real HTTP against the
simulated API server, which keeps managedFields as the real one does: the agent's writes are
trusted, a `kubectl annotate`-style write is not, and the agent takes an identical annotation
back from an older writer.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.cluster.run import build_controller, kube_api_client
from exporter.core.findings import FINDINGS_ANNOTATION, HEALTH_CONDITION, Finding
from exporter.core.provenance import (
    AGENT_FIELD_MANAGER,
    REFUSED,
    agent_entry,
    check,
    owners,
    screen_node,
)
from exporter.sim.cluster import ClusterShape
from exporter.sim.environment import NodeAgentFleet, SimulatedEnvironment
from exporter.sim.faults import parse_fault
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from exporter.sources.kubeapi import KubeApi
from healthcheck.detection.monitor import HealthMonitor, HealthReport
from healthcheck.detection.reporter import NodeReporter
from healthcheck.remediation.controller import RemediationController
from tests.cluster.test_cluster_service import RunningService, eventually
from tests.remediation.test_remediation_controller import finding, make, node, trail

T0 = 1_750_000_000.0
HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
NODE = "ip-10-1-2-3.ec2.internal"


def entry(manager: str, *keys: str, operation: str = "Update") -> dict[str, Any]:
    return {
        "manager": manager,
        "operation": operation,
        "apiVersion": "v1",
        "time": "2025-06-15T15:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{k}": {} for k in keys}}},
    }


def written_by(obj: dict[str, Any], *entries: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["managedFields"] = list(entries)
    return out


def sick(name: str = "n1") -> dict[str, Any]:
    obj = node(name, [finding("replace")])
    obj["status"]["conditions"] = [
        {"type": "Ready", "status": "True"},
        {"type": HEALTH_CONDITION, "status": "False", "reason": "Xid"},
    ]
    return obj


# --- the pure check ------------------------------------------------------------------------------


def test_the_agents_own_write_is_trusted_and_passes_through_untouched() -> None:
    obj = sick()
    assert owners(obj) == (AGENT_FIELD_MANAGER,)
    assert check(obj) is None
    screened, refusal = screen_node(obj)
    assert refusal is None and screened is obj


def test_no_findings_means_nothing_to_refuse() -> None:
    obj = node("n1")
    obj["metadata"]["managedFields"] = [entry("kubectl-annotate", "other")]
    assert check(obj) is None


@pytest.mark.parametrize(
    ("entries", "named"),
    [
        ([entry("kubectl-annotate", FINDINGS_ANNOTATION)], "kubectl-annotate"),
        ([entry("OpenAPI-Generator", FINDINGS_ANNOTATION)], "OpenAPI-Generator"),
        ([entry("topowatch", FINDINGS_ANNOTATION)], "topowatch"),  # a pre-provenance agent
        # shared with another manager (a server-side apply of the same value): not the agent alone
        (
            [
                entry(AGENT_FIELD_MANAGER, FINDINGS_ANNOTATION),
                entry("argocd-controller", FINDINGS_ANNOTATION, operation="Apply"),
            ],
            "argocd-controller",
        ),
        # the agent's manager owns something else, not the findings
        ([entry(AGENT_FIELD_MANAGER, "topowatch.io/other")], "no owner"),
        ([], "no owner"),  # managedFields cleared with [{}]
        ([{"manager": AGENT_FIELD_MANAGER, "fieldsV1": "garbage"}], "no owner"),
    ],
    ids=["kubectl", "client-default", "old-agent", "shared", "other-key", "none", "malformed"],
)
def test_findings_written_by_anyone_else_are_refused(
    entries: list[dict[str, Any]], named: str
) -> None:
    obj = written_by(sick(), *entries)
    refusal = check(obj)
    assert refusal is not None
    assert refusal.node == "n1" and refusal.reason == REFUSED
    assert named in refusal.detail
    screened, again = screen_node(obj)
    assert again == refusal
    # the screened view has neither the findings nor our condition; the rest is intact
    assert FINDINGS_ANNOTATION not in screened["metadata"]["annotations"]
    assert [c["type"] for c in screened["status"]["conditions"]] == ["Ready"]
    assert screened["metadata"]["labels"] == obj["metadata"]["labels"]
    assert FINDINGS_ANNOTATION in obj["metadata"]["annotations"]  # the input is not modified
    assert len(obj["status"]["conditions"]) == 2


def test_a_node_without_managed_fields_at_all_is_refused() -> None:
    obj = sick()
    del obj["metadata"]["managedFields"]
    refusal = check(obj)
    assert refusal is not None and "no owner" in refusal.detail


def test_anything_but_a_node_passes_through() -> None:
    for thing in (None, "x", 3, {"kind": "Node"}, {"metadata": "x"}):
        assert screen_node(thing) == (thing, None)


def test_agent_entry_is_what_the_check_trusts() -> None:
    assert owners({"metadata": {"managedFields": [agent_entry()]}}) == (AGENT_FIELD_MANAGER,)


# --- through the controller ------------------------------------------------------------------


def problems_metric(controller: RemediationController) -> dict[str, float]:
    """topowatch_remediation_problems{reason} as the cluster service's /metrics shows it."""
    out: dict[str, float] = {}
    for family in controller.families():
        if family.name == "topowatch_remediation_problems":
            for labels, value in family.samples:
                match = re.fullmatch(r'\{reason="([^"]*)"\}', labels)
                assert match, labels
                out[match.group(1)] = float(value)
    return out


def test_the_controller_acts_on_findings_its_agent_wrote() -> None:
    controller, provider, _, _ = make()
    controller.observe_node(sick("n1"), T0)
    controller.run_once()
    assert [name for name, _ in provider.calls] == ["n1"]  # whatever the ladder says
    assert REFUSED not in {reason for _, _, reason in trail(controller)}


def test_findings_from_another_manager_are_refused_audited_and_nothing_acts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    controller, provider, writer, _ = make()
    forged = written_by(sick("n1"), entry("kubectl-annotate", FINDINGS_ANNOTATION))
    with caplog.at_level(logging.WARNING, logger="topowatch.audit"):
        controller.observe_node(forged, T0)
        controller.run_once()
    assert provider.calls == []
    assert writer.states == {}
    assert ("n1", "skip", REFUSED) in trail(controller)
    assert problems_metric(controller)[REFUSED] == 1
    # no second complaint: the condition went with the refused findings
    assert "malformed_findings" not in problems_metric(controller)
    logged = [json.loads(r.getMessage()) for r in caplog.records if REFUSED in r.getMessage()]
    assert logged and logged[0]["node"] == "n1" and "kubectl-annotate" in logged[0]["detail"]
    assert any(e.reason == REFUSED and e.node == "n1" for e in writer.events)
    # the agent writes again: trusted, acted on
    controller.observe_node(sick("n1"), T0 + 1)
    controller.run_once()
    assert [name for name, _ in provider.calls] == ["n1"]  # whatever the ladder says


def test_findings_on_a_node_without_managed_fields_are_refused() -> None:
    controller, provider, _, _ = make()
    bare = sick("n1")
    del bare["metadata"]["managedFields"]
    controller.observe_node(bare, T0)
    controller.run_once()
    assert provider.calls == []
    assert ("n1", "skip", REFUSED) in trail(controller)


@pytest.mark.parametrize("writer_entry", [agent_entry(), entry("kubectl", FINDINGS_ANNOTATION)])
def test_findings_that_are_not_json_are_refused_and_nothing_acts(
    writer_entry: dict[str, Any],
) -> None:
    controller, provider, _, _ = make()
    garbled = written_by(node("n1", "{not json"), writer_entry)
    controller.observe_node(garbled, T0)
    controller.run_once()
    assert provider.calls == []
    reasons = {reason for name, _, reason in trail(controller) if name == "n1"}
    expected = "malformed_findings" if writer_entry["manager"] == AGENT_FIELD_MANAGER else REFUSED
    assert expected in reasons
    assert problems_metric(controller)[expected] == 1


# --- over HTTP, on the simulated API server's managedFields ---------------------------------------


@pytest.fixture
def store() -> ObjectStore:
    s = ObjectStore()
    s.upsert(
        "nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"node.kubernetes.io/instance-type": "p5"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        },
    )
    return s


@pytest.fixture
def api(store: ObjectStore) -> Iterator[KubeApi]:
    with FakeApiServer(store) as server, KubeApi(server.url) as client:
        yield client


XID = Finding("xid", "gpu3", "fatal", "replace", "XID 79", T0, T0, True)


def stored(store: ObjectStore) -> dict[str, Any]:
    obj = store.get("nodes", "", NODE)
    assert obj is not None
    return obj


def test_the_agents_writes_are_owned_by_its_field_manager(api: KubeApi, store: ObjectStore) -> None:
    reporter = NodeReporter(api, NODE, HealthMonitor(), clock=lambda: T0)
    assert reporter.report(HealthReport(NODE, T0, (XID,)))
    obj = stored(store)
    assert owners(obj) == (AGENT_FIELD_MANAGER,)
    assert check(obj) is None
    condition = ("f:status", "f:conditions")
    assert owners(obj, condition) == (AGENT_FIELD_MANAGER,)  # written through nodes/status
    (status_entry,) = [e for e in obj["metadata"]["managedFields"] if e.get("subresource")]
    assert status_entry["subresource"] == "status"


def test_a_kubectl_annotate_over_http_is_refused(api: KubeApi, store: ObjectStore) -> None:
    NodeReporter(api, NODE, clock=lambda: T0).report(HealthReport(NODE, T0, ()))
    forged = json.dumps([XID.to_dict()])
    body = {"metadata": {"annotations": {FINDINGS_ANNOTATION: forged}}}
    api.patch(f"/api/v1/nodes/{NODE}?fieldManager=kubectl-annotate", body)
    obj = stored(store)
    assert owners(obj) == ("kubectl-annotate",)
    controller, provider, _, _ = make()
    controller.observe_node(obj, T0)
    controller.run_once()
    assert provider.calls == []
    assert (NODE, "skip", REFUSED) in trail(controller)


def test_the_agent_takes_back_an_identical_annotation_written_by_someone_else(
    api: KubeApi, store: ObjectStore
) -> None:
    # an agent of an earlier version wrote "[]" with the client's default manager ("topowatch")
    api.patch(f"/api/v1/nodes/{NODE}", {"metadata": {"annotations": {FINDINGS_ANNOTATION: "[]"}}})
    assert owners(stored(store)) == ("topowatch",)
    monitor = HealthMonitor()
    reporter = NodeReporter(api, NODE, monitor, clock=lambda: T0)
    assert reporter.report(HealthReport(NODE, T0, ()))  # the same "[]": no change of owner alone
    obj = stored(store)
    assert obj["metadata"]["annotations"][FINDINGS_ANNOTATION] == "[]"
    assert owners(obj) == (AGENT_FIELD_MANAGER,)
    assert monitor.report_count("written", "annotation_reclaimed") == 1
    # and once owned, a rewrite costs no extra request
    reporter._written = None  # force a rewrite
    assert reporter.report(HealthReport(NODE, T0, ()))
    assert monitor.report_count("written", "annotation_reclaimed") == 1


# --- end to end: agent -> API server -> informers -> controller ------------------------------


@pytest.fixture
def env() -> Iterator[SimulatedEnvironment]:
    shape = ClusterShape(
        p5_nodes=3, ultraserver_nodes=0, teams=("a",), arrivals_per_minute=0.0, initial_workloads=0
    )
    environment = SimulatedEnvironment(seed=0, shape=shape).start()
    yield environment
    environment.stop()


def test_end_to_end_the_agents_findings_act_and_a_forged_annotation_does_not(
    env: SimulatedEnvironment, tmp_path: Path
) -> None:
    sick_name, forged_name = (n.name for n in env.cluster.nodes()[:2])
    fleet = NodeAgentFleet(
        env, interval=0.2, faults=[parse_fault(f"node={sick_name}:xid=79@gpu3")], report_url=env.url
    )
    config = tmp_path / "remediation.yaml"
    config.write_text("mode: act\nproviders: [hyperpod]\n")
    controller, _ = build_controller(config, kube_api_client(env.url))
    fleet.start()
    running = RunningService(env.url, controller=controller)
    refused = f'topowatch_remediation_problems_total{{reason="{REFUSED}"}}'.encode()

    def label(name: str) -> str:
        obj = env.store.get("nodes", "", name)
        assert obj is not None
        return str(obj["metadata"]["labels"][HEALTH_LABEL])

    try:
        # The sick node's own agent reported: the controller acts on it (whichever rung).
        eventually(lambda: label(sick_name) != "Schedulable", timeout=20, what="an action")
        assert refused not in running.get("/metrics")[1]
        # Someone else writes a fatal finding onto a healthy node, as kubectl annotate would.
        eventually(
            lambda: owners(env.store.get("nodes", "", forged_name) or {}) == (AGENT_FIELD_MANAGER,),
            timeout=20,
            what="the healthy node's own report",
        )
        forged = json.dumps([XID.to_dict()])
        with KubeApi(env.url) as kubectl:
            kubectl.patch(
                f"/api/v1/nodes/{forged_name}?fieldManager=kubectl-annotate",
                {"metadata": {"annotations": {FINDINGS_ANNOTATION: forged}}},
            )
        eventually(lambda: refused in running.get("/metrics")[1], what="the refusal metric")
        time.sleep(0.5)
        assert label(forged_name) == "Schedulable"
        _, status = running.get("/api/v1/remediation")
        audit = [r for r in status["recent"] if r["node"] == forged_name]
        assert any(r["reason"] == REFUSED for r in audit)
        assert not any(r["audit"] == "decision" and r["verdict"] == "act" for r in audit)
    finally:
        running.stop()
        fleet.close()
