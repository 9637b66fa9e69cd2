"""One verdict per UltraServer (issue 30, item 3): the NVLink domain judged as a unit, from its
nodes' health and the fabric each node's agent reports; the verdict's metrics, explain's
"waits" line for a pending workload on an UltraServer flavor, and the topology page's badge.

Fabric rows cite the NVML API reference ("Fabric definitions", nvmlGpuFabricInfo_t/_v2_t/_v3_t):
`state` NVML_GPU_FABRIC_STATE_COMPLETED means the registration probe ended, `status` "must be
checked only if state returns complete", `clusterUuid`/`cliqueId` name "the cluster" and "the
fabric clique to which this GPU belongs", and NVML_GPU_FABRIC_HEALTH_MASK_* flags a route
unhealthy or an incorrect configuration (judged per GPU by the node agent's fabric check).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.cluster.explain import explain_text
from exporter.cluster.metrics import render as metrics
from exporter.cluster.model import ClusterModel
from exporter.cluster.parse.core import parse_node
from exporter.cluster.ui.pages import topology_page, topology_picture
from exporter.cluster.ultraserver import member, verdicts
from exporter.cluster.views.workloads import topology_view, workload_view
from exporter.core.exposition import encode_text
from exporter.core.ultraserver import (
    FABRIC_ANNOTATION,
    Member,
    NodeFabric,
    Thresholds,
    judge,
)
from exporter.sim import synthetic as s
from exporter.topology.labels import ULTRASERVER_KEY
from tests.crds import assert_valid_kueue

T0 = 1_795_000_000.0
GB200 = "ml.p6e-gb200.36xlarge"
UUID = "9c6f5af3-53bf-49b5-a436-b66766c413c3"
OTHER_UUID = "0b1d1c52-7c1e-4b7e-9a7e-3f5c7b7d0e11"
CLIQUE = 32766

GOOD = NodeFabric(gpus=4, registered=4, cluster_uuid=UUID, clique_id=CLIQUE)


def ok(name: str, fabric: NodeFabric | None = GOOD) -> Member:
    return Member(name, 4, True, fabric=fabric)


def sick(name: str, why: str = "TopowatchHealthy=False (Xid: gpu3 xid)") -> Member:
    return Member(name, 4, False, why, fabric=GOOD)


def rack(n: int, bad: dict[int, Member] | None = None) -> list[Member]:
    bad = bad or {}
    return [bad.get(i, ok(f"g{i:02d}")) for i in range(n)]


# (why, members, verdict, nodes healthy, usable GPUs, fabric agreed)
ROWS: list[tuple[str, list[Member], str, int, int, bool | None]] = [
    (
        "every GPU COMPLETED with NVML_SUCCESS in one (clusterUuid, cliqueId): healthy",
        rack(18),
        "healthy", 18, 72, True,
    ),
    (
        "no agent reported a fabric (older agents, no annotation): judged on health alone",
        [ok(f"g{i}", None) for i in range(18)],
        "healthy", 18, 72, None,
    ),
    (
        "one node TopowatchHealthy=False: the domain is degraded, its GPUs not usable",
        rack(18, {3: sick("g03")}),
        "degraded", 17, 68, True,
    ),
    (
        "4 of 18 bad: degraded (14 of 18 healthy), below the 50 % failed share",
        rack(18, {i: sick(f"g{i:02d}") for i in range(4)}),
        "degraded", 14, 56, True,
    ),
    (
        "9 of 18 bad: half the rack, failed (the share remediation escalates at)",
        rack(18, {i: sick(f"g{i:02d}") for i in range(9)}),
        "failed", 9, 36, True,
    ),
    (
        "state not COMPLETED (NOT_STARTED / IN_PROGRESS) on one GPU: not in the domain yet",
        rack(18, {5: ok("g05", NodeFabric(4, 3, UUID, CLIQUE, problem="GPU 1: fabric"
                                          " registration still in progress"))}),
        "degraded", 17, 68, False,
    ),
    (
        "COMPLETED with status NVML_ERROR_INSUFFICIENT_RESOURCES (status checked only once"
        " complete): a failed registration counts against the domain",
        rack(18, {6: ok("g06", NodeFabric(4, 0, "", None, problem="GPU 0: fabric registration"
                                          " completed with status NVML_ERROR_INSUFFICIENT_"
                                          "RESOURCES"))}),
        "degraded", 17, 68, False,
    ),
    (
        "healthMask ROUTE_UNHEALTHY_TRUE on a GPU (the agent counts it unregistered)",
        rack(18, {7: ok("g07", NodeFabric(4, 3, UUID, CLIQUE, problem="GPU 2: fabric health"
                                          " mask: route to the fabric unhealthy"))}),
        "degraded", 17, 68, False,
    ),
    (
        "a node in another cliqueId of the same cluster: cut off from the domain's NVLink",
        rack(18, {8: ok("g08", NodeFabric(4, 4, UUID, 7))}),
        "degraded", 17, 68, False,
    ),
    (
        "a node in another clusterUuid: cut off from the domain's NVLink",
        rack(18, {9: ok("g09", NodeFabric(4, 4, OTHER_UUID, CLIQUE))}),
        "degraded", 17, 68, False,
    ),
    (
        "a node whose own GPUs report different cliques: mixed, counts against the domain",
        rack(18, {10: ok("g10", NodeFabric(4, 4, UUID, CLIQUE, mixed=True))}),
        "degraded", 17, 68, False,
    ),
    (
        "no (clusterUuid, cliqueId) held by most nodes: no NVLink domain left, failed",
        [ok(f"g{i}", NodeFabric(4, 4, UUID, i % 3)) for i in range(6)],
        "failed", 2, 8, False,
    ),
    (
        "HyperPod Unschedulable* and a deep health check count as unhealthy nodes too",
        rack(4, {0: Member("g00", 4, False, "HyperPod UnschedulablePendingReboot"),
                 1: Member("g01", 4, False, "deep health check InProgress")}),
        "failed", 2, 8, True,
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("why", "members", "verdict", "healthy", "usable", "agreed"),
    ROWS,
    ids=[r[0][:60] for r in ROWS],
)
def test_verdict_as_nvml_and_the_thresholds_say(
    why: str,
    members: list[Member],
    verdict: str,
    healthy: int,
    usable: int,
    agreed: bool | None,
) -> None:
    v = judge("us-a", members)
    assert (v.verdict, v.nodes_healthy, v.gpus_usable, v.fabric_agreed) == (
        verdict,
        healthy,
        usable,
        agreed,
    ), v.reason
    assert v.nodes_total == len(members)
    assert len(v.bad) == v.nodes_total - v.nodes_healthy
    assert v.reason


def test_the_reason_names_the_bad_nodes_and_why() -> None:
    v = judge("us-a", rack(18, {i: sick(f"g{i:02d}") for i in range(4)}))
    assert v.summary() == "degraded, 14 of 18 nodes healthy"
    assert v.reason.startswith("4 of 18 nodes bad: g00 (TopowatchHealthy=False")
    assert "and 1 more" in v.reason


def test_thresholds_are_configurable_in_one_place() -> None:
    three_bad = rack(18, {i: sick(f"g{i:02d}") for i in range(3)})
    assert judge("us-a", three_bad).verdict == "degraded"
    assert judge("us-a", three_bad, Thresholds(failed_share=1 / 6)).verdict == "failed"
    # fewer usable GPUs than the smallest job that needs the UltraServer
    assert judge("us-a", three_bad, Thresholds(min_usable_gpus=64)).verdict == "failed"
    assert judge("us-a", three_bad, Thresholds(min_usable_gpus=60)).verdict == "degraded"
    assert Thresholds().escalates(9, 18) and not Thresholds().escalates(8, 18)
    assert Thresholds(escalate_share=0.25).escalates(5, 18)
    assert not Thresholds().escalates(0, 0)


# --- the annotation the agent writes, read by the cluster's parse layer -----------------------


def gb200_node(
    name: str,
    us: str = "us-a",
    fabric: NodeFabric | str | None = GOOD,
    **kw: Any,
) -> dict[str, Any]:
    obj = s.node(name, ("nn-1", "nn-2", "nn-3"), gpus=4, instance_type=GB200, ultraserver=us, **kw)
    if fabric is not None:
        text = fabric if isinstance(fabric, str) else fabric.to_json()
        obj["metadata"].setdefault("annotations", {})[FABRIC_ANNOTATION] = text
    return obj


def test_the_fabric_annotation_round_trips_through_the_node_parser() -> None:
    fabric = NodeFabric(4, 3, UUID, CLIQUE, problem="GPU 2: route to the fabric unhealthy")
    problems: list[str] = []
    node = parse_node(gb200_node("g0", fabric=fabric), problems)
    assert problems == []
    assert node.fabric == fabric
    assert json.loads(fabric.to_json()) == {
        "gpus": 4,
        "registered": 3,
        "clusterUuid": UUID,
        "cliqueId": CLIQUE,
        "problem": "GPU 2: route to the fabric unhealthy",
    }


@pytest.mark.parametrize(
    ("text", "note"),
    [
        ("{not json", "not JSON"),
        ("[]", "expected a JSON object"),
        ('{"gpus": 4}', "registered: expected a count"),
        ('{"gpus": 4, "registered": 5}', "registered 5 > gpus 4"),
        ('{"gpus": true, "registered": 0}', "gpus: expected a count"),
        ('{"gpus": 4, "registered": 4, "cliqueId": "7"}', "cliqueId: expected an integer"),
    ],
)
def test_a_bad_fabric_annotation_is_a_note_and_no_fabric(text: str, note: str) -> None:
    problems: list[str] = []
    node = parse_node(gb200_node("g0", fabric=text), problems)
    assert node.name == "g0" and node.fabric is None
    assert any(FABRIC_ANNOTATION in p and note in p for p in problems), problems


def test_a_node_is_judged_by_what_the_cluster_sees() -> None:
    cases = {
        "ok": gb200_node("ok"),
        "cordoned": gb200_node("cordoned", unschedulable=True),
        "hyperpod": gb200_node("hyperpod", health="UnschedulablePendingReplacement"),
        "notready": gb200_node("notready", ready=False),
    }
    got = {k: member(parse_node(v)) for k, v in cases.items()}
    assert got["ok"].healthy and got["ok"].fabric == GOOD and got["ok"].gpus == 4
    assert got["cordoned"].why == "cordoned"
    assert got["hyperpod"].why == "HyperPod UnschedulablePendingReplacement"
    assert got["notready"].why == "not Ready"


# --- the cluster model: metrics, explain, the topology page -----------------------------------


def ultraserver_cluster(bad: int = 4, size: int = 18) -> ClusterModel:
    """us-a: `size` GB200 nodes, the first `bad` cordoned; us-b: 2 healthy nodes, one whose
    agent reports no fabric; a p5 node with no UltraServer."""
    model = ClusterModel()
    for i in range(size):
        model.apply("Node", "ADDED", gb200_node(f"a{i:02d}", unschedulable=i < bad), T0)
    model.apply("Node", "ADDED", gb200_node("b00", "us-b"), T0)
    model.apply("Node", "ADDED", gb200_node("b01", "us-b", fabric=None), T0)
    model.apply("Node", "ADDED", s.node("p0", ("nn-1", "nn-2", "nn-9")), T0)
    return model


def samples(model: ClusterModel) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = encode_text(metrics.render(model)).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("topowatch_ultraserver_")
    }


def test_metrics_per_ultraserver() -> None:
    got = samples(ultraserver_cluster())

    def value(name: str, **labels: str) -> float:
        return got[(name, frozenset(labels.items()))]

    assert value("topowatch_ultraserver_nodes", ultraserver="us-a", state="healthy") == 14
    assert value("topowatch_ultraserver_nodes", ultraserver="us-a", state="unhealthy") == 4
    assert value("topowatch_ultraserver_gpus", ultraserver="us-a") == 72
    assert value("topowatch_ultraserver_usable_gpus", ultraserver="us-a") == 56
    verdicts_a = {
        dict(k[1])["verdict"]: v for k, v in got.items() if k[0] == "topowatch_ultraserver_verdict"
        and dict(k[1])["ultraserver"] == "us-a"
    }  # fmt: skip
    assert verdicts_a == {"healthy": 0, "degraded": 1, "failed": 0}
    assert value("topowatch_ultraserver_fabric_agreed", ultraserver="us-a") == 1
    assert value("topowatch_ultraserver_fabric_agreed", ultraserver="us-b") == 1
    assert value("topowatch_ultraserver_verdict", ultraserver="us-b", verdict="healthy") == 1
    # the p5 node, in no UltraServer, has no series
    assert {dict(k[1])["ultraserver"] for k in got} == {"us-a", "us-b"}


def test_no_fabric_reported_means_no_fabric_agreed_series() -> None:
    model = ClusterModel()
    model.apply("Node", "ADDED", gb200_node("c0", "us-c", fabric=None), T0)
    got = samples(model)
    assert not [k for k in got if k[0] == "topowatch_ultraserver_fabric_agreed"]
    healthy = frozenset({("ultraserver", "us-c"), ("verdict", "healthy")})
    assert got[("topowatch_ultraserver_verdict", healthy)] == 1


def test_a_fabric_fault_turns_the_verdict_and_back() -> None:
    model = ultraserver_cluster(bad=0)
    assert verdicts(model.nodes)["us-a"].verdict == "healthy"
    broken = NodeFabric(4, 3, UUID, CLIQUE, problem="GPU 2: fabric registration completed with"
                        " status NVML_ERROR_INSUFFICIENT_RESOURCES")  # fmt: skip
    model.apply("Node", "MODIFIED", gb200_node("a05", fabric=broken, rv="2"), T0 + 10)
    v = verdicts(model.nodes)["us-a"]
    assert (v.verdict, v.nodes_healthy, v.fabric_agreed) == ("degraded", 17, False)
    assert v.bad == (("a05", "fabric: 3 of 4 GPUs registered: " + broken.problem),)
    model.apply("Node", "MODIFIED", gb200_node("a05", rv="3"), T0 + 20)
    assert verdicts(model.nodes)["us-a"].verdict == "healthy"


def kueue(obj: dict[str, Any]) -> dict[str, Any]:
    assert_valid_kueue(obj)
    return obj


def pending_on_gb200(model: ClusterModel) -> dict[str, Any]:
    flavor = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": GB200},
        "spec": {"nodeLabels": {"node.kubernetes.io/instance-type": GB200}},
    }
    model.apply("ResourceFlavor", "ADDED", kueue(flavor), T0)
    model.apply("ClusterQueue", "ADDED", kueue(s.cluster_queue("cq-gb", 256, flavor=GB200)), T0)
    model.apply("LocalQueue", "ADDED", kueue(s.local_queue("team-a", "cq-gb")), T0)
    message = (
        "couldn't assign flavors to pod set main: topology doesn't allow to fit any of 18 pod(s)"
    )
    wl = s.workload(
        "team-a",
        "whole-rack",
        18,
        4,
        T0,
        topology=("required", ULTRASERVER_KEY),
        flavor=GB200,
        conditions=[s.condition("QuotaReserved", "False", "Pending", message, T0)],
    )
    model.apply("Workload", "ADDED", kueue(wl), T0)
    return workload_view(model, model.workloads[("team-a", "whole-rack")])


def test_explain_says_a_pending_workload_waits_for_its_degraded_ultraserver() -> None:
    model = ClusterModel()
    for i in range(18):
        model.apply("Node", "ADDED", gb200_node(f"a{i:02d}", unschedulable=i < 4), T0)
    view = pending_on_gb200(model)
    (waits,) = view["ultraserver_waits"]
    assert (waits["ultraserver"], waits["verdict"]) == ("us-a", "degraded")
    text = explain_text(view)
    assert "Waits: its UltraServer us-a is degraded, 14 of 18 nodes healthy" in text


def test_explain_says_nothing_when_the_ultraserver_is_healthy_or_not_an_ultraserver() -> None:
    model = ClusterModel()
    for i in range(18):
        model.apply("Node", "ADDED", gb200_node(f"a{i:02d}"), T0)
    view = pending_on_gb200(model)
    assert view["ultraserver_waits"] == []
    assert "Waits:" not in explain_text(view)
    p5 = ClusterModel()
    p5.apply("Node", "ADDED", s.node("p0", ("nn-1", "nn-2", "nn-9"), unschedulable=True), T0)
    assert pending_on_gb200(p5)["ultraserver_waits"] == []  # its flavor selects no node
    # a flavor no ResourceFlavor describes selects every node: no UltraServer is claimed
    unknown = ClusterModel()
    for i in range(18):
        unknown.apply("Node", "ADDED", gb200_node(f"a{i:02d}", unschedulable=i < 9), T0)
    unknown.apply("ClusterQueue", "ADDED", kueue(s.cluster_queue("cq-gb", 256, flavor=GB200)), T0)
    unknown.apply("LocalQueue", "ADDED", kueue(s.local_queue("team-a", "cq-gb")), T0)
    wl = s.workload("team-a", "w", 1, 4, T0, flavor=GB200)
    unknown.apply("Workload", "ADDED", kueue(wl), T0)
    view = workload_view(unknown, unknown.workloads[("team-a", "w")])
    assert view["ultraserver_waits"] == []


def test_the_topology_view_carries_each_ultraservers_verdict() -> None:
    rows = {r["domain"]: r for r in topology_view(ultraserver_cluster())["ultraservers"]}
    assert rows["us-a"]["health"]["summary"] == "degraded, 14 of 18 nodes healthy"
    assert rows["us-a"]["health"]["bad_nodes"][0] == {"node": "a00", "why": "cordoned"}
    assert rows["us-b"]["health"]["verdict"] == "healthy"
    json.dumps(rows)  # the JSON API serves it as is


def test_topology_page_has_a_badge_per_ultraserver() -> None:
    html = topology_page(topology_picture(ultraserver_cluster()))
    assert '<li id="ultraserver-us-a"><span class="badge verdict-degraded"' in html
    assert "us-a: 14 of 18 nodes healthy, 56 of 72 GPUs usable — 4 of 18 nodes bad" in html
    assert '<li id="ultraserver-us-b"><span class="badge verdict-healthy"' in html
    plain = ClusterModel()
    plain.apply("Node", "ADDED", s.node("p0", ("nn-1", "nn-2", "nn-9")), T0)
    assert "UltraServers" not in topology_page(topology_picture(plain))


# --- the simulated HyperPod cluster --------------------------------------------------------------


def test_the_simulated_ultraserver_carries_its_fabric_and_turns_degraded_on_a_fault() -> None:
    """The simulated cluster's p6e-gb200 UltraServer (18 nodes): each node's agent annotation
    names one cluster UUID and clique, so the domain is agreed; a node fault the simulated
    HyperPod repairs (cordoned meanwhile) degrades it."""
    from exporter.sim.cluster import SimulatedCluster
    from exporter.sim.hyperpod_layout import ClusterShape
    from exporter.sim.node_faults import FaultRates
    from tests.sim.test_sim_cluster import MemoryStore

    store = MemoryStore()
    shape = ClusterShape(p5_nodes=0, arrivals_per_minute=0.0, initial_workloads=0)
    start = 1_795_000_000.0
    cluster = SimulatedCluster(
        store, shape, seed=1, start=start, elastic=False, faults=FaultRates()
    )
    cluster.step(start + 1)

    def model() -> ClusterModel:
        m = ClusterModel()
        for obj in store.items("nodes"):
            m.apply("Node", "ADDED", obj, T0)
        return m

    (v,) = verdicts(model().nodes).values()
    assert (v.verdict, v.nodes_total, v.fabric_agreed, v.gpus_usable) == ("healthy", 18, True, 72)
    victim = sorted(n["metadata"]["name"] for n in store.items("nodes"))[0]
    cluster.inject_node_fault(victim, "faulty_gpu")
    cluster.step(start + 120)  # cordoned, then marked UnschedulablePendingReplacement
    (v,) = verdicts(model().nodes).values()
    assert (v.verdict, v.nodes_healthy) == ("degraded", 17)
    assert v.bad_nodes == (victim,)
