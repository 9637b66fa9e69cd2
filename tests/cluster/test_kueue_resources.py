"""Every resource end to end, Kueue's node feasibility for TAS, and verdicts judged in the
workload's own world (issue 27).

Each row is a small cluster built from API objects (nodes with topology labels, allocatable
cpu, memory and pods; ResourceFlavors with a Topology; ClusterQueues whose resourceGroups
cover GPUs, cpu and memory; Workloads whose pod templates request every resource and carry
tolerations, nodeSelectors and required node affinity; their pods), with the answer Kueue's
rules give and the rule it rests on, cited from kubernetes-sigs/kueue@ff69552e79ad:

- pkg/scheduler/flavorassigner/flavorassigner.go `assignFlavors`, `findFlavorForPodSets`,
  `checkFlavorForPodSets`, `flavorSelector`, `fitsResourceQuota` (quota is checked resource
  by resource before a pod is placed: "insufficient quota for R in flavor F, ... > maximum
  capacity (M)" vs "insufficient unused quota for R in flavor F, N more needed"), flavor
  fungibility, several resource groups;
- pkg/resources/resource_formatter.go (how Kueue writes amounts: "500Gi", "10500m", "15");
- pkg/cache/scheduler/tas_flavor_snapshot.go `findTopologyAssignment`, `fillLeafCounts`,
  `fillInCountsHelper` and scheduling_simulator_default.go `FindFeasibleNodes` (taints against
  the pod's tolerations plus the flavor's, nodeSelector, required node affinity, every
  requested resource plus one pod against what each node has left).

Every row runs live (the scene in the simulated API server, the production informers and
the service's model) and offline (`topowatch explain --from DUMP --json` on a `kubectl get
nodes,pods,workloads,clusterqueues,localqueues,events,resourceflavors,topologies -A -o yaml`
List of the same objects), and both must give the same pending view. Preemption rows replay
the objects into the model in many informer orders (every order, one verdict), and offline
stay `unknown` (a dump shows the cluster after the preemption). Every Kueue object is
validated against the CRDs (tests/crds.py) unless a row says it is invalid on purpose.
"""

from __future__ import annotations

import copy
import io
import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import redirect_stdout
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.cli import main
from exporter.cluster.capacity.quota import kueue_quantity
from exporter.cluster.metrics import render as metrics
from exporter.cluster.model import ClusterModel
from exporter.cluster.ui import pages as ui
from exporter.cluster.views.workloads import topology_view
from exporter.core.exposition import encode_text
from exporter.sim import synthetic as s
from exporter.sim.kubeapi.server import ObjectStore
from exporter.sim.kueue.status import priority_note
from tests.cluster.test_informers import eventually
from tests.cluster.test_kueue_semantics import (
    Delivery,
    History,
    Live,
    Story,
    crd_problems,
    interleave,
    replay,
)
from tests.conftest import promtool_lint
from tests.crds import assert_valid_kueue

T = 1_795_000_000.0
L1 = "topology.k8s.aws/network-node-layer-1"
L2 = "topology.k8s.aws/network-node-layer-2"
L3 = "topology.k8s.aws/network-node-layer-3"
HOSTNAME = "kubernetes.io/hostname"
ULTRASERVER = "topology.k8s.aws/ultraserver-id"
INSTANCE = "node.kubernetes.io/instance-type"
GPU = "nvidia.com/gpu"
P5 = "ml.p5.48xlarge"
GB200 = "ml.p6e-gb200.36xlarge"
TOPOLOGY = "hyperpod-network-topology"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
GI = 2**30
EKS_GPU_TAINT = {"key": GPU, "value": "true", "effect": "NoSchedule"}
TOLERATE_GPU = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
Obj = dict[str, Any]

# What `kubectl get` lists here, by plural: (apiVersion, kind). The dump asks for flavors and
# topologies too, so offline and live rest on the same objects.
DUMPED = {
    "nodes": ("v1", "Node"),
    "pods": ("v1", "Pod"),
    "workloads": (KUEUE_API, "Workload"),
    "clusterqueues": (KUEUE_API, "ClusterQueue"),
    "localqueues": (KUEUE_API, "LocalQueue"),
    "events": ("v1", "Event"),
    "resourceflavors": (KUEUE_API, "ResourceFlavor"),
    "topologies": (KUEUE_API, "Topology"),
    "cohorts": (KUEUE_API, "Cohort"),
}


def kueue(obj: Obj) -> Obj:
    assert_valid_kueue(obj)
    return obj


# --- objects ----------------------------------------------------------------------------------


def topology() -> Obj:
    levels = [{"nodeLabel": key} for key in (L1, L2, L3, HOSTNAME)]
    return kueue(
        {
            "apiVersion": KUEUE_API,
            "kind": "Topology",
            "metadata": {"name": TOPOLOGY},
            "spec": {"levels": levels},
        }
    )


def flavor(
    name: str, taints: Sequence[Obj] = (), tolerations: Sequence[Obj] = (), valid: bool = True
) -> Obj:
    spec: Obj = {"nodeLabels": {INSTANCE: name}, "topologyName": TOPOLOGY}
    if taints:
        spec["nodeTaints"] = [dict(t) for t in taints]
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    obj = {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": name}}
    obj["spec"] = spec
    return kueue(obj) if valid else obj


def node(
    name: str,
    l3: str,
    *,
    l2: str = "nn-mid",
    gpus: int = 8,
    instance: str = P5,
    memory: str = "2000Gi",
    pods: int | None = None,
    taints: Sequence[Obj] = (),
    ultraserver: str = "",
) -> Obj:
    obj = s.node(name, ("nn-top", l2, l3), gpus, instance_type=instance, ultraserver=ultraserver)
    obj["status"]["allocatable"]["memory"] = memory
    if pods is not None:
        obj["status"]["allocatable"]["pods"] = str(pods)
    if taints:
        obj["spec"]["taints"] = [dict(t) for t in taints]
    return obj


def quantity(resource: str, amount: int) -> str:
    return kueue_quantity(resource, amount)


def cluster_queue(
    team: str,
    groups: Sequence[tuple[Sequence[str], Sequence[tuple[str, Mapping[str, str]]]]],
    cohort: str = "",
    valid: bool = True,
) -> Obj:
    """`<team>-cq`: resource groups of (covered resources, [(flavor, {resource: nominal})])."""
    spec: Obj = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": list(covered),
                "flavors": [
                    {
                        "name": name,
                        "resources": [{"name": r, "nominalQuota": q} for r, q in quotas.items()],
                    }
                    for name, quotas in flavors
                ],
            }
            for covered, flavors in groups
        ],
        "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"},
    }
    if cohort:
        spec["cohortName"] = cohort
    name = f"{team}-cq"
    obj = {
        "apiVersion": KUEUE_API,
        "kind": "ClusterQueue",
        "metadata": {"name": name, "uid": s.uid_for("cq", name)},
        "spec": spec,
    }
    return kueue(obj) if valid else obj


def p5_queue(team: str, gpu: str = "64", cpu: str = "768", memory: str = "4Ti", **kw: Any) -> Obj:
    return cluster_queue(
        team, [([GPU, "cpu", "memory"], [(P5, {GPU: gpu, "cpu": cpu, "memory": memory})])], **kw
    )


def workload(
    team: str,
    name: str,
    pods: int,
    per_pod: Mapping[str, str],
    *,
    topology_request: tuple[str, str] | None = None,
    message: str | None = None,
    admitted_on: Sequence[str] = (),
    flavors: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Obj] = (),
    affinity: Obj | None = None,
    priority: int = 0,
    created: float = T - 120,
    slices: tuple[str, int] | None = None,
    rv: str = "1",
    conditions: Sequence[Obj] | None = None,
    valid: bool = True,
) -> Obj:
    """A Workload of `pods` pods requesting `per_pod` each (GPUs included in it); admitted
    on `admitted_on` (one pod per node, every requested resource charged on `flavors`, P5 by
    default) or pending with Kueue's QuotaReserved=False `message`."""
    gpus = int(per_pod.get(GPU, "0"))
    cq = f"{team}-cq"
    if conditions is None:
        if admitted_on:
            conditions = s.admitted_conditions(cq, created)
        elif message is not None:
            conditions = [s.condition("QuotaReserved", "False", "Pending", message, T - 60)]
        else:
            conditions = []
    wl = s.workload(
        team,
        name,
        pods,
        gpus,
        created,
        priority=priority,
        topology=topology_request,
        conditions=conditions,
        cluster_queue=cq if admitted_on else "",
        assignment=[((n,), 1) for n in admitted_on],
        rv=rv,
    )
    pod_set = wl["spec"]["podSets"][0]
    template = pod_set["template"]["spec"]
    template["containers"][0]["resources"]["requests"] = dict(per_pod)
    if node_selector:
        template["nodeSelector"] = dict(node_selector)
    if tolerations:
        template["tolerations"] = [dict(t) for t in tolerations]
    if affinity:
        template["affinity"] = copy.deepcopy(affinity)
    if slices is not None:
        request = pod_set.setdefault("topologyRequest", {})
        request["podSetSliceRequiredTopology"] = slices[0]
        request["podSetSliceSize"] = slices[1]
    if admitted_on:
        psa = wl["status"]["admission"]["podSetAssignments"][0]
        psa["flavors"] = {r: (flavors or {}).get(r, P5) for r in per_pod}
        psa["resourceUsage"] = {r: quantity(r, _amount(r, v) * pods) for r, v in per_pod.items()}
    return kueue(wl) if valid else wl


def _amount(resource: str, value: str) -> int:
    from exporter.cluster.parse.core import quota_amount

    return quota_amount(resource, value)


def pods_of(wl: Obj, nodes: Sequence[str]) -> list[Obj]:
    """One Running pod of the workload on each node, requesting what its template requests."""
    meta = wl["metadata"]
    requests = wl["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]
    out = []
    for i, name in enumerate(nodes):
        pod = s.pod(
            meta["namespace"],
            f"{meta['name']}-{i}",
            name,
            int(requests["requests"].get(GPU, "0")),
            meta["labels"]["kueue.x-k8s.io/job-uid"],
            meta["name"],
        )
        pod["spec"]["containers"][0]["resources"] = {"requests": dict(requests["requests"])}
        out.append(pod)
    return out


def plain_pod(name: str, node_name: str, requests: Mapping[str, str]) -> Obj:
    """A pod outside Kueue (a DaemonSet's, a system pod) holding part of a node."""
    pod = s.pod("kube-system", name, node_name, 0, s.uid_for("ds", name), name)
    pod["metadata"]["labels"] = {}
    pod["spec"]["containers"][0]["resources"] = {"requests": dict(requests)}
    return pod


@dataclass
class Scene:
    """Objects by API plural; the pending workloads go in after the service has synced."""

    objects: dict[str, list[Obj]] = field(default_factory=dict)
    pending: list[Obj] = field(default_factory=list)

    def add(self, plural: str, *objs: Obj) -> None:
        self.objects.setdefault(plural, []).extend(objs)

    def base(self, *flavors: Obj) -> None:
        self.add("topologies", topology())
        self.add("resourceflavors", *(flavors or (flavor(P5),)))

    def queue(self, cq: Obj) -> None:
        self.add("clusterqueues", cq)
        team = cq["metadata"]["name"].removesuffix("-cq")
        self.add("localqueues", kueue(s.local_queue(team, cq["metadata"]["name"])))

    def run(self, wl: Obj, nodes: Sequence[str]) -> None:
        self.add("workloads", wl)
        self.add("pods", *pods_of(wl, nodes))

    def pend(self, wl: Obj) -> str:
        self.pending.append(wl)
        return f"{wl['metadata']['namespace']}/{wl['metadata']['name']}"


def full_dump(store: ObjectStore) -> str:
    items = []
    for plural, (api_version, kind) in DUMPED.items():
        for obj in store.items(plural):
            items.append({**obj, "apiVersion": api_version, "kind": kind})
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})


@dataclass(frozen=True)
class Answers:
    live: dict[str, Any]  # the service's workload view of the target
    offline: dict[str, Any]  # `topowatch explain --from DUMP --json`
    text: str  # `topowatch explain --from DUMP` (the plain answer)
    metrics: str
    problems: dict[tuple[str, str], int]


def run_both(scene: Scene, target: str, dump_dir: Path) -> Answers:
    """The scene's cluster listed by the service at start, the pending workloads watched;
    then the same objects dumped and explained offline."""
    store = ObjectStore(clock=lambda: T)
    for plural, objs in scene.objects.items():
        for obj in objs:
            store.upsert(plural, obj)
    live = Live(store)
    try:
        for wl in scene.pending:
            store.upsert("workloads", wl)
        assert eventually(
            lambda: live.holds("workloads", "Workload") and live.holds("pods", "Pod"), 15
        ), "the model did not catch up with the store"
        view = live.service.workload(*target.split("/"))
        assert view is not None, target
        body = live.service.metrics_body(False).decode()
        with live.service.lock:
            problems = dict(live.service.model.problems)
    finally:
        live.close()
    dump = dump_dir / "dump.yaml"
    dump.write_text(full_dump(store))
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["explain", "--from", str(dump), "--json", target]) == 0
    offline = json.loads(out.getvalue())
    text = io.StringIO()
    with redirect_stdout(text):
        assert main(["explain", "--from", str(dump), target]) == 0
    return Answers(view, offline, text.getvalue(), body, problems)


# --- the rows ---------------------------------------------------------------------------------


def _two_domains(scene: Scene, busy: Sequence[str] = ("n1", "n3"), **node_kw: Any) -> None:
    """nn-a holds n1, n2; nn-b holds n3, n4 (p5, 8 GPUs, 2000Gi); `busy` run a team-z job."""
    scene.add("nodes", *(node(n, l3, **node_kw) for n, l3 in (("n1", "nn-a"), ("n2", "nn-a"))))
    scene.add("nodes", *(node(n, l3, **node_kw) for n, l3 in (("n3", "nn-b"), ("n4", "nn-b"))))
    if busy:
        scene.queue(p5_queue("z"))
        scene.run(
            workload("z", "z-run", len(busy), {GPU: "8"}, admitted_on=busy, created=T - 600),
            busy,
        )


def memory_above_maximum_capacity() -> tuple[Scene, str]:
    """a's queue holds 1Ti of memory; 2 pods of 600Gi need 1200Gi: more than it could ever
    hold, so no preemption, placement or relaxed topology would start it (and its layer-3
    domains, one free node each, would not hold it either: the cause is still quota)."""
    scene = Scene()
    scene.base()
    _two_domains(scene)
    scene.queue(p5_queue("a", memory="1Ti"))
    message = (
        "couldn't assign flavors to pod set main: insufficient quota for memory in flavor"
        f" {P5}, previously considered podsets requests (0) + current podset request (1200Gi)"
        " > maximum capacity (1Ti)"
    )
    wl = workload(
        "a",
        "big-mem",
        2,
        {GPU: "8", "cpu": "96", "memory": "600Gi"},
        topology_request=("required", L3),
        message=message,
    )
    return scene, scene.pend(wl)


def memory_short_of_unused_quota(
    quota: str = "1Ti", short: str = "176Gi", gpus: str = "64"
) -> tuple[Scene, str]:
    """a holds 1Ti of memory and runs 600Gi; the next 600Gi pod needs 176Gi more."""
    scene = Scene()
    scene.base()
    _two_domains(scene, busy=())
    scene.queue(p5_queue("a", gpu=gpus, memory=quota))
    asked = {GPU: "8", "cpu": "96", "memory": "600Gi"}
    scene.run(workload("a", "a-run", 1, asked, admitted_on=["n1"], created=T - 600), ["n1"])
    message = (
        "couldn't assign flavors to pod set main: insufficient unused quota for memory in flavor"
        f" {P5}, {short} more needed"
    )
    return scene, scene.pend(workload("a", "a-next", 1, asked, message=message))


def cpu_short_in_millicores() -> tuple[Scene, str]:
    """a holds 100 cores and runs 2 pods of 45 (90); the next pod asks 20500m: 10500m more."""
    scene = Scene()
    scene.base()
    _two_domains(scene, busy=())
    scene.queue(p5_queue("a", cpu="100"))
    scene.run(
        workload("a", "a-run", 2, {GPU: "8", "cpu": "45"}, admitted_on=["n1", "n3"]),
        ["n1", "n3"],
    )
    message = (
        "couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor"
        f" {P5}, 10500m more needed"
    )
    return scene, scene.pend(
        workload("a", "a-next", 1, {GPU: "8", "cpu": "20500m"}, message=message)
    )


def gpu_short_never_another_flavor() -> tuple[Scene, str]:
    """The demo's case: llm's queue lists p5 (24 GPUs, 15 lent to research) then GB200 (48,
    free). Its job selects p5 nodes (nodeSelector), so Kueue passes GB200 over ("doesn't
    match node affinity") and finds p5 15 GPUs short: quota, on p5, never the GB200 domain."""
    scene = Scene()
    scene.base(flavor(P5), flavor(GB200))
    _two_domains(scene, busy=())
    scene.add(
        "nodes",
        *(
            node(f"g{i}", "nn-g", l2="nn-g-mid", gpus=4, instance=GB200, ultraserver="us-1")
            for i in range(1, 13)
        ),
    )
    scene.add(
        "cohorts", kueue({"apiVersion": KUEUE_API, "kind": "Cohort", "metadata": {"name": "org"}})
    )
    scene.queue(
        cluster_queue("llm", [([GPU], [(P5, {GPU: "24"}), (GB200, {GPU: "48"})])], cohort="org")
    )
    scene.queue(cluster_queue("research", [([GPU], [(P5, {GPU: "0"})])], cohort="org"))
    scene.run(workload("research", "r-1", 1, {GPU: "8"}, admitted_on=["n1"]), ["n1"])
    scene.run(workload("research", "r-2", 1, {GPU: "7"}, admitted_on=["n3"]), ["n3"])
    message = (
        f"couldn't assign flavors to pod set main: flavor {GB200} doesn't match node affinity,"
        f" insufficient unused quota for {GPU} in flavor {P5}, 15 more needed"
    )
    wl = workload(
        "llm",
        "pretrain",
        3,
        {GPU: "8"},
        topology_request=("required", L3),
        node_selector={INSTANCE: P5},
        message=message,
    )
    return scene, scene.pend(wl)


def several_resource_groups() -> tuple[Scene, str]:
    """GPUs in one resource group (p5), cpu and memory in another ("cpu-a" then "cpu-b"): the
    groups choose flavors apart. cpu-a's 100Gi can never hold 200Gi (maximum capacity); cpu-b
    holds 300Gi with 200Gi in use: short 100Gi of unused quota, which preemption may free, so
    Kueue keeps cpu-b's attempt (preemption beats no fit) and the cause names cpu-b. No
    flavor has a Topology here: a TAS flavor beside non-TAS ones would take only pod sets
    asking for a topology (checkPodSetAndFlavorMatchForTAS)."""
    scene = Scene()
    p5 = kueue(
        {
            "apiVersion": KUEUE_API,
            "kind": "ResourceFlavor",
            "metadata": {"name": P5},
            "spec": {"nodeLabels": {INSTANCE: P5}},
        }
    )
    scene.base(p5, *(_plain_flavor(n) for n in ("cpu-a", "cpu-b")))
    _two_domains(scene, busy=())
    groups = [
        ([GPU], [(P5, {GPU: "64"})]),
        (
            ["cpu", "memory"],
            [(n, {"cpu": "500", "memory": m}) for n, m in (("cpu-a", "100Gi"), ("cpu-b", "300Gi"))],
        ),
    ]
    scene.queue(cluster_queue("a", groups))
    running = workload(
        "a",
        "a-run",
        1,
        {GPU: "8", "memory": "200Gi"},
        admitted_on=["n1"],
        flavors={GPU: P5, "memory": "cpu-b"},
    )
    scene.run(running, ["n1"])
    message = (
        "couldn't assign flavors to pod set main: insufficient quota for memory in flavor"
        " cpu-a, previously considered podsets requests (0) + current podset request (200Gi) >"
        " maximum capacity (100Gi), insufficient unused quota for memory in flavor cpu-b,"
        " 100Gi more needed"
    )
    return scene, scene.pend(
        workload("a", "a-next", 1, {GPU: "8", "memory": "200Gi"}, message=message)
    )


def _plain_flavor(name: str) -> Obj:
    return kueue(
        {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": {}}
    )


def tainted_pool_tolerated() -> tuple[Scene, str]:
    """Every GPU node carries EKS's nvidia.com/gpu=true:NoSchedule and the job's pods tolerate
    it; one node of each layer-3 domain is busy. Its 2 pods fit no one domain: topology,
    with the largest free domain named, never "no eligible node"."""
    scene = Scene()
    scene.base()
    _two_domains(scene, taints=[EKS_GPU_TAINT])
    scene.queue(p5_queue("a"))
    wl = workload(
        "a",
        "train",
        2,
        {GPU: "8"},
        topology_request=("required", L3),
        tolerations=[TOLERATE_GPU],
        message=_topology_message(2),
    )
    return scene, scene.pend(wl)


def tainted_pool_not_tolerated() -> tuple[Scene, str]:
    """The same pool; this job's pods carry no toleration: no node is eligible, and the answer
    says the nodes are tainted, which a toleration would cure."""
    scene, _ = tainted_pool_tolerated()
    scene.pending.clear()
    wl = workload(
        "a",
        "untolerated",
        2,
        {GPU: "8"},
        topology_request=("required", L3),
        message=_topology_message(2),
    )
    return scene, scene.pend(wl)


def _topology_message(pods: int, what: str = "pod") -> str:
    return (
        f"couldn't assign flavors to pod set main: topology \"{TOPOLOGY}\" doesn't allow to fit"
        f" any of {pods} {what}(s)"
    )


def memory_holds_a_node() -> tuple[Scene, str]:
    """nn-a's n1 and n2 have all 8 GPUs free, but a system pod holds 1900Gi of n2's 2000Gi:
    a pod asking 500Gi fits n1 only. Kueue's TAS counts every requested resource against what
    each node has left, so nn-a holds 1 of 2 pods (nn-b is busy)."""
    scene = Scene()
    scene.base()
    _two_domains(scene, busy=("n3", "n4"))
    scene.add("pods", plain_pod("cache-n2", "n2", {"memory": "1900Gi"}))
    scene.queue(p5_queue("a"))
    wl = workload(
        "a",
        "train",
        2,
        {GPU: "8", "memory": "500Gi"},
        topology_request=("required", L3),
        message=_topology_message(2),
    )
    return scene, scene.pend(wl)


def pod_limit_holds_a_node() -> tuple[Scene, str]:
    """n2 may run 3 pods (allocatable pods: 3) and runs 3 system pods: it holds none of this
    job's, whatever its free GPUs (`resources.OnePodRequest` is part of every pod's request)."""
    scene = Scene()
    scene.base()
    _two_domains(scene, busy=("n3", "n4"), pods=3)
    scene.add("pods", *(plain_pod(f"ds-{i}", "n2", {"cpu": "100m"}) for i in range(3)))
    scene.queue(p5_queue("a"))
    wl = workload(
        "a",
        "train",
        2,
        {GPU: "8"},
        topology_request=("required", L3),
        message=_topology_message(2),
    )
    return scene, scene.pend(wl)


def required_node_affinity() -> tuple[Scene, str]:
    """The job's pods require layer-3 NotIn (nn-a): only nn-b's nodes are eligible, and nn-b
    has one free node; nn-a's two free nodes are not offered."""
    scene = Scene()
    scene.base()
    _two_domains(scene, busy=("n3",))
    scene.queue(p5_queue("a"))
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": L3, "operator": "NotIn", "values": ["nn-a"]}]}
                ]
            }
        }
    }
    wl = workload(
        "a",
        "train",
        2,
        {GPU: "8"},
        topology_request=("required", L3),
        affinity=affinity,
        message=_topology_message(2),
    )
    return scene, scene.pend(wl)


def slices_one_pod_short() -> tuple[Scene, str]:
    """4 pods in one layer-2 domain, in slices of 2 within one layer-3 domain each. nn-a has 3
    free nodes (1 slice and a pod), nn-b 1 (no slice): 1 of 2 slices. One more free node in
    either layer-3 domain completes a slice; "room for 2 more pods" overstates it."""
    scene = Scene()
    scene.base()
    for i in range(1, 5):
        scene.add("nodes", node(f"a{i}", "nn-a"), node(f"b{i}", "nn-b"))
    scene.queue(p5_queue("z", gpu="96"))
    busy = ["a4", "b2", "b3", "b4"]
    scene.run(workload("z", "z-run", 4, {GPU: "8"}, admitted_on=busy), busy)
    scene.queue(p5_queue("a"))
    wl = workload(
        "a",
        "sliced",
        4,
        {GPU: "8"},
        topology_request=("required", L2),
        slices=(L3, 2),
        message=_topology_message(2, "slice"),
    )
    return scene, scene.pend(wl)


@dataclass(frozen=True)
class Row:
    id: str
    rule: str
    build: Callable[[], tuple[Scene, str]]
    check: Callable[[Mapping[str, Any], Answers], None]


def _shortfall(view: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    return [(x["resource"], x["flavor"], x["limit"], x["need"]) for x in view["pending"]["short"]]


def _no_placement_advice(view: Mapping[str, Any]) -> None:
    pending = view["pending"]
    assert pending["topology_message"] == "" and pending["fit"] is None, pending
    for fix in view["would_run_if"]:
        assert "room for" not in fix and "relaxed" not in fix and "label" not in fix, fix


def check_memory_maximum(view: Mapping[str, Any], found: Answers) -> None:
    pending = view["pending"]
    assert (pending["cause"], pending["label"]) == ("quota", "quota (maximum capacity)")
    assert _shortfall(view) == [("memory", P5, "maximum capacity", "176Gi more memory")]
    (short,) = pending["short"]
    assert short["kueue_message"] == pending["quota_message"].split(": ", 1)[1]
    assert (
        "176Gi more memory in flavor ml.p5.48xlarge than the queue can ever hold"
        in (pending["summary"])
    )
    _no_placement_advice(view)
    assert any("maximum capacity for memory" in fix for fix in view["would_run_if"])
    assert "Pending (quota (maximum capacity)): 176Gi more memory" in found.text


def check_memory_unused(view: Mapping[str, Any], found: Answers) -> None:
    pending = view["pending"]
    assert (pending["cause"], pending["label"]) == ("quota", "quota")
    assert _shortfall(view) == [("memory", P5, "unused quota", "176Gi more memory")]
    assert pending["short"][0]["kueue_message"] == pending["quota_message"].split(": ", 1)[1]
    assert pending["short"][0]["available"] == "424Gi"
    assert any("could admit 176Gi more memory in ml.p5.48xlarge" in f for f in view["would_run_if"])
    assert not any("GPUs" in fix for fix in view["would_run_if"]), view["would_run_if"]


def check_cpu_millicores(view: Mapping[str, Any], found: Answers) -> None:
    assert _shortfall(view) == [("cpu", P5, "unused quota", "10500m more cpu")]
    assert (
        view["pending"]["short"][0]["kueue_message"]
        == (view["pending"]["quota_message"].split(": ", 1)[1])
    )
    assert view["request"][0]["per_pod"] == {"cpu": "20500m", GPU: "8"}


def check_demo_gpu(view: Mapping[str, Any], found: Answers) -> None:
    pending = view["pending"]
    assert pending["cause"] == "quota" and pending["flavor"] == P5
    assert _shortfall(view) == [(GPU, P5, "unused quota", "15 more nvidia.com/gpu")]
    assert pending["quota_available_gpus"] == 9
    assert "GB200" not in json.dumps(pending) and "nn-g" not in json.dumps(pending)
    _no_placement_advice(view)


def check_groups(view: Mapping[str, Any], found: Answers) -> None:
    assert _shortfall(view) == [("memory", "cpu-b", "unused quota", "100Gi more memory")]
    assert view["pending"]["label"] == "quota"


def check_tolerated(view: Mapping[str, Any], found: Answers) -> None:
    pending = view["pending"]
    assert pending["cause"] == "topology", pending
    assert (
        "fits 1 of 2 pods of 8 GPUs in the largest free network-node-layer-3 domain"
        in (pending["summary"])
    )
    assert "no eligible node" not in pending["summary"]
    assert "4 of 4 nodes usable" in pending["nodes"], pending["nodes"]
    assert any("room for 1 more pod of 8 GPUs" in f for f in view["would_run_if"])
    assert not any("label" in f for f in view["would_run_if"]), view["would_run_if"]


def check_untolerated(view: Mapping[str, Any], found: Answers) -> None:
    pending = view["pending"]
    assert pending["cause"] == "topology"
    assert "no eligible node for 2 pods of 8 GPUs" in pending["summary"]
    assert (
        "4 tainted without a toleration (nvidia.com/gpu=true:NoSchedule not tolerated)"
        in (pending["nodes"])
    )
    # the change that starts it is a toleration, not a label its nodes already carry
    (fix,) = view["would_run_if"]
    assert "tainted without a toleration" in fix and "label" not in fix, fix


def check_memory_node(view: Mapping[str, Any], found: Answers) -> None:
    fit = view["pending"]["fit"]
    assert (fit["domain"], fit["pods_fit"]) == ("nn-a", 1), fit
    assert "room for 2 pods by GPUs, but memory on 1 node" in fit["summary"], fit["summary"]


def check_pod_limit(view: Mapping[str, Any], found: Answers) -> None:
    fit = view["pending"]["fit"]
    assert (fit["domain"], fit["pods_fit"]) == ("nn-a", 1), fit
    assert "but pods on 1 node" in fit["summary"], fit["summary"]


def check_affinity(view: Mapping[str, Any], found: Answers) -> None:
    pending = view["pending"]
    assert pending["fit"]["domain"] == "nn-b" and pending["fit"]["pods_fit"] == 1, pending
    assert "2 not matching the required node affinity" in pending["nodes"], pending["nodes"]


def check_slices(view: Mapping[str, Any], found: Answers) -> None:
    fixes = view["would_run_if"]
    assert any(
        "network-node-layer-3 domain nn-a or nn-b (in network-node-layer-2 domain nn-mid) had"
        " room for 1 more pod of 8 GPUs" in f
        for f in fixes
    ), fixes
    assert not any("room for 2 more pods" in f for f in fixes), fixes


# --- issue 27's last classes: the implied TAS request, and flavors passed over -----------------

US_TOPOLOGY = "hyperpod-ultraserver-topology"


def us_topology() -> Obj:
    """The GB200 flavor's Topology: an UltraServer level between layer 3 and the node."""
    levels = [{"nodeLabel": key} for key in (L1, L2, L3, ULTRASERVER, HOSTNAME)]
    return kueue(
        {
            "apiVersion": KUEUE_API,
            "kind": "Topology",
            "metadata": {"name": US_TOPOLOGY},
            "spec": {"levels": levels},
        }
    )


def _gb200_nodes(scene: Scene, count: int = 4, taints: Sequence[Obj] = ()) -> None:
    scene.add(
        "nodes",
        *(
            node(
                f"g{i}",
                "nn-g",
                l2="nn-g-mid",
                gpus=4,
                instance=GB200,
                ultraserver="us-1",
                taints=taints,
            )
            for i in range(1, count + 1)
        ),
    )


def implied_request_fragmented() -> tuple[Scene, str]:
    """Every flavor of a's queue has a Topology (a TAS-only ClusterQueue), so its job, which
    asks for no topology, gets an implied one: TAS places its pod on any node, every resource
    counted. Quota has room (64 GPUs, none in use), but team z holds 4 GPUs of each of the
    4 nodes: no node has 8 free. Kueue says topology; before issue 27 topowatch read "no
    request" as quota-only and said quota."""
    scene = Scene()
    scene.base()
    _two_domains(scene, busy=())
    scene.queue(p5_queue("z"))
    everywhere = ["n1", "n2", "n3", "n4"]
    scene.run(workload("z", "z-half", 4, {GPU: "4"}, admitted_on=everywhere), everywhere)
    scene.queue(p5_queue("a"))
    wl = workload("a", "any-node", 1, {GPU: "8", "cpu": "96"}, message=_topology_message(1))
    return scene, scene.pend(wl)


def flavor_without_the_level() -> tuple[Scene, str]:
    """a's queue lists p5 (whose Topology has no UltraServer level) then GB200 (whose has).
    The job asks for one UltraServer: Kueue passes p5 over ('does not contain the requested
    level') and finds GB200's memory short of its maximum capacity. The short resource is
    GB200's memory, never p5's GPUs or memory (which have room)."""
    scene = Scene()
    gb200 = flavor(GB200)
    gb200["spec"]["topologyName"] = US_TOPOLOGY
    scene.base(flavor(P5), kueue(gb200))
    scene.add("topologies", us_topology())
    _two_domains(scene, busy=())
    _gb200_nodes(scene)
    groups = [
        (
            [GPU, "memory"],
            [(P5, {GPU: "64", "memory": "4Ti"}), (GB200, {GPU: "48", "memory": "1Ti"})],
        )
    ]
    scene.queue(cluster_queue("a", groups))
    message = (
        f'couldn\'t assign flavors to pod set main: Flavor "{P5}" does not contain the requested'
        f" level, insufficient quota for memory in flavor {GB200}, previously considered podsets"
        " requests (0) + current podset request (1200Gi) > maximum capacity (1Ti)"
    )
    wl = workload(
        "a",
        "on-one-ultraserver",
        2,
        {GPU: "4", "memory": "600Gi"},
        topology_request=("required", ULTRASERVER),
        message=message,
    )
    return scene, scene.pend(wl)


def untolerated_flavor_skipped() -> tuple[Scene, str]:
    """a's queue lists GB200 first (its nodeTaints: EKS's nvidia.com/gpu taint, plenty of
    quota), then p5 (1Ti of memory). The job's pods tolerate nothing: Kueue passes GB200 over
    ('untolerated taint ... in flavor') and finds p5's memory short of its maximum capacity;
    the short resource is p5's, never GB200's."""
    scene = Scene()
    scene.base(flavor(GB200, taints=[EKS_GPU_TAINT]), flavor(P5))
    _two_domains(scene, busy=())
    _gb200_nodes(scene, taints=[EKS_GPU_TAINT])
    groups = [
        (
            [GPU, "memory"],
            [(GB200, {GPU: "48", "memory": "4Ti"}), (P5, {GPU: "64", "memory": "1Ti"})],
        )
    ]
    scene.queue(cluster_queue("a", groups))
    message = (
        f"couldn't assign flavors to pod set main: insufficient quota for memory in flavor {P5},"
        " previously considered podsets requests (0) + current podset request (1200Gi) >"
        " maximum capacity (1Ti), untolerated taint {nvidia.com/gpu true NoSchedule <nil>} in"
        f" flavor {GB200}"
    )
    return scene, scene.pend(
        workload("a", "no-toleration", 2, {GPU: "4", "memory": "600Gi"}, message=message)
    )


def _slice(wl: Obj, origin: str, replaces: str = "") -> Obj:
    """Kueue's elastic Job annotations (ElasticJobsViaWorkloadSlices) on a Workload slice."""
    annotations = wl["metadata"].setdefault("annotations", {})
    annotations["kueue.x-k8s.io/elastic-job"] = "true"
    annotations["kueue.x-k8s.io/workload-slice-name"] = origin
    if replaces:
        annotations["kueue.x-k8s.io/workload-slice-replacement-for"] = replaces
    return kueue(wl)


def slice_adds_one_pod() -> tuple[Scene, str]:
    """A Kueue elastic Job grows from 2 to 3 pods of 8 GPUs: its new slice replaces the
    admitted one (2 pods on n1, n2), which keeps its quota and its nodes meanwhile. a's queue
    holds 24 GPUs: the new slice asks only for the 8 it adds, which fit; TAS keeps the old
    pods where they are and places the one it adds, for which no node has room (z runs on
    n3, n4): topology, never "8 more nvidia.com/gpu" (the whole 24 against 8 unused)."""
    scene = Scene()
    scene.base()
    _two_domains(scene, busy=("n3", "n4"))
    scene.queue(p5_queue("a", gpu="24"))
    old = workload("a", "job-grow-1", 2, {GPU: "8"}, admitted_on=["n1", "n2"], created=T - 600)
    scene.run(_slice(old, "job-grow-1"), ["n1", "n2"])
    new = workload("a", "job-grow-2", 3, {GPU: "8"}, message=_topology_message(1))
    return scene, scene.pend(_slice(new, "job-grow-1", replaces="a/job-grow-1"))


def check_slice_delta(view: Mapping[str, Any], found: Answers) -> None:
    pending = view["pending"]
    assert pending["cause"] == "topology", pending
    assert pending["short"] == [] and pending["quota_available_gpus"] == 8, pending
    assert (
        "implied request (TAS-only queue) at node: only 0 of 1 pod of 8 GPUs fit on all 4 nodes"
        in pending["summary"]
    ), pending["summary"]


def check_implied(view: Mapping[str, Any], found: Answers) -> None:
    pending = view["pending"]
    assert pending["cause"] == "topology", pending
    assert (
        "implied request (TAS-only queue) at node: only 0 of 1 pod of 8 GPUs fit on all 4 nodes"
        in pending["summary"]
    ), pending["summary"]
    assert pending["quota_available_gpus"] == 64 and pending["short"] == []
    fixes = view["would_run_if"]
    assert any("its flavor's nodes had room for 1 more pod of 8 GPUs" in f for f in fixes), fixes
    assert not any("relaxed" in f or "label" in f for f in fixes), fixes
    assert (
        'topowatch_pending_workloads{cluster_queue="a-cq",cause="topology"} 1' in found.metrics
    ), [line for line in found.metrics.splitlines() if "pending_workloads" in line]


def check_level_skipped(view: Mapping[str, Any], found: Answers) -> None:
    pending = view["pending"]
    assert (pending["cause"], pending["label"]) == ("quota", "quota (maximum capacity)"), pending
    assert _shortfall(view) == [("memory", GB200, "maximum capacity", "176Gi more memory")]
    assert pending["flavor"] == GB200
    assert pending["short"][0]["kueue_message"] in pending["quota_message"]
    _no_placement_advice(view)


def check_taint_skipped(view: Mapping[str, Any], found: Answers) -> None:
    pending = view["pending"]
    assert (pending["cause"], pending["label"]) == ("quota", "quota (maximum capacity)"), pending
    assert _shortfall(view) == [("memory", P5, "maximum capacity", "176Gi more memory")]
    assert pending["flavor"] == P5
    assert pending["short"][0]["kueue_message"] in pending["quota_message"]


ROWS = [
    Row(
        "memory-above-maximum-capacity",
        "flavorassigner.go fitsResourceQuota: request > PotentialAvailable is NoFit ('insufficient"
        " quota ... > maximum capacity'); assignFlavors tries TAS only when quota fits",
        memory_above_maximum_capacity,
        check_memory_maximum,
    ),
    Row(
        "memory-short-of-unused-quota",
        "flavorassigner.go fitsResourceQuota: request > Available is 'insufficient unused quota"
        " ..., N more needed' (resource_formatter.go: memory in BinarySI)",
        memory_short_of_unused_quota,
        check_memory_unused,
    ),
    Row(
        "cpu-short-in-millicores",
        "resources.AmountFromQuantity counts cpu in millicores; resource_formatter.go writes"
        " NewMilliQuantity DecimalSI ('10500m')",
        cpu_short_in_millicores,
        check_cpu_millicores,
    ),
    Row(
        "gpu-short-never-another-flavor",
        "flavorassigner.go checkFlavorForPodSets/flavorSelector: a flavor whose nodeLabels the"
        " pod's nodeSelector rules out is skipped ('doesn't match node affinity')",
        gpu_short_never_another_flavor,
        check_demo_gpu,
    ),
    Row(
        "several-resource-groups",
        "flavorassigner.go assignFlavors/findFlavorForPodSets: each resource group picks its own"
        " flavor; the most preferred attempt (preemption over no fit) is kept",
        several_resource_groups,
        check_groups,
    ),
    Row(
        "tainted-pool-tolerated",
        "tas_flavor_snapshot.go findTopologyAssignment (pod tolerations + flavor's) and"
        " scheduling_simulator_default.go FindFeasibleNodes step 1 (FindMatchingUntoleratedTaint)",
        tainted_pool_tolerated,
        check_tolerated,
    ),
    Row(
        "tainted-pool-not-tolerated",
        "scheduling_simulator_default.go FindFeasibleNodes step 1: an untolerated NoSchedule"
        " taint excludes the node",
        tainted_pool_not_tolerated,
        check_untolerated,
    ),
    Row(
        "memory-holds-a-node",
        "tas_flavor_snapshot.go fillLeafCounts: CountInWithLimitingResource of every requested"
        " resource against allocatable minus what the node's pods request",
        memory_holds_a_node,
        check_memory_node,
    ),
    Row(
        "pod-limit-holds-a-node",
        "tas_flavor_snapshot.go findTopologyAssignment adds resources.OnePodRequest: the node's"
        " pods allocatable counts",
        pod_limit_holds_a_node,
        check_pod_limit,
    ),
    Row(
        "required-node-affinity",
        "scheduling_simulator_default.go FindFeasibleNodes step 3: requiredDuringScheduling"
        " node affinity (nodeaffinity.NewNodeSelector)",
        required_node_affinity,
        check_affinity,
    ),
    Row(
        "slices-one-pod-short",
        "tas_flavor_snapshot.go fillInCountsHelper: a domain holds sum over its slice-level"
        " domains of floor(pods / slice size)",
        slices_one_pod_short,
        check_slices,
    ),
    Row(
        "implied-request-fragmented",
        "tas_flavorassigner.go isTASImplied / clusterqueue.go isTASOnly: on a ClusterQueue whose"
        " flavors all have a Topology a pod set without a request is placed by TAS"
        " (unconstrained at the lowest level, levelKeyWithImpliedFallback), every resource per"
        " node; quota that fits while no node holds a pod is a TAS failure",
        implied_request_fragmented,
        check_implied,
    ),
    Row(
        "flavor-without-the-level",
        "tas_flavorassigner.go checkPodSetAndFlavorMatchForTAS (TASFlavorSnapshot.HasLevel): a"
        " flavor whose Topology lacks the requested level is passed over before quota is"
        " checked; the short resource is the next flavor's",
        flavor_without_the_level,
        check_level_skipped,
    ),
    Row(
        "untolerated-flavor-skipped",
        "flavorassigner.go checkFlavorForPodSets (FindMatchingUntoleratedTaint on the flavor's"
        " nodeTaints, the pod's tolerations plus the flavor's): an untolerated flavor is passed"
        " over before quota is checked; the short resource is the next flavor's",
        untolerated_flavor_skipped,
        check_taint_skipped,
    ),
    Row(
        "slice-asks-only-what-it-adds",
        "flavorassigner.go findFlavorForPodSets/findOldPodSetRequest (a slice replacing another"
        " keeps its flavor and asks 'only the delta needed') and tas_elastic_workloads.go"
        " handleScaleUp (the old pods stay, only the added ones are placed)",
        slice_adds_one_pod,
        check_slice_delta,
    ),
]


def _scenes() -> dict[str, tuple[Scene, str]]:
    return {row.id: row.build() for row in ROWS}


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Row], Answers]:
    done: dict[str, Answers] = {}

    def get(row: Row) -> Answers:
        if row.id not in done:
            scene, target = row.build()
            done[row.id] = run_both(scene, target, tmp_path_factory.mktemp(row.id))
        return done[row.id]

    return get


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_the_live_answer_follows_kueue(row: Row, answers: Callable[[Row], Answers]) -> None:
    found = answers(row)
    row.check(found.live, found)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_a_dump_gives_the_live_answer(row: Row, answers: Callable[[Row], Answers]) -> None:
    """The dump holds every object the answer rests on: offline and live agree on the whole
    pending view, the advice and the request."""
    found = answers(row)
    for key in ("pending", "would_run_if", "request"):
        assert found.offline[key] == found.live[key], key
    row.check(found.offline, found)


def test_the_quota_metrics_name_the_short_resource(answers: Callable[[Row], Answers]) -> None:
    """`topowatch_pending_quota_workloads` says which resource keeps workloads out and which
    limit binds; `topowatch_team_quota` carries every (flavor, resource) in base units."""
    body = answers(ROWS[0]).metrics
    assert (
        'topowatch_pending_quota_workloads{cluster_queue="a-cq",flavor="ml.p5.48xlarge",'
        'resource="memory",limit="maximum_capacity"} 1'
    ) in body
    assert (
        'topowatch_team_quota{cluster_queue="a-cq",team="a-cq",cohort="",flavor="ml.p5.48xlarge"'
        f',resource="memory",state="nominal"}} {2**40}'
    ) in body
    assert re.search(
        r'topowatch_team_quota\{cluster_queue="a-cq",[^}]*resource="cpu",state="nominal"\} 768',
        body,
    )
    body = answers(ROWS[1]).metrics
    assert 'resource="memory",limit="unused_quota"} 1' in body
    assert promtool_lint(body.encode()) == ""


def test_the_rows_are_what_the_crds_accept() -> None:
    """Every object of every row validates (the builders assert it); the one row invalid on
    purpose below proves the check can fail."""
    for scene, _ in _scenes().values():
        for plural in ("clusterqueues", "resourceflavors", "workloads"):
            for obj in scene.objects.get(plural, []):
                assert crd_problems(obj) == [], obj["metadata"]["name"]


# --- preemptions: judged in the preemptor's own world ------------------------------------------


def _cluster(*extra: Delivery) -> tuple[Delivery, ...]:
    nodes = [
        node(n, l3) for n, l3 in (("n1", "nn-a"), ("n2", "nn-a"), ("n3", "nn-b"), ("n4", "nn-b"))
    ]
    return (
        Delivery("Topology", "ADDED", topology(), "topology"),
        *(Delivery("Node", "ADDED", n, "node") for n in nodes),
        *extra,
    )


def _story(
    name: str,
    queues: Sequence[Obj],
    cohort: str,
    victims: Sequence[tuple[Obj, Sequence[str]]],
    preemptor: Obj,
    preemptor_placed: Obj,
    preemptor_nodes: Sequence[str],
    reason: str,
    cause_words: str,
    verdict: str,
    phrases: Sequence[str],
    extra: Sequence[Delivery] = (),
) -> Story:
    """Victims running before; the preemptor arrives pending, Kueue evicts the victims with
    `reason` and admits it; its pods start where the victims' were."""
    ns_of = preemptor["metadata"]["namespace"]
    cq_of = f"{ns_of}-cq"
    objects: list[History] = []
    for cq in queues:
        objects.append(History((Delivery("ClusterQueue", "ADDED", cq, "cq"),), prior=1))
    cluster = list(_cluster(*extra))
    for cq in queues:
        team = cq["metadata"]["name"].removesuffix("-cq")
        cluster.append(
            Delivery(
                "LocalQueue",
                "ADDED",
                kueue(s.local_queue(team, cq["metadata"]["name"])),
                "local-queue",
            )
        )
    if cohort:
        cluster.append(
            Delivery(
                "Cohort",
                "ADDED",
                kueue({"apiVersion": KUEUE_API, "kind": "Cohort", "metadata": {"name": cohort}}),
                "cohort",
            )
        )

    def path(cq: str) -> str:
        return f"/{cohort}/{cq}" if cohort else f"/{cq}"

    victim_cq = victims[0][0]["status"]["admission"]["clusterQueue"]
    text = s.preemption_message_by(preemptor, path(cq_of), path(victim_cq), cause_words)
    for victim, on in victims:
        meta = victim["metadata"]
        evicted = copy.deepcopy(victim)
        evicted["metadata"]["resourceVersion"] = "2"
        evicted["status"]["conditions"] = [
            *victim["status"]["conditions"],
            *s.preempted_conditions(text, reason, T),
        ]
        pods = pods_of(victim, on)
        objects.append(
            History(
                (
                    Delivery("Workload", "ADDED", victim, "victim"),
                    Delivery("Workload", "MODIFIED", evicted, "evicted"),
                ),
                prior=1,
            )
        )
        for pod in pods:
            objects.append(
                History(
                    (
                        Delivery("Pod", "ADDED", pod, "victim-pod"),
                        Delivery("Pod", "DELETED", pod, "pod-deleted"),
                    ),
                    prior=1,
                )
            )
        event = s.preemption_event(
            meta["namespace"], meta["name"], text + priority_note(100, 10), T
        )
        objects.append(History((Delivery("Event", "ADDED", event, "event"),)))
    objects.append(
        History(
            (
                Delivery("Workload", "ADDED", preemptor, "preemptor"),
                Delivery("Workload", "MODIFIED", preemptor_placed, "admitted"),
            )
        )
    )
    for pod in pods_of(preemptor_placed, preemptor_nodes):
        objects.append(History((Delivery("Pod", "ADDED", pod, "preemptor-pod"),)))
    return Story(
        name=name,
        cluster=tuple(cluster),
        objects=tuple(objects),
        verdict=verdict,
        phrases=tuple(phrases),
        counted=(victim_cq, cq_of, reason, verdict),
    )


def memory_preemption_story() -> Story:
    """a's queue holds 64 GPUs and 1Ti of memory; `low` runs 1 pod of 8 GPUs and 600Gi.
    `claim` asks 1 pod of 8 GPUs and 600Gi in one layer-3 domain: GPUs, and free nodes in
    both domains, are plenty, but memory is 176Gi short of the unused 424Gi. Kueue preempts
    `low` in the ClusterQueue. Before issue 27 topowatch counted GPUs only: "neither quota nor
    topology explains it" (unknown)."""
    asked = {GPU: "8", "memory": "600Gi"}
    queue = p5_queue("a", memory="1Ti")
    low = workload("a", "low", 1, asked, admitted_on=["n1"], priority=10, created=T - 600)
    claim = workload(
        "a",
        "claim",
        1,
        asked,
        topology_request=("required", L3),
        priority=100,
        created=T,
        message=(
            "couldn't assign flavors to pod set main: insufficient unused quota for memory in"
            f" flavor {P5}, 176Gi more needed. Pending the preemption of 1 workload(s)"
        ),
    )
    placed = workload(
        "a",
        "claim",
        1,
        asked,
        topology_request=("required", L3),
        priority=100,
        created=T,
        admitted_on=["n1"],
        rv="2",
        conditions=s.admitted_conditions("a-cq", T + 2),
    )
    return _story(
        "memory",
        [queue],
        "",
        [(low, ["n1"])],
        claim,
        placed,
        ["n1"],
        "InClusterQueue",
        "prioritization in the ClusterQueue",
        "quota",
        ("its queue could reserve only 424Gi of the 600Gi memory needed", "176Gi more memory"),
        extra=(Delivery("ResourceFlavor", "ADDED", flavor(P5), "flavor"),),
    )


def demo_story() -> Story:
    """The demo's first preemption: llm's p5 job (nodeSelector p5, 3 pods of 8 GPUs, one
    layer-3 domain) reclaims the 15 p5 GPUs research borrowed. Kueue said "flavor GB200
    doesn't match node affinity, insufficient unused quota for nvidia.com/gpu in flavor p5, 15
    more needed". Before issue 27 topowatch picked GB200 (48 free GPUs of quota) for the
    pending preemptor and judged topology against the GB200 domain's 4-GPU nodes."""
    gb200 = [
        Delivery(
            "Node",
            "ADDED",
            node(f"g{i}", "nn-g", l2="nn-g-mid", gpus=4, instance=GB200, ultraserver="us-1"),
            "node",
        )
        for i in range(1, 13)
    ]
    queues = [
        cluster_queue("llm", [([GPU], [(P5, {GPU: "24"}), (GB200, {GPU: "48"})])], cohort="org"),
        cluster_queue("research", [([GPU], [(P5, {GPU: "0"})])], cohort="org"),
    ]
    r1 = workload("research", "r-1", 1, {GPU: "8"}, admitted_on=["n1"], priority=10)
    r2 = workload("research", "r-2", 1, {GPU: "7"}, admitted_on=["n2"], priority=10)
    common: dict[str, Any] = dict(
        topology_request=("required", L3), node_selector={INSTANCE: P5}, priority=100, created=T
    )
    pretrain = workload(
        "llm",
        "pretrain",
        3,
        {GPU: "8"},
        **common,
        message=(
            f"couldn't assign flavors to pod set main: flavor {GB200} doesn't match node"
            f" affinity, insufficient unused quota for {GPU} in flavor {P5}, 15 more needed."
            " Pending the preemption of 2 workload(s)"
        ),
    )
    placed = workload(
        "llm",
        "pretrain",
        3,
        {GPU: "8"},
        **common,
        admitted_on=["n1", "n2", "n4"],
        rv="2",
        conditions=s.admitted_conditions("llm-cq", T + 2),
    )
    return _story(
        "demo",
        queues,
        "org",
        [(r1, ["n1"]), (r2, ["n2"])],
        pretrain,
        placed,
        ["n1", "n2", "n4"],
        "InCohortReclamation",
        "reclamation within the cohort",
        "quota",
        ("its queue could reserve only 9 of the 24 GPUs needed", "15 more nvidia.com/gpu"),
        extra=(
            Delivery("ResourceFlavor", "ADDED", flavor(P5), "flavor"),
            Delivery("ResourceFlavor", "ADDED", flavor(GB200), "flavor"),
            *gb200,
        ),
    )


STORIES = {"memory": memory_preemption_story, "demo": demo_story}


@pytest.mark.parametrize("name", sorted(STORIES))
def test_a_preemption_is_judged_in_the_preemptors_world_in_every_order(name: str) -> None:
    """Rule: flavorassigner.go assignFlavors checks every resource's quota on the flavors the
    preemptor may use (fitsResourceQuota) before TAS; a preemption Kueue made because one did
    not fit is quota-driven, and names that resource. 30 seeded informer orders, one verdict."""
    story = STORIES[name]()
    resource = GPU if name == "demo" else "memory"
    victims = sum(1 for h in story.objects if h.versions[0].label == "victim")
    seen: dict[tuple[tuple[str, str, str], ...], int] = {}
    for seed in range(30):
        model = replay(story.steady(random.Random(seed)))
        records = list(model.ledger)
        assert len(records) == victims, records
        seen[tuple(sorted({(r.verdict, r.verdict_detail, r.resource) for r in records}))] = seed
        assert dict(model.preemption_counts) == {story.counted: victims}
        assert dict(model.quota_preemption_counts) == {(*story.counted[:3], resource): victims}
    assert len(seen) == 1, seen
    ((judgement,),) = seen
    verdict, detail, short = judgement
    assert verdict == story.verdict, detail
    for phrase in story.phrases:
        assert phrase in detail, detail
    assert "nn-g" not in detail and "GB200" not in detail
    assert short == resource


def test_a_preemption_dump_stays_unknown(tmp_path: Path) -> None:
    """Offline the verdict is unknown, saying why: a dump shows the cluster after it."""
    from tests.cluster.test_kueue_semantics import dump_after, offline_preemptions

    for name, build in STORIES.items():
        records = offline_preemptions(dump_after(build(), tmp_path / f"{name}.yaml"))
        assert records
        for record in records:
            assert record["verdict"] == "unknown" and "dump" in record["verdict_detail"]


def test_the_quota_preemption_counter_names_the_resource() -> None:
    story = memory_preemption_story()
    model = replay(story.steady(random.Random(0)))
    exposition = encode_text(metrics.render(model))
    body = exposition.decode()
    assert (
        'topowatch_quota_preemptions_total{cluster_queue="a-cq",preempting_cluster_queue="a-cq",'
        'reason="InClusterQueue",resource="memory"} 1'
    ) in body
    assert promtool_lint(exposition) == ""


# --- topology-driven preemptions: the implied request, and the same scheduling cycle -------------


def _running(cq: str, name: str, nodes: Sequence[str], gpus: str = "8") -> list[Delivery]:
    """A workload of team `cq` running one pod on each of `nodes`, known before the story."""
    wl = workload(cq, name, len(nodes), {GPU: gpus}, admitted_on=nodes, created=T - 900)
    return [
        Delivery("Workload", "ADDED", wl, "running"),
        *(Delivery("Pod", "ADDED", pod, "running-pod") for pod in pods_of(wl, nodes)),
    ]


def _claim(message: str, on: Sequence[str], pods: int = 1) -> tuple[Obj, Obj]:
    """a's 8-GPU job asking for no topology: pending with Kueue's `message`, then admitted."""
    pending = workload("a", "claim", pods, {GPU: "8"}, priority=100, created=T, message=message)
    placed = workload(
        "a",
        "claim",
        pods,
        {GPU: "8"},
        priority=100,
        created=T,
        admitted_on=on,
        rv="2",
        conditions=s.admitted_conditions("a-cq", T + 2),
    )
    return pending, placed


IMPLIED_PHRASES = (
    "implied request (TAS-only queue) at node: only 0 of 1 pod of 8 GPUs fit on all 4 nodes",
)


def implied_story() -> Story:
    """a's queue (64 GPUs, TAS-only: its one flavor has a Topology) runs `low` (4 GPUs) on n1;
    team z fills n2-n4. `claim` (8 GPUs, no topology request) has the quota but no node has 8
    free: Kueue's TAS, implied, fails, so Kueue preempts `low` to make room (assignFlavors:
    Preempt after a TAS failure). Before issue 27 topowatch said quota ("asked for no
    topology, so only quota could block it")."""
    pending, placed = _claim(
        _topology_message(1) + ". Pending the preemption of 1 workload(s)", ["n1"]
    )
    low = workload("a", "low", 1, {GPU: "4"}, admitted_on=["n1"], priority=10, created=T - 600)
    return _story(
        "implied",
        [p5_queue("a"), p5_queue("z")],
        "",
        [(low, ["n1"])],
        pending,
        placed,
        ["n1"],
        "InClusterQueue",
        "prioritization in the ClusterQueue",
        "topology",
        IMPLIED_PHRASES,
        extra=(
            Delivery("ResourceFlavor", "ADDED", flavor(P5), "flavor"),
            *_running("z", "z-busy", ["n2", "n3", "n4"]),
        ),
    )


def same_cycle_story() -> Story:
    """In one scheduling cycle Kueue admits `early` (8 GPUs, a's queue) on n2, then finds no
    node for `claim` (n1 runs `low`, z fills n3, n4) and preempts `low`. `early`'s pods are
    not bound yet when the preemption is judged, and its admission may reach topowatch after
    the victim's Preempted Event: Kueue counted it (scheduler.go processEntry adds each
    admission's usage to the cycle's snapshot, AddUsage; TAS counts its TopologyAssignment),
    so the verdict is topology, not "TAS places it" on n2 (unknown)."""
    pending, placed = _claim(
        _topology_message(1) + ". Pending the preemption of 1 workload(s)", ["n1"]
    )
    low = workload("a", "low", 1, {GPU: "8"}, admitted_on=["n1"], priority=10, created=T - 600)
    story = _story(
        "same-cycle",
        [p5_queue("a", gpu="32"), p5_queue("z")],
        "",
        [(low, ["n1"])],
        pending,
        placed,
        ["n1"],
        "InClusterQueue",
        "prioritization in the ClusterQueue",
        "topology",
        IMPLIED_PHRASES,
        extra=(
            Delivery("ResourceFlavor", "ADDED", flavor(P5), "flavor"),
            *_running("z", "z-busy", ["n3", "n4"]),
        ),
    )
    early = workload("a", "early", 1, {GPU: "8"}, priority=50, created=T - 30, message="")
    admitted = workload(
        "a",
        "early",
        1,
        {GPU: "8"},
        priority=50,
        created=T - 30,
        admitted_on=["n2"],
        rv="2",
        conditions=s.admitted_conditions("a-cq", T),
    )
    history = History(
        (
            Delivery("Workload", "ADDED", early, "early"),
            Delivery("Workload", "MODIFIED", admitted, "early-admitted"),
        ),
        prior=1,
    )
    # `claim` waited before the cycle (Kueue's candidates and its own entry are of the
    # cycle's snapshot): known before, as `low` and `early` are
    objects = tuple(
        History(h.versions, prior=1) if h.versions[0].label == "preemptor" else h
        for h in story.objects
    )
    return replace(story, objects=(*objects, history))


def unbound_victim_story() -> Story:
    """a's `gated` (8 GPUs) holds quota and a TopologyAssignment on n1 but no pod yet: its
    AdmissionCheck is not Ready, so its pods are not created (QuotaReserved True, Admitted
    not yet). z fills n2-n4. `claim` (8 GPUs) has the quota but no node has 8 free: Kueue's
    TAS counts `gated`'s assignment on n1 (tas_flavor_snapshot.go addUsage from each cached
    workload's topologyAssignment, pods or not), so it preempts `gated`: topology. Kueue then
    gives the quota back and clears status.admission; topowatch, which saw no pod on n1,
    said "TAS places it on n1" (unknown) before the assignment was remembered from the
    reservation book."""
    pending, placed = _claim(
        _topology_message(1) + ". Pending the preemption of 1 workload(s)", ["n1"]
    )
    reserved = [c for c in s.admitted_conditions("a-cq", T - 20) if c["type"] == "QuotaReserved"]
    gated = workload(
        "a",
        "gated",
        1,
        {GPU: "8"},
        admitted_on=["n1"],
        priority=10,
        created=T - 60,
        conditions=reserved,
    )
    story = _story(
        "unbound-victim",
        [p5_queue("a", gpu="32"), p5_queue("z")],
        "",
        [(gated, [])],
        pending,
        placed,
        ["n1"],
        "InClusterQueue",
        "prioritization in the ClusterQueue",
        "topology",
        IMPLIED_PHRASES,
        extra=(
            Delivery("ResourceFlavor", "ADDED", flavor(P5), "flavor"),
            *_running("z", "z-busy", ["n2", "n3", "n4"]),
        ),
    )
    histories = []
    for h in story.objects:
        if h.versions[0].label == "victim":
            evicted = h.versions[-1].obj
            released = copy.deepcopy(evicted)
            released["metadata"]["resourceVersion"] = "3"
            del released["status"]["admission"]
            conditions = released["status"]["conditions"]
            for c in conditions:
                if c["type"] == "QuotaReserved":
                    c.update(status="False", reason="Preempted", message="Preempted")
                    c["lastTransitionTime"] = evicted["status"]["conditions"][-1][
                        "lastTransitionTime"
                    ]
            h = History(
                (*h.versions, Delivery("Workload", "MODIFIED", kueue(released), "released")),
                h.prior,
            )
        elif h.versions[0].label == "preemptor":
            h = History(h.versions, prior=1)  # waiting before the cycle, as in same-cycle
        histories.append(h)
    return replace(story, objects=tuple(histories))


# The order Kueue writes Workloads in one cycle, which one Workload watch keeps.
_WRITES = {"early-admitted": 0, "evicted": 1, "released": 2, "preemptor": 3, "admitted": 4}


def watch_order(story: Story, rng: random.Random) -> list[Delivery]:
    """As a watching service gets it: what existed before in any order, then the changes with
    each kind's watch keeping the order of its writes (Workloads as Kueue wrote them), the
    kinds interleaved at random."""
    before = [h.versions[: h.prior] for h in story.objects if h.prior]
    changes = [d for h in story.objects for d in h.versions[h.prior :]]
    workloads = sorted((d for d in changes if d.kind == "Workload"), key=lambda d: _WRITES[d.label])
    others = [[d] for d in changes if d.kind != "Workload"]
    return [*story.cluster, *interleave(rng, before), *interleave(rng, [workloads, *others])]


TOPOLOGY_STORIES = {
    "implied": implied_story,
    "same-cycle": same_cycle_story,
    "unbound-victim": unbound_victim_story,
}


@pytest.mark.parametrize("name", sorted(TOPOLOGY_STORIES))
def test_a_topology_preemption_of_a_pod_set_without_a_request(name: str) -> None:
    """Rules: tas_flavorassigner.go isTASImplied (a TAS-only ClusterQueue places every pod
    set by TAS) and scheduler.go processEntry -> AddUsage (what the cycle admitted before
    counts, its TopologyAssignment included). 30 seeded orders as the watches deliver them
    (the Preempted Event before or after the evictions and admissions), one verdict."""
    story = TOPOLOGY_STORIES[name]()
    seen: set[tuple[str, str]] = set()
    for seed in range(30):
        model = replay(watch_order(story, random.Random(seed)))
        (record,) = list(model.ledger)
        seen.add((record.verdict, record.verdict_detail))
        assert dict(model.preemption_counts) == {story.counted: 1}
        assert dict(model.quota_preemption_counts) == {}
    assert len(seen) == 1, seen
    ((verdict, detail),) = seen
    assert verdict == "topology", detail
    for phrase in story.phrases:
        assert phrase in detail, detail


def test_a_verdict_waits_for_the_victims_eviction() -> None:
    """The Preempted Event first, the cycle's admission and the eviction after it: the verdict
    is not judged on the cluster without `early` (which would place `claim` on n2), nor
    counted, until the eviction arrives."""
    story = same_cycle_story()
    order = watch_order(story, random.Random(0))
    event = next(d for d in order if d.kind == "Event")
    rest = [d for d in order if d is not event]
    first_change = next(i for i, d in enumerate(rest) if d.label in ("early-admitted", "evicted"))
    order = [*rest[:first_change], event, *rest[first_change:]]
    model = ClusterModel()
    for i, delivery in enumerate(order):
        model.apply(delivery.kind, delivery.type, delivery.obj, T + 0.25 * i)
        if delivery is event:
            (record,) = list(model.ledger)
            assert record.verdict == "unknown" and "awaiting the victim" in record.verdict_detail
            assert dict(model.preemption_counts) == {}
    (record,) = list(model.ledger)
    assert record.verdict == "topology", record.verdict_detail
    assert dict(model.preemption_counts) == {story.counted: 1}


# --- capacity per flavor: never two instance types added together ------------------------------


def mixed_model() -> ClusterModel:
    """Layer-3 nn-s holds p5 nodes p1, p2 (one busy) and GB200 nodes g1-g14 (4 GPUs each, all
    free): 8 p5 GPUs and 56 GB200 GPUs free there; summed, 64, a block no job could use."""
    model = ClusterModel()
    for obj in (topology(), flavor(P5), flavor(GB200)):
        model.apply(obj["kind"], "ADDED", obj, T)
    for name in ("p1", "p2"):
        model.apply("Node", "ADDED", node(name, "nn-s"), T)
    for i in range(1, 15):
        obj = node(f"g{i}", "nn-s", gpus=4, instance=GB200, ultraserver="us-1")
        model.apply("Node", "ADDED", obj, T)
    pod = s.pod("team-z", "busy-0", "p1", 8, "uid-busy", "busy")
    model.apply("Pod", "ADDED", pod, T)
    return model


def test_the_topology_page_shows_free_gpus_per_flavor() -> None:
    """Rule: a ResourceFlavor's nodeLabels select its nodes (tas_nodes_cache.go
    NodeMatchesFlavor): free GPUs by level are per flavor, as /metrics exports them."""
    model = mixed_model()
    rows = {(r["flavor"], r["level"]): r for r in topology_view(model)["fragmentation"]}
    assert rows[(P5, "network-node-layer-3")]["largest_free"] == 8
    assert rows[(GB200, "network-node-layer-3")]["largest_free"] == 56
    assert all(r["largest_free"] != 64 for r in rows.values())
    page = ui.topology_page(ui.topology_picture(model))
    assert f"Free GPUs by level — flavor {P5}" in page
    assert f"Free GPUs by level — flavor {GB200}" in page
    for table in re.findall(r'<table class="fragmentation".*?</table>', page, re.S):
        cells = re.findall(r'<td class="largest-free">(\d+)</td>', table)
        assert "64" not in cells, table
    assert f"free by flavor: 8 {P5}, 56 {GB200}" in page
    body = encode_text(metrics.render(model)).decode()
    assert (
        f'topowatch_cluster_largest_free_block_gpus{{flavor="{P5}",level="network-node-layer-3"}} 8'
        in body
    )


# --- quota advice where cpu and memory bind ---------------------------------------------------


def test_the_advisor_recommends_memory_where_memory_binds(tmp_path: Path) -> None:
    """A team whose jobs wait on memory quota (Kueue: insufficient unused quota for memory)
    is advised more memory, in GiB, and no GPU nominal change (more GPUs would not start its
    jobs; its idle GPU quota is not a reason to cut it while they wait). Live (the service's
    advice after a history sample) and offline (`topowatch quota advise --from DUMP`)."""
    # 32 GPUs of quota on the 32 GPUs of its 4 nodes: nothing else for the advisor to say
    scene, _ = memory_short_of_unused_quota(quota="800Gi", short="400Gi", gpus="32")
    store = ObjectStore(clock=lambda: T)
    for plural, objs in scene.objects.items():
        for obj in objs:
            store.upsert(plural, obj)
    for wl in scene.pending:
        store.upsert("workloads", wl)
    live = Live(store)
    try:
        assert eventually(lambda: live.holds("workloads", "Workload"), 15)
        live.service.quota_min_observed_s = 0.0
        live.service.sample_quota()
        recs = live.service.quota_recommendations()
        body = live.service.metrics_body(False).decode()
    finally:
        live.close()
    dump = tmp_path / "dump.yaml"
    dump.write_text(full_dump(store))
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["quota", "advise", "--from", str(dump), "--json"]) == 0
    offline = json.loads(out.getvalue())
    for found in (recs, offline):
        mine = [r for r in found if r["cluster_queue"] == "a-cq"]
        memory = [r for r in mine if r["resource"] == "memory"]
        assert len(memory) == 1, mine
        (rec,) = memory
        assert (rec["kind"], rec["flavor"], rec["current"]) == ("nominal", P5, 800 * GI)
        assert rec["recommended"] == 1200 * GI  # 600Gi used + 600Gi waiting
        assert "jobs waited on memory quota" in rec["detail"] and "1200Gi" in rec["detail"]
        assert not [r for r in mine if r["resource"] == GPU and r["kind"] == "nominal"], mine
    assert re.search(
        r'topowatch_quota_recommended\{cluster_queue="a-cq",team="a-cq",kind="nominal",'
        r'reason="demand_above_nominal",flavor="ml.p5.48xlarge",resource="memory"\} '
        + str(1200 * GI),
        body,
    ), body
    # and what it would apply: the Kueue patch sets the quantity as Kueue writes it
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["quota", "advise", "--from", str(dump), "--emit", "kueue"]) == 0
    patches = {p["cluster_queue"]: p["patch"] for p in json.loads(out.getvalue())}
    resources = patches["a-cq"]["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert {r["name"]: r["nominalQuota"] for r in resources}["memory"] == "1200Gi"


# --- bad input: what is unknown, and why; nothing guessed, nothing crashes --------------------


def bad_toleration() -> tuple[Scene, str]:
    """The job's pods tolerate the EKS GPU taint with operator "Exist" (a typo: core/v1 has
    Exists). The Workload CRD types it as a string, so it is stored; it tolerates nothing."""
    scene, _ = tainted_pool_tolerated()
    scene.pending.clear()
    typo = {**TOLERATE_GPU, "operator": "Exist"}
    wl = workload(
        "a",
        "typo",
        2,
        {GPU: "8"},
        topology_request=("required", L3),
        tolerations=[typo],
        message=_topology_message(2),
    )
    return scene, scene.pend(wl)


def bad_memory_unit() -> tuple[Scene, str]:
    """a's memory nominalQuota is "1TB": no Kubernetes quantity (the CRD pattern refuses it,
    as Kueue's webhook would); built bypassing validation, as a damaged dump hands it over."""
    scene = Scene()
    scene.base()
    _two_domains(scene, busy=())
    bad = p5_queue("a", memory="1TB", valid=False)
    assert crd_problems(bad), "meant to be CRD-invalid"
    scene.queue(bad)
    wl = workload("a", "next", 1, {GPU: "8", "memory": "600Gi"}, message=None)
    return scene, scene.pend(wl)


def bad_flavor_toleration() -> tuple[Scene, str]:
    """The p5 flavor taints its nodes (nodeTaints) and adds a toleration with operator
    "Exist": Kueue's CEL rule refuses that (Equal, Exists only), so only a bypassed webhook or
    a damaged object holds it. It tolerates nothing: the flavor does not suit the job."""
    scene = Scene()
    taint = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    odd = {"key": "dedicated", "operator": "Exist", "effect": "NoSchedule"}
    scene.base(flavor(P5, taints=[taint], tolerations=[odd]))
    _two_domains(scene, busy=())
    scene.queue(p5_queue("a"))
    return scene, scene.pend(workload("a", "next", 1, {GPU: "8"}, message=None))


def test_a_toleration_with_an_unknown_operator_is_said_not_guessed(tmp_path: Path) -> None:
    scene, target = bad_toleration()
    found = run_both(scene, target, tmp_path)
    for view in (found.live, found.offline):
        pending = view["pending"]
        assert pending["cause"] == "topology"
        assert "no eligible node for 2 pods of 8 GPUs" in pending["summary"]
        assert any("'Exist'" in p and "tolerates no taint" in p for p in pending["node_problems"])
        assert "a toleration with operator 'Exist' tolerates nothing" in pending["nodes"]
        assert not any("label" in fix for fix in view["would_run_if"]), view["would_run_if"]
        assert any("'Exist'" in p for p in view["problems"])
    assert "Unreadable: toleration nvidia.com/gpu:NoSchedule has operator 'Exist'" in found.text
    assert found.problems.get(("Workload", "malformed"), 0) >= 1


def test_a_quota_in_a_unit_kueue_rejects_is_unknown_not_guessed(tmp_path: Path) -> None:
    scene, target = bad_memory_unit()
    found = run_both(scene, target, tmp_path)
    for view in (found.live, found.offline):
        pending = view["pending"]
        (unknown,) = pending["quota_unknown"]
        assert unknown.startswith(f"memory in flavor {P5}: unknown: ClusterQueue 'a-cq'")
        assert "'1TB' is not a Kubernetes quantity" in unknown
        assert pending["short"] == [] and pending["cause"] == "waiting"
    assert "Quota unknown for memory in flavor" in found.text
    assert found.problems.get(("ClusterQueue", "bad_quantity")) == 1
    assert 'kind="ClusterQueue",problem="bad_quantity"} 1' in found.metrics


def test_a_flavor_toleration_with_an_unknown_operator_rules_the_flavor_out(
    tmp_path: Path,
) -> None:
    scene, target = bad_flavor_toleration()
    found = run_both(scene, target, tmp_path)
    for view in (found.live, found.offline):
        pending = view["pending"]
        assert pending["cause"] == "misconfigured", pending
        (why,) = pending["flavor_mismatches"]
        assert why == (
            f"untolerated taint dedicated=ml:NoSchedule in flavor {P5} (a toleration with"
            " operator 'Exist' tolerates nothing)"
        )
        assert any(why in fix for fix in view["would_run_if"])


# --- the pure rules, row by row ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("resource", "amount", "text"),
    [
        ("cpu", 10_500, "10500m"),  # NewMilliQuantity(DecimalSI): millicores when not whole
        ("cpu", 16_000, "16"),
        ("cpu", 2_000_000, "2k"),
        ("memory", 500 * GI, "500Gi"),  # BinarySI, canonical
        ("memory", 1536 * 2**20, "1536Mi"),
        ("memory", 10**9, "1G"),  # not a multiple of 1024: DecimalSI
        ("memory", 1000, "1k"),  # below 1024: DecimalSI
        ("hugepages-2Mi", 4 * 2**20, "4Mi"),
        (GPU, 15, "15"),
        ("pods", 3, "3"),
    ],
)
def test_amounts_are_written_as_kueue_writes_them(resource: str, amount: int, text: str) -> None:
    """Rule: pkg/resources/resource_formatter.go ResourceQuantityString."""
    assert kueue_quantity(resource, amount) == text


def _node(labels: Mapping[str, str], name: str = "n") -> Any:
    from exporter.cluster.objects import Node

    return Node(name, tuple(sorted(labels.items())), 8, True, "")


@pytest.mark.parametrize(
    ("operator", "values", "labels", "holds"),
    [
        ("In", ("a", "b"), {"k": "a"}, True),
        ("In", ("a",), {}, False),
        ("NotIn", ("a",), {}, True),  # an absent label is not in any set
        ("NotIn", ("a",), {"k": "a"}, False),
        ("Exists", (), {"k": ""}, True),
        ("DoesNotExist", (), {"k": "x"}, False),
        ("Gt", ("5",), {"k": "7"}, True),
        ("Lt", ("5",), {"k": "7"}, False),
        ("Gt", ("5",), {"k": "seven"}, False),
        ("Exist", (), {"k": "x"}, False),  # not an operator: the selector is invalid
    ],
)
def test_required_node_affinity(
    operator: str, values: tuple[str, ...], labels: Mapping[str, str], holds: bool
) -> None:
    """Rule: k8s.io/component-helpers nodeaffinity (NewNodeSelector), as Kueue's
    FindFeasibleNodes step 3 applies it."""
    from exporter.cluster.capacity.placement import node_affinity_matches
    from exporter.cluster.objects import NodeSelectorRequirement, NodeSelectorTerm

    term = NodeSelectorTerm((NodeSelectorRequirement("k", operator, values),))
    assert node_affinity_matches((term,), _node(labels)) is holds


def test_terms_are_ored_and_an_empty_term_matches_nothing() -> None:
    from exporter.cluster.capacity.placement import node_affinity_matches
    from exporter.cluster.objects import NodeSelectorRequirement, NodeSelectorTerm

    no = NodeSelectorTerm((NodeSelectorRequirement("k", "In", ("z",)),))
    yes = NodeSelectorTerm(fields=(NodeSelectorRequirement("metadata.name", "In", ("n",)),))
    assert node_affinity_matches((no, yes), _node({"k": "a"}))
    assert not node_affinity_matches((NodeSelectorTerm(),), _node({"k": "a"}))


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "", "operator": "Exists", "effect": ""}, True),  # empty key + Exists: all
        ({"key": GPU, "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": GPU, "operator": "Equal", "value": "true", "effect": "NoSchedule"}, True),
        ({"key": GPU, "operator": "", "value": "false", "effect": "NoSchedule"}, False),
        ({"key": GPU, "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": GPU, "operator": "Exist", "effect": "NoSchedule"}, False),  # unknown: nothing
    ],
)
def test_tolerations_against_the_eks_gpu_taint(
    toleration: Mapping[str, str], tolerated: bool
) -> None:
    """Rule: core/v1 Toleration.ToleratesTaint, as FindMatchingUntoleratedTaint applies it
    (scheduling_simulator_default.go step 1)."""
    from exporter.cluster.capacity.placement import screen_nodes
    from exporter.cluster.parse.core import parse_node, tolerations

    problems: list[str] = []
    parsed = tolerations([dict(toleration)], "tolerations", problems)
    assert bool(problems) is (toleration["operator"] == "Exist")
    tainted = parse_node(node("n1", "nn-a", taints=[EKS_GPU_TAINT]))
    found = screen_nodes(None, [tainted], tolerations=parsed)
    assert (found.nodes == {"n1"}) is tolerated
    if toleration["operator"] == "Exist":
        assert found.problems and "tolerates no taint" in found.problems[0]


def test_a_node_holds_the_fewest_pods_any_requested_resource_allows() -> None:
    """Rule: resources.CountInWithLimitingResource of the pod's requests plus one pod
    (tas_flavor_snapshot.go findTopologyAssignment, fillLeafCounts)."""
    from exporter.cluster.capacity.placement import NodeResourcesFree, fit
    from exporter.cluster.parse.core import parse_node
    from exporter.topology.tree import TopologyTree

    nodes = {n: parse_node(node(n, "nn-a", memory="1000Gi", pods=10)) for n in ("n1", "n2")}
    tree = TopologyTree()
    for name, spec in nodes.items():
        tree.set_node(name, dict(spec.labels), spec.allocatable_gpus, True)
    used = {"n1": {"memory": 900 * GI, "pods": 1}, "n2": {"pods": 10}}
    capacity = NodeResourcesFree(tree, nodes, lambda n: used.get(n, {}))
    asked = ((GPU, 2), ("memory", 50 * GI))
    found = fit(capacity, set(nodes), L3, 8, 2, requests=asked)
    # n1: GPUs 4, memory 2 (100Gi left) -> 2; n2: GPUs 4, pods 0 -> 0
    assert (found.pods_fit, found.domain_gpu_pods) == (2, 8)
    assert found.limited_by == (("memory", 1), ("pods", 1))


def test_fungibility_try_next_flavor_when_borrowing() -> None:
    """Rule: flavorassigner.go shouldTryNextFlavor: a flavor that fits only by borrowing ends
    the search unless whenCanBorrow is TryNextFlavor."""
    from exporter.cluster.capacity.flavors import assign
    from exporter.cluster.capacity.quota import QuotaTree
    from exporter.cluster.parse.kueue import parse_cluster_queue, parse_workload

    def queue(when: str) -> Any:
        cq = cluster_queue("a", [([GPU], [("f1", {GPU: "8"}), ("f2", {GPU: "16"})])], cohort="org")
        if when:
            cq["spec"]["flavorFungibility"] = {"whenCanBorrow": when}
        other = cluster_queue("b", [([GPU], [("f1", {GPU: "32"}), ("f2", {GPU: "0"})])], "org")
        return parse_cluster_queue(kueue(cq)), parse_cluster_queue(other)

    wl = parse_workload(workload("a", "w", 2, {GPU: "8"}))
    for when, chosen in (("", "f1"), ("MayStopSearch", "f1"), ("TryNextFlavor", "f2")):
        mine, other = queue(when)
        tree = QuotaTree.build([mine, other])
        found = assign(wl, mine, tree, lambda name: None)
        assert found.fits and found.flavor_for(GPU) == chosen, (when, found)


def test_pods_is_a_resource_when_a_group_covers_it() -> None:
    """Rule: flavorassigner.go assignFlavors sets requests[pods] = count when the
    ClusterQueue covers pods."""
    from exporter.cluster.capacity.flavors import assign
    from exporter.cluster.capacity.quota import QuotaTree
    from exporter.cluster.parse.kueue import parse_cluster_queue, parse_workload

    cq = parse_cluster_queue(
        cluster_queue("a", [([GPU, "pods"], [(P5, {GPU: "64", "pods": "3"})])])
    )
    found = assign(
        parse_workload(workload("a", "w", 4, {GPU: "8"})), cq, QuotaTree.build([cq]), lambda n: None
    )
    (short,) = found.short
    assert (short.resource, short.status, short.need) == ("pods", "maximum", "1 more pods")


def test_the_smallest_room_for_several_missing_slices() -> None:
    """Rule: fillInCountsHelper (sum of floor(pods / size) per slice-level domain): the
    missing slices are completed where fewest pods are lacking."""
    from exporter.cluster.capacity.placement import Fit

    found = Fit(
        "too-small",
        "network-node-layer-2",
        "nn-mid",
        2,
        8,
        8,
        slice_level="network-node-layer-3",
        slice_size=2,
        slices_fit=1,
        slices_needed=4,
        slice_pods=(("nn-a", 3), ("nn-b", 1), ("nn-c", 1), ("nn-d", 0)),
    )
    # 3 slices missing: one pod each in nn-a, nn-b, nn-c (3 pods), not 6
    assert found.smallest_room() == (3, ("nn-a", "nn-b", "nn-c"))
