"""`topowatch explain` names places and tells each preemption once.

Placement: per level the domain ids the pods landed in, pods per domain where they are spread,
the UltraServer id and the worst pair with its hops, in the text and in the JSON view (the one
`/api/v1/workloads/{ns}/{name}` serves). Timeline: Kueue records one preemption as Evicted
(reason Preempted), Preempted (InClusterQueue, InCohortReclamation, ...), a Preempted Event and,
once the pods are gone, QuotaReserved=False/Pending and Requeued (reason Preempted) with the same
message; explain shows one step with the message once, and two preemptions as two steps. Every
Kueue fixture validates against the CRDs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.cli import main
from exporter.cluster.explain import explain_text, model_from_objects
from exporter.cluster.model import ClusterModel
from exporter.cluster.timeline import TimelineEntry, fold_preemptions
from exporter.cluster.views.workloads import iso, workload_view
from exporter.sim import synthetic as s
from exporter.sim.cluster import ClusterShape, SimulatedCluster
from exporter.sim.kubeapi.server import ObjectStore
from tests.crds import assert_valid_kueue

T0 = 1_795_000_000.0
NS = "hyperpod-ns-alpha"
CQ = "hyperpod-ns-alpha-clusterqueue"
L3 = "topology.k8s.aws/network-node-layer-3"
GB200 = "ml.p6e-gb200.36xlarge"


def kueue(obj: dict[str, Any]) -> dict[str, Any]:
    assert_valid_kueue(obj)
    return obj


# --- placement ------------------------------------------------------------------------------


def cluster() -> list[dict[str, Any]]:
    """p5 nodes n1-n3 under layer-3 nn-a and n4 under nn-b (one layer-2, nn-mid); GB200 nodes
    g1, g2 in UltraServer us-0a1 and g3 in us-0b2, all three under layer-3 nn-c."""
    nodes = [s.node(n, ("nn-top", "nn-mid", l3)) for n, l3 in (("n1", "nn-a"), ("n2", "nn-a"))]
    nodes += [
        s.node("n3", ("nn-top", "nn-mid", "nn-a")),
        s.node("n4", ("nn-top", "nn-mid", "nn-b")),
    ]
    nodes += [
        s.node(g, ("nn-top", "nn-mid", "nn-c"), gpus=4, instance_type=GB200, ultraserver=us)
        for g, us in (("g1", "us-0a1"), ("g2", "us-0a1"), ("g3", "us-0b2"))
    ]
    return [*nodes, kueue(s.local_queue(NS, CQ))]


def running(name: str, pods_on: list[str], gpus: int, at: float = T0) -> list[dict[str, Any]]:
    """An admitted Workload with one pod per entry of `pods_on` (a node may repeat)."""
    placement: dict[str, int] = {}
    for node in pods_on:
        placement[node] = placement.get(node, 0) + 1
    wl = kueue(
        s.workload(
            NS,
            name,
            len(pods_on),
            gpus,
            at,
            topology=("preferred", L3),
            conditions=s.admitted_conditions(CQ, at),
            cluster_queue=CQ,
            assignment=[((n,), c) for n, c in placement.items()],
        )
    )
    job_uid = wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]
    pods = [s.pod(NS, f"{name}-{i}", node, gpus, job_uid, name) for i, node in enumerate(pods_on)]
    return [wl, *pods]


def dump(tmp_path: Path, objects: list[dict[str, Any]]) -> Path:
    """What `kubectl get nodes,pods,workloads,localqueues,events -A -o yaml` prints."""
    path = tmp_path / "dump.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects}))
    return path


def explain(capsys: pytest.CaptureFixture[str], path: Path, name: str, *flags: str) -> str:
    code = main(["explain", "--from", str(path), *flags, f"{NS}/{name}"])
    out = capsys.readouterr().out
    assert code == 0
    return out


@pytest.fixture
def placed(tmp_path: Path) -> Path:
    objects = [
        *cluster(),
        *running("spread", ["n1", "n1", "n2", "n4"], 4),
        *running("nvl", ["g1", "g2"], 4),
        *running("two-ultra", ["g1", "g3", "g3"], 1),
    ]
    return dump(tmp_path, objects)


def test_text_names_each_levels_domains_with_pods_per_domain_when_spread(
    placed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = explain(capsys, placed, "spread")
    assert "Placement: 4 pods on 3 nodes (" in out
    assert "worst pair 4 hops (n1 <-> n4)" in out
    assert "  region: us-east-2\n" in out
    assert "  zone: us-east-2a\n" in out
    assert "  network-node-layer-1: nn-top\n" in out
    assert "  network-node-layer-2: nn-mid\n" in out
    # Two pods share n1: counts are pods, not nodes.
    assert "  network-node-layer-3: nn-a (3 pods), nn-b (1 pod)\n" in out
    assert "UltraServer" not in out  # p5 nodes belong to none


def test_text_names_the_ultraserver(placed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = explain(capsys, placed, "nvl")
    assert "  UltraServer: us-0a1\n" in out
    assert "  network-node-layer-3: nn-c\n" in out
    assert "worst pair 2 hops (g1 <-> g2)" in out
    out = explain(capsys, placed, "two-ultra")
    assert "  UltraServer: us-0b2 (2 pods), us-0a1 (1 pod)\n" in out


def test_json_carries_the_same_places_as_data(
    placed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loc = json.loads(explain(capsys, placed, "spread", "--json"))["locality"]
    assert loc["worst_pair_hops"] == 4 and loc["worst_pair"] == ["n1", "n4"]
    by_level = {lvl["level"]: lvl["domains"] for lvl in loc["where"]}
    assert [lvl["level"] for lvl in loc["where"]] == [
        "region",
        "zone",
        "network-node-layer-1",
        "network-node-layer-2",
        "network-node-layer-3",
    ]
    assert by_level["network-node-layer-3"] == [
        {"domain": "nn-a", "pods": 3, "nodes": 2},
        {"domain": "nn-b", "pods": 1, "nodes": 1},
    ]
    assert by_level["zone"] == [{"domain": "us-east-2a", "pods": 4, "nodes": 3}]
    loc = json.loads(explain(capsys, placed, "nvl", "--json"))["locality"]
    assert loc["ultraserver"] == "us-0a1"
    assert loc["where"][-1] == {
        "level": "ultraserver",
        "domains": [{"domain": "us-0a1", "pods": 2, "nodes": 2}],
    }


def test_live_model_and_dump_give_the_same_places(placed: Path) -> None:
    """The service's model (objects applied one event at a time) answers as the dump does."""
    objects = yaml.safe_load(placed.read_text())["items"]
    offline, _ = model_from_objects(objects)
    live = ClusterModel()
    for obj in objects:
        live.apply(obj["kind"], "ADDED", obj, T0)
    for name in ("spread", "nvl", "two-ultra"):
        views = [workload_view(m, m.workload_state(NS, name))["locality"] for m in (offline, live)]
        assert views[0] == views[1]


def test_pods_on_nodes_without_a_label_are_counted_apart(tmp_path: Path) -> None:
    objects = [*cluster(), *running("mixed", ["n1", "g1"], 1)]
    model, _ = model_from_objects(objects)
    view = workload_view(model, model.workload_state(NS, "mixed"))
    ultra = view["locality"]["where"][-1]
    assert ultra == {
        "level": "ultraserver",
        "domains": [
            {"domain": "us-0a1", "pods": 1, "nodes": 1},
            {"domain": None, "pods": 1, "nodes": 1},
        ],
    }
    assert "  UltraServer: us-0a1 (1 pod), no label (1 pod)\n" in explain_text(view)


# --- one preemption, one step -----------------------------------------------------------------


def victim(rv: int, conditions: list[dict[str, Any]], admitted: bool) -> dict[str, Any]:
    return kueue(
        s.workload(
            NS,
            "victim",
            1,
            8,
            T0,
            priority=10,
            conditions=conditions,
            cluster_queue=CQ if admitted else "",
            assignment=[(("n1",), 1)] if admitted else [],
            rv=str(rv),
        )
    )


def preemptor(name: str, at: float) -> dict[str, Any]:
    return kueue(s.workload(NS, name, 1, 8, at, priority=1000))


def message(by: dict[str, Any], cause: str) -> str:
    return s.preemption_message_by(by, f"/{CQ}", f"/{CQ}", cause)


def requeued(text: str, at: float) -> list[dict[str, Any]]:
    """What the job reconciler sets once the pods are gone (UnsetQuotaReservationWithCondition,
    SetRequeuedCondition with the eviction's reason and message)."""
    return [
        s.condition("QuotaReserved", "False", "Pending", text, at),
        s.condition("Admitted", "False", "NoReservation", "The workload has no reservation", at),
        s.condition("Requeued", "True", "Preempted", text, at),
    ]


def readmitted(previous: list[dict[str, Any]], at: float) -> list[dict[str, Any]]:
    """SetQuotaReservation: admitted again, Evicted and Preempted turned to "Previously: ..."."""
    out = s.admitted_conditions(CQ, at)
    for cond in previous:
        if cond["type"] in ("Evicted", "Preempted"):
            prior = "Previously: " + cond["message"]
            out.append(s.condition(cond["type"], "False", "QuotaReserved", prior, at))
        elif cond["type"] == "Requeued":
            out.append(cond)
    return out


def timeline_text(view: dict[str, Any]) -> str:
    return explain_text(view).split("Timeline:\n", 1)[1]


def live_model() -> ClusterModel:
    model = ClusterModel()
    for obj in cluster():
        model.apply(obj["kind"], "ADDED", obj, T0)
    return model


@pytest.mark.parametrize("order", ["condition-first", "event-first", "event-after-requeue"])
def test_one_preemption_is_one_step_with_its_message_once(order: str) -> None:
    model = live_model()
    admitted = s.admitted_conditions(CQ, T0)
    model.apply("Workload", "ADDED", victim(1, admitted, admitted=True), T0)
    urgent = preemptor("urgent", T0 + 5)
    model.apply("Workload", "ADDED", urgent, T0 + 5)
    text = message(urgent, "prioritization in the ClusterQueue")
    event = s.preemption_event(NS, "victim", text + s_priority_note(1000, 10), T0 + 10)
    eviction = [*admitted, *s.preempted_conditions(text, "InClusterQueue", T0 + 10)]
    # The pods take 40 s to stop; only then is the admission cleared.
    after = [*s.preempted_conditions(text, "InClusterQueue", T0 + 10), *requeued(text, T0 + 50)]
    steps: list[tuple[str, dict[str, Any], float]] = [
        ("Workload", victim(2, eviction, admitted=True), T0 + 10),
        ("Workload", victim(3, after, admitted=False), T0 + 50),
    ]
    at = {"condition-first": 1, "event-first": 0, "event-after-requeue": 2}[order]
    steps.insert(at, ("Event", event, T0 + 11))
    for kind, obj, now in steps:
        model.apply(kind, "MODIFIED" if kind == "Workload" else "ADDED", obj, now)

    view = workload_view(model, model.workload_state(NS, "victim"))
    assert [e["step"] for e in view["timeline"]] == [
        "created",
        "quota_reserved",
        "admitted",
        "preempted",
    ]
    step = view["timeline"][-1]
    assert step["time"] == iso(T0 + 10) and step["reason"] == "InClusterQueue"
    assert step["detail"].startswith(text)
    folded = {(f["step"], f["time"]) for f in step["folded"]}
    assert folded >= {
        ("evicted", iso(T0 + 10)),
        ("preempted", iso(T0 + 10)),
        ("requeued", iso(T0 + 50)),
        ("pending", iso(T0 + 50)),
    }
    shown = timeline_text(view)
    assert shown.count(text) == 1
    assert " [evicted, " in shown
    assert f"requeued at {iso(T0 + 50)}" in shown and f"pending at {iso(T0 + 50)}" in shown
    # The model keeps every record; only the view folds them.
    raw = [e.step for e in model.workload_state(NS, "victim").timeline]
    assert {"evicted", "requeued", "pending"} <= set(raw)


def s_priority_note(preemptor_priority: int, victim_priority: int) -> str:
    """The priorities Kueue appends to the Preempted Event's message (not to the condition)."""
    return (
        f"; preemptor effective priority: {preemptor_priority}"
        f" (base: {preemptor_priority}, boost: 0)"
        f"; preemptee effective priority: {victim_priority} (base: {victim_priority}, boost: 0)"
    )


def test_two_preemptions_are_two_steps() -> None:
    model = live_model()
    last = s.admitted_conditions(CQ, T0)
    model.apply("Workload", "ADDED", victim(1, last, admitted=True), T0)
    texts = []
    for n, (name, cause, reason) in enumerate(
        [
            ("urgent", "prioritization in the ClusterQueue", "InClusterQueue"),
            ("reclaimer", "reclamation within the cohort", "InCohortReclamation"),
        ]
    ):
        t = T0 + 1000 * n + 10
        by = preemptor(name, t - 5)
        model.apply("Workload", "ADDED", by, t - 5)
        text = message(by, cause)
        texts.append(text)
        current = [c for c in last if c["type"] not in ("Evicted", "Preempted")]
        hit = victim(3 * n + 2, [*current, *s.preempted_conditions(text, reason, t)], admitted=True)
        model.apply("Workload", "MODIFIED", hit, t)
        model.apply("Event", "ADDED", s.preemption_event(NS, "victim", text, t + 1), t + 1)
        gone = [*s.preempted_conditions(text, reason, t), *requeued(text, t + 20)]
        if n == 1:  # Requeued is still True from the first requeue: no new transition
            gone = [c for c in gone if c["type"] != "Requeued"]
            gone += [c for c in last if c["type"] == "Requeued"]
        model.apply("Workload", "MODIFIED", victim(3 * n + 3, gone, admitted=False), t + 20)
        last = readmitted(gone, t + 100)
        model.apply("Workload", "MODIFIED", victim(3 * n + 4, last, admitted=True), t + 100)

    view = workload_view(model, model.workload_state(NS, "victim"))
    steps = [e["step"] for e in view["timeline"]]
    cycle = ["quota_reserved", "admitted", "preempted"]
    assert steps == ["created", *cycle, *cycle, "quota_reserved", "admitted"]
    preempted = [e for e in view["timeline"] if e["step"] == "preempted"]
    assert [e["reason"] for e in preempted] == ["InClusterQueue", "InCohortReclamation"]
    assert [e["time"] for e in preempted] == [iso(T0 + 10), iso(T0 + 1010)]
    shown = timeline_text(view)
    for text, step in zip(texts, preempted, strict=True):
        assert step["detail"] == text
        assert shown.count(text) == 1


def test_dump_shows_one_step_and_keeps_a_later_pending_with_its_own_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    urgent = preemptor("urgent", T0 + 5)
    text = message(urgent, "prioritization in the ClusterQueue")
    after = [*s.preempted_conditions(text, "InClusterQueue", T0 + 10), *requeued(text, T0 + 12)]
    event = s.preemption_event(NS, "victim", text + s_priority_note(1000, 10), T0 + 10)
    base = [*cluster(), urgent, event]
    out = explain(capsys, dump(tmp_path, [*base, victim(3, after, admitted=False)]), "victim")
    shown = out.split("Timeline:\n", 1)[1]
    assert shown.count(text) == 1 and len(shown.splitlines()) == 2  # created, preempted
    assert "preempted (InClusterQueue)" in shown

    # The scheduler tried again and wrote why it still waits: a step of its own, after it.
    retry = s.quota_message(8)
    later = [
        s.condition("QuotaReserved", "False", "Pending", retry, T0 + 12)
        if c["type"] == "QuotaReserved"
        else c
        for c in after
    ]
    view = json.loads(
        explain(
            capsys, dump(tmp_path, [*base, victim(4, later, admitted=False)]), "victim", "--json"
        )
    )
    assert [e["step"] for e in view["timeline"]] == ["created", "preempted", "pending"]
    assert view["timeline"][-1]["detail"] == retry
    assert {f["step"] for f in view["timeline"][1]["folded"]} == {
        "evicted",
        "preempted",
        "requeued",
    }


def test_simulated_kueue_preemption_watched_live_is_one_step() -> None:
    """The simulated Kueue's own sequence, each version seen as the informers see it: Evicted and
    Preempted, the Event, then QuotaReserved=False/Pending and Requeued with the message."""
    start = T0
    store = ObjectStore(clock=lambda: start)
    shape = ClusterShape(
        p5_nodes=8, ultraserver_nodes=0, teams=("a",), arrivals_per_minute=0.0, initial_workloads=0
    )
    sim = SimulatedCluster(store, shape, seed=2, start=start)
    sim.bootstrap()
    model = ClusterModel()

    def watch(now: float) -> None:
        for plural, (api_version, kind) in LISTED.items():
            items = [{**o, "apiVersion": api_version, "kind": kind} for o in store.items(plural)]
            model.replace(kind, items, now)

    watch(start)
    sim.submit("a", "ft-1", 8, 3, "fine-tuning-priority", ("required", L3), start)
    names = {}
    for i in range(1, 6):
        sim.step(start + i)
        watch(start + i)
        if i == 1:
            names["victim"] = sim.submit(
                "a", "ft-2", 8, 3, "fine-tuning-priority", ("required", L3), start + i
            )
        if i == 2:
            sim.submit("a", "train", 8, 2, "training-priority", ("required", L3), start + i)
    state = model.workload_state("hyperpod-ns-a", names["victim"])
    raw = [e.step for e in state.timeline]
    assert {"evicted", "preempted", "requeued", "pending"} <= set(raw)  # what Kueue recorded
    view = workload_view(model, state)
    steps = [e["step"] for e in view["timeline"]]
    assert steps == ["created", "quota_reserved", "admitted", "preempted"]
    step = view["timeline"][-1]
    assert {f["step"] for f in step["folded"]} == {"evicted", "preempted", "requeued", "pending"}
    assert timeline_text(view).count(step["detail"]) == 1


LISTED = {
    "nodes": ("v1", "Node"),
    "clusterqueues": ("kueue.x-k8s.io/v1beta2", "ClusterQueue"),
    "localqueues": ("kueue.x-k8s.io/v1beta2", "LocalQueue"),
    "workloads": ("kueue.x-k8s.io/v1beta2", "Workload"),
    "pods": ("v1", "Pod"),
    "events": ("v1", "Event"),
}


def entry(step: str, at: float, reason: str = "", detail: str = "m") -> TimelineEntry:
    return TimelineEntry(at, step, reason, detail)


def test_fold_splits_preemptions_apart_in_time_even_without_a_recorded_readmission() -> None:
    """History lost (a restart between them): two evictions 300 s apart are two preemptions;
    a condition and its Event seconds apart are one."""
    folded = fold_preemptions(
        [
            entry("created", T0, detail=""),
            entry("evicted", T0 + 10, "Preempted", "m1 (underlying cause: InClusterQueue)"),
            entry("preempted", T0 + 12, "InClusterQueue", "m1; preemptor effective priority: 9"),
            entry("requeued", T0 + 40, "Preempted", "m1"),
            entry("evicted", T0 + 310, "Preempted", "m2 (underlying cause: InCohortReclamation)"),
            entry("pending", T0 + 330, "Pending", "m2"),
        ]
    )
    assert [(e.step, e.time, e.reason) for e in folded] == [
        ("created", T0, ""),
        ("preempted", T0 + 10, "InClusterQueue"),
        ("preempted", T0 + 310, "InCohortReclamation"),
    ]
    assert folded[1].detail == "m1; preemptor effective priority: 9"
    assert folded[2].detail == "m2"  # the eviction's message, its cause moved to the reason
    assert [f.step for f in folded[1].folded] == ["evicted", "preempted", "requeued"]


def test_fold_leaves_other_evictions_and_waits_alone() -> None:
    steps = [
        entry("created", T0, detail=""),
        entry("pending", T0 + 1, "Pending", "quota"),
        entry("quota_reserved", T0 + 2, "QuotaReserved"),
        entry("admitted", T0 + 2, "Admitted"),
        entry("evicted", T0 + 9, "PodsReadyTimeout", "timeout"),
        entry("requeued", T0 + 20, "PodsReadyTimeout", "timeout"),
    ]
    assert fold_preemptions(steps) == steps
