"""Issue 4 end to end on the simulation: XID 79 injected on one simulated node → the node
agent's finding → its Node condition and findings annotation → the cluster service's controller
→ the HyperPod replacement label. Every hop is the production code: the agent's checks and
reporter, the API server, the informers, the policy and the hyperpod provider."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.cluster.run import build_controller, kube_api_client
from exporter.sim.cluster import ClusterShape
from exporter.sim.environment import NodeAgentFleet, SimulatedEnvironment
from exporter.sim.faults import parse_fault
from tests.cluster.test_cluster_service import RunningService, eventually

HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"


@pytest.fixture
def env() -> Iterator[SimulatedEnvironment]:
    shape = ClusterShape(
        p5_nodes=4,
        ultraserver_nodes=0,
        teams=("a",),
        arrivals_per_minute=0.0,
        initial_workloads=0,
    )
    environment = SimulatedEnvironment(seed=0, shape=shape).start()
    yield environment
    environment.stop()


def node_obj(env: SimulatedEnvironment, name: str) -> dict[str, Any]:
    obj = env.store.get("nodes", "", name)
    assert obj is not None
    return obj


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for cond in obj.get("status", {}).get("conditions", []):
        if cond.get("type") == type_:
            return dict(cond)
    return None


@pytest.mark.parametrize("mode", ["act", "observe"])
def test_xid79_leads_to_the_hyperpod_replacement_label(
    env: SimulatedEnvironment, tmp_path: Path, mode: str
) -> None:
    sick, healthy = (n.name for n in env.cluster.nodes()[:2])
    fleet = NodeAgentFleet(
        env,
        interval=0.2,
        faults=[parse_fault(f"node={sick}:xid=79@gpu3")],
        report_url=env.url,
    )
    config = tmp_path / "remediation.yaml"
    config.write_text(f"mode: {mode}\nproviders: [hyperpod]\n")
    controller, _ = build_controller(config, kube_api_client(env.url))
    fleet.start()
    running = RunningService(env.url, controller=controller)
    try:
        # The agent reports: condition False, annotation with the fatal XID finding.
        reported = eventually(
            lambda: (
                (c := condition(node_obj(env, sick), "TopowatchHealthy")) and c["status"] == "False"
            ),
            timeout=20,
            what="the sick node's TopowatchHealthy=False",
        )
        assert reported
        findings = json.loads(
            node_obj(env, sick)["metadata"]["annotations"]["topowatch.io/findings"]
        )
        assert any(f["check"] == "xid" and "XID 79" in f["evidence"] for f in findings)

        if mode == "act":
            # XID 79's first ladder step is a reboot (NVIDIA's catalog: RESTART_BM); the same GPU
            # again within 24 h would be a replacement
            # (tests/remediation/test_remediation_lifecycle.py).
            eventually(
                lambda: (
                    node_obj(env, sick)["metadata"]["labels"].get(HEALTH_LABEL)
                    == "UnschedulablePendingReboot"
                ),
                timeout=20,
                what="the HyperPod reboot label",
            )
            state = json.loads(
                node_obj(env, sick)["metadata"]["annotations"]["topowatch.io/remediation"]
            )
            assert state["action"] == "reboot" and state["provider"] == "hyperpod"
            assert [(m["rule"], m["component"], m["step"]) for m in state["ladder"]] == [
                ("xid-79", "gpu3", 0)
            ]
            _, body = running.get("/metrics")
            assert (
                b'topowatch_remediation_detection_to_action_seconds_count{action="reboot"} 1'
                in body
            )
            _, status = running.get("/api/v1/remediation")
            [entry] = [n for n in status["nodes"] if n["node"] == sick]
            assert [(s["rule"], s["step"], s["next"]) for s in entry["ladder"]] == [
                ("xid-79", 1, "replace")
            ]
        else:
            # Observe decides and says so, and touches nothing.
            decided = b'topowatch_remediation_decisions_total{verdict="skip",reason="observe",'
            eventually(lambda: decided in running.get("/metrics")[1], what="an observe decision")
            time.sleep(0.5)
            assert node_obj(env, sick)["metadata"]["labels"][HEALTH_LABEL] == "Schedulable"
            assert "topowatch.io/remediation" not in node_obj(env, sick)["metadata"].get(
                "annotations", {}
            )
        # The healthy neighbour is left alone either way.
        assert node_obj(env, healthy)["metadata"]["labels"][HEALTH_LABEL] == "Schedulable"
        neighbour = condition(node_obj(env, healthy), "TopowatchHealthy")
        assert neighbour is None or neighbour["status"] == "True"
    finally:
        running.stop()
        fleet.close()
