"""The simulated Kueue runs admission checks as Kueue does (exporter/sim/kueue/checks.py).

Each scenario cites the Kueue code (kubernetes-sigs/kueue @ff69552) it rests on. The tests play
the check controller the way a real one works: a JSON merge patch of the Workload's
`status.admissionChecks` through the simulated API server (`/status` subresource, either API
version), and the AdmissionCheck's `Active` condition likewise; the simulation reads both back
at its next step. Every Kueue object the run leaves in the store validates against the CRDs in
v1beta1 and v1beta2.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes.client as kc
import pytest

from exporter.sim.cluster import ClusterShape, SimulatedCluster
from exporter.sim.environment import SharedNodes
from exporter.sim.hyperpod_layout import GB200, P5, cluster_queue, namespace
from exporter.sim.kubeapi.server import FakeApiServer, ObjectStore
from exporter.sim.kueue import checks as ck
from exporter.sim.kueue.checks import AdmissionChecks, CheckSpec
from exporter.sim.kueue.convert import convert, domains_from_slices
from exporter.sim.kueue.objects import rfc3339
from tests.crds import assert_valid_kueue

START = 1_795_000_000.0
GROUP = "kueue.x-k8s.io"
NS = namespace("a")
CQ = cluster_queue("a")
CHECK = ck.NODE_HEALTH_CHECK
KUEUE_PLURALS = (
    "workloads",
    "clusterqueues",
    "localqueues",
    "cohorts",
    "resourceflavors",
    "topologies",
    "workloadpriorityclasses",
    "admissionchecks",
)
Obj = dict[str, Any]


class Sim:
    """A scripted cluster of one team, its API server, and a client playing a check
    controller."""

    def __init__(
        self,
        api: kc.ApiClient,
        store: ObjectStore,
        checks: AdmissionChecks | None,
        p5_nodes: int = 2,
        ultraserver_nodes: int = 0,
    ) -> None:
        shape = ClusterShape(
            p5_nodes=p5_nodes,
            ultraserver_nodes=ultraserver_nodes,
            teams=("a",),
            arrivals_per_minute=0.0,
            initial_workloads=0,
        )
        self.store = store
        self.cluster = SimulatedCluster(store, shape, seed=1, start=START, admission_checks=checks)
        self.custom = kc.CustomObjectsApi(api)
        self.now = START
        self.cluster.bootstrap()

    def step(self, seconds: int = 1) -> None:
        for _ in range(seconds):
            self.now += 1.0
            self.cluster.step(self.now)

    def submit(self, name: str, pods: int = 2, flavor: str = P5, gpus: int = 8) -> str:
        return self.cluster.submit(
            "a", name, gpus, pods, "training-priority", instance_type=flavor, now=self.now
        )

    def workload(self, name: str, version: str = "v1beta2") -> Obj:
        obj: Obj = self.custom.get_namespaced_custom_object(GROUP, version, NS, "workloads", name)
        return obj

    def set_check(
        self,
        name: str,
        state: str,
        message: str = "",
        check: str = CHECK,
        requeue_after_s: int | None = None,
        version: str = "v1beta2",
    ) -> Obj:
        """What a check controller does: read the Workload, set its entry's state (a new
        lastTransitionTime when the state changes, Kueue's SetAdmissionCheckState), and
        merge-patch status.admissionChecks with the resourceVersion it read."""
        wl = self.workload(name, version)
        entries = wl["status"]["admissionChecks"]
        for entry in entries:
            if entry["name"] == check:
                if entry["state"] != state:
                    entry["lastTransitionTime"] = rfc3339(self.now)
                entry.update(state=state, message=message)
                if requeue_after_s is not None:
                    entry["requeueAfterSeconds"] = requeue_after_s
        body = {
            "metadata": {"resourceVersion": wl["metadata"]["resourceVersion"]},
            "status": {"admissionChecks": entries},
        }
        out: Obj = self.custom.patch_namespaced_custom_object_status(
            GROUP, version, NS, "workloads", name, body
        )
        return out

    def set_active(self, check: str = CHECK) -> None:
        """The check's controller says it is ready to decide (its Active condition)."""
        body = {
            "status": {
                "conditions": [
                    {
                        "type": "Active",
                        "status": "True",
                        "reason": "Active",
                        "message": "topowatch node-health is deciding",
                        "lastTransitionTime": rfc3339(self.now),
                    }
                ]
            }
        }
        self.custom.patch_cluster_custom_object_status(
            GROUP, "v1beta2", "admissionchecks", check, body
        )

    def pods(self, workload: str) -> list[Obj]:
        return [
            p
            for p in self.store.items("pods")
            if p["metadata"]["annotations"].get("kueue.x-k8s.io/workload") == workload
        ]

    def queue(self) -> Obj:
        obj = self.store.get("clusterqueues", "", CQ)
        assert obj is not None
        return obj

    def events(self, workload: str) -> list[tuple[str, str, str]]:
        return [
            (e["type"], e["reason"], e["message"])
            for e in self.store.items("events")
            if e["involvedObject"]["name"] == workload
        ]

    def decisions(self, workload: str) -> list[Any]:
        return [d for d in self.cluster.decisions.decisions if d.workload == f"{NS}/{workload}"]

    def validate(self) -> int:
        """Every Kueue object now stored validates against its CRD in both versions."""
        count = 0
        for plural in KUEUE_PLURALS:
            for obj in self.store.items(plural):
                for version in ("v1beta2", "v1beta1"):
                    assert_valid_kueue(convert(obj, version))
                    count += 1
        return count


def cond(obj: Obj, kind: str) -> Obj:
    found: dict[str, Obj] = {c["type"]: c for c in obj["status"].get("conditions", [])}
    return found.get(kind, {})


def entries(obj: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in obj["status"].get("admissionChecks", [])}


@pytest.fixture
def env() -> Iterator[tuple[kc.ApiClient, ObjectStore]]:
    store = ObjectStore()
    with (
        FakeApiServer(store) as server,
        kc.ApiClient(kc.Configuration(host=server.url)) as api,
    ):
        yield api, store


def make(
    env: tuple[kc.ApiClient, ObjectStore],
    checks: AdmissionChecks | None = None,
    **shape: int,
) -> Sim:
    api, store = env
    return Sim(api, store, checks if checks is not None else AdmissionChecks(), **shape)


# --- quota reserved -> checks Pending ---------------------------------------------------------


def test_reservation_leaves_checks_pending_and_the_job_suspended(env: Any) -> None:
    """scheduler.go prepareWorkload (SetQuotaReservation, then SyncAdmittedCondition: quota
    reserved, checks not all Ready -> Admitted False "UnsatisfiedChecks"); workload.go
    AdmissionChecksForWorkload (a check without onFlavors applies to every workload of the
    queue, so a pending one carries it too); the job reconciler keeps the Job suspended until
    Admitted: no pods."""
    sim = make(env)
    ac = sim.store.get("admissionchecks", "", CHECK)
    assert ac is not None and ac["spec"] == {"controllerName": ck.NODE_HEALTH_CONTROLLER}
    assert ck.is_active(ac)
    strategy = sim.queue()["spec"]["admissionChecksStrategy"]
    assert strategy == {"admissionChecks": [{"name": CHECK}]}
    first = sim.submit("first")
    second = sim.submit("second")  # the queue's 16 GPUs go to the first
    sim.step()
    wl = sim.workload(first)
    assert wl["status"]["admission"]["clusterQueue"] == CQ
    assert cond(wl, "QuotaReserved")["status"] == "True"
    admitted = cond(wl, "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "UnsatisfiedChecks")
    assert admitted["message"] == "The workload has not all checks ready"
    assert entries(wl)[CHECK]["state"] == "Pending"
    assert entries(wl)[CHECK]["message"] == ""
    assert sim.pods(first) == []
    pending = sim.workload(second)
    assert "admission" not in pending["status"]
    assert entries(pending)[CHECK]["state"] == "Pending"
    status = sim.queue()["status"]
    assert (status["reservingWorkloads"], status["admittedWorkloads"]) == (1, 0)
    assert [d.kind for d in sim.decisions(first)] == ["reserved"]
    assert sim.decisions(first)[0].cause == ck.CAUSE
    assert ("Normal", "QuotaReserved") in {(t, r) for t, r, _ in sim.events(first)}
    sim.step(10)  # nobody decides: it waits, holding the quota
    assert cond(sim.workload(first), "Admitted")["status"] == "False"
    assert "admission" not in sim.workload(second)["status"]
    assert sim.validate()


def test_all_ready_admits_and_the_pods_start(env: Any) -> None:
    """admissionchecks.go SyncAdmittedCondition: reservation and every check Ready ->
    Admitted True "The workload is admitted"; workload_controller.go records the Admitted
    event with the wait since reservation. The controller writes through the v1beta1 API."""
    sim = make(env)
    name = sim.submit("train")
    sim.step()
    sim.step(4)
    sim.set_check(name, "Ready", "nodes healthy", version="v1beta1")
    assert sim.pods(name) == []  # nothing happens until Kueue's next pass
    sim.step()
    wl = sim.workload(name)
    admitted = cond(wl, "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("True", "Admitted")
    assert entries(wl)[CHECK]["state"] == "Ready"
    assert entries(wl)[CHECK]["message"] == "nodes healthy"
    pods = sim.pods(name)
    assert len(pods) == 2 and all(p["status"]["phase"] == "Running" for p in pods)
    messages = [m for _, r, m in sim.events(name) if r == "Admitted"]
    assert messages == [f"Admitted by ClusterQueue {CQ}, wait time since reservation was 5s"]
    reserved, admitted_ = sim.decisions(name)
    assert (reserved.kind, admitted_.kind) == ("reserved", "admitted")
    assert admitted_.domains == reserved.domains and admitted_.domains  # where it runs
    assert admitted_.detail == f"admission checks Ready: {CHECK}"
    status = sim.queue()["status"]
    assert (status["reservingWorkloads"], status["admittedWorkloads"]) == (1, 1)
    assert sim.validate()


def test_retry_releases_the_quota_to_another_workload_and_requeues_after_the_backoff(
    env: Any,
) -> None:
    """workload_controller.go: NeedsRequeueAtUpdate (requeueAt = the Retry's
    lastTransitionTime + requeueAfterSeconds), reconcileCheckBasedEviction (Evict with reason
    AdmissionCheck, message buildAdmissionChecksMessage); evict.go resetChecksOnEviction
    (Pending, "Reset to Pending after eviction. Previously: Retry", retryCount + 1); the job
    reconciler releases the quota (Requeued False/AdmissionCheck, QuotaReserved False); once
    requeueAt passes, Requeued True/BackoffFinished and the workload is queued again."""
    sim = make(env)
    first = sim.submit("first")
    second = sim.submit("second")
    sim.step()
    assert "admission" not in sim.workload(second)["status"]
    why = "node hyperpod-i-0abc: XID 79 on GPU 3 since 10:02"
    sim.set_check(first, "Retry", why, requeue_after_s=ck.retry_backoff_s(0))
    retried_at = sim.now
    sim.step()
    wl = sim.workload(first)
    evicted = cond(wl, "Evicted")
    message = f'Evicted due to AdmissionCheck in Retry state: "{CHECK}" ({why})'
    assert (evicted["status"], evicted["reason"], evicted["message"]) == (
        "True",
        "AdmissionCheck",
        message,
    )
    assert "admission" not in wl["status"]
    assert cond(wl, "QuotaReserved")["status"] == "False"
    requeued = cond(wl, "Requeued")
    assert (requeued["status"], requeued["reason"]) == ("False", "AdmissionCheck")
    entry = entries(wl)[CHECK]
    assert entry["state"] == "Pending" and entry["retryCount"] == 1
    assert entry["message"] == "Reset to Pending after eviction. Previously: Retry"
    assert entry["requeueAfterSeconds"] == 60
    assert wl["status"]["requeueState"] == {"requeueAt": rfc3339(retried_at + 60)}
    stats = wl["status"]["schedulingStats"]["evictions"]
    assert stats == [{"reason": "AdmissionCheck", "underlyingCause": "", "count": 1}]
    assert ("Normal", "EvictedDueToAdmissionCheck", message) in sim.events(first)
    # The freed quota goes to the other workload in the same step.
    other = sim.workload(second)
    assert other["status"]["admission"]["clusterQueue"] == CQ
    kinds = [d.kind for d in sim.decisions(first)]
    assert kinds == ["reserved", "evicted"]
    assert sim.decisions(first)[1].reason == "AdmissionCheck"
    assert sim.validate()
    # The second one is turned away too, without a delay: requeued at once; the first waits.
    sim.set_check(second, "Retry", "node hyperpod-i-0def: EFA link down")
    sim.step()
    assert cond(sim.workload(second), "Requeued")["reason"] == "BackoffFinished"
    assert "admission" not in sim.workload(first)["status"]
    assert "admission" in sim.workload(second)["status"]  # back at once, checks Pending again
    while sim.now < retried_at + 59:
        sim.step()
        assert "admission" not in sim.workload(first)["status"]
        assert cond(sim.workload(first), "Requeued")["status"] == "False"
    sim.set_check(second, "Rejected", "repeat offender")  # frees the quota for good
    sim.step(2)
    wl = sim.workload(first)
    assert wl["status"]["admission"]["clusterQueue"] == CQ
    requeued = cond(wl, "Requeued")
    assert (requeued["status"], requeued["reason"]) == ("True", "BackoffFinished")
    assert requeued["message"] == "The workload backoff was finished"
    assert cond(wl, "Evicted")["status"] == "False"  # "Previously: ..." once reserved again
    assert "requeueAt" not in wl["status"].get("requeueState", {})
    assert sim.validate()


def test_rejected_deactivates_and_releases_the_quota_for_good(env: Any) -> None:
    """workload_controller.go reconcileCheckBasedEviction (a Rejected check:
    DeactivationTarget, Warning event AdmissionCheckRejected "Deactivated due to ..."), then
    spec.active false, then Evict with reason Deactivated and underlying cause AdmissionCheck
    ("DeactivatedDueToAdmissionCheck", "The workload is deactivated due to ...") clearing
    requeueState; the quota is released and the workload is never queued again."""
    sim = make(env)
    name = sim.submit("train")
    sim.step()
    sim.set_check(name, "Ready")
    sim.step()
    assert len(sim.pods(name)) == 2  # running: a Rejected stops it too
    sim.set_check(name, "Rejected", "GPU 3 retired pages exceeded")
    sim.step()
    wl = sim.workload(name)
    assert wl["spec"]["active"] is False
    rejected = f'AdmissionCheck in Rejected state: "{CHECK}" (GPU 3 retired pages exceeded)'
    message = f"The workload is deactivated due to {rejected}"
    evicted = cond(wl, "Evicted")
    assert (evicted["status"], evicted["reason"], evicted["message"]) == (
        "True",
        "DeactivatedDueToAdmissionCheck",
        message,
    )
    assert cond(wl, "DeactivationTarget") == {}
    assert cond(wl, "Admitted")["reason"] == "NoReservation"
    assert "admission" not in wl["status"] and "requeueState" not in wl["status"]
    assert entries(wl)[CHECK]["message"] == "Reset to Pending after eviction. Previously: Rejected"
    assert wl["status"]["schedulingStats"]["evictions"] == [
        {"reason": "Deactivated", "underlyingCause": "AdmissionCheck", "count": 1}
    ]
    events = sim.events(name)
    assert ("Warning", "AdmissionCheckRejected", f"Deactivated due to {rejected}") in events
    assert ("Normal", "EvictedDueToDeactivatedDueToAdmissionCheck", message) in events
    assert sim.pods(name) == []
    usage = sim.queue()["status"]["flavorsReservation"][0]["resources"][0]
    assert usage["total"] == "0"
    sim.step(120)
    assert "admission" not in sim.workload(name)["status"]
    assert [d.kind for d in sim.decisions(name)] == ["reserved", "admitted", "deactivated"]
    assert sim.validate()


def test_on_flavors_applies_the_check_only_to_the_listed_flavors(env: Any) -> None:
    """pkg/util/admissioncheck NewAdmissionChecks (onFlavors), workload.go
    AdmissionChecksForWorkload: with an admission, the checks whose flavors meet the
    assigned ones; without one, only checks covering every flavor of the queue (so a pending
    workload carries none here)."""
    checks = AdmissionChecks((CheckSpec(on_flavors=(GB200,)),))
    sim = make(env, checks, p5_nodes=2, ultraserver_nodes=18)
    rule = sim.queue()["spec"]["admissionChecksStrategy"]["admissionChecks"]
    assert rule == [{"name": CHECK, "onFlavors": [GB200]}]
    p5 = sim.submit("on-p5")
    gb = sim.submit("on-gb200", pods=4, flavor=GB200, gpus=4)
    assert entries(sim.workload(gb)) == {}  # pending: the check does not cover every flavor
    sim.step()
    wl = sim.workload(p5)
    assert cond(wl, "Admitted")["status"] == "True" and entries(wl) == {}
    assert len(sim.pods(p5)) == 2
    wl = sim.workload(gb)
    assert wl["status"]["admission"]["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"] == GB200
    assert cond(wl, "Admitted")["reason"] == "UnsatisfiedChecks"
    assert entries(wl)[CHECK]["state"] == "Pending"
    assert sim.pods(gb) == []
    sim.set_check(gb, "Retry", "UltraServer us-1 degraded")
    sim.step()
    # Evicted, requeued at once (no requeueAfterSeconds) and reserved again in the same step.
    wl = sim.workload(gb)
    evicted = cond(wl, "Evicted")
    assert (evicted["status"], evicted["reason"]) == ("False", "QuotaReserved")
    assert evicted["message"].startswith("Previously: Evicted due to AdmissionCheck in Retry")
    assert "admission" in wl["status"]
    # Without an admission the flavor-specific check was no longer wanted and its entry went
    # (syncAdmissionCheckConditions), retryCount with it; the new reservation adds it afresh.
    assert entries(wl)[CHECK]["state"] == "Pending" and "retryCount" not in entries(wl)[CHECK]
    assert [d.kind for d in sim.decisions(gb)] == ["reserved", "evicted", "reserved"]
    assert sim.validate()


def test_a_check_of_another_controller_is_left_to_it(env: Any) -> None:
    """The simulation decides no check itself: topowatch's Ready does not admit while another
    controller's check is Pending (HasAllChecksReady); two Retry checks name both in one
    message, sorted ("AdmissionChecks in Retry state: ...", buildAdmissionChecksMessage)."""
    other = CheckSpec("provisioning", "kueue.x-k8s.io/provisioning-request")
    sim = make(env, AdmissionChecks((CheckSpec(), other)))
    assert sim.store.get("admissionchecks", "", "provisioning") is not None
    name = sim.submit("train")
    sim.step()
    sim.set_check(name, "Ready")
    sim.step(10)
    wl = sim.workload(name)
    assert cond(wl, "Admitted")["status"] == "False"
    assert entries(wl)["provisioning"]["state"] == "Pending"
    assert entries(wl)[CHECK]["state"] == "Ready"
    assert sim.pods(name) == []
    sim.set_check(name, "Retry", "capacity", check="provisioning")
    sim.set_check(name, "Retry", "node bad")
    sim.step()
    evicted = cond(sim.workload(name), "Evicted")  # requeued at once, reserved again
    assert evicted["message"] == (
        'Previously: Evicted due to AdmissionChecks in Retry state: "provisioning" (capacity); '
        f'"{CHECK}" (node bad)'
    )
    sim.set_check(name, "Ready", check="provisioning")
    sim.set_check(name, "Ready")
    sim.step()
    assert cond(sim.workload(name), "Admitted")["status"] == "True"
    assert len(sim.pods(name)) == 2
    assert sim.validate()


def test_an_inactive_check_holds_its_cluster_queue(env: Any) -> None:
    """clusterqueue.go updateWithAdmissionChecks/inactiveReason: a listed AdmissionCheck
    whose Active condition is not True makes the ClusterQueue inactive ("Can't admit new
    workloads: references inactive AdmissionCheck(s): ..."); its workloads wait with
    QuotaReserved False/Inadmissible "ClusterQueue ... is inactive" (getQueueBlocker). Kueue's
    core never sets Active: the check's controller does, here through the API."""
    sim = make(env, AdmissionChecks((CheckSpec(active=False),)))
    name = sim.submit("train")
    sim.step(3)
    active = cond(sim.queue(), "Active")
    assert (active["status"], active["reason"]) == ("False", "AdmissionCheckInactive")
    assert active["message"] == (
        f"Can't admit new workloads: references inactive AdmissionCheck(s): {CHECK}."
    )
    local = sim.store.items("localqueues")[0]
    assert cond(local, "Active")["reason"] == "ClusterQueueIsInactive"
    reserved = cond(sim.workload(name), "QuotaReserved")
    assert (reserved["reason"], reserved["message"]) == (
        "Inadmissible",
        f"ClusterQueue {CQ} is inactive",
    )
    assert sim.validate()
    sim.set_active()
    sim.step()
    back = cond(sim.queue(), "Active")
    assert (back["status"], back["lastTransitionTime"]) == ("True", rfc3339(sim.now))
    assert cond(sim.store.items("localqueues")[0], "Active")["status"] == "True"
    assert "admission" in sim.workload(name)["status"]


def test_checks_off_by_default_change_nothing(env: Any) -> None:
    """Without `admission_checks` a reservation is an admission, as before."""
    api, store = env
    sim = Sim(api, store, None)
    name = sim.submit("train")
    sim.step()
    wl = sim.workload(name)
    assert cond(wl, "Admitted")["status"] == "True" and "admissionChecks" not in wl["status"]
    assert "admissionChecksStrategy" not in sim.queue()["spec"]
    assert store.items("admissionchecks") == []
    assert [d.kind for d in sim.decisions(name)] == ["admitted"]


# --- the pure rules -----------------------------------------------------------------------


def test_checks_message_backoff_and_retry_time_follow_kueue() -> None:
    """buildAdmissionChecksMessage, UpdateAdmissionCheckRequeueState (60 s * 2^retryCount,
    capped at 1800 s), GetMaxRetryTime (only Retry checks with a delay count)."""
    one = [{"name": "b", "state": "Retry", "message": ""}]
    assert ck.checks_message(one, "Retry") == 'AdmissionCheck in Retry state: "b"'
    assert [ck.retry_backoff_s(n) for n in range(7)] == [60, 120, 240, 480, 960, 1800, 1800]
    at = "2026-11-18T00:00:00Z"
    entries_ = [
        {"name": "a", "state": "Retry", "lastTransitionTime": at, "requeueAfterSeconds": 60},
        {"name": "b", "state": "Retry", "lastTransitionTime": at, "requeueAfterSeconds": 120},
        {"name": "c", "state": "Ready", "lastTransitionTime": at, "requeueAfterSeconds": 900},
    ]
    base = ck.parse_time(at)
    assert base is not None and ck.max_retry_time(entries_) == base + 120
    assert ck.max_retry_time([{"name": "a", "state": "Retry", "lastTransitionTime": at}]) is None
    assert ck.queue_inactive([], []) is None
    assert ck.queue_inactive(["x"], ["y"]) == (
        "AdmissionCheckNotFound",
        "Can't admit new workloads: references missing AdmissionCheck(s): x, "
        "references inactive AdmissionCheck(s): y.",
    )


def test_admission_check_converts_between_versions() -> None:
    """v1beta1 serves the deprecated retryDelayMinutes (default 15); v1beta2 has none."""
    obj = ck.admission_check_manifest(CheckSpec(), "uid-1", "2026-11-18T00:00:00Z")
    old = convert(obj, "v1beta1")
    assert old["spec"]["retryDelayMinutes"] == 15
    assert convert(old, "v1beta2")["spec"] == obj["spec"]
    assert_valid_kueue(old)
    assert_valid_kueue(obj)


def test_the_environment_writer_keeps_a_controller_verdict_written_in_between() -> None:
    """SharedNodes (the demo's writer) merges status.admissionChecks three ways in one atomic
    write: a verdict patched after the simulation's last write survives its next write of the
    same workload, unless the simulation changed that check itself (an eviction's reset)."""
    store = ObjectStore()
    writer = SharedNodes(store)
    pending = {"name": CHECK, "state": "Pending", "message": "", "lastTransitionTime": "x"}
    wl = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "w", "namespace": NS},
        "spec": {},
        "status": {"admissionChecks": [pending]},
    }
    writer.upsert("workloads", wl)
    stored = store.get("workloads", NS, "w")
    assert stored is not None
    ready = {**pending, "state": "Ready", "message": "ok"}
    store.upsert("workloads", {**stored, "status": {"admissionChecks": [ready]}})
    writer.upsert("workloads", {**wl, "spec": {"active": True}})  # checks unchanged by the sim
    after = store.get("workloads", NS, "w")
    assert after is not None and after["status"]["admissionChecks"] == [ready]
    assert after["spec"] == {"active": True}
    reset = {**pending, "message": "Reset to Pending after eviction. Previously: Ready"}
    writer.upsert("workloads", {**wl, "status": {"admissionChecks": [reset]}})
    after = store.get("workloads", NS, "w")
    assert after is not None and after["status"]["admissionChecks"] == [reset]
    assert writer.get("workloads", NS, "w") == after


def test_a_retry_steers_the_workload_off_a_node_that_went_bad(env: Any) -> None:
    """The point of the check: its controller answers Retry for a workload placed on a bad
    node; the quota is released and the next reservation (TAS: a cordoned node takes no new
    pods) places it elsewhere, checks Pending again."""
    sim = make(env, p5_nodes=3)
    name = sim.submit("train")
    sim.step()
    nodes = sorted(_nodes(sim.workload(name)))
    assert len(nodes) == 2
    bad = nodes[0]
    sim.cluster.cordon(bad)  # HyperPod marks it: UnschedulablePendingReplacement
    sim.set_check(name, "Retry", f"node {bad}: XID 79 on GPU 3")
    sim.step()
    wl = sim.workload(name)
    assert bad not in _nodes(wl) and len(_nodes(wl)) == 2
    sim.set_check(name, "Ready")
    sim.step()
    assert {p["spec"]["nodeName"] for p in sim.pods(name)} == _nodes(sim.workload(name))
    assert sim.validate()


def test_a_reserved_workload_can_be_preempted_and_its_checks_reset(env: Any) -> None:
    """Preemption candidates are the workloads holding quota (preemption.go), admitted or
    not; the eviction resets the victim's checks (evict.go resetChecksOnEviction), a Pending
    one staying as it was."""
    sim = make(env)
    low = sim.cluster.submit("a", "low", 8, 2, "fine-tuning-priority", instance_type=P5)
    sim.step()
    assert cond(sim.workload(low), "Admitted")["reason"] == "UnsatisfiedChecks"
    high = sim.cluster.submit("a", "high", 8, 2, "training-priority", instance_type=P5)
    sim.step()
    wl = sim.workload(low)
    assert cond(wl, "Preempted")["status"] == "True" and "admission" not in wl["status"]
    assert entries(wl)[CHECK]["state"] == "Pending" and entries(wl)[CHECK]["message"] == ""
    assert sim.pods(low) == []
    assert [d.kind for d in sim.decisions(low)] == ["reserved", "preempted"]
    sim.step()
    assert "admission" in sim.workload(high)["status"]
    assert sim.validate()


def _nodes(wl: Obj) -> set[str]:
    assignment = wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    return {values[-1] for values, _ in domains_from_slices(assignment["slices"])}


def test_a_missing_check_holds_its_cluster_queue(env: Any) -> None:
    """clusterqueue.go: a listed AdmissionCheck that does not exist -> AdmissionCheckNotFound
    ("references missing AdmissionCheck(s): ..."); the admin's creating it lets the queue go."""
    sim = make(env, AdmissionChecks(create=False))
    assert sim.store.items("admissionchecks") == []
    name = sim.submit("train")
    sim.step()
    active = cond(sim.queue(), "Active")
    assert (active["status"], active["reason"]) == ("False", "AdmissionCheckNotFound")
    assert "admission" not in sim.workload(name)["status"]
    sim.custom.create_cluster_custom_object(
        GROUP,
        "v1beta1",
        "admissionchecks",
        {
            "apiVersion": f"{GROUP}/v1beta1",
            "kind": "AdmissionCheck",
            "metadata": {"name": CHECK},
            "spec": {"controllerName": ck.NODE_HEALTH_CONTROLLER},
        },
    )
    sim.step()
    assert cond(sim.queue(), "Active")["reason"] == "AdmissionCheckInactive"
    sim.set_active()
    sim.step()
    assert "admission" in sim.workload(name)["status"]
    assert sim.validate()


def test_a_garbled_verdict_is_ignored(env: Any) -> None:
    """A state outside the CRD's enum (a real API server refuses it; the simulated one stores
    it) is no verdict: the workload keeps waiting, nothing crashes."""
    sim = make(env)
    name = sim.submit("train")
    sim.step()
    sim.set_check(name, "Maybe", "?")
    sim.step(3)
    wl = sim.workload(name)
    assert cond(wl, "Admitted")["reason"] == "UnsatisfiedChecks" and "admission" in wl["status"]
    assert [d.kind for d in sim.decisions(name)] == ["reserved"]
    sim.set_check(name, "Ready")
    sim.step()
    assert cond(sim.workload(name), "Admitted")["status"] == "True"
