"""The cluster service's per-level capacity metrics carry a `flavor` label, and the team quota
metrics follow the one quota model.

A mixed cluster of p5 (8 GPUs a node) and GB200 (4 GPUs a node) nodes, two ResourceFlavors
selecting them by instance type, and one layer-3 network node holding nodes of both: each
flavor's free GPUs and largest free block count only its own nodes, so a p5 job is never told
about GB200 GPUs. Without ResourceFlavors one set with flavor="" covers every node. Every Kueue
fixture validates against the CRDs.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from exporter.cluster.metrics import render as metrics
from exporter.cluster.model import ClusterModel
from exporter.core.exposition import encode_text
from exporter.sim import synthetic as s
from tests.conftest import promtool_lint
from tests.crds import assert_valid_kueue

T0 = 1_795_000_000.0
P5 = "ml.p5.48xlarge"
GB200 = "ml.p6e-gb200.36xlarge"
L3 = "network-node-layer-3"
GPU = "nvidia.com/gpu"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"

Sample = tuple[str, frozenset[tuple[str, str]]]


def kueue(obj: dict[str, Any]) -> dict[str, Any]:
    assert_valid_kueue(obj)
    return obj


def flavor(name: str) -> dict[str, Any]:
    return kueue(
        {
            "apiVersion": s.KUEUE_V1BETA2,
            "kind": "ResourceFlavor",
            "metadata": {"name": name, "resourceVersion": "1"},
            "spec": {"nodeLabels": {INSTANCE_TYPE: name}},
        }
    )


def gb200(name: str, l3: str, ultraserver: str, **kwargs: Any) -> dict[str, Any]:
    return s.node(
        name,
        ("nn-top", "nn-mid", l3),
        gpus=4,
        instance_type=GB200,
        ultraserver=ultraserver,
        **kwargs,
    )


def mixed_cluster(model: ClusterModel, flavors: bool = True) -> None:
    """p5 nodes p1, p2 under layer-3 nn-a and p3 under nn-s; GB200 nodes g1-g3 under nn-s (the
    layer-3 network node both kinds share) in UltraServer us-1, and g4 under nn-g in us-2.
    Free at layer 3: p5 16 in nn-a and 8 in nn-s; GB200 12 in nn-s and 4 in nn-g; mixed
    together nn-s would look like the largest block, with 20."""
    for name, l3 in (("p1", "nn-a"), ("p2", "nn-a"), ("p3", "nn-s")):
        model.apply("Node", "ADDED", s.node(name, ("nn-top", "nn-mid", l3)), T0)
    for name, l3, ultraserver in (
        ("g1", "nn-s", "us-1"),
        ("g2", "nn-s", "us-1"),
        ("g3", "nn-s", "us-1"),
        ("g4", "nn-g", "us-2"),
    ):
        model.apply("Node", "ADDED", gb200(name, l3, ultraserver), T0)
    if flavors:
        for name in (P5, GB200):
            model.apply("ResourceFlavor", "ADDED", flavor(name), T0)


def scrape(model: ClusterModel) -> dict[Sample, float]:
    body = encode_text(metrics.render(model))
    assert promtool_lint(body) == ""
    out: dict[Sample, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: dict[Sample, float], name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no {name}{labels}"
    return samples[key]


def domain_gpus(
    samples: dict[Sample, float], flavor: str, domain: str, state: str, level: str = L3
) -> float | None:
    labels = {"flavor": flavor, "level": level, "domain": domain, "state": state}
    return samples.get(("topowatch_cluster_domain_gpus", frozenset(labels.items())))


def per_level(samples: dict[Sample, float], name: str, flavor: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for (sample_name, labels), number in samples.items():
        labelled = dict(labels)
        if sample_name == name and labelled.get("flavor", "") == flavor:
            found[labelled["level"]] = number
    return found


def test_each_flavor_counts_only_its_own_nodes() -> None:
    model = ClusterModel()
    mixed_cluster(model)
    got = scrape(model)
    assert value(got, "topowatch_cluster_free_gpus", flavor=P5, level=L3) == 24
    assert value(got, "topowatch_cluster_free_gpus", flavor=GB200, level=L3) == 16
    assert value(got, "topowatch_cluster_largest_free_block_gpus", flavor=P5, level=L3) == 16
    assert value(got, "topowatch_cluster_largest_free_block_gpus", flavor=GB200, level=L3) == 12
    assert value(got, "topowatch_cluster_fragmentation_ratio", flavor=P5, level=L3) == 1 - 16 / 24
    assert value(got, "topowatch_cluster_domains", flavor=P5, level=L3) == 2
    # The shared network node appears once per flavor, with that flavor's GPUs only.
    for name, gpus in ((P5, 8), (GB200, 12)):
        assert [domain_gpus(got, name, "nn-s", state) for state in ("allocatable", "free")] == [
            gpus,
            gpus,
        ]
    assert domain_gpus(got, P5, "nn-g", "free") is None  # no p5 node there
    # UltraServers are GB200's: the p5 flavor has none, and says so.
    assert (
        value(got, "topowatch_cluster_largest_free_block_gpus", flavor=GB200, level="ultraserver")
        == 12
    )
    assert value(got, "topowatch_cluster_domains", flavor=P5, level="ultraserver") == 0
    assert value(got, "topowatch_cluster_free_gpus", flavor=P5, level="ultraserver") == 0
    # The flavors partition the nodes, so summing them over flavor gives the whole cluster.
    for level in ("zone", "network-node-layer-1", L3, "node"):
        whole = model.tree.fragmentation(level).free
        assert (
            sum(per_level(got, "topowatch_cluster_free_gpus", f)[level] for f in (P5, GB200))
            == whole
        )


def test_use_and_unusable_nodes_move_only_their_flavor() -> None:
    model = ClusterModel()
    mixed_cluster(model)
    wl = kueue(
        s.workload(
            "hyperpod-ns-alpha",
            "train",
            1,
            8,
            T0,
            conditions=s.admitted_conditions("alpha", T0),
            cluster_queue="alpha",
            assignment=[(("p1",), 1)],
        )
    )
    model.apply("Workload", "ADDED", wl, T0)
    job_uid = wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]
    model.apply(
        "Pod", "ADDED", s.pod("hyperpod-ns-alpha", "train-0", "p1", 8, job_uid, "train"), T0
    )
    # g1 is cordoned; g4 carries a NoSchedule taint no flavor tolerates.
    model.apply("Node", "MODIFIED", gb200("g1", "nn-s", "us-1", unschedulable=True, rv="2"), T0)
    tainted = gb200("g4", "nn-g", "us-2", rv="2")
    tainted["spec"]["taints"] = [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]
    model.apply("Node", "MODIFIED", tainted, T0)
    got = scrape(model)
    assert value(got, "topowatch_cluster_free_gpus", flavor=P5, level=L3) == 16
    # p5's two blocks now hold 8 each: the tie goes to the smaller id, nn-a.
    assert value(got, "topowatch_cluster_largest_free_block_gpus", flavor=P5, level=L3) == 8
    assert domain_gpus(got, P5, "nn-a", "used") == 8
    assert value(got, "topowatch_cluster_free_gpus", flavor=GB200, level=L3) == 8
    assert value(got, "topowatch_cluster_largest_free_block_gpus", flavor=GB200, level=L3) == 8
    assert [domain_gpus(got, GB200, d, "unschedulable") for d in ("nn-s", "nn-g")] == [4, 4]
    assert [domain_gpus(got, GB200, d, "free") for d in ("nn-s", "nn-g")] == [8, 0]
    assert domain_gpus(got, GB200, "nn-s", "allocatable") == 12  # cordoned, still its node


def test_without_resource_flavors_one_set_covers_every_node() -> None:
    model = ClusterModel()
    mixed_cluster(model, flavors=False)
    got = scrape(model)
    assert value(got, "topowatch_cluster_free_gpus", flavor="", level=L3) == 40
    assert value(got, "topowatch_cluster_largest_free_block_gpus", flavor="", level=L3) == 20
    assert domain_gpus(got, "", "nn-s", "free") == 20
    assert not [key for key in got if dict(key[1]).get("flavor")]


# --- team quota ------------------------------------------------------------------------------


def two_flavor_queue(name: str, quotas: dict[str, int], used: dict[str, int]) -> dict[str, Any]:
    """A v1beta2 ClusterQueue in cohort "research" with GPU quota in each flavor of `quotas`
    and `used` GPUs reserved per flavor (status.flavorsReservation, as Kueue writes it)."""
    reservation = [
        {
            "name": f,
            "resources": [
                {"name": GPU, "total": str(n), "borrowed": str(max(0, n - quotas.get(f, 0)))}
            ],
        }
        for f, n in used.items()
    ]
    return kueue(
        {
            "apiVersion": s.KUEUE_V1BETA2,
            "kind": "ClusterQueue",
            "metadata": {"name": name, "resourceVersion": "1"},
            "spec": {
                "cohortName": "research",
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": [GPU],
                        "flavors": [
                            {"name": f, "resources": [{"name": GPU, "nominalQuota": n}]}
                            for f, n in quotas.items()
                        ],
                    }
                ],
            },
            "status": {"flavorsReservation": reservation, "flavorsUsage": reservation},
        }
    )


def team(samples: dict[Sample, float], queue: str, state: str) -> float | None:
    for (name, labels), number in samples.items():
        labelled = dict(labels)
        if (
            name == "topowatch_team_gpus"
            and labelled["cluster_queue"] == queue
            and labelled["state"] == state
        ):
            return number
    return None


def test_team_lending_is_per_flavor_and_follows_the_quota_tree() -> None:
    """alpha's p5 quota idles and its GB200 quota is all in use; beta borrows 8 GB200 GPUs,
    which only gamma's idle GB200 quota can lend. Shared out over idle quota of any flavor,
    alpha would be said to lend 5 of them and gamma 3."""
    model = ClusterModel()
    mixed_cluster(model)
    for cq in (
        two_flavor_queue("alpha", {P5: 16, GB200: 8}, {P5: 0, GB200: 8}),
        two_flavor_queue("beta", {GB200: 0}, {GB200: 8}),
        two_flavor_queue("gamma", {GB200: 8}, {GB200: 0}),
    ):
        model.apply("ClusterQueue", "ADDED", cq, T0)
    got = scrape(model)
    assert [team(got, q, "lent") for q in ("alpha", "beta", "gamma")] == [0, 0, 8]
    assert [team(got, q, "borrowed") for q in ("alpha", "beta", "gamma")] == [0, 8, 0]
    assert team(got, "alpha", "nominal") == 24


def test_team_lending_is_absent_when_the_quota_model_cannot_answer() -> None:
    model = ClusterModel()
    mixed_cluster(model)
    model.apply("ClusterQueue", "ADDED", two_flavor_queue("delta", {"ml.g5.48xlarge": 8}, {}), T0)
    got = scrape(model)
    assert team(got, "delta", "nominal") == 8
    assert team(got, "delta", "lent") is None  # inactive in Kueue: FlavorNotFound
