"""The admission check's verdicts, row by row, each resting on a Kueue rule (kubernetes-sigs/kueue
@ff69552): which entries are ours, which states we move, onFlavors, both API versions, and what
makes a node unfit. Every fixture is validated against Kueue's CRDs (tests/crds.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from exporter.cluster.admission.settings import AdmissionSettings
from tests.cluster.admission.world import (
    CHECK,
    FLAVOR,
    OTHER,
    T0,
    World,
    cluster_queue,
    entry,
    node,
    pod,
    workload,
    xid,
)

Setup = Callable[[World], None]


def nodes(*specs: tuple[str, dict[str, object]]) -> Setup:
    def setup(w: World) -> None:
        for name, kwargs in specs:
            w.add("Node", node(name, **kwargs))  # type: ignore[arg-type]

    return setup


HEALTHY = nodes(("n1", {}), ("n2", {}))


@dataclass
class Row:
    id: str
    rule: str  # the Kueue code the row rests on
    setup: Setup
    wl: dict[str, object]
    state: str | None  # None: no decision at all
    reason: str = ""
    says: str = ""  # a part of the message
    queue: list[tuple[str, tuple[str, ...]]] = field(default_factory=lambda: [(CHECK, ())])
    settings: AdmissionSettings = field(
        default_factory=lambda: AdmissionSettings(enabled=True, mode="enforce")
    )


PENDING = [entry(CHECK, "Pending"), entry(OTHER, "Pending")]
ROWS = [
    Row(
        "pending-healthy-nodes-ready",
        "pkg/workload/admissionchecks.go HasAllChecksReady: all Ready admits",
        HEALTHY,
        {"entries": PENDING},
        "Ready",
        "healthy",
        "2 assigned node(s) healthy",
    ),
    Row(
        "xid-on-assigned-node-retry",
        "workload_controller.go reconcileCheckBasedEviction: Retry evicts, quota released",
        nodes(("n1", {"findings": [xid()]}), ("n2", {})),
        {"entries": PENDING},
        "Retry",
        "unhealthy_node",
        "node n1: XID 79 on GPU 3 since 10:56:40Z",
    ),
    Row(
        "finding-still-damping-ready",
        "our node agent: only a confirmed (actionable) finding asks for action",
        nodes(("n1", {"findings": [xid(actionable=False)]}), ("n2", {})),
        {"entries": PENDING},
        "Ready",
        "healthy",
    ),
    Row(
        "hyperpod-pending-reboot-retry",
        "HyperPod labels a node UnschedulablePendingReboot before it reboots it",
        nodes(("n1", {}), ("n2", {"health": "UnschedulablePendingReboot"})),
        {"entries": PENDING},
        "Retry",
        "unhealthy_node",
        "node n2: HyperPod health UnschedulablePendingReboot",
    ),
    Row(
        "deep-health-check-running-retry",
        "HyperPod deep health check InProgress: the node is not the workload's",
        nodes(("n1", {"deep": "InProgress"}), ("n2", {})),
        {"entries": PENDING},
        "Retry",
        "unhealthy_node",
        "node n1: deep health check InProgress",
    ),
    Row(
        "cordoned-retry",
        "spec.unschedulable: the scheduler would not bind the pod there",
        nodes(("n1", {}), ("n2", {"cordoned": True})),
        {"entries": PENDING},
        "Retry",
        "unhealthy_node",
        "node n2: cordoned",
    ),
    Row(
        "agent-condition-false-retry",
        "our node agent's TopowatchHealthy=False condition without findings annotation",
        nodes(("n1", {"condition_false": "gpu0 ecc (replace)"}), ("n2", {})),
        {"entries": PENDING},
        "Retry",
        "unhealthy_node",
        "node n1: node agent reports TopowatchHealthy=False (Xid: gpu0 ecc (replace))",
    ),
    Row(
        "v1beta1-domains-form-retry",
        "apis/kueue/v1beta1 TopologyAssignment{levels, domains}",
        nodes(("n1", {}), ("n2", {"findings": [xid(gpu=5, code=48)]})),
        {"entries": PENDING, "v1beta1": True},
        "Retry",
        "unhealthy_node",
        "node n2: XID 48 on GPU 5",
    ),
    Row(
        "v1beta2-slices-form-ready",
        "apis/kueue/v1beta2 TopologyAssignment{levels, slices}",
        HEALTHY,
        {"entries": [entry(CHECK, "Pending")]},
        "Ready",
        "healthy",
    ),
    Row(
        "retry-entry-is-kueues-to-reset",
        "pkg/workload/evict resetChecksOnEviction: Kueue, not the controller, resets Retry",
        nodes(("n1", {"findings": [xid()]}), ("n2", {})),
        {"entries": [entry(CHECK, "Retry")]},
        None,
    ),
    Row(
        "rejected-entry-final",
        "workload_controller.go: Rejected deactivates; nothing left to answer",
        HEALTHY,
        {"entries": [entry(CHECK, "Rejected")]},
        None,
    ),
    Row(
        "no-quota-reserved-no-answer",
        "checks are asked after quota reservation (AdmissionChecksForWorkload)",
        HEALTHY,
        {"entries": [entry(CHECK, "Pending")], "reserved": False, "nodes": None},
        None,
    ),
    Row(
        "foreign-entry-only-untouched",
        "pkg/util/admissioncheck FilterForController: only our controllerName's entries",
        nodes(("n1", {"findings": [xid()]}), ("n2", {})),
        {"entries": [entry(OTHER, "Pending")]},
        None,
        queue=[(OTHER, ())],
    ),
    Row(
        "on-flavors-excludes-assigned-flavor",
        "workload.go admissionChecksForAdmission: onFlavors must meet the assigned flavors",
        nodes(("n1", {"findings": [xid()]}), ("n2", {})),
        {"entries": PENDING},
        None,
        queue=[(CHECK, ("ml.p6e-gb200.36xlarge",))],
    ),
    Row(
        "on-flavors-includes-assigned-flavor",
        "workload.go admissionChecksForAdmission",
        nodes(("n1", {"findings": [xid()]}), ("n2", {})),
        {"entries": PENDING},
        "Retry",
        "unhealthy_node",
        queue=[(CHECK, (FLAVOR,))],
    ),
    Row(
        "no-tas-flavor-holds-pods-ready",
        "no TAS: the scheduler picks the flavor's nodes after admission",
        nodes(("n1", {}), ("n2", {}), ("n3", {"findings": [xid()]})),
        {"entries": PENDING, "nodes": None, "pods": 2},
        "Ready",
        "healthy",
        "2 healthy node(s)",
    ),
    Row(
        "no-tas-flavor-too-few-healthy-retry",
        "no TAS: too few healthy nodes on the flavor for its pods",
        nodes(("n1", {}), ("n2", {"findings": [xid()]})),
        {"entries": PENDING, "nodes": None, "pods": 2},
        "Retry",
        "too_few_healthy_nodes",
        "flavor ml.p5.48xlarge: 1 of 2 nodes healthy, room for 1 of 2 pods",
    ),
    Row(
        "no-tas-too-few-rejected-when-configured",
        "workload_controller.go: Rejected deactivates (only with reject: true)",
        nodes(("n1", {}), ("n2", {"findings": [xid()]})),
        {"entries": PENDING, "nodes": None, "pods": 2},
        "Rejected",
        "too_few_healthy_nodes",
        settings=AdmissionSettings(enabled=True, mode="enforce", reject=True),
    ),
    Row(
        "tas-bad-node-retry-even-with-reject",
        "a bad assigned node is placement's problem: Retry lets Kueue place it again",
        nodes(("n1", {"findings": [xid()]}), ("n2", {})),
        {"entries": PENDING},
        "Retry",
        "unhealthy_node",
        settings=AdmissionSettings(enabled=True, mode="enforce", reject=True),
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_verdicts(row: Row) -> None:
    w = World(row.settings)
    w.add("ClusterQueue", cluster_queue(row.queue))
    row.setup(w)
    raw = workload(**row.wl)  # type: ignore[arg-type]
    w.add("Workload", raw)
    made = w.cycle()
    if row.state is None:
        assert made == [], row.rule
        assert w.writer.patches == []
        return
    assert len(made) == 1, row.rule
    decision = made[0]
    assert (decision["state"], decision["reason"]) == (row.state, row.reason), row.rule
    assert row.says in decision["message"]
    # what reached the API: our entry changed, every other entry exactly as read
    [(target, patch)] = w.writer.patches
    assert target == "hyperpod-ns-alpha/train"
    sent = {e["name"]: e for e in patch["status"]["admissionChecks"]}
    assert sent[CHECK]["state"] == row.state
    assert sent[CHECK]["message"] == decision["message"]
    for before in raw["status"]["admissionChecks"]:
        if before["name"] != CHECK:
            assert sent[before["name"]] == before


def test_ready_check_withdrawn_when_a_node_turns_bad_before_pods_start() -> None:
    """kueue#12757: admitted, check Ready, pods still gated; a node of its assignment turns
    bad: Retry evicts it before it starts there. Once its pods run, it is not ours to stop."""
    w = World()
    w.add("ClusterQueue", cluster_queue()).add("Node", node("n1")).add("Node", node("n2"))
    w.add("Workload", workload(entries=[entry(CHECK, "Ready")], admitted=True))
    w.add("Pod", pod("train-0", "", gated=True)).add("Pod", pod("train-1", "", gated=True))
    assert w.cycle() == []  # healthy: a Ready check stays Ready, nothing written
    assert w.writer.patches == []
    w.add("Node", node("n2", findings=[xid(gpu=1)]), "MODIFIED")
    [decision] = w.cycle()
    assert (decision["previous"], decision["state"]) == ("Ready", "Retry")
    assert decision["message"].startswith("node n2: XID 79 on GPU 1")


def test_ready_check_left_alone_once_pods_run() -> None:
    w = World()
    w.add("ClusterQueue", cluster_queue())
    w.add("Node", node("n1")).add("Node", node("n2", findings=[xid()]))
    w.add("Workload", workload(entries=[entry(CHECK, "Ready")], admitted=True))
    w.add("Pod", pod("train-0", "n1")).add("Pod", pod("train-1", "n2"))
    assert w.cycle() == []
    assert w.writer.patches == []


def test_repeat_offender_is_held_off() -> None:
    """The goodput reliability book's repeat offenders (what the remediation ladder replaces
    rather than reboots) get no new work."""
    w = World()
    w.add("ClusterQueue", cluster_queue()).add("Node", node("n1")).add("Node", node("n2"))
    w.add("Workload", workload(entries=[entry(CHECK, "Pending")]))
    w.controller.sync_checks(w.now)
    judged = w.controller.judge(
        w.service.model, w.now, {"n2": "repeat offender: 3 hardware incidents in 7 days"}, True
    )
    assert [(j.decision.state, j.decision.message) for j in judged] == [
        ("Retry", "node n2: repeat offender: 3 hardware incidents in 7 days")
    ]


def test_settings_pick_which_checks_count() -> None:
    """Two AdmissionChecks of our controller; `checks` names the one that counts."""
    from tests.cluster.admission.world import FakeWriter, admission_check

    writer = FakeWriter([admission_check(active=True), admission_check("gpu-health", active=True)])
    w = World(AdmissionSettings(enabled=True, mode="enforce", checks=("gpu-health",)), writer)
    w.add("ClusterQueue", cluster_queue([(CHECK, ()), ("gpu-health", ())]))
    w.add("Node", node("n1", findings=[xid()])).add("Node", node("n2"))
    w.add("Workload", workload(entries=[entry(CHECK, "Pending"), entry("gpu-health", "Pending")]))
    assert [(d["check"], d["state"]) for d in w.cycle()] == [("gpu-health", "Retry")]


def test_message_names_the_day_when_the_finding_is_old() -> None:
    w = World()
    w.add("ClusterQueue", cluster_queue())
    w.add("Node", node("n1", findings=[xid(at=T0 - 3 * 86_400)])).add("Node", node("n2"))
    w.add("Workload", workload(entries=[entry(CHECK, "Pending")]))
    [decision] = w.cycle()
    assert decision["message"] == "node n1: XID 79 on GPU 3 since 2026-11-15T11:06:40Z"
