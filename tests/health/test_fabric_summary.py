"""The node agent's fabric summary (issue 30, item 3): what each node tells the cluster about its
GPUs' NVLink fabric registration, so the cluster can judge its UltraServer as one domain.

A GPU counts as registered only when NVML says NVML_GPU_FABRIC_STATE_COMPLETED with status
NVML_SUCCESS and no failing bit in NVML_GPU_FABRIC_HEALTH_MASK_* (the same per-GPU rules as the
gpu_fabric check, without its start-up grace: a GPU still registering is not in the domain yet).
The summary travels in the Node annotation `topowatch.io/nvlink-fabric`, written by the agent
on its own Node in the same patch as its findings, on change.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from exporter.core.snapshot import FabricInfo, NodeSnapshot
from exporter.core.ultraserver import FABRIC_ANNOTATION, NodeFabric
from exporter.sim.kubeapi.server import ObjectStore
from exporter.sources.kubeapi import KubeApi
from healthcheck.detection.checks.fabric import node_fabric
from healthcheck.detection.monitor import HealthMonitor, HealthReport
from healthcheck.detection.reporter import NodeReporter
from tests.conftest import SimHarness, healthy_snapshot
from tests.health.test_fabric_health import CLUSTER, ROUTE_UNHEALTHY_TRUE, completed
from tests.health.test_health_checks import with_gpu
from tests.health.test_health_reporter import NODE, T0, Clock, api, server, store

__all__ = ["api", "server", "store"]  # fixtures, imported for pytest
Sim = Callable[..., SimHarness]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> NodeSnapshot:
    return healthy_snapshot("p6e-gb200.36xlarge", tmp_path_factory.mktemp("gb200"))


def test_a_healthy_gb200_reports_every_gpu_registered_in_one_clique(base: NodeSnapshot) -> None:
    got = node_fabric(base)
    assert got is not None
    assert (got.gpus, got.registered, got.mixed, got.problem) == (4, 4, False, "")
    assert got.cluster_uuid and got.clique_id is not None


# (what NVML says, GPU 2's reading, registered of 4, the problem named)
ROWS = [
    ("COMPLETED with a failed status: a failed registration",
     completed("NVML_ERROR_INSUFFICIENT_RESOURCES"), 3,
     "GPU 2: fabric registration completed with status NVML_ERROR_INSUFFICIENT_RESOURCES"),
    ("healthMask ROUTE_UNHEALTHY_TRUE: the route to the fabric is unhealthy",
     completed(mask=ROUTE_UNHEALTHY_TRUE), 3,
     "GPU 2: fabric health mask: route to the fabric unhealthy"),
    ("IN_PROGRESS: not in the domain yet, grace or not",
     FabricInfo("in_progress", None), 3, "GPU 2: fabric registration still in progress"),
    ("NOT_SUPPORTED: the GPU has no fabric and is not counted",
     FabricInfo("not_supported", None), 3, ""),
]  # fmt: skip


@pytest.mark.parametrize(("meaning", "fabric", "registered", "problem"), ROWS)
def test_one_gpu_off_the_fabric(
    base: NodeSnapshot, meaning: str, fabric: FabricInfo, registered: int, problem: str
) -> None:
    got = node_fabric(with_gpu(base, 2, fabric=fabric))
    assert got is not None
    if fabric.state == "not_supported":
        assert (got.gpus, got.registered) == (3, 3)
    else:
        assert (got.gpus, got.registered) == (4, registered)
    assert got.problem == problem


def test_gpus_in_two_cliques_are_mixed(base: NodeSnapshot) -> None:
    other = FabricInfo("completed", True, 7, CLUSTER, "NVML_SUCCESS", 0)
    got = node_fabric(with_gpu(base, 1, fabric=other))
    assert got is not None and got.mixed and got.registered == 4
    assert got.problem == "GPUs report different fabric cliques"
    assert not got.complete


def test_a_lost_gpu_is_not_registered(base: NodeSnapshot) -> None:
    got = node_fabric(with_gpu(base, 3, up=False))
    assert got is not None and (got.gpus, got.registered) == (4, 3)
    assert got.problem == "GPU 3: GPU lost"


def test_no_fabric_on_any_gpu_is_no_summary(base: NodeSnapshot) -> None:
    none = base
    for i in range(4):
        none = with_gpu(none, i, fabric=None)
    assert node_fabric(none) is None


def test_the_simulated_fabric_fault_reaches_the_report(sim: Sim) -> None:
    h = sim("p6e-gb200.36xlarge", "fabric-degraded@gpu2")
    monitor = HealthMonitor()
    snapshot, _ = h.poll(10.0)
    time.sleep(0.01)
    report = monitor.observe(snapshot)
    assert report.fabric is not None
    assert (report.fabric.gpus, report.fabric.registered) == (4, 3)
    assert "GPU 2" in report.fabric.problem


def node_annotations(store: ObjectStore) -> dict[str, str]:
    node = store.get("nodes", "", NODE)
    assert node is not None
    return dict(node["metadata"].get("annotations") or {})


def test_the_reporter_writes_the_summary_with_the_findings_and_on_change(
    api: KubeApi, store: ObjectStore
) -> None:
    clock = Clock()
    reporter = NodeReporter(api, NODE, clock=clock)
    good = NodeFabric(4, 4, CLUSTER, 32766)
    assert reporter.report(HealthReport(NODE, T0, (), fabric=good))
    written = json.loads(node_annotations(store)[FABRIC_ANNOTATION])
    assert written == {"gpus": 4, "registered": 4, "clusterUuid": CLUSTER, "cliqueId": 32766}
    version = store.get("nodes", "", NODE)["metadata"]["resourceVersion"]  # type: ignore[index]
    clock.now += 10
    assert reporter.report(HealthReport(NODE, T0 + 10, (), fabric=good))  # unchanged: no write
    assert store.get("nodes", "", NODE)["metadata"]["resourceVersion"] == version  # type: ignore[index]
    bad = NodeFabric(4, 3, CLUSTER, 32766, problem="GPU 2: route to the fabric unhealthy")
    clock.now += 10
    assert reporter.report(HealthReport(NODE, T0 + 20, (), fabric=bad))  # findings same, fabric not
    assert NodeFabric.from_json(node_annotations(store)[FABRIC_ANNOTATION]) == bad
    clock.now += 10
    assert reporter.report(HealthReport(NODE, T0 + 30, ()))  # no fabric any more: removed
    assert FABRIC_ANNOTATION not in node_annotations(store)
