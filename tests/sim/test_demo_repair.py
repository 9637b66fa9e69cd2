"""The demo's remediation lifecycle reaches its end (issue 31): XID 79 on a simulated node →
the node agent's finding → the controller's HyperPod reboot label → the simulated HyperPod
reboots the node a moment later (the job on it stops, the operator resumes it) → the node is
back, Schedulable, with a new boot ID, its agent started afresh without the fault → the
controller records the action as recovered.

The simulation is one writer of Nodes among several: its writes are merged three ways, so the
agent's annotation and condition and the controller's state and label survive them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.cluster.run import build_controller, kube_api_client
from exporter.sim.cluster import ClusterShape, SimulatedCluster
from exporter.sim.environment import (
    HyperPodRepair,
    NodeAgentFleet,
    SharedNodes,
    SimulatedEnvironment,
    merge3,
)
from exporter.sim.faults import parse_fault
from exporter.sim.kubeapi.server import ObjectStore
from exporter.sim.node_faults import FaultRates
from tests.cluster.test_cluster_service import RunningService, eventually

HEALTH = "sagemaker.amazonaws.com/node-health-status"
FAST = HyperPodRepair(start_s=(1.0, 1.0), reboot_s=(2.0, 2.0), replace_s=(3.0, 3.0))


@pytest.fixture
def env() -> Iterator[SimulatedEnvironment]:
    shape = ClusterShape(
        p5_nodes=4, ultraserver_nodes=0, teams=("a",), arrivals_per_minute=0.0, initial_workloads=0
    )
    environment = SimulatedEnvironment(seed=0, shape=shape, tick=0.2, repair=FAST).start()
    yield environment
    environment.stop()


def node_obj(env: SimulatedEnvironment, name: str) -> dict[str, Any]:
    obj = env.store.get("nodes", "", name)
    assert obj is not None
    return obj


def labels(env: SimulatedEnvironment, name: str) -> dict[str, str]:
    return dict(node_obj(env, name)["metadata"].get("labels", {}))


def annotations(env: SimulatedEnvironment, name: str) -> dict[str, str]:
    return dict(node_obj(env, name)["metadata"].get("annotations", {}))


def boot_id(env: SimulatedEnvironment, name: str) -> str:
    return str(node_obj(env, name)["status"]["nodeInfo"]["bootID"])


def test_a_rebooted_node_comes_back_and_the_lifecycle_ends_recovered(
    env: SimulatedEnvironment, tmp_path: Path
) -> None:
    sick, healthy = (n.name for n in env.cluster.nodes()[:2])
    fleet = NodeAgentFleet(
        env, interval=0.2, faults=[parse_fault(f"node={sick}:xid=79@gpu3")], report_url=env.url
    )
    config = tmp_path / "remediation.yaml"
    config.write_text("mode: act\nproviders: [hyperpod]\n")
    controller, _ = build_controller(config, kube_api_client(env.url))
    boot_before = boot_id(env, sick)
    fleet.start()
    running = RunningService(env.url, controller=controller)
    try:
        eventually(
            lambda: labels(env, sick).get(HEALTH) == "UnschedulablePendingReboot",
            timeout=30,
            what="the controller's reboot label",
        )
        # HyperPod cordons it; the simulation's own write kept what the others wrote
        eventually(
            lambda: node_obj(env, sick)["spec"].get("unschedulable") is True,
            timeout=10,
            what="HyperPod's cordon",
        )
        assert "topowatch.io/remediation" in annotations(env, sick)
        assert "xid" in annotations(env, sick)["topowatch.io/findings"]
        assert labels(env, sick).get(HEALTH) == "UnschedulablePendingReboot"
        # HyperPod reboots it; it comes back Schedulable with a new boot ID and a fresh agent
        eventually(
            lambda: (
                labels(env, sick).get(HEALTH) == "Schedulable" and boot_id(env, sick) != boot_before
            ),
            timeout=30,
            what="the node back from its reboot",
        )
        eventually(lambda: fleet.reboots == 1, timeout=10, what="the agent started afresh")
        assert not node_obj(env, sick)["spec"].get("unschedulable")
        eventually(
            lambda: "xid" not in annotations(env, sick).get("topowatch.io/findings", "xid"),
            timeout=20,
            what="the fresh agent's report without the XID",
        )

        def outcome() -> str | None:
            _, status = running.get("/api/v1/remediation")
            for entry in status["nodes"]:
                if entry["node"] == sick and entry["state"] is not None:
                    return str(entry["state"]["outcome"])
            return None

        eventually(lambda: outcome() == "recovered", timeout=30, what="the action recovered")

        def written() -> dict[str, Any] | None:
            state = json.loads(annotations(env, sick)["topowatch.io/remediation"])
            return state if state["outcome"] == "recovered" else None

        state = eventually(written, timeout=10, what="the recovered state on the Node")
        assert state["boot_id"] == boot_before
        # no second action: the finding from before the reboot asks for nothing
        assert state["attempts"] == 1
        assert labels(env, healthy).get(HEALTH) == "Schedulable"
        assert boot_id(env, healthy) == env.cluster.boot_id(healthy)
    finally:
        running.stop()
        fleet.close()


def test_the_jobs_on_a_rebooted_node_stop_and_resume_once_it_is_back() -> None:
    start = 1_795_000_000.0
    store = ObjectStore(clock=lambda: start)
    shape = ClusterShape(
        p5_nodes=4, ultraserver_nodes=0, teams=("a",), arrivals_per_minute=0, initial_workloads=0
    )
    sim = SimulatedCluster(
        SharedNodes(store), shape, start=start, elastic=False, faults=FaultRates(scale=0)
    )
    sim.submit("a", "train", 8, 2, "training-priority", runtime_s=3600.0)
    sim.step(start + 10)

    def pods() -> list[dict[str, Any]]:
        return [p for p in store.items("pods") if p["metadata"]["name"].startswith("train")]

    node = pods()[0]["spec"]["nodeName"]
    kinds = FAST.kinds()
    reboot = kinds["UnschedulablePendingReboot"]
    before = sim.boot_id(node)
    assert sim.hyperpod_label(node, "UnschedulablePendingReboot", reboot, FAST.start_s)
    assert not sim.hyperpod_label(node, "UnschedulablePendingReboot", reboot, FAST.start_s)
    assert len(pods()) == 2  # cordoned, not yet rebooted: the job still runs
    sim.step(start + 12)  # the reboot starts: the job's pods go
    assert pods() == []
    truth = sim.truth
    assert truth is not None
    (stop,) = truth.interruptions
    assert (stop.cause, stop.node, stop.fault) == ("remediation", node, "requested_reboot")
    t = start + 12
    while t < start + 600 and len([p for p in pods() if p["status"]["phase"] == "Running"]) < 2:
        t += 5
        sim.step(t)
    assert sim.boot_id(node) != before
    obj = store.get("nodes", "", node)
    assert obj is not None and obj["metadata"]["labels"][HEALTH] == "Schedulable"
    assert obj["status"]["nodeInfo"]["bootID"] == sim.boot_id(node)
    assert len(pods()) == 2 and t < start + 600  # the operator resumed the job


def test_a_replacement_label_is_carried_out_too(env: SimulatedEnvironment) -> None:
    node = env.cluster.nodes()[0].name
    before = boot_id(env, node)
    obj = node_obj(env, node)
    obj["metadata"]["labels"][HEALTH] = "UnschedulablePendingReplacement"
    obj["metadata"].setdefault("annotations", {})["someone/else"] = "kept"
    env.store.upsert("nodes", obj)
    eventually(
        lambda: labels(env, node).get(HEALTH) == "Schedulable" and boot_id(env, node) != before,
        timeout=30,
        what="the replaced node back",
    )
    assert annotations(env, node)["someone/else"] == "kept"
    assert env.cluster.truth is not None  # the repair path of the fault simulation ran it


def test_merge3_keeps_what_others_wrote_and_what_the_simulation_changed() -> None:
    base = {
        "metadata": {"name": "n", "labels": {"h": "Schedulable", "a": "1"}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    theirs = {
        "metadata": {
            "name": "n",
            "labels": {"h": "UnschedulablePendingReboot", "a": "1"},
            "annotations": {"topowatch.io/findings": "[]"},
        },
        "spec": {},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "TopowatchHealthy", "status": "False"},
            ]
        },
    }
    ours = {
        "metadata": {"name": "n", "labels": {"h": "Schedulable", "a": "2"}},
        "spec": {"unschedulable": True},
        "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
    }
    merged = merge3(base, ours, theirs)
    assert merged["metadata"]["labels"] == {"h": "UnschedulablePendingReboot", "a": "2"}
    assert merged["metadata"]["annotations"] == {"topowatch.io/findings": "[]"}
    assert merged["spec"] == {"unschedulable": True}
    assert merged["status"]["conditions"] == [
        {"type": "Ready", "status": "Unknown"},
        {"type": "TopowatchHealthy", "status": "False"},
    ]
    assert theirs["metadata"]["labels"]["h"] == "UnschedulablePendingReboot"  # not changed
    assert merge3(None, ours, theirs) is ours
