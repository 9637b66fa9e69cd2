"""Elastic training jobs in the simulated cluster (exporter/sim/elastic.py), read back through
the objects it writes: HyperPodPyTorchJobs with several Kueue Workloads each, and Kueue-native
elastic Jobs resized through workload slices.

Every HyperPodPyTorchJob is validated against our reconstructed CRD
(tests/fixtures/hyperpod/hyperpodpytorchjob-crd.yaml) and every Workload against Kueue's real
CRDs (tests/crds.py), so nothing here can pass on a field no cluster would store.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.cluster.explain import model_from_objects
from exporter.cluster.model import ClusterModel
from exporter.cluster.ui.pages import topology_picture
from exporter.sim.cluster import ClusterShape, SimulatedCluster, default_shape
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from tests.crds import assert_valid, assert_valid_kueue, crd_validator
from tests.sim.test_sim_cluster import START, MemoryStore, conditions

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hyperpod"
HYPERPOD_API = "sagemaker.amazonaws.com/v1"
SLICE_NAME = "kueue.x-k8s.io/workload-slice-name"
REPLACEMENT_FOR = "kueue.x-k8s.io/workload-slice-replacement-for"
WORKLOAD = "kueue.x-k8s.io/workload"
GATE = "kueue.x-k8s.io/elastic-job"
Obj = dict[str, Any]


def shape(p5_nodes: int = 8) -> ClusterShape:
    """A scripted single-team cluster with no bootstrap elastic jobs."""
    return ClusterShape(
        p5_nodes=p5_nodes,
        ultraserver_nodes=0,
        teams=("a",),
        arrivals_per_minute=0.0,
        initial_workloads=0,
        elastic_hyperpod_jobs=0,
        elastic_batch_jobs=0,
    )


def owned_by(store: MemoryStore, plural: str, uid: str) -> list[Obj]:
    return [
        o
        for o in store.items(plural)
        if any(ref["uid"] == uid for ref in o["metadata"].get("ownerReferences", []))
    ]


def admitted(workload: Obj) -> bool:
    got = conditions(workload)
    return (
        "admission" in workload["status"]
        and got.get("Admitted", {}).get("status") == "True"
        and got.get("Finished", {}).get("status") != "True"
    )


def ready(pod: Obj) -> bool:
    got = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    return pod["status"]["phase"] == "Running" and got.get("Ready") == "True"


def job(store: MemoryStore, name: str) -> Obj:
    [found] = [j for j in store.items("hyperpodpytorchjobs") if j["metadata"]["name"] == name]
    return found


def scaling(obj: Obj) -> Obj:
    status: Obj = obj["status"].get("elasticScalingStatus", {})
    return status


def target(obj: Obj) -> int | None:
    replicas = scaling(obj).get("targetReplicas")
    return None if replicas is None else int(replicas["pods"])


def settled(obj: Obj) -> int | None:
    """The size a job runs at once its last scaling completed: `targetReplicas` is what the
    operator scales to (it moves when the operator asks), `lastScalingTime` is written when the
    scaling completes, and `lastUpdated` with both; None while a scaling is under way."""
    status = scaling(obj)
    done = status.get("lastScalingTime")
    return target(obj) if done is not None and done == status.get("lastUpdated") else None


def run(cluster: SimulatedCluster, start: float, seconds: int) -> Iterator[float]:
    for i in range(1, seconds + 1):
        cluster.step(start + i)
        yield start + i


def grow_to(cluster: SimulatedCluster, store: MemoryStore, name: str, size: int) -> float:
    """Step until job `name` runs at `size` replicas; returns the time it did."""
    for now in run(cluster, cluster_now(cluster), 900):
        if settled(job(store, name)) == size:
            return now
    raise AssertionError(f"{name} never reached {size} replicas: {scaling(job(store, name))}")


def cluster_now(cluster: SimulatedCluster) -> float:
    return float(cluster._now)


# --- (a) schema: fixtures and everything the simulation writes ------------------------------


@pytest.mark.parametrize(
    "path", sorted(p.name for p in FIXTURES.glob("*.yaml") if not p.name.endswith("-crd.yaml"))
)
def test_every_fixture_validates(path: str) -> None:
    assert_valid(yaml.safe_load((FIXTURES / path).read_text()))


def test_the_reconstructed_schema_is_closed_and_bad_bounds_are_only_semantic() -> None:
    fixture = yaml.safe_load((FIXTURES / "hyperpodpytorchjob-elastic.yaml").read_text())
    fixture["spec"]["elasticPolicy"]["minReplica"] = 2  # a typo the API server would prune
    fixture["status"]["elasticScalingStatus"]["isFaultyPodScaleDown"] = "no"
    problems = "\n".join(
        crd_validator("sagemaker.amazonaws.com", "HyperPodPyTorchJob", "v1")(fixture)
    )
    assert "minReplica" in problems and "isFaultyPodScaleDown" in problems
    bad = yaml.safe_load((FIXTURES / "hyperpodpytorchjob-bad-bounds.yaml").read_text())
    policy = bad["spec"]["elasticPolicy"]
    assert policy["minReplicas"] > policy["maxReplicas"]  # valid to the schema, wrong in meaning
    with pytest.raises(AssertionError, match=r"not in the kueue\.x-k8s\.io group"):
        assert_valid_kueue(bad)


def test_everything_the_default_simulation_writes_for_elastic_jobs_validates() -> None:
    store = MemoryStore()
    cluster = SimulatedCluster(store, default_shape(), seed=0)
    for _ in run(cluster, START, 900):
        pass
    seen = {"job": 0, "hyperpod-workload": 0, "slice": 0, "replacement": 0, "replaced": 0}
    for op, plural, obj in store.log:
        if op != "upsert":
            continue
        if plural == "hyperpodpytorchjobs":
            assert_valid(obj)
            seen["job"] += 1
        elif plural == "workloads":
            owner = obj["metadata"]["ownerReferences"][0]
            annotations = obj["metadata"].get("annotations", {})
            if owner["apiVersion"] == HYPERPOD_API:
                assert_valid(obj)
                assert obj["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == owner["uid"]
                assert obj["metadata"]["name"].startswith(f"hyperpodpytorchjob-{owner['name']}-")
                seen["hyperpod-workload"] += 1
            elif annotations.get("kueue.x-k8s.io/elastic-job") == "true":
                assert_valid(obj)
                seen["slice"] += 1
                seen["replacement"] += REPLACEMENT_FOR in annotations
                finished = conditions(obj).get("Finished", {})
                seen["replaced"] += finished.get("reason") == "WorkloadSliceReplaced"
    assert all(seen.values()), seen
    priorities = {c["metadata"]["name"]: c["value"] for c in store.items("workloadpriorityclasses")}
    assert priorities["elastic-priority"] < min(
        v for k, v in priorities.items() if k != "elastic-priority"
    )


def test_the_api_server_serves_hyperpod_jobs_for_discovery_list_and_watch() -> None:
    store = ObjectStore(clock=lambda: START)
    cluster = SimulatedCluster(store, default_shape(), seed=0, start=START)
    cluster.bootstrap()
    with FakeApiServer(store) as server:

        def get(path: str) -> Any:
            with urllib.request.urlopen(server.url + path, timeout=5) as response:
                return json.loads(response.read())

        groups = {g["name"]: g for g in get("/apis")["groups"]}
        assert groups["sagemaker.amazonaws.com"]["preferredVersion"]["version"] == "v1"
        resources = get("/apis/sagemaker.amazonaws.com/v1")["resources"]
        assert {r["name"]: r["kind"] for r in resources}["hyperpodpytorchjobs"] == (
            "HyperPodPyTorchJob"
        )
        listed = get("/apis/sagemaker.amazonaws.com/v1/hyperpodpytorchjobs")
        assert len(listed["items"]) == 2
        assert listed["items"][0]["kind"] == "HyperPodPyTorchJob"
        one = get("/apis/sagemaker.amazonaws.com/v1/namespaces/hyperpod-ns-llm/hyperpodpytorchjobs")
        assert [j["metadata"]["namespace"] for j in one["items"]] == ["hyperpod-ns-llm"]
        rv = listed["metadata"]["resourceVersion"]
        for _ in run(cluster, START, 200):  # until a job scales
            if target(store.items("hyperpodpytorchjobs")[0]) != 2:
                break
        url = (
            "/apis/sagemaker.amazonaws.com/v1/hyperpodpytorchjobs"
            f"?watch=1&resourceVersion={rv}&timeoutSeconds=1"
        )
        with urllib.request.urlopen(server.url + url, timeout=5) as response:
            events = [json.loads(line) for line in response.read().splitlines() if line.strip()]
        assert events and {e["type"] for e in events} <= {"ADDED", "MODIFIED", "BOOKMARK"}
        assert any(e["type"] == "MODIFIED" for e in events)


# --- (b) the default demo scales within its first minutes ------------------------------------


def test_a_default_hyperpod_job_scales_up_in_the_first_minutes() -> None:
    store = MemoryStore()
    cluster = SimulatedCluster(store, default_shape(), seed=0)
    both_admitted = None
    history: dict[str, tuple[int | None, str | None]] = {}
    grew: list[tuple[float, str]] = []
    pending_pods_seen = False
    for now in run(cluster, START, 240):
        for hp in store.items("hyperpodpytorchjobs"):
            name, uid = hp["metadata"]["name"], hp["metadata"]["uid"]
            workloads = owned_by(store, "workloads", uid)
            live = [w for w in workloads if admitted(w)]
            classes = {w["spec"]["priorityClassRef"]["name"] for w in live}
            if len(live) >= 2 and both_admitted is None:
                assert classes == {"training-priority", "elastic-priority"}  # base + scale-up
                # the target is what the operator scales to, from the moment it asks (§1.4)
                assert target(hp) == sum(w["spec"]["podSets"][0]["count"] for w in live)
                both_admitted = now
            pods = owned_by(store, "pods", uid)
            pending_pods_seen |= any(p["status"]["phase"] == "Pending" for p in pods)
            new = (target(hp), scaling(hp).get("lastScalingTime"))
            old = history.get(name)
            if old is not None and old[0] is not None and new[1] == old[1]:
                continue  # no scaling completed: compare with the last one that did
            if old is not None and old[0] is not None and new[0] is not None and new[0] > old[0]:
                assert new[1] is not None and (old[1] is None or new[1] > old[1])
                assert scaling(hp)["lastRestartTime"] == new[1]
                assert len(pods) == new[0] and all(ready(p) for p in pods)  # restarted once Ready
                assert {p["metadata"]["annotations"][WORKLOAD] for p in pods} == {
                    w["metadata"]["name"] for w in live
                }
                grew.append((now, name))
            history[name] = new
    assert both_admitted is not None and both_admitted - START <= 120
    assert grew and grew[0][0] - START <= 180, grew
    assert pending_pods_seen  # new pods start Pending and turn Ready later


def test_the_default_kueue_elastic_job_gets_a_replacement_slice_early() -> None:
    store = MemoryStore()
    cluster = SimulatedCluster(store, default_shape(), seed=0)
    for now in run(cluster, START, 150):
        slices = [
            w
            for w in store.items("workloads")
            if REPLACEMENT_FOR in w["metadata"].get("annotations", {})
        ]
        if slices:
            assert now - START <= 120
            return
    raise AssertionError("no replacement slice in the first 150 s")


# --- (c) (d) (f) scripted HyperPod scaling ----------------------------------------------------


def test_a_preempted_scale_up_is_deleted_and_the_job_shrinks() -> None:
    store = MemoryStore()
    cluster = SimulatedCluster(store, shape(), seed=1, elastic=True)
    base = cluster.submit_elastic("a", "train", 2, 6, snooze_s=10, now=START)
    assert base.startswith("hyperpodpytorchjob-train-")
    grow_to(cluster, store, "train", 6)
    hp = job(store, "train")
    uid = hp["metadata"]["uid"]
    live = [w for w in owned_by(store, "workloads", uid) if admitted(w)]
    assert sorted(w["spec"]["podSets"][0]["count"] for w in live) == [1, 1, 1, 1, 2]
    for w in live:
        ref = w["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["name"], ref["controller"]) == (
            "HyperPodPyTorchJob",
            "train",
            True,
        )
    before = scaling(hp)["lastScalingTime"]

    now = cluster_now(cluster)
    cluster.submit("a", "urgent", 8, 3, "inference-priority", now=now, runtime_s=600)
    cluster.step(now + 1)
    victims = [
        w
        for w in owned_by(store, "workloads", uid)
        if conditions(w).get("Preempted", {}).get("status") == "True"
    ]
    assert len(victims) == 1  # the newest scale-up (lowest priority, latest admitted) only
    victim = victims[0]["metadata"]["name"]
    assert victims[0]["spec"]["priorityClassRef"]["name"] == "elastic-priority"
    assert conditions(victims[0])["Evicted"]["reason"] == "Preempted"
    assert store.pods_of(victim) == []
    for _ in run(cluster, now + 1, 60):
        if settled(job(store, "train")) == 5:
            break
    names = {w["metadata"]["name"] for w in store.items("workloads")}
    assert victim not in names  # the operator removed the Workload
    assert ("delete", "workloads") in {
        (op, p) for op, p, o in store.log if o["metadata"]["name"] == victim
    }
    hp = job(store, "train")
    assert target(hp) == 5 and scaling(hp)["lastScalingTime"] > before
    assert len(owned_by(store, "pods", uid)) == 5
    assert conditions(store.workload(base))["Admitted"]["status"] == "True"


def test_fault_pod_scales_the_job_down_as_faulty() -> None:
    store = MemoryStore()
    cluster = SimulatedCluster(store, shape(), seed=2, elastic=True)
    cluster.submit_elastic("a", "train", 2, 4, snooze_s=10, now=START)
    with pytest.raises(ValueError, match="no admitted scale-up"):
        cluster.step(START + 1)
        cluster.fault_pod("hyperpod-ns-a", "train")
    grow_to(cluster, store, "train", 4)
    with pytest.raises(ValueError, match="no HyperPodPyTorchJob"):
        cluster.fault_pod("hyperpod-ns-a", "nope")
    failed = cluster.fault_pod("hyperpod-ns-a", "train")
    pod = {p["metadata"]["name"]: p for p in store.items("pods")}[failed]
    assert pod["status"]["phase"] == "Failed" and not ready(pod)
    faulty_workload = pod["metadata"]["annotations"][WORKLOAD]
    hp = job(store, "train")
    assert scaling(hp)["isFaultyPodScaleDown"] is False
    start = cluster_now(cluster)
    when = None
    for t in run(cluster, start, 120):
        hp = job(store, "train")
        if scaling(hp)["isFaultyPodScaleDown"]:
            when = t
            break
    assert (
        when is not None and when - start >= 60
    )  # faultyScaleDownTimeoutInSeconds: the operator waits for recovery
    assert target(hp) == 3
    assert faulty_workload not in {w["metadata"]["name"] for w in store.items("workloads")}
    assert failed not in {p["metadata"]["name"] for p in store.items("pods")}
    grow_to(cluster, store, "train", 4)
    assert scaling(job(store, "train"))["isFaultyPodScaleDown"] is False  # reset by the next scale


def test_a_scale_up_pending_past_its_timeout_is_withdrawn_with_backoff() -> None:
    store = MemoryStore()
    cluster = SimulatedCluster(store, shape(p5_nodes=3), seed=3, elastic=True)
    blocker = cluster.submit("a", "blocker", 8, 1, "inference-priority", now=START, runtime_s=400)
    cluster.submit_elastic("a", "train", 2, 3, snooze_s=10, scaling_timeout_s=30, now=START)
    created: dict[str, float] = {}
    last: dict[str, Obj] = {}
    deleted: dict[str, float] = {}
    failures = []
    for now in run(cluster, START, 390):
        hp = job(store, "train")
        scale_ups = [
            w
            for w in owned_by(store, "workloads", hp["metadata"]["uid"])
            if w["spec"]["priorityClassRef"]["name"] == "elastic-priority"
        ]
        for w in scale_ups:
            created.setdefault(w["metadata"]["name"], now)
            last[w["metadata"]["name"]] = w
        for name in created.keys() - deleted.keys() - {w["metadata"]["name"] for w in scale_ups}:
            deleted[name] = now
        failures.append(scaling(hp).get("consecutiveScalingFailures", 0))
    assert len(deleted) >= 3
    for name, gone in deleted.items():
        assert 30 <= gone - created[name] <= 31  # scalingTimeoutInSeconds
        pending = conditions(last[name])["QuotaReserved"]
        assert (pending["status"], pending["reason"]) == ("False", "Pending")
    order = sorted(created, key=created.__getitem__)
    gaps = [created[order[i + 1]] - deleted[order[i]] for i in range(len(order) - 1)]
    assert gaps[0] >= 20 and gaps[1] >= 40 and gaps[1] > gaps[0]  # snooze doubles per failure
    assert max(failures) >= 2 and failures == sorted(failures)
    assert store.workload(blocker)["status"]["admission"]  # it held the third node all along
    for _ in run(cluster, START + 390, 400):  # the blocker ends; the next try succeeds
        if settled(job(store, "train")) == 3:
            break
    assert scaling(job(store, "train"))["consecutiveScalingFailures"] == 0


# --- (e) Kueue-native elastic Job: workload slices -----------------------------------------------


def test_a_kueue_elastic_job_grows_by_a_replacement_slice_and_shrinks_in_place() -> None:
    store = MemoryStore()
    cluster = SimulatedCluster(store, shape(p5_nodes=2), seed=4, elastic=True)
    origin = cluster.submit_elastic_batch("a", "sweep", 2, 4, now=START, resize_after_s=10_000)
    blocker = cluster.submit("a", "blocker", 8, 1, "inference-priority", now=START, runtime_s=100)
    cluster.step(START + 1)
    first = store.workload(origin)
    assert first["metadata"]["annotations"] == {
        "kueue.x-k8s.io/elastic-job": "true",
        SLICE_NAME: origin,
    }
    assert admitted(first) and len(store.pods_of(origin)) == 2
    assert all(store.pods_of(blocker))

    new = cluster.resize_elastic_batch("hyperpod-ns-a", "sweep", 4)
    assert new != origin and new.startswith("job-sweep-")
    with pytest.raises(ValueError, match="already waits"):
        cluster.resize_elastic_batch("hyperpod-ns-a", "sweep", 5)
    for _ in run(cluster, START + 1, 60):
        replacement = store.workload(new)
        assert replacement["metadata"]["annotations"][REPLACEMENT_FOR] == f"hyperpod-ns-a/{origin}"
        assert replacement["metadata"]["annotations"][SLICE_NAME] == origin
        assert not admitted(replacement)  # the blocker holds the other node
        gated = store.pods_of(new)
        assert len(gated) == 2
        for pod in gated:
            assert pod["spec"]["schedulingGates"] == [{"name": GATE}]
            assert "nodeName" not in pod["spec"] and pod["status"]["phase"] == "Pending"
            assert pod["metadata"]["annotations"][SLICE_NAME] == origin
        assert admitted(store.workload(origin))
    for _ in run(cluster, START + 61, 60):
        if admitted(store.workload(new)):
            break
    replacement = store.workload(new)
    assert admitted(replacement)
    assignment = replacement["status"]["admission"]["podSetAssignments"][0]
    assert (assignment["count"], assignment["resourceUsage"]["nvidia.com/gpu"]) == (4, "16")
    finished = conditions(store.workload(origin))["Finished"]
    assert (finished["status"], finished["reason"], finished["message"]) == (
        "True",
        "WorkloadSliceReplaced",
        "Replaced to accommodate a new workload slice",
    )
    pods = store.pods_of(new)
    assert len(pods) == 4 and store.pods_of(origin) == []  # the old pods moved to the new slice
    for pod in pods:
        assert "schedulingGates" not in pod["spec"] and pod["spec"]["nodeName"]
        assert ready(pod)
    [queue] = store.items("clusterqueues")
    assert queue["status"]["flavorsUsage"][0]["resources"][0]["total"] == "16"  # not 8 + 16

    same = cluster.resize_elastic_batch("hyperpod-ns-a", "sweep", 3)
    cluster.step(cluster_now(cluster) + 1)
    assert same == new  # shrinking keeps the slice
    shrunk = store.workload(new)
    assert shrunk["spec"]["podSets"][0]["count"] == 3
    assert shrunk["status"]["admission"]["podSetAssignments"][0]["count"] == 3
    assert len(store.pods_of(new)) == 3
    [queue] = store.items("clusterqueues")
    assert queue["status"]["flavorsUsage"][0]["resources"][0]["total"] == "12"
    assert_valid(shrunk)


# --- the demo read back by the cluster service: one Workload, its own pods ------------------------

KIND_OF = {
    "nodes": "Node",
    "pods": "Pod",
    "events": "Event",
    "workloads": "Workload",
    "clusterqueues": "ClusterQueue",
    "localqueues": "LocalQueue",
    "cohorts": "Cohort",
    "resourceflavors": "ResourceFlavor",
    "topologies": "Topology",
    "workloadpriorityclasses": "WorkloadPriorityClass",
    "hyperpodpytorchjobs": "HyperPodPyTorchJob",
}


def judged_demo(model: ClusterModel) -> None:
    """What the demo's pages must agree on, for every elastic job the model holds:
    - the Workloads of one job list disjoint pods, and no Workload is credited (metrics, the
      topology page) with more GPUs than it was admitted for (one Workload per increment, 1.4;
      Kueue's kueue.x-k8s.io/workload annotation names a pod's Workload; a replaced slice owns
      none, 1.6);
    - a HyperPod job's target is what the operator scales to (1.3 targetReplicas, 1.4 "an
      additional Kueue Workload ... representing the new resource requirements"): never below
      what Kueue admitted for it, so one page cannot read 2 while the next reads 3."""
    slots: Counter[str] = Counter()
    for tile in topology_picture(model).nodes.values():
        slots.update(slot.workload_key for slot in tile.slots if slot is not None)
    for job in model.elastic.jobs.values():
        seen: dict[str, str] = {}
        for workload in job.workloads.values():
            pods = model.pods_of(workload)
            for pod in pods:
                assert pod.name not in seen, (job.name, pod.name, seen[pod.name], workload.name)
                seen[pod.name] = workload.name
            held = sum(p.gpus for p in pods if p.holds_gpus)
            assert held <= workload.gpus_requested, (workload.name, held)
            assert slots[f"{workload.namespace}/{workload.name}"] <= workload.gpus_requested
        if job.kind == "HyperPodPyTorchJob" and job.target is not None:
            assert job.target >= job.admitted, (job.name, job.target, job.admitted)


def test_the_demo_pages_agree_live_and_from_a_dump() -> None:
    """The default demo for ten simulated minutes, fed to the model as informers deliver it
    (live), checked every 10 s; then the store dumped and read as `explain --from` does."""
    store = MemoryStore()
    cluster = SimulatedCluster(store, default_shape(), seed=0)
    model = ClusterModel()
    done = 0
    multi = 0
    for now in run(cluster, START, 600):
        for op, plural, obj in store.log[done:]:
            kind = KIND_OF.get(plural)
            if kind is not None:
                model.apply(kind, "DELETED" if op == "delete" else "ADDED", obj, now)
        done = len(store.log)
        if int(now - START) % 10 == 0:
            judged_demo(model)
            multi += sum(len(j.workloads) > 1 for j in model.elastic.jobs.values())
    assert multi, "no elastic job ever held two Workloads: nothing was checked"
    events = list(model.elastic.events())
    assert any(e.direction == "up" and e.done and not e.failed for e in events)
    for event in events:  # a preempted scale-up that was admitted did not fail before it
        if "admitted" in event.phases:
            assert event.failed_phase != "admitted", event
    dump = [{**obj, "kind": KIND_OF[plural]} for plural in KIND_OF for obj in store.items(plural)]
    offline, _ = model_from_objects(dump)
    judged_demo(offline)
    assert any(len(j.workloads) > 1 for j in offline.elastic.jobs.values())


# --- determinism ----------------------------------------------------------------------------------


def test_elastic_jobs_are_repeatable_and_can_be_turned_off() -> None:
    logs = []
    for elastic in (True, True, False):
        store = MemoryStore()
        cluster = SimulatedCluster(store, default_shape(), seed=5, elastic=elastic)
        for _ in run(cluster, START, 200):
            pass
        logs.append(json.dumps(store.log, sort_keys=True))
        jobs = store.items("hyperpodpytorchjobs")
        assert bool(jobs) is elastic
    assert logs[0] == logs[1] != logs[2]
