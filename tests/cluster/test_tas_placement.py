"""Flavor-aware, pod-granular capacity (exporter.cluster.capacity.placement) against Kueue's rules.

Every scenario is a small HyperPod-shaped cluster (core/v1 Node dicts through the real Node
parser, ResourceFlavors validated against the Kueue CRDs through tests/crds.py and the real
ResourceFlavor parser) and one question about a pod set shape, with the answer Kueue's
Topology-Aware Scheduling would give and the rule it rests on (kubernetes-sigs/kueue@ff69552e79ad
unless another source is named).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from exporter.cluster.capacity.placement import (
    Fit,
    NodeFreeMap,
    PlacementAnswer,
    eligible_nodes,
    fit,
    level_name,
    place,
    screen_nodes,
    tolerates,
    untolerated_taint,
)
from exporter.cluster.objects import Node, ResourceFlavor, Taint, Toleration, TopologyRequest
from exporter.cluster.parse.core import parse_node
from exporter.cluster.parse.kueue import parse_resource_flavor, parse_topology, topology_request
from exporter.topology.tree import TopologyTree
from tests.crds import assert_valid_kueue

L1 = "topology.k8s.aws/network-node-layer-1"
L2 = "topology.k8s.aws/network-node-layer-2"
L3 = "topology.k8s.aws/network-node-layer-3"
L4 = "topology.k8s.aws/network-node-layer-4"
HOSTNAME = "kubernetes.io/hostname"
INSTANCE = "node.kubernetes.io/instance-type"
ULTRASERVER = "topology.k8s.aws/ultraserver-id"
P5 = "ml.p5.48xlarge"
GB200 = "ml.p6e-gb200.36xlarge"
HYPERPOD_LEVELS = (L1, L2, L3, HOSTNAME)
GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


# --- fixtures: nodes, flavors, a topology --------------------------------------------------


def node_obj(
    name: str,
    layers: Sequence[str],
    *,
    instance: str = P5,
    gpus: int = 8,
    taints: Sequence[Mapping[str, str]] = (),
    cordoned: bool = False,
    ready: bool = True,
    ultraserver: str = "",
    health: str = "Schedulable",
) -> dict[str, Any]:
    """A HyperPod node as the API server serves it; `layers` are its network node ids,
    layer-1 first (p5 has three, newer types four)."""
    labels = {
        INSTANCE: instance,
        HOSTNAME: name,
        "topology.kubernetes.io/zone": "usw2-az2",
        "sagemaker.amazonaws.com/node-health-status": health,
    }
    for depth, value in enumerate(layers, start=1):
        labels[f"topology.k8s.aws/network-node-layer-{depth}"] = value
    if ultraserver:
        labels[ULTRASERVER] = ultraserver
    spec: dict[str, Any] = {"providerID": f"aws:///us-west-2b/{name}"}
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    if cordoned:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "191450m"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def flavor_obj(
    name: str,
    instance: str,
    *,
    tolerations: Sequence[Mapping[str, str]] = (GPU_TAINT,),
    node_taints: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """A HyperPod-style ResourceFlavor: one per instance type, on the network Topology."""
    spec: dict[str, Any] = {
        "nodeLabels": {INSTANCE: instance},
        "topologyName": "hyperpod-network-topology",
    }
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if node_taints:
        spec["nodeTaints"] = [dict(t) for t in node_taints]
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": spec,
    }


def flavor(obj: dict[str, Any]) -> ResourceFlavor:
    assert_valid_kueue(obj)  # never test a field no cluster would store
    problems: list[str] = []
    parsed = parse_resource_flavor(obj, problems)
    assert problems == []
    return parsed


P5_FLAVOR = flavor_obj(P5, P5)
GB200_FLAVOR = flavor_obj(GB200, GB200)


@dataclass
class Cluster:
    """Parsed nodes, and GPUs in use per node, seen both through the topology tree the model
    keeps and through a plain NodeFreeMap; both must give the same answers."""

    nodes: dict[str, Node]
    used: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, objs: Sequence[dict[str, Any]], used: Mapping[str, int] = {}) -> Cluster:
        nodes = {}
        for obj in objs:
            problems: list[str] = []
            node = parse_node(obj, problems)
            assert problems == []
            nodes[node.name] = node
        return cls(nodes, dict(used))

    def tree(self) -> TopologyTree:
        tree = TopologyTree()
        for node in self.nodes.values():
            tree.set_node(node.name, dict(node.labels), node.allocatable_gpus, node.schedulable)
        for name, gpus in self.used.items():
            tree.add_used(name, gpus)
        return tree

    def views(self) -> tuple[TopologyTree, NodeFreeMap]:
        return self.tree(), NodeFreeMap.from_nodes(self.nodes, self.used)


def both(cluster: Cluster, question: Any) -> Any:
    """Ask through the tree and through the plain map; the answers must agree."""
    tree, plain = cluster.views()
    answer = question(tree)
    assert question(plain) == answer
    return answer


def nodes_in(prefix: str, count: int, layers: Sequence[str], **kw: Any) -> list[dict[str, Any]]:
    return [node_obj(f"{prefix}-{i}", layers, **kw) for i in range(count)]


def required(level: str) -> TopologyRequest:
    return TopologyRequest("required", level)


def preferred(level: str) -> TopologyRequest:
    return TopologyRequest("preferred", level)


# --- taints and tolerations ----------------------------------------------------------------

MAINT = Taint("example.com/maintenance", "true", "NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        # core/v1 Toleration.ToleratesTaint (k8s.io/component-helpers/scheduling/corev1)
        (Toleration("example.com/maintenance", "Equal", "true", "NoSchedule"), MAINT, True),
        (Toleration("example.com/maintenance", "", "true", ""), MAINT, True),  # "" is Equal
        (Toleration("example.com/maintenance", "Equal", "false", "NoSchedule"), MAINT, False),
        (Toleration("example.com/maintenance", "Exists", "", ""), MAINT, True),
        (Toleration("example.com/maintenance", "Exists", "", "NoExecute"), MAINT, False),
        (Toleration("", "Exists", "", ""), MAINT, True),  # empty key + Exists: everything
        (Toleration("other", "Exists", "", ""), MAINT, False),
        (Toleration("x", "Lt", "5", ""), Taint("x", "3", "NoSchedule"), True),  # taint < 5
        (Toleration("x", "Lt", "5", ""), Taint("x", "7", "NoSchedule"), False),
        (Toleration("x", "Gt", "5", ""), Taint("x", "7", "NoSchedule"), True),  # taint > 5
        (Toleration("x", "Gt", "5", ""), Taint("x", "seven", "NoSchedule"), False),
        (Toleration("x", "Gt", "05", ""), Taint("x", "7", "NoSchedule"), False),  # not canonical
        (Toleration("x", "Matches", "7", ""), Taint("x", "7", "NoSchedule"), False),
    ],
)
def test_tolerations_follow_core_v1(toleration: Toleration, taint: Taint, tolerated: bool) -> None:
    assert tolerates(toleration, taint) is tolerated


def test_only_noschedule_and_noexecute_taints_exclude() -> None:
    # IsSchedulingTaint (pkg/util/taints/taints.go): PreferNoSchedule never excludes a node.
    soft = Taint("example.com/soft", "", "PreferNoSchedule")
    hard = Taint("example.com/evict", "", "NoExecute")
    assert untolerated_taint([soft], []) is None
    assert untolerated_taint([soft, hard], []) == hard
    assert untolerated_taint([hard], [Toleration("example.com/evict", "Exists", "", "")]) is None


# --- parsers: the Node and ResourceFlavor fields placement reads ----------------------------


def test_node_parser_reads_taints_and_cordon() -> None:
    obj = node_obj("hyperpod-i-0a1", ["nn-1", "nn-2", "nn-3"], taints=[GPU_TAINT | {"value": ""}])
    obj["spec"]["taints"].append({"key": "k", "value": "v", "effect": "NoExecute"})
    obj["spec"]["taints"].append({"value": "no key"})  # refused by the API server; noted
    obj["spec"]["unschedulable"] = True
    problems: list[str] = []
    node = parse_node(obj, problems)
    assert node.taints == (Taint("nvidia.com/gpu", "", "NoSchedule"), Taint("k", "v", "NoExecute"))
    assert node.cordoned and not node.schedulable
    assert problems == ["spec.taints[2]: a taint needs a key and an effect (ignored)"]
    assert parse_node(node_obj("n", ["a"])).taints == ()
    assert not parse_node(node_obj("n", ["a"])).cordoned


def test_flavor_parser_reads_tolerations_and_node_taints() -> None:
    obj = flavor_obj(
        "spot-p5",
        P5,
        node_taints=[{"key": "example.com/spot", "value": "true", "effect": "NoSchedule"}],
    )
    parsed = flavor(obj)
    assert parsed.node_labels == ((INSTANCE, P5),)
    assert parsed.tolerations == (Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule"),)
    assert parsed.node_taints == (Taint("example.com/spot", "true", "NoSchedule"),)
    for version in ("v1beta1", "v1beta2"):  # both served versions spell them the same way
        assert flavor(obj | {"apiVersion": f"kueue.x-k8s.io/{version}"}) == parsed


# --- which nodes a queue's flavor may use ---------------------------------------------------


def test_a_p5_flavor_leaves_gb200_nodes_out_and_says_why() -> None:
    # NodeMatchesFlavor (pkg/util/tas/node.go): every flavor nodeLabel, equal values.
    cluster = Cluster.of(
        [
            *nodes_in("p5", 2, ["nn-a", "nn-b", "nn-p5"]),
            *nodes_in("gb", 3, ["nn-a", "nn-c", "nn-d", "nn-gb"], instance=GB200, gpus=4),
        ]
    )
    screened = screen_nodes(flavor(P5_FLAVOR), cluster.nodes)
    assert screened.nodes == {"p5-0", "p5-1"}
    assert screened.count("flavor") == 3
    assert screened.summary == (
        f"2 of 5 nodes usable on flavor {P5}; left out: 3 not selected by the flavor"
        f" ({INSTANCE}={P5})"
    )
    assert eligible_nodes(flavor(P5_FLAVOR), cluster.nodes.values()) == {"p5-0", "p5-1"}


def test_exclusions_in_kueues_order() -> None:
    """Flavor labels and Topology labels (tas_nodes_cache.go find), Ready and not cordoned
    (tas_nodes_cache.go sync), untolerated NoSchedule/NoExecute taints, then nodeSelector
    (scheduling_simulator_default.go FindFeasibleNodes steps 1-2)."""
    layers = ["nn-a", "nn-b", "nn-c"]
    maintenance = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}
    cluster = Cluster.of(
        [
            node_obj("ok", layers, taints=[GPU_TAINT]),  # tolerated by the flavor
            node_obj("soft", layers, taints=[{"key": "s", "effect": "PreferNoSchedule"}]),
            node_obj("tainted", layers, taints=[maintenance]),
            node_obj("cordoned", layers, cordoned=True, taints=[maintenance]),
            node_obj("notready", layers, ready=False),
            node_obj("sick", layers, health="UnschedulablePendingReplacement"),
            node_obj("flat", ["nn-a", "nn-b"]),  # no layer-3 label: not in the TAS tree
            node_obj("gb", ["nn-a", "nn-b", "nn-c", "nn-d"], instance=GB200),
        ]
    )
    screened = screen_nodes(flavor(P5_FLAVOR), cluster.nodes, topology_levels=HYPERPOD_LEVELS)
    assert screened.nodes == {"ok", "soft"}
    assert {e.node: e.cause for e in screened.excluded} == {
        "tainted": "taint",
        "cordoned": "cordoned",
        "notready": "not-ready",
        "sick": "unhealthy",
        "flat": "topology-label",
        "gb": "flavor",
    }
    assert "1 tainted without a toleration (example.com/maintenance=true:NoSchedule" in (
        screened.summary
    )
    assert f"1 missing a Topology level label (no {L3})" in screened.summary

    # A pod toleration lets the tainted node in; a nodeSelector can still keep it out.
    pod_toleration = Toleration("example.com/maintenance", "Equal", "true", "NoSchedule")
    assert eligible_nodes(flavor(P5_FLAVOR), cluster.nodes, tolerations=[pod_toleration]) == {
        "ok",
        "soft",
        "tainted",
        "flat",
    }
    picky = screen_nodes(flavor(P5_FLAVOR), cluster.nodes, node_selector={HOSTNAME: "ok"})
    assert picky.nodes == {"ok"}
    assert picky.count("node-selector") == 2  # soft, flat

    # Without the flavor's own toleration the GPU taint keeps "ok" out too.
    bare = flavor(flavor_obj(P5, P5, tolerations=()))
    assert "ok" not in eligible_nodes(bare, cluster.nodes)


def test_flavor_node_taints_not_tolerated_make_the_flavor_unusable() -> None:
    # checkFlavorForPodSets (pkg/scheduler/flavorassigner/flavorassigner.go): spec.nodeTaints
    # against the pod's tolerations plus the flavor's.
    spot = {"key": "example.com/spot", "value": "true", "effect": "NoSchedule"}
    spot_flavor = flavor(flavor_obj("spot-p5", P5, node_taints=[spot]))
    cluster = Cluster.of(nodes_in("p5", 2, ["nn-a", "nn-b", "nn-c"]))
    screened = screen_nodes(spot_flavor, cluster.nodes)
    assert screened.nodes == frozenset() and screened.count("flavor-taint") == 2
    tolerated = Toleration("example.com/spot", "Exists", "", "")
    assert eligible_nodes(spot_flavor, cluster.nodes, tolerations=[tolerated]) == {"p5-0", "p5-1"}


# --- the scenario table ---------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    rule: str  # the Kueue rule the expected answer rests on
    nodes: Sequence[dict[str, Any]]
    used: Mapping[str, int]
    flavor: dict[str, Any] | None
    request: TopologyRequest
    pods: int
    gpus_per_pod: int
    placeable: bool
    level: str  # where it lands, "" when it does not
    domains: tuple[str, ...]
    summary: str
    levels: Sequence[str] | None = HYPERPOD_LEVELS


def _fragmented() -> list[dict[str, Any]]:
    return nodes_in("frag", 4, ["nn-1", "nn-2", "nn-frag"])


def _two_racks() -> list[dict[str, Any]]:
    """One layer-2 domain over two layer-3 domains of 2 free p5 nodes each, and a second
    layer-1 domain with one more layer-3 domain of 2 free nodes."""
    return [
        *nodes_in("ra", 2, ["nn-1", "nn-2", "nn-3a"]),
        *nodes_in("rb", 2, ["nn-1", "nn-2", "nn-3b"]),
        *nodes_in("rc", 2, ["nn-9", "nn-8", "nn-3c"]),
    ]


def _mixed() -> list[dict[str, Any]]:
    """A p5 layer-3 domain with one free node and a GB200 UltraServer, all free."""
    return [
        *nodes_in("p5", 2, ["nn-1", "nn-2", "nn-p5"]),
        *nodes_in(
            "gb", 8, ["nn-1", "nn-5", "nn-6", "nn-gb"], instance=GB200, gpus=4, ultraserver="us-1"
        ),
    ]


SCENARIOS = [
    Scenario(
        name="fragmented-by-node",
        rule="fillLeafCounts: a node holds floor(free/per-pod) whole pods; a domain the sum",
        nodes=_fragmented(),
        used={f"frag-{i}": 4 for i in range(4)},  # 4 x 4 free = 16 free GPUs in one domain
        flavor=P5_FLAVOR,
        request=required(L3),
        pods=2,
        gpus_per_pod=8,
        placeable=False,
        level="",
        domains=(),
        summary=(
            "required network-node-layer-3: fits 0 of 2 pods of 8 GPUs in the largest free"
            " network-node-layer-3 domain nn-frag (16 free GPUs there, but no node has 8 free:"
            " at most 4 on any of its 4 nodes)"
        ),
    ),
    Scenario(
        name="mixed-instance-types-p5-queue",
        rule="NodeMatchesFlavor: the p5 flavor's nodeLabels leave the GB200 domain out",
        nodes=_mixed(),
        used={"p5-0": 8},
        flavor=P5_FLAVOR,
        request=required(L3),
        pods=4,
        gpus_per_pod=4,
        placeable=False,
        level="",
        domains=(),
        summary=(
            "required network-node-layer-3: fits 2 of 4 pods of 4 GPUs in the largest free"
            " network-node-layer-3 domain nn-p5 (8 free GPUs there)"
        ),
    ),
    Scenario(
        name="mixed-instance-types-gb200-queue",
        rule="NodeMatchesFlavor: the GB200 flavor selects the GB200 nodes only",
        nodes=_mixed(),
        used={"p5-0": 8},
        flavor=GB200_FLAVOR,
        request=required(L3),
        pods=4,
        gpus_per_pod=4,
        placeable=True,
        level="network-node-layer-3",
        domains=("nn-6",),  # GB200 nodes hang from layer 4: nn-gb sits under nn-6
        summary=(
            "required network-node-layer-3: fits 4 of 4 pods of 4 GPUs in"
            " network-node-layer-3 domain nn-6"
        ),
        levels=None,
    ),
    Scenario(
        name="tainted-node-not-tolerated",
        rule="FindFeasibleNodes step 1: an untolerated NoSchedule taint excludes the node",
        nodes=[
            node_obj("t-0", ["nn-1", "nn-2", "nn-t"]),
            node_obj(
                "t-1",
                ["nn-1", "nn-2", "nn-t"],
                taints=[{"key": "example.com/maintenance", "effect": "NoSchedule"}],
            ),
        ],
        used={},
        flavor=P5_FLAVOR,
        request=required(L3),
        pods=2,
        gpus_per_pod=8,
        placeable=False,
        level="",
        domains=(),
        summary=(
            "required network-node-layer-3: fits 1 of 2 pods of 8 GPUs in the largest free"
            " network-node-layer-3 domain nn-t (8 free GPUs there)"
        ),
    ),
    Scenario(
        name="cordoned-node",
        rule="tas_nodes_cache.go sync: only Ready, schedulable nodes count",
        nodes=[
            node_obj("c-0", ["nn-1", "nn-2", "nn-c"]),
            node_obj("c-1", ["nn-1", "nn-2", "nn-c"], cordoned=True),
        ],
        used={},
        flavor=P5_FLAVOR,
        request=required(L3),
        pods=2,
        gpus_per_pod=8,
        placeable=False,
        level="",
        domains=(),
        summary=(
            "required network-node-layer-3: fits 1 of 2 pods of 8 GPUs in the largest free"
            " network-node-layer-3 domain nn-c (8 free GPUs there)"
        ),
    ),
    Scenario(
        name="required-does-not-climb",
        rule="findLevelWithFitDomains: required returns the not-fit reason at its level",
        nodes=_two_racks(),
        used={},
        flavor=P5_FLAVOR,
        request=required(L3),
        pods=4,
        gpus_per_pod=8,
        placeable=False,
        level="",
        domains=(),
        summary=(
            "required network-node-layer-3: fits 2 of 4 pods of 8 GPUs in the largest free"
            " network-node-layer-3 domain nn-3a (16 free GPUs there)"
        ),
    ),
    Scenario(
        name="preferred-climbs-one-level",
        rule="findLevelWithFitDomains: preferred recurses to the level above",
        nodes=_two_racks(),
        used={},
        flavor=P5_FLAVOR,
        request=preferred(L3),
        pods=4,
        gpus_per_pod=8,
        placeable=True,
        level="network-node-layer-2",
        domains=("nn-2",),
        summary=(
            "preferred network-node-layer-3: fits 2 of 4 pods of 8 GPUs in the largest free"
            " network-node-layer-3 domain nn-3a (16 free GPUs there); one level up, fits 4 of"
            " 4 pods of 8 GPUs in network-node-layer-2 domain nn-2"
        ),
    ),
    Scenario(
        name="preferred-spreads-at-the-top",
        rule="findLevelWithFitDomains at the highest level: greedy over several domains",
        nodes=_two_racks(),
        used={},
        flavor=P5_FLAVOR,
        request=preferred(L3),
        pods=6,
        gpus_per_pod=8,
        placeable=True,
        level="network-node-layer-1",
        domains=("nn-1", "nn-9"),
        summary=(
            "preferred network-node-layer-3: no single domain up to network-node-layer-1"
            " holds 6 pods of 8 GPUs; spread over 2 network-node-layer-1 domains (nn-1, nn-9)"
        ),
    ),
    Scenario(
        name="preferred-beyond-the-cluster",
        rule="findLevelWithFitDomains: not-fit reason when even all top domains fall short",
        nodes=_two_racks(),
        used={},
        flavor=P5_FLAVOR,
        request=preferred(L3),
        pods=7,
        gpus_per_pod=8,
        placeable=False,
        level="",
        domains=(),
        summary=(
            "preferred network-node-layer-3: no single domain up to network-node-layer-1"
            " holds 7 pods of 8 GPUs; even spread over every network-node-layer-1 domain"
            " only 6 fit"
        ),
    ),
    Scenario(
        name="slices-in-one-block",
        rule="fillInCountsHelper: a layer-2 domain holds the sum of its layer-3 slice counts",
        nodes=_two_racks(),
        used={},
        flavor=P5_FLAVOR,
        request=TopologyRequest("required", L2, slice_level=L3, slice_size=2),
        pods=4,
        gpus_per_pod=8,
        placeable=True,
        level="network-node-layer-2",
        domains=("nn-2",),
        summary=(
            "required network-node-layer-2: fits 4 of 4 pods of 8 GPUs (2 of 2 slices of"
            " 2 pods, each in one network-node-layer-3 domain) in network-node-layer-2"
            " domain nn-2"
        ),
    ),
    Scenario(
        name="slice-larger-than-any-rack",
        rule="fillInCountsHelper: floor(pods in the slice domain / slice size)",
        nodes=_two_racks(),
        used={},
        flavor=P5_FLAVOR,
        request=TopologyRequest("required", L2, slice_level=L3, slice_size=4),
        pods=4,
        gpus_per_pod=8,
        placeable=False,
        level="",
        domains=(),
        summary=(
            "required network-node-layer-2: fits 0 of 4 pods of 8 GPUs (0 of 1 slices of"
            " 4 pods, each in one network-node-layer-3 domain) in the largest free"
            " network-node-layer-2 domain nn-2 (32 free GPUs there, room for 4 pods, but only"
            " 0 whole slices of 4 within one network-node-layer-3 domain)"
        ),
    ),
    Scenario(
        name="slices-alone-spread",
        rule="levelKey: a slice-only request is unconstrained at the highest level",
        nodes=_two_racks(),
        used={},
        flavor=P5_FLAVOR,
        request=TopologyRequest("none", None, slice_level=L3, slice_size=2),
        pods=6,
        gpus_per_pod=8,
        placeable=True,
        level="network-node-layer-1",
        domains=("nn-9", "nn-1"),
        summary=(
            "slices at network-node-layer-1: fits 6 pods of 8 GPUs in slices of 2 within"
            " one network-node-layer-3 each on 2 network-node-layer-1 domains"
        ),
    ),
    Scenario(
        name="unconstrained",
        rule="levelKey/isUnconstrained: any nodes, lowest level, least free first",
        nodes=_two_racks(),
        used={"ra-0": 4},  # ra-0 has room for 1 pod of 4 GPUs, every other node for 2
        flavor=P5_FLAVOR,
        request=TopologyRequest("unconstrained", None),
        pods=3,
        gpus_per_pod=4,
        placeable=True,
        level="node",
        domains=("ra-0", "ra-1"),  # the small gap first
        summary="unconstrained at node: fits 3 pods of 4 GPUs on 2 nodes",
    ),
    Scenario(
        name="no-domain-at-the-level",
        rule="findLevelWithFitDomains: 'no topology domains at level' places nothing",
        nodes=_fragmented(),
        used={},
        flavor=P5_FLAVOR,
        request=required(L4),
        pods=2,
        gpus_per_pod=8,
        placeable=False,
        level="",
        domains=(),
        summary=(
            "required network-node-layer-4: no network-node-layer-4 domain to place 2 pods"
            " of 8 GPUs in: none of the 4 eligible nodes carries the label"
            f" {L4}"
        ),
        levels=None,
    ),
    Scenario(
        name="level-not-in-the-topology",
        rule="findTopologyAssignment: 'no requested topology level'",
        nodes=_fragmented(),
        used={},
        flavor=P5_FLAVOR,
        request=preferred(L4),
        pods=2,
        gpus_per_pod=8,
        placeable=False,
        level="",
        domains=(),
        summary=f"cannot place 2 pods of 8 GPUs: {L4} is not a level of the flavor's Topology",
    ),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_scenario(scenario: Scenario) -> None:
    cluster = Cluster.of(scenario.nodes, scenario.used)
    chosen = flavor(scenario.flavor) if scenario.flavor is not None else None
    eligible = eligible_nodes(chosen, cluster.nodes)

    def ask(capacity: Any) -> PlacementAnswer:
        return place(
            capacity,
            eligible,
            scenario.request,
            scenario.pods,
            scenario.gpus_per_pod,
            levels=scenario.levels,
        )

    answer = both(cluster, ask)
    assert (answer.placeable, answer.level, answer.domains) == (
        scenario.placeable,
        scenario.level,
        scenario.domains,
    ), scenario.rule
    assert answer.summary == scenario.summary, scenario.rule
    assert answer.pods_needed == scenario.pods and answer.gpus_per_pod == scenario.gpus_per_pod


# --- the rules one by one -----------------------------------------------------------------


def test_fragmented_domain_has_the_gpus_but_not_the_pods() -> None:
    cluster = Cluster.of(_fragmented(), {f"frag-{i}": 4 for i in range(4)})
    tree = cluster.tree()
    largest = tree.largest_free("network-node-layer-3")
    assert largest is not None and largest.free == 16  # a GPU count says 2 x 8 fits
    eligible = eligible_nodes(flavor(P5_FLAVOR), cluster.nodes)
    answer = fit(tree, eligible, L3, pods=2, gpus_per_pod=8)
    assert (answer.status, answer.pods_fit, answer.free_gpus) == ("too-small", 0, 16)
    assert answer.gpus_needed == 16 and not answer.fits
    # The same domain takes 4 pods of 4 GPUs: one per node.
    assert fit(tree, eligible, L3, pods=4, gpus_per_pod=4).fits


def test_leftovers_smaller_than_a_pod_do_not_add_up() -> None:
    # 2 nodes x 12 free = 24 free GPUs, room for 2 pods of 8 (not 3).
    cluster = Cluster.of(nodes_in("n", 2, ["nn-1", "nn-2", "nn-x"], gpus=16), {"n-0": 4, "n-1": 4})
    answer = both(cluster, lambda c: fit(c, set(cluster.nodes), L3, pods=3, gpus_per_pod=8))
    assert (answer.pods_fit, answer.domain_pods, answer.free_gpus) == (2, 2, 24)
    assert answer.summary.endswith(
        "(24 free GPUs there, but in whole pods per node its 2 nodes hold 2)"
    )


def test_best_fit_picks_the_tightest_domain_that_holds_all() -> None:
    # findBestFitDomainBy: among domains that hold the pods, the one with the fewest.
    cluster = Cluster.of(
        [
            *nodes_in("big", 4, ["nn-1", "nn-2", "nn-big"]),
            *nodes_in("small", 2, ["nn-1", "nn-2", "nn-small"]),
            *nodes_in("tiny", 1, ["nn-1", "nn-2", "nn-tiny"]),
        ]
    )
    eligible = set(cluster.nodes)
    two = both(cluster, lambda c: fit(c, eligible, L3, pods=2, gpus_per_pod=8))
    assert (two.domain, two.pods_fit) == ("nn-small", 2)
    five = both(cluster, lambda c: fit(c, eligible, L3, pods=5, gpus_per_pod=8))
    assert (five.status, five.domain, five.pods_fit) == ("too-small", "nn-big", 4)


def test_levels_by_name_or_label_key() -> None:
    assert level_name(L3) == level_name("network-node-layer-3") == "network-node-layer-3"
    assert level_name(HOSTNAME) == "node"
    assert level_name(ULTRASERVER) == "ultraserver"
    assert level_name("cloud.provider.com/topology-rack") is None
    cluster = Cluster.of(_mixed())
    gb = eligible_nodes(flavor(GB200_FLAVOR), cluster.nodes)
    by_ultraserver = fit(cluster.tree(), gb, ULTRASERVER, pods=8, gpus_per_pod=4)
    assert (by_ultraserver.status, by_ultraserver.domain) == ("fits", "us-1")
    unknown = fit(cluster.tree(), gb, "cloud.provider.com/topology-rack", 1, 4)
    assert unknown.status == "invalid"
    assert unknown.summary == (
        "cannot judge 1 pod of 4 GPUs: unknown topology level 'cloud.provider.com/topology-rack'"
    )


def test_topology_levels_exclude_nodes_lacking_a_level() -> None:
    # NodeMatchesFlavor's requiredLevels: with layer-4 in the Topology, 3-layer p5 nodes are
    # not in the flavor's TAS tree at all, and the answer says so.
    topology = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Topology",
        "metadata": {"name": "four-layers"},
        "spec": {"levels": [{"nodeLabel": key} for key in (L1, L2, L3, L4, HOSTNAME)]},
    }
    assert_valid_kueue(topology)
    levels = parse_topology(topology).levels
    cluster = Cluster.of(_fragmented())
    screened = screen_nodes(flavor(P5_FLAVOR), cluster.nodes, topology_levels=levels)
    assert screened.nodes == frozenset() and screened.count("topology-label") == 4
    answer = place(cluster.tree(), screened.nodes, required(L4), 2, 8, levels=levels)
    assert not answer.placeable
    assert answer.summary == "required network-node-layer-4: no eligible node for 2 pods of 8 GPUs"
    assert screened.summary.endswith(f"4 missing a Topology level label (no {L4})")


def test_slice_shape_rules() -> None:
    # tas_validation.go: a slice size of at least 1, at most the pod count; the slice level
    # at or below the pod set level (findTopologyAssignment).
    cluster = Cluster.of(_two_racks())
    tree, eligible = cluster.tree(), set(cluster.nodes)
    too_big = fit(tree, eligible, L2, 2, 8, slice_level=L3, slice_size=4)
    assert too_big.summary == "cannot judge 2 pods of 8 GPUs: slice size 4 exceeds the pod count 2"
    upside_down = fit(tree, eligible, L3, 4, 8, slice_level=L1, slice_size=2)
    assert upside_down.reason == (
        "slice level network-node-layer-1 is above the pod set level network-node-layer-3"
    )
    assert fit(tree, eligible, L2, 4, 8, slice_size=2).status == "invalid"
    zero = place(tree, eligible, required(L3), 2, 0, levels=HYPERPOD_LEVELS)
    assert not zero.placeable and "request no GPUs" in zero.summary


def test_topology_request_from_annotations_drives_placement() -> None:
    # The pod template annotations Kueue reads (site/.../topology_aware_scheduling.md).
    pod_set = {
        "name": "workers",
        "count": 4,
        "template": {
            "metadata": {
                "annotations": {
                    "kueue.x-k8s.io/podset-required-topology": L2,
                    "kueue.x-k8s.io/podset-slice-required-topology": L3,
                    "kueue.x-k8s.io/podset-slice-size": "2",
                }
            }
        },
    }
    request = topology_request(pod_set)
    assert request == TopologyRequest("required", L2, slice_level=L3, slice_size=2)
    cluster = Cluster.of(_two_racks())
    answer = place(cluster.tree(), set(cluster.nodes), request, 4, 8, levels=HYPERPOD_LEVELS)
    assert answer.placeable and answer.domains == ("nn-2",)


def test_fit_for_a_queue_never_counts_another_flavors_domains() -> None:
    cluster = Cluster.of(_mixed(), {"p5-0": 8})
    tree = cluster.tree()
    everything = fit(tree, set(cluster.nodes), L3, pods=4, gpus_per_pod=4)
    assert (everything.fits, everything.domain) == (True, "nn-6")  # GB200: not this queue's
    p5_only = fit(tree, eligible_nodes(flavor(P5_FLAVOR), cluster.nodes), L3, 4, 4)
    assert (p5_only.fits, p5_only.domain, p5_only.pods_fit) == (False, "nn-p5", 2)
    assert "nn-6" not in p5_only.summary


def test_no_eligible_node() -> None:
    cluster = Cluster.of(_mixed())
    nothing: set[str] = set()
    answer: Fit = fit(cluster.tree(), nothing, L3, 1, 8)
    assert answer.status == "no-nodes"
    assert answer.summary == "no eligible node for 1 pod of 8 GPUs"
    spread = place(cluster.tree(), nothing, TopologyRequest("unconstrained", None), 1, 8)
    assert not spread.placeable and spread.summary == "no eligible node for 1 pod of 8 GPUs"
