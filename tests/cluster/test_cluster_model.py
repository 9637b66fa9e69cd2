"""ClusterModel: GPU accounting by domain, timelines, the preemption ledger and its verdicts,
pending causes, locality, re-lists and bad input. Every Kueue fixture validates against the CRDs."""

from __future__ import annotations

from typing import Any

import pytest

from exporter.cluster.model import ClusterModel
from exporter.cluster.views.workloads import workload_view
from exporter.sim import synthetic as s
from tests.crds import assert_valid_kueue

T0 = 1_795_000_000.0
L3 = "topology.k8s.aws/network-node-layer-3"
CQ_A = "hyperpod-ns-alpha-clusterqueue"
CQ_B = "hyperpod-ns-beta-clusterqueue"
NS_A = "hyperpod-ns-alpha"
NS_B = "hyperpod-ns-beta"


def kueue(obj: dict[str, Any]) -> dict[str, Any]:
    assert_valid_kueue(obj)
    return obj


def topology_pending_workload(namespace: str) -> dict[str, Any]:
    """ "waiting": 2 pods x 8 GPUs required in one layer-3 domain, pending with the message
    Kueue's TAS gives when no domain fits them (QuotaReserved=False, reason Pending)."""
    return kueue(
        s.workload(
            namespace,
            "waiting",
            2,
            8,
            T0,
            topology=("required", L3),
            conditions=[
                s.condition(
                    "QuotaReserved",
                    "False",
                    "Pending",
                    'couldn\'t assign flavors to pod set main: topology "hyperpod-default" '
                    "doesn't allow to fit any of 2 pod(s)",
                    T0,
                )
            ],
        )
    )


def two_domain_cluster(model: ClusterModel) -> None:
    """Two layer-3 domains under one layer-2: nn-a holds n1,n2; nn-b holds n3,n4 (8 GPUs each)."""
    for name, l3 in (("n1", "nn-a"), ("n2", "nn-a"), ("n3", "nn-b"), ("n4", "nn-b")):
        model.apply("Node", "ADDED", s.node(name, ("nn-top", "nn-mid", l3)), T0)
    model.apply("LocalQueue", "ADDED", kueue(s.local_queue(NS_A, CQ_A)), T0)
    model.apply("LocalQueue", "ADDED", kueue(s.local_queue(NS_B, CQ_B)), T0)


def run(
    model: ClusterModel,
    ns: str,
    name: str,
    placement: list[tuple[str, int]],
    gpus: int = 8,
    priority: int = 0,
    cq: str = CQ_A,
    at: float = T0,
    topology: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """An admitted workload with one pod per (node, count) entry, pods bound accordingly."""
    pods = sum(c for _, c in placement)
    wl = kueue(
        s.workload(
            ns,
            name,
            pods,
            gpus,
            at,
            priority=priority,
            topology=topology,
            conditions=s.admitted_conditions(cq, at),
            cluster_queue=cq,
            assignment=[((n,), c) for n, c in placement],
        )
    )
    model.apply("Workload", "ADDED", wl, at)
    job_uid = wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]
    i = 0
    for node_name, count in placement:
        for _ in range(count):
            model.apply(
                "Pod", "ADDED", s.pod(ns, f"{name}-{i}", node_name, gpus, job_uid, name), at
            )
            i += 1
    return wl


def test_gpu_accounting_follows_pods_through_every_level() -> None:
    model = ClusterModel()
    two_domain_cluster(model)
    run(model, NS_A, "big", [("n1", 1), ("n3", 1)])
    assert model.tree.usage("network-node-layer-3", "nn-a").free == 8
    assert model.tree.usage("network-node-layer-2", "nn-mid").used == 16
    model.apply("Pod", "DELETED", {"metadata": {"namespace": NS_A, "name": "big-0"}}, T0)
    assert model.tree.usage("network-node-layer-3", "nn-a").free == 16
    assert model.tree.usage("network-node-layer-2", "nn-mid").used == 8


def test_locality_counts_domains_and_worst_pair_hops_and_judges_the_request() -> None:
    model = ClusterModel()
    two_domain_cluster(model)
    run(model, NS_A, "spread", [("n1", 1), ("n3", 1)], topology=("required", L3))
    run(model, NS_A, "compact", [("n1", 1), ("n2", 1)], topology=("required", L3))
    spread = model.locality_of(model.workload_state(NS_A, "spread"))
    compact = model.locality_of(model.workload_state(NS_A, "compact"))
    assert spread.domains["network-node-layer-3"] == 2
    assert spread.worst_pair_hops == 4
    assert spread.topology_met is False
    assert compact.domains["network-node-layer-3"] == 1
    assert compact.worst_pair_hops == 2
    assert compact.topology_met is True


def test_locality_cache_is_invalidated_when_pods_move() -> None:
    model = ClusterModel()
    two_domain_cluster(model)
    wl = run(model, NS_A, "job", [("n1", 1)], topology=("required", L3))
    state = model.workload_state(NS_A, "job")
    assert model.locality_of(state).nodes == ("n1",)
    job_uid = wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]
    model.apply("Pod", "ADDED", s.pod(NS_A, "job-9", "n4", 8, job_uid, "job"), T0)
    assert model.locality_of(state).nodes == ("n1", "n4")


def test_a_relabelled_node_moves_only_when_a_label_it_is_placed_by_moved() -> None:
    """HyperPod's health label flips at every reboot it plans: the node's GPUs stop counting
    free, its place and flavor stay. A label a ResourceFlavor selects on moves its flavor, a
    network-node label its place (the model re-reads only what such labels decide)."""
    model = ClusterModel()
    two_domain_cluster(model)
    reserved = {
        "apiVersion": s.KUEUE_V1BETA2,
        "kind": "ResourceFlavor",
        "metadata": {"name": "reserved", "resourceVersion": "1"},
        "spec": {"nodeLabels": {"example.com/pool": "reserved"}},
    }
    model.apply("ResourceFlavor", "ADDED", kueue(reserved), T0)
    layer3 = "network-node-layer-3"
    assert model.node_flavor("n1") == "ml.p5.48xlarge"

    health = "UnschedulablePendingReboot"
    flipped = s.node("n1", ("nn-top", "nn-mid", "nn-a"), health=health, rv="2")
    model.apply("Node", "MODIFIED", flipped, T0 + 1)
    assert model.tree.usage(layer3, "nn-a").free == 8
    assert model.tree.usage(layer3, "nn-a").unschedulable == 8
    assert model.idle.idle_now()["health"] == 8
    assert model.node_flavor("n1") == "ml.p5.48xlarge"

    pooled = s.node("n1", ("nn-top", "nn-mid", "nn-a"), rv="3")
    pooled["metadata"]["labels"]["example.com/pool"] = "reserved"
    model.apply("Node", "MODIFIED", pooled, T0 + 2)
    assert model.node_flavor("n1") == "reserved"
    assert model.tree.usage(layer3, "nn-a").free == 16
    assert model.idle.idle_now()["health"] == 0

    moved = s.node("n1", ("nn-top", "nn-mid", "nn-b"), health=health, rv="4")
    moved["metadata"]["labels"]["example.com/pool"] = "reserved"
    model.apply("Node", "MODIFIED", moved, T0 + 3)
    place = model.tree.placement("n1")
    assert place is not None and place.layers == ("nn-top", "nn-mid", "nn-b")
    assert model.tree.usage(layer3, "nn-a").free == 8
    assert model.tree.usage(layer3, "nn-b").unschedulable == 8
    totals = model.idle.totals(T0 + 4)
    assert totals[("reserved", "nn-a", "no_demand")] == 8.0  # T0+2 to T0+3, in nn-a
    assert totals[("reserved", "nn-b", "health")] == 8.0  # T0+3 to T0+4, in nn-b


def test_both_tas_assignment_forms_give_the_same_view() -> None:
    views = []
    for v1beta1 in (False, True):
        model = ClusterModel()
        two_domain_cluster(model)
        wl = kueue(
            s.workload(
                NS_A,
                "w",
                3,
                8,
                T0,
                conditions=s.admitted_conditions(CQ_A, T0),
                cluster_queue=CQ_A,
                assignment=[(("nn-a", "n1"), 2), (("nn-b", "n3"), 1)],
                assignment_levels=(L3, "kubernetes.io/hostname"),
                v1beta1=v1beta1,
            )
        )
        model.apply("Workload", "ADDED", wl, T0)
        views.append(workload_view(model, model.workload_state(NS_A, "w"))["assignment"])
    assert views[0] == views[1]
    assert views[0][0]["domains"] == [
        {"values": ["nn-a", "n1"], "count": 2},
        {"values": ["nn-b", "n3"], "count": 1},
    ]


def preempt(
    model: ClusterModel,
    victim: dict[str, Any],
    preemptor: dict[str, Any],
    at: float,
    reason: str = "InClusterQueue",
    cause: str = "prioritization in the ClusterQueue",
    message: str | None = None,
) -> str:
    """Kueue marks the victim Evicted+Preempted; returns the message it used."""
    pmeta = preemptor["metadata"]
    text = message or s.preemption_message_v015(
        pmeta["uid"],
        pmeta["labels"]["kueue.x-k8s.io/job-uid"],
        f"/{preemptor['status']['admission']['clusterQueue']}"
        if "status" in preemptor and "admission" in preemptor["status"]
        else "/hyperpod-cohort/" + CQ_B,
        f"/{CQ_A}",
        cause,
    )
    updated = dict(victim)
    updated["metadata"] = {**victim["metadata"], "resourceVersion": str(at)}
    updated["status"] = {
        **victim.get("status", {}),
        "conditions": [
            *victim["status"]["conditions"],
            *s.preempted_conditions(text, reason, at),
        ],
    }
    model.apply("Workload", "MODIFIED", kueue(updated), at)
    return text


def test_preemption_pairs_victim_with_preemptor_once_from_condition_and_event() -> None:
    model = ClusterModel()
    two_domain_cluster(model)
    victim = run(model, NS_A, "victim", [("n1", 1)], priority=10)
    preemptor = kueue(
        s.workload(NS_A, "urgent", 1, 8, T0 + 5, priority=1000, topology=("required", L3))
    )
    model.apply("Workload", "ADDED", preemptor, T0 + 5)
    text = preempt(model, victim, preemptor, T0 + 10)
    model.apply("Event", "ADDED", s.preemption_event(NS_A, "victim", text, T0 + 11), T0 + 11)
    (record,) = list(model.ledger)
    assert record.preemptor == f"{NS_A}/urgent"
    assert record.reason == "InClusterQueue"
    assert record.victim_priority == 10 and record.preemptor_priority == 1000
    assert record.gpus_freed == 8
    assert record.victim_cluster_queue == CQ_A
    steps = [e.step for e in model.workload_state(NS_A, "victim").timeline]
    assert steps[0] == "created" and "evicted" in steps
    assert steps.count("preempted") == 1  # the condition and the Event are one preemption


def test_preemptor_known_only_by_job_uid_is_resolved_through_the_label() -> None:
    model = ClusterModel()
    two_domain_cluster(model)
    victim = run(model, NS_A, "victim", [("n1", 1)])
    preemptor = kueue(s.workload(NS_A, "urgent", 1, 8, T0, priority=1000))
    model.apply("Workload", "ADDED", preemptor, T0)
    job_uid = preemptor["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]
    text = s.preemption_message_v015(
        "uid-from-an-older-incarnation",
        job_uid,
        f"/{CQ_A}",
        f"/{CQ_A}",
        "prioritization in the ClusterQueue",
    )
    preempt(model, victim, preemptor, T0 + 10, message=text)
    (record,) = list(model.ledger)
    assert record.preemptor == f"{NS_A}/urgent"


def test_preemptor_arriving_after_its_victim_is_filled_in() -> None:
    model = ClusterModel()
    two_domain_cluster(model)
    victim = run(model, NS_A, "victim", [("n1", 1)])
    preemptor = kueue(s.workload(NS_B, "later", 1, 8, T0, priority=1000))
    preempt(model, victim, preemptor, T0 + 10, reason="InCohortReclamation")
    assert next(iter(model.ledger)).preemptor_name == ""
    assert not model.preemption_counts  # counted once its labels are settled, never taken back
    model.apply("Workload", "ADDED", preemptor, T0 + 12)
    assert next(iter(model.ledger)).preemptor == f"{NS_B}/later"
    assert model.preemption_counts == {(CQ_A, CQ_B, "InCohortReclamation", "quota"): 1}


def test_a_preemptor_that_never_appears_is_counted_after_a_minute() -> None:
    model = ClusterModel()
    two_domain_cluster(model)
    victim = run(model, NS_A, "victim", [("n1", 1)])
    ghost = kueue(s.workload(NS_B, "ghost", 1, 8, T0, priority=1000))
    preempt(model, victim, ghost, T0 + 10, reason="InCohortReclamation")
    model.apply("Node", "ADDED", s.node("n9", ("t", "m", "nn-c"), rv="2"), T0 + 100)
    assert sum(model.preemption_counts.values()) == 1
    ((_, _, _, cause),) = model.preemption_counts
    assert cause == "unknown"


@pytest.mark.parametrize(
    ("message", "format_"),
    [
        (
            "Preempted to accommodate a workload (UID: {uid}) due to prioritization in the "
            "ClusterQueue",
            "v0.10",
        ),
        (
            "Preempted to accommodate a workload (UID: {uid}, JobUID: {job}) due to "
            "prioritization in the ClusterQueue",
            "v0.11",
        ),
        (
            "Preempted to accommodate a workload (UID: {uid}, JobUID: {job}) due to "
            "prioritization in the ClusterQueue; preemptor path: /{cq}; preemptee path: /{cq}",
            "v0.15",
        ),
    ],
)
def test_every_kueue_message_format_pairs_the_preemptor(message: str, format_: str) -> None:
    model = ClusterModel()
    two_domain_cluster(model)
    victim = run(model, NS_A, "victim", [("n1", 1)])
    preemptor = kueue(s.workload(NS_A, "urgent", 1, 8, T0, priority=1000))
    model.apply("Workload", "ADDED", preemptor, T0)
    meta = preemptor["metadata"]
    text = message.format(uid=meta["uid"], job=meta["labels"]["kueue.x-k8s.io/job-uid"], cq=CQ_A)
    preempt(model, victim, preemptor, T0 + 10, message=text)
    (record,) = list(model.ledger)
    assert record.preemptor == f"{NS_A}/urgent", format_
    assert record.reason == "InClusterQueue"


def test_unknown_preemption_message_is_counted_and_still_recorded() -> None:
    model = ClusterModel()
    two_domain_cluster(model)
    victim = run(model, NS_A, "victim", [("n1", 1)])
    preemptor = kueue(s.workload(NS_A, "urgent", 1, 8, T0, priority=1000))
    preempt(model, victim, preemptor, T0 + 10, message="Evicted by the gremlins")
    assert model.problems[("Workload", "unknown_preemption_message")] == 1
    (record,) = list(model.ledger)
    assert record.preemptor == "unknown" and record.reason == "InClusterQueue"


def test_topology_driven_preemption_verdict() -> None:
    """16 GPUs free across two layer-3 domains, 8 in each; the preemptor needs 16 in one."""
    model = ClusterModel()
    two_domain_cluster(model)
    model.apply("ClusterQueue", "ADDED", kueue(s.cluster_queue(CQ_A, 32, used=16)), T0)
    victim = run(model, NS_A, "victim", [("n1", 1)], priority=1)
    run(model, NS_A, "other", [("n3", 1)], priority=1)
    preemptor = kueue(
        s.workload(NS_A, "compact", 2, 8, T0, priority=1000, topology=("required", L3))
    )
    model.apply("Workload", "ADDED", preemptor, T0)
    preempt(model, victim, preemptor, T0 + 10)
    (record,) = list(model.ledger)
    assert record.verdict == "topology"
    assert "fits 1 of 2 pods of 8 GPUs in the largest free network-node-layer-3 domain nn-a" in (
        record.verdict_detail
    )
    assert model.preemption_counts[(CQ_A, CQ_A, "InClusterQueue", "topology")] == 1


def test_quota_driven_preemption_verdict() -> None:
    model = ClusterModel()
    two_domain_cluster(model)
    model.apply("ClusterQueue", "ADDED", kueue(s.cluster_queue(CQ_A, 16, used=16)), T0)
    victim = run(model, NS_A, "victim", [("n1", 1)], priority=1)
    run(model, NS_A, "other", [("n3", 1)], priority=1)
    preemptor = kueue(
        s.workload(NS_A, "compact", 2, 8, T0, priority=1000, topology=("required", L3))
    )
    model.apply("Workload", "ADDED", preemptor, T0)
    preempt(model, victim, preemptor, T0 + 10)
    (record,) = list(model.ledger)
    assert record.verdict == "quota"
    assert "could reserve only 0 of the 16" in record.verdict_detail


def test_restart_rebuilds_the_ledger_from_status_and_events_without_guessing_verdicts() -> None:
    first = ClusterModel()
    two_domain_cluster(first)
    victim = run(first, NS_A, "victim", [("n1", 1)])
    preemptor = kueue(s.workload(NS_A, "urgent", 1, 8, T0, priority=1000))
    first.apply("Workload", "ADDED", preemptor, T0)
    text = preempt(first, victim, preemptor, T0 + 10)
    victim_now = first.workload_state(NS_A, "victim")
    assert victim_now is not None
    # An older preemption of the same victim survives only as an Event.
    older = s.preemption_event(NS_A, "victim", text, T0 - 3600)
    # "Restart": a new model lists everything an hour later.
    later = T0 + 3600
    second = ClusterModel()
    second.replace("Node", [s.node(n, ("t", "m", "nn-a")) for n in ("n1", "n2")], later)
    stored_victim = dict(victim)
    stored_victim["status"] = {
        **victim["status"],
        "conditions": [
            *victim["status"]["conditions"],
            s.condition("Preempted", "True", "InClusterQueue", text, T0 + 10),
        ],
    }
    second.replace("Workload", [kueue(stored_victim), preemptor], later)
    second.replace("Event", [s.preemption_event(NS_A, "victim", text, T0 + 11), older], later)
    records = sorted(second.ledger, key=lambda r: r.time)
    assert [r.time for r in records] == [T0 - 3600, T0 + 10]
    assert all(r.verdict == "unknown" for r in records)
    assert all(r.preemptor == f"{NS_A}/urgent" for r in records)


def test_ledger_is_bounded_and_counts_what_it_dropped() -> None:
    model = ClusterModel(ledger_capacity=3)
    two_domain_cluster(model)
    for i in range(5):
        model.apply(
            "Event",
            "ADDED",
            s.preemption_event(
                NS_A,
                f"v{i}",
                "Preempted to accommodate a workload (UID: x) due to prioritization in the "
                "ClusterQueue",
                T0 + i,
            ),
            T0 + i,
        )
    assert len(model.ledger) == 3
    assert model.ledger.dropped == 2
    assert [r.victim_name for r in model.ledger] == ["v2", "v3", "v4"]


def test_pending_cause_names_the_largest_free_domain_when_topology_blocks() -> None:
    model = ClusterModel()
    two_domain_cluster(model)
    model.apply("ClusterQueue", "ADDED", kueue(s.cluster_queue(CQ_A, 64, used=16)), T0)
    run(model, NS_A, "a", [("n1", 1)], cq=CQ_A)
    run(model, NS_A, "b", [("n3", 1)], cq=CQ_A)
    model.apply("Workload", "ADDED", topology_pending_workload(NS_A), T0)
    cause = model.pending_cause(model.workload_state(NS_A, "waiting").workload)
    assert cause is not None and cause.cause == "topology"
    assert cause.topology_message == (
        "quota allows 48 GPUs; required network-node-layer-3: fits 1 of 2 pods of 8 GPUs in"
        " the largest free network-node-layer-3 domain nn-a (8 free GPUs there)"
    )
    view = workload_view(model, model.workload_state(NS_A, "waiting"))
    assert any("room for 1 more pod of 8 GPUs" in fix for fix in view["would_run_if"])


def test_pending_cause_is_quota_when_the_queue_is_full() -> None:
    model = ClusterModel()
    two_domain_cluster(model)
    model.apply("ClusterQueue", "ADDED", kueue(s.cluster_queue(CQ_A, 8, used=8, cohort="")), T0)
    waiting = kueue(
        s.workload(
            NS_A,
            "waiting",
            1,
            8,
            T0,
            topology=("required", L3),
            conditions=[s.condition("QuotaReserved", "False", "Pending", s.quota_message(8), T0)],
        )
    )
    model.apply("Workload", "ADDED", waiting, T0)
    cause = model.pending_cause(model.workload_state(NS_A, "waiting").workload)
    assert cause is not None and cause.cause == "quota" and cause.topology_message == ""
    view = workload_view(model, model.workload_state(NS_A, "waiting"))
    assert any("could admit 8 more GPUs" in fix for fix in view["would_run_if"])


def test_timeline_records_each_step_across_versions() -> None:
    model = ClusterModel()
    two_domain_cluster(model)
    base = dict(
        namespace=NS_A, name="w", pods=1, gpus_per_pod=8, created=T0, topology=("preferred", L3)
    )
    pending = s.condition("QuotaReserved", "False", "Pending", s.quota_message(8), T0 + 1)
    model.apply("Workload", "ADDED", kueue(s.workload(**base, conditions=[pending], rv="1")), T0)
    admitted = s.admitted_conditions(CQ_A, T0 + 30)
    model.apply(
        "Workload",
        "MODIFIED",
        kueue(s.workload(**base, conditions=admitted, cluster_queue=CQ_A, rv="2")),
        T0 + 30,
    )
    finished = [*admitted, s.condition("Finished", "True", "Succeeded", "done", T0 + 90)]
    model.apply(
        "Workload",
        "MODIFIED",
        kueue(s.workload(**base, conditions=finished, cluster_queue=CQ_A, rv="3")),
        T0 + 90,
    )
    steps = [e.step for e in model.workload_state(NS_A, "w").timeline]
    assert steps == ["created", "pending", "quota_reserved", "admitted", "finished"]
    hist = model.wait_histograms[(CQ_A, "preferred")]
    assert hist.count == 1 and hist.total == 30


def test_relist_reconciles_deletions_and_skips_unchanged_objects() -> None:
    model = ClusterModel()
    nodes = [s.node(f"n{i}", ("t", "m", "nn-a")) for i in range(3)]
    model.replace("Node", nodes, T0)
    applied = model.events_applied["Node"]
    model.replace("Node", nodes[:2], T0)
    assert set(model.nodes) == {"n0", "n1"}
    assert model.tree.usage("network-node-layer-3", "nn-a").allocatable == 16
    assert model.events_applied["Node"] == applied + 1  # only the deletion was applied


@pytest.mark.parametrize(
    "garbage",
    [
        {},
        {"metadata": "nope"},
        {"metadata": {"name": "w", "namespace": "ns"}, "spec": "oops"},
        {"metadata": {"name": "w", "namespace": "ns"}, "spec": {"podSets": [{"count": "many"}]}},
        {
            "metadata": {"name": "w", "namespace": "ns"},
            "status": {"admission": {"podSetAssignments": [{"topologyAssignment": {"slices": 7}}]}},
        },
    ],
)
def test_malformed_workloads_are_counted_never_raised(garbage: dict[str, Any]) -> None:
    model = ClusterModel()
    model.apply("Workload", "ADDED", garbage, T0)
    assert sum(model.problems.values()) >= 1
    assert model.drain_problems()


def test_huge_workload_parses_in_reasonable_time() -> None:
    model = ClusterModel()
    domains = [((f"node-{i}",), 1) for i in range(10_000)]
    wl = s.workload(
        NS_A,
        "huge",
        10_000,
        1,
        T0,
        conditions=s.admitted_conditions(CQ_A, T0),
        cluster_queue=CQ_A,
        assignment=domains,
    )
    model.apply("Workload", "ADDED", wl, T0)
    state = model.workload_state(NS_A, "huge")
    assert state is not None
    assert len(state.workload.placements[0].domains) == 10_000


def test_topology_verdict_survives_events_arriving_out_of_order() -> None:
    """Informers deliver Pods and Workloads on separate streams: the victim's pods may be gone
    and the preemptor's pods bound before the victim's Preempted condition arrives. The verdict
    must judge the capacity Kueue saw, not the capacity after the swap."""
    model = ClusterModel()
    two_domain_cluster(model)
    model.apply("ClusterQueue", "ADDED", kueue(s.cluster_queue(CQ_A, 32, used=16)), T0)
    victim = run(model, NS_A, "victim", [("n1", 1)], priority=1)
    run(model, NS_A, "other", [("n3", 1)], priority=1)
    preemptor = kueue(
        s.workload(NS_A, "compact", 2, 8, T0, priority=1000, topology=("required", L3))
    )
    model.apply("Workload", "ADDED", preemptor, T0)
    # The swap lands first: the victim's pod is deleted, the preemptor's two pods bound in nn-a.
    model.apply("Pod", "DELETED", {"metadata": {"namespace": NS_A, "name": "victim-0"}}, T0 + 9)
    job_uid = preemptor["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]
    for i, node_name in enumerate(("n1", "n2")):
        model.apply(
            "Pod", "ADDED", s.pod(NS_A, f"compact-{i}", node_name, 8, job_uid, "compact"), T0 + 9
        )
    preempt(model, victim, preemptor, T0 + 10)
    (record,) = list(model.ledger)
    assert record.verdict == "topology", record.verdict_detail
    assert "fits 1 of 2 pods of 8 GPUs in the largest free network-node-layer-3 domain nn-a" in (
        record.verdict_detail
    )


def test_unknown_kueue_version_is_read_best_effort_and_reported() -> None:
    model = ClusterModel()
    two_domain_cluster(model)
    wl = run(model, NS_A, "ok", [("n1", 1)])
    future = {**wl, "apiVersion": "kueue.x-k8s.io/v1"}
    future["metadata"] = {**wl["metadata"], "resourceVersion": "99"}
    model.apply("Workload", "MODIFIED", future, T0)
    assert any("unknown Kueue API version 'kueue.x-k8s.io/v1'" in p for p in model.drain_problems())
    state = model.workload_state(NS_A, "ok")
    assert state is not None and model.locality_of(state).nodes == ("n1",)
