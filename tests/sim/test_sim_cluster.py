"""The simulated HyperPod cluster and its mini Kueue, read back through what it writes.

Every check here looks at the API objects the simulation hands its writer (an in-memory store
that assigns uids and resourceVersions like the real one), because those are all the cluster
service will ever see.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from exporter.sim.cluster import ClusterShape, SimulatedCluster, default_shape
from exporter.sim.kueue.objects import encode_topology_assignment
from tests.conftest import reference
from tests.crds import assert_valid_kueue

START = 1_795_000_000.0
GPU = "nvidia.com/gpu"
L1 = "topology.k8s.aws/network-node-layer-1"
L2 = "topology.k8s.aws/network-node-layer-2"
L3 = "topology.k8s.aws/network-node-layer-3"
ULTRASERVER = "topology.k8s.aws/ultraserver-id"
HOSTNAME = "kubernetes.io/hostname"
KUEUE_PLURALS = {
    "workloads",
    "clusterqueues",
    "localqueues",
    "cohorts",
    "resourceflavors",
    "topologies",
    "workloadpriorityclasses",
}
Obj = dict[str, Any]


class MemoryStore:
    """A dict per resource; fills uid and resourceVersion the way the real store does."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[tuple[str, str], Obj]] = defaultdict(dict)
        self.log: list[tuple[str, str, Obj]] = []
        self._rv = 0

    def upsert(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        prev = self.objects[plural].get(key)
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        if prev is not None:
            meta["uid"] = prev["metadata"]["uid"]
        else:
            meta.setdefault("uid", str(uuid.uuid4()))
        self.objects[plural][key] = obj
        self.log.append(("upsert", plural, obj))
        return copy.deepcopy(obj)

    def delete(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.log.append(("delete", plural, {"metadata": {"namespace": namespace, "name": name}}))
        return self.objects[plural].pop((namespace, name), None)

    def items(self, plural: str) -> list[Obj]:
        return list(self.objects[plural].values())

    def workload(self, name: str) -> Obj:
        found = [w for w in self.items("workloads") if w["metadata"]["name"] == name]
        assert len(found) == 1, f"workload {name} not found"
        return found[0]

    def pods_of(self, workload: str) -> list[Obj]:
        return [
            p
            for p in self.items("pods")
            if p["metadata"]["annotations"]["kueue.x-k8s.io/workload"] == workload
        ]

    def events_on(self, workload: str, reason: str) -> list[Obj]:
        return [
            e
            for e in self.items("events")
            if e["involvedObject"]["name"] == workload and e["reason"] == reason
        ]


def conditions(obj: Obj) -> dict[str, Obj]:
    return {c["type"]: c for c in obj["status"].get("conditions", [])}


def decode_assignment(assignment: Obj) -> Counter[str]:
    """Pods per node from a v1beta2 topologyAssignment (written here, not shared with the
    encoder, so an encoding mistake shows up as a mismatch)."""
    host = assignment["levels"].index(HOSTNAME)
    per_node: Counter[str] = Counter()
    for piece in assignment["slices"]:
        n = piece["domainCount"]
        level = piece["valuesPerLevel"][host]
        if "universal" in level:
            names = [level["universal"]] * n
        else:
            ind = level["individual"]
            names = [ind.get("prefix", "") + r + ind.get("suffix", "") for r in ind["roots"]]
        counts = piece["podCounts"]
        pods = [counts["universal"]] * n if "universal" in counts else counts["individual"]
        for name, count in zip(names, pods, strict=True):
            per_node[name] += count
    return per_node


def pod_gpus(pod: Obj) -> int:
    return sum(int(c["resources"]["requests"][GPU]) for c in pod["spec"]["containers"])


def scripted(teams: tuple[str, ...] = ("a",), p5_nodes: int = 8) -> ClusterShape:
    return ClusterShape(
        p5_nodes=p5_nodes,
        ultraserver_nodes=0,
        teams=teams,
        arrivals_per_minute=0.0,
        initial_workloads=0,
    )


def run(cluster: SimulatedCluster, seconds: int, start: float = START) -> Iterator[float]:
    for i in range(1, seconds + 1):
        cluster.step(start + i)
        yield start + i


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


# --- the cluster's shape -------------------------------------------------------------------


def test_bootstrap_writes_a_hyperpod_shaped_cluster(store: MemoryStore) -> None:
    cluster = SimulatedCluster(store, default_shape(), seed=3)
    cluster.bootstrap()
    nodes = store.items("nodes")
    p5 = [
        n
        for n in nodes
        if n["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "ml.p5.48xlarge"
    ]
    gb200 = [n for n in nodes if n not in p5]
    assert (len(p5), len(gb200)) == (16, 18)
    for node in nodes:
        labels = node["metadata"]["labels"]
        assert re.fullmatch(r"hyperpod-i-0[0-9a-f]{16}", node["metadata"]["name"])
        assert labels[HOSTNAME] == node["metadata"]["name"]
        assert labels["sagemaker.amazonaws.com/node-health-status"] == "Schedulable"
        assert labels["topology.kubernetes.io/zone"] == "us-east-2a"
        assert all(re.fullmatch(r"nn-[0-9a-f]{17}", labels[k]) for k in (L1, L2, L3))
        assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
    layers = [{n["metadata"]["labels"][k] for n in p5} for k in (L1, L2, L3)]
    assert [len(values) for values in layers] == [1, 2, 4]
    us_labels = [n["metadata"]["labels"] for n in gb200]
    assert len({labels[ULTRASERVER] for labels in us_labels}) == 1
    assert {labels[L3] for labels in us_labels}.isdisjoint(layers[2])
    assert all(n["status"]["allocatable"][GPU] == "8" for n in p5)
    assert all(n["status"]["allocatable"][GPU] == "4" for n in gb200)

    topology = {t["metadata"]["name"]: t for t in store.items("topologies")}["hyperpod-default"]
    assert [lv["nodeLabel"] for lv in topology["spec"]["levels"]] == [L1, L2, L3, HOSTNAME]
    flavors = {f["metadata"]["name"]: f["spec"] for f in store.items("resourceflavors")}
    assert flavors["ml.p5.48xlarge"] == {
        "nodeLabels": {"node.kubernetes.io/instance-type": "ml.p5.48xlarge"},
        "topologyName": "hyperpod-default",
    }
    assert "ml.p6e-gb200.36xlarge" in flavors
    classes = {c["metadata"]["name"]: c["value"] for c in store.items("workloadpriorityclasses")}
    assert classes["inference-priority"] > classes["training-priority"]
    assert classes["training-priority"] > classes["fine-tuning-priority"]
    queues = {q["metadata"]["name"]: q for q in store.items("clusterqueues")}
    assert set(queues) == {f"hyperpod-ns-{t}-clusterqueue" for t in ("llm", "vision", "research")}
    assert {q["spec"]["cohortName"] for q in queues.values()} == {"hyperpod-cohort"}
    local = {
        (q["metadata"]["namespace"], q["metadata"]["name"]) for q in store.items("localqueues")
    }
    assert ("hyperpod-ns-llm", "hyperpod-ns-llm-localqueue") in local
    nominal = sum(
        int(r["nominalQuota"])
        for q in queues.values()
        for f in q["spec"]["resourceGroups"][0]["flavors"]
        for r in f["resources"]
    )
    assert nominal == 16 * 8 + 18 * 4  # the quota hands out exactly the cluster's GPUs


def test_same_seed_writes_the_same_objects() -> None:
    logs = []
    for seed in (7, 7, 8):
        store = MemoryStore()
        cluster = SimulatedCluster(store, default_shape(), seed=seed)
        for _ in run(cluster, 300):
            pass
        logs.append(json.dumps(store.log, sort_keys=True))
    assert logs[0] == logs[1]
    assert logs[0] != logs[2]


# --- scripted Kueue behaviour --------------------------------------------------------------


def test_quota_preemption_in_the_cluster_queue(store: MemoryStore) -> None:
    cluster = SimulatedCluster(store, scripted(), seed=1)
    bulk = cluster.submit("a", "bulk", 8, 8, "fine-tuning-priority", now=START, runtime_s=3000)
    cluster.step(START + 1)
    assert len(store.pods_of(bulk)) == 8
    serve = cluster.submit("a", "serve", 8, 1, "inference-priority", now=START + 1, runtime_s=60)
    cluster.step(START + 2)

    preemptor = store.workload(serve)
    uid = preemptor["metadata"]["uid"]
    job_uid = preemptor["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]
    assert preemptor["metadata"]["ownerReferences"][0]["uid"] == job_uid
    assert conditions(preemptor)["QuotaReserved"]["message"] == (
        "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu "
        "in flavor ml.p5.48xlarge, 8 more needed. Pending the preemption of 1 workload(s)"
    )
    victim = store.workload(bulk)
    got = conditions(victim)
    assert (got["Evicted"]["status"], got["Evicted"]["reason"]) == ("True", "Preempted")
    assert (got["Preempted"]["status"], got["Preempted"]["reason"]) == ("True", "InClusterQueue")
    path = "/hyperpod-cohort/hyperpod-ns-a-clusterqueue"
    expected = (
        f"Preempted to accommodate a workload (UID: {uid}, JobUID: {job_uid}) due to "
        f"prioritization in the ClusterQueue; preemptor path: {path}; preemptee path: {path}"
    )
    assert got["Preempted"]["message"] == expected
    assert (got["Requeued"]["status"], got["QuotaReserved"]["status"]) == ("True", "False")
    assert got["Admitted"]["reason"] == "NoReservation"
    assert "admission" not in victim["status"]
    assert victim["status"]["requeueState"]["count"] == 1
    assert store.pods_of(bulk) == []  # the victim's pods are gone

    [event] = store.events_on(bulk, "Preempted")
    assert event["type"] == "Normal"
    assert event["source"]["component"] == "kueue-admission"
    assert event["involvedObject"]["uid"] == victim["metadata"]["uid"]
    assert event["involvedObject"]["kind"] == "Workload"
    assert event["message"].startswith(expected + "; preemptor effective priority: 90")
    assert re.fullmatch(re.escape(bulk) + r"\.[0-9a-f]+", event["metadata"]["name"])

    cluster.step(START + 3)  # the preemptor takes the freed GPUs
    assert conditions(store.workload(serve))["Admitted"]["status"] == "True"
    assert len(store.pods_of(serve)) == 1
    assert conditions(store.workload(bulk))["QuotaReserved"]["message"] == (
        "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu "
        "in flavor ml.p5.48xlarge, 8 more needed"
    )  # the victim cannot preempt the higher-priority job back

    for _ in run(cluster, 90, START + 3):  # serve finishes, bulk runs again
        pass
    again = store.workload(bulk)
    assert conditions(again)["Admitted"]["status"] == "True"
    assert conditions(again)["Evicted"]["status"] == "False"
    assert conditions(again)["Evicted"]["message"].startswith("Previously: Preempted to")
    assert conditions(store.workload(serve))["Finished"]["status"] == "True"
    [admitted] = store.events_on(bulk, "Admitted")
    assert admitted["count"] == 2  # the recorder folded the identical second Event into one


def test_topology_preemption_makes_room_in_one_domain(store: MemoryStore) -> None:
    cluster = SimulatedCluster(store, scripted(), seed=2)
    layer3 = {n.name: n.labels[L3] for n in cluster.nodes()}
    first = cluster.submit("a", "ft-1", 8, 3, "fine-tuning-priority", ("required", L3), START)
    cluster.step(START + 1)
    second = cluster.submit("a", "ft-2", 8, 3, "fine-tuning-priority", ("required", L3), START + 1)
    cluster.step(START + 2)
    domains = [{layer3[p["spec"]["nodeName"]] for p in store.pods_of(w)} for w in (first, second)]
    assert len(domains[0]) == len(domains[1]) == 1 and domains[0] != domains[1]
    [queue] = store.items("clusterqueues")
    used = int(queue["status"]["flavorsUsage"][0]["resources"][0]["total"])
    assert used == 48  # 16 GPUs of quota and 16 GPUs of nodes are free, one node per domain

    train = cluster.submit("a", "train", 8, 2, "training-priority", ("required", L3), START + 2)
    cluster.step(START + 3)
    message = conditions(store.workload(train))["QuotaReserved"]["message"]
    assert message == (
        'couldn\'t assign flavors to pod set main: topology "hyperpod-default" allows to fit '
        'only 1 out of 2 pod(s). Total nodes: 8; excluded: resource "nvidia.com/gpu": 6. '
        "Pending the preemption of 1 workload(s)"
    )
    assert conditions(store.workload(second))["Preempted"]["reason"] == "InClusterQueue"
    assert conditions(store.workload(first))["Admitted"]["status"] == "True"  # only one victim

    cluster.step(START + 4)
    placed = store.workload(train)["status"]["admission"]["podSetAssignments"][0]
    nodes = decode_assignment(placed["topologyAssignment"])
    assert sum(nodes.values()) == 2
    assert len({layer3[n] for n in nodes}) == 1  # a compact slot, as required
    assert Counter(p["spec"]["nodeName"] for p in store.pods_of(train)) == nodes
    cluster.step(START + 5)
    assert conditions(store.workload(second))["QuotaReserved"]["message"] == (
        'couldn\'t assign flavors to pod set main: topology "hyperpod-default" allows to fit '
        'only 2 out of 3 pod(s). Total nodes: 8; excluded: resource "nvidia.com/gpu": 5'
    )


def test_cohort_reclamation_evicts_the_borrower(store: MemoryStore) -> None:
    cluster = SimulatedCluster(store, scripted(teams=("a", "b")), seed=4)
    borrower = cluster.submit("b", "borrow", 8, 4, "training-priority", now=START)
    cluster.step(START + 1)
    queues = {q["metadata"]["name"]: q for q in store.items("clusterqueues")}
    b_usage = queues["hyperpod-ns-b-clusterqueue"]["status"]["flavorsUsage"][0]["resources"][0]
    assert (b_usage["total"], b_usage["borrowed"]) == ("32", "16")

    claim = cluster.submit("a", "claim", 8, 5, "fine-tuning-priority", now=START + 1)
    cluster.step(START + 2)
    got = conditions(store.workload(borrower))
    assert got["Preempted"]["reason"] == "InCohortReclamation"
    assert "due to reclamation within the cohort;" in got["Preempted"]["message"]
    assert got["Preempted"]["message"].endswith(
        "preemptor path: /hyperpod-cohort/hyperpod-ns-a-clusterqueue; "
        "preemptee path: /hyperpod-cohort/hyperpod-ns-b-clusterqueue"
    )
    cluster.step(START + 3)
    assert conditions(store.workload(claim))["Admitted"]["status"] == "True"
    queues = {q["metadata"]["name"]: q for q in store.items("clusterqueues")}
    assert queues["hyperpod-ns-b-clusterqueue"]["status"]["flavorsUsage"][0]["resources"][0] == {
        "name": GPU,
        "total": "0",
        "borrowed": "0",
    }
    assert queues["hyperpod-ns-b-clusterqueue"]["status"]["pendingWorkloads"] == 1


def test_a_slot_no_domain_can_offer_waits_without_preempting(store: MemoryStore) -> None:
    cluster = SimulatedCluster(store, scripted(), seed=5)
    small = cluster.submit("a", "small", 8, 1, "fine-tuning-priority", now=START)
    cluster.step(START + 1)
    wide = cluster.submit("a", "wide", 8, 5, "inference-priority", ("required", L3), START + 1)
    cluster.step(START + 2)
    assert conditions(store.workload(wide))["QuotaReserved"]["message"] == (
        'couldn\'t assign flavors to pod set main: topology "hyperpod-default" allows to fit '
        'only 4 out of 5 pod(s). Total nodes: 8; excluded: resource "nvidia.com/gpu": 1'
    )  # no domain has 5 nodes, so evicting the lower-priority job would not help
    assert conditions(store.workload(small))["Admitted"]["status"] == "True"
    [pending] = store.events_on(wide, "Pending")
    assert pending["type"] == "Warning"


def test_admission_events_and_gpu_packing(store: MemoryStore) -> None:
    cluster = SimulatedCluster(store, scripted(), seed=6)
    one = cluster.submit("a", "one", 2, 1, "experimentation-priority", now=START)
    cluster.step(START + 5)
    two = cluster.submit("a", "two", 4, 1, "experimentation-priority", now=START + 5)
    cluster.step(START + 6)
    [reserved] = store.events_on(one, "QuotaReserved")
    assert reserved["message"] == (
        "Quota reserved in ClusterQueue hyperpod-ns-a-clusterqueue, wait time since queued was 5s"
    )
    assert reserved["firstTimestamp"] == reserved["lastTimestamp"] == "2026-11-18T11:06:45Z"
    [admitted] = store.events_on(one, "Admitted")
    assert admitted["message"] == (
        "Admitted by ClusterQueue hyperpod-ns-a-clusterqueue, wait time since reservation was 0s"
    )
    [pod_one], [pod_two] = store.pods_of(one), store.pods_of(two)
    node = pod_one["spec"]["nodeName"]
    assert pod_two["spec"]["nodeName"] == node  # best fit packs small jobs onto one node
    ns = "hyperpod-ns-a"
    first, second = pod_one["metadata"]["name"], pod_two["metadata"]["name"]
    assert cluster.gpu_pods(node) == {
        0: (ns, first, "trainer"),
        1: (ns, first, "trainer"),
        **{i: (ns, second, "trainer") for i in range(2, 6)},
    }
    assert re.fullmatch(r"one-0-[bcdfghjklmnpqrstvwxz2456789]{5}", first)


def test_cordoned_node_gets_no_new_pods(store: MemoryStore) -> None:
    cluster = SimulatedCluster(store, scripted(), seed=7)
    target = cluster.nodes()[0].name
    cluster.cordon(target)
    node = {n["metadata"]["name"]: n for n in store.items("nodes")}[target]
    assert node["metadata"]["labels"]["sagemaker.amazonaws.com/node-health-status"] == (
        "UnschedulablePendingReplacement"
    )
    assert node["spec"]["unschedulable"] is True
    full = cluster.submit("a", "full", 8, 8, "training-priority", now=START)
    cluster.step(START + 1)
    assert conditions(store.workload(full))["QuotaReserved"]["message"] == (
        'couldn\'t assign flavors to pod set main: topology "hyperpod-default" allows to fit '
        "only 7 out of 8 pod(s)"
    )
    seven = cluster.submit("a", "seven", 8, 7, "inference-priority", now=START + 1)
    cluster.step(START + 2)
    assert len(store.pods_of(seven)) == 7
    assert target not in {p["spec"]["nodeName"] for p in store.items("pods")}
    cluster.cordon(target, "Schedulable")
    assert (
        "unschedulable"
        not in {n["metadata"]["name"]: n for n in store.items("nodes")}[target]["spec"]
    )


def test_bad_submissions_are_refused(store: MemoryStore) -> None:
    cluster = SimulatedCluster(store, scripted(), seed=8)
    with pytest.raises(ValueError, match="unknown team"):
        cluster.submit("nobody", "x", 8, 1, "training-priority")
    with pytest.raises(ValueError, match="priority class"):
        cluster.submit("a", "x", 8, 1, "urgent")
    with pytest.raises(ValueError, match="required or preferred"):
        cluster.submit("a", "x", 8, 1, "training-priority", ("mandatory", L3))
    with pytest.raises(ValueError, match=re.escape("no ml.p6e-gb200.36xlarge nodes")):
        cluster.submit("a", "x", 4, 1, "training-priority", ("required", ULTRASERVER))
    cluster.submit("a", "x", 8, 1, "training-priority")
    with pytest.raises(ValueError, match="already exists"):
        cluster.submit("a", "x", 8, 1, "training-priority")
    with pytest.raises(ValueError, match="DNS label"):
        cluster.submit("a", "My Job", 8, 1, "training-priority")
    with pytest.raises(ValueError, match="at least one pod"):
        cluster.submit("a", "empty", 8, 0, "training-priority")
    with pytest.raises(ValueError, match="no node named"):
        cluster.cordon("hyperpod-i-0000")
    with pytest.raises(ValueError, match="finite"):
        cluster.step(float("nan"))


# --- invariants over a long random run -----------------------------------------------------


def test_quota_nodes_and_placements_stay_consistent(store: MemoryStore) -> None:
    cluster = SimulatedCluster(store, default_shape(), seed=11)
    allocatable = {n.name: n.gpus for n in cluster.nodes()}
    borrowed_seen = 0
    for now in run(cluster, 1200):
        queues = store.items("clusterqueues")
        cohort_total: Counter[str] = Counter()
        cohort_nominal: Counter[str] = Counter()
        for queue in queues:
            quota = {
                f["name"]: f["resources"][0] for f in queue["spec"]["resourceGroups"][0]["flavors"]
            }
            for usage in queue["status"]["flavorsUsage"]:
                flavor, res = usage["name"], usage["resources"][0]
                total, borrowed = int(res["total"]), int(res["borrowed"])
                nominal = int(quota[flavor]["nominalQuota"])
                limit = int(quota[flavor]["borrowingLimit"])
                assert total <= nominal + limit, f"{queue['metadata']['name']} over quota at {now}"
                assert borrowed == max(0, total - nominal)
                cohort_total[flavor] += total
                cohort_nominal[flavor] += nominal
                borrowed_seen = max(borrowed_seen, borrowed)
        assert all(cohort_total[f] <= cohort_nominal[f] for f in cohort_total)

        per_node: Counter[str] = Counter()
        for pod in store.items("pods"):
            if "nodeName" in pod["spec"]:  # an elastic Job's gated pods are not bound yet
                per_node[pod["spec"]["nodeName"]] += pod_gpus(pod)
        assert all(used <= allocatable[node] for node, used in per_node.items()), now
        if int(now) % 20:
            continue
        admitted_usage: Counter[str] = Counter()
        for w in store.items("workloads"):
            admission = w["status"].get("admission")
            if admission is None or conditions(w).get("Finished"):
                continue
            [assignment] = admission["podSetAssignments"]
            admitted_usage[admission["clusterQueue"]] += int(assignment["resourceUsage"][GPU])
            pods = store.pods_of(w["metadata"]["name"])
            placed = Counter(p["spec"]["nodeName"] for p in pods)
            assert placed == decode_assignment(assignment["topologyAssignment"])
            assert len(pods) == assignment["count"]
        for queue in queues:
            total = sum(int(u["resources"][0]["total"]) for u in queue["status"]["flavorsUsage"])
            assert total == admitted_usage[queue["metadata"]["name"]]
        for node in allocatable:
            owners = cluster.gpu_pods(node)
            held = Counter(pod for _, pod, _ in owners.values())
            on_node = {
                p["metadata"]["name"]: pod_gpus(p)
                for p in store.items("pods")
                if p["spec"].get("nodeName") == node
            }
            assert dict(held) == on_node
    assert borrowed_seen > 0  # the run did exercise borrowing


def test_default_cluster_churns_at_demo_rates(store: MemoryStore) -> None:
    cluster = SimulatedCluster(store, default_shape(), seed=0)
    capacity = sum(n.gpus for n in cluster.nodes())
    utilisation, pending = [], []
    for now in run(cluster, 1800):
        if now - START >= 300 and int(now) % 30 == 0:
            utilisation.append(sum(pod_gpus(p) for p in store.items("pods")) / capacity)
            pending.append(
                sum(1 for w in store.items("workloads") if "admission" not in w["status"])
            )
    seen: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for op, plural, obj in store.log:
        if op == "upsert" and plural == "events" and obj["count"] == 1:
            seen[obj["reason"]] += 1
        if op == "upsert" and plural == "workloads":
            for c in obj["status"].get("conditions", []):
                if c["type"] == "Preempted" and c["status"] == "True":
                    reasons[c["reason"]] += 1
    minutes = 30
    assert 0.6 <= sum(utilisation) / len(utilisation) <= 0.9
    assert 1 <= sum(pending) / len(pending) <= 15
    assert 1 <= seen["QuotaReserved"] / minutes <= 10
    assert 0.2 <= seen["Preempted"] / minutes <= 5
    assert reasons["InClusterQueue"] and reasons["InCohortReclamation"]
    finished = [
        w
        for op, p, w in store.log
        if p == "workloads" and op == "upsert" and conditions(w).get("Finished")
    ]
    assert finished


def test_every_kueue_object_validates_against_the_crds() -> None:
    store = MemoryStore()
    cluster = SimulatedCluster(store, default_shape(), seed=12)
    cluster.submit("llm", "us-pretrain", 4, 9, "training-priority", ("required", ULTRASERVER))
    cluster.submit("vision", "spread", 8, 3, "fine-tuning-priority", ("preferred", L3))
    for _ in run(cluster, 600):
        pass
    checked: Counter[str] = Counter()
    for op, plural, obj in store.log:
        if op == "upsert" and plural in KUEUE_PLURALS:
            assert_valid_kueue(obj)
            checked[obj["kind"]] += 1
    kinds = {
        "Workload",
        "ClusterQueue",
        "LocalQueue",
        "Cohort",
        "ResourceFlavor",
        "Topology",
        "WorkloadPriorityClass",
    }
    assert set(checked) == kinds
    assert any(
        "admission" in obj["status"] and "requeueState" in obj["status"]
        for op, p, obj in store.log
        if p == "workloads" and op == "upsert"
    )


# --- the v1beta2 topologyAssignment encoding -----------------------------------------------


def test_topology_assignment_encoding_matches_kueue() -> None:
    examples = json.loads(
        reference("kueue/examples/03_tas_topologyAssignment_v1beta2_slices.json").read_text()
    )["examples"]
    ours = encode_topology_assignment([HOSTNAME], [(("kind-worker",), 7), (("kind-worker2",), 3)])
    assert ours == examples[0]
    ours = encode_topology_assignment([HOSTNAME], [(("kind-worker2",), 4), (("kind-worker8",), 2)])
    assert ours == examples[1]
    same = encode_topology_assignment([L3, HOSTNAME], [(("nn-1", "a-1"), 2), (("nn-1", "a-2"), 2)])
    assert same["slices"][0]["valuesPerLevel"][0] == {"universal": "nn-1"}
    assert same["slices"][0]["podCounts"] == {"universal": 2}
    assert decode_assignment(same) == Counter({"a-1": 2, "a-2": 2})
