"""The simulation as the admission check's oracle, and the demo's steering line.

`SimulatedCluster.note_check_verdicts` logs each verdict a check controller wrote with the
truth of that moment, judged only from what the simulation has published on the Node objects
(`observable_problem`): a finding the node agent has not reported yet is no one's to see.
`stand_in_checks` answers the checks from the same truth for a cluster's past (the demo's
history). The demo prints a line when a Retry steers a workload (`SteeringLog`).
"""

from __future__ import annotations

import io
from typing import Any

from exporter.sim.cluster import ClusterShape, SimulatedCluster
from exporter.sim.demo import SteeringLog
from exporter.sim.hyperpod_layout import namespace
from exporter.sim.kubeapi.store import ObjectStore
from exporter.sim.kueue import checks as ck
from exporter.sim.kueue.checks import AdmissionChecks
from exporter.sim.kueue.decisions import Decision, DecisionLog

START = 1_795_000_000.0


def finding(action: str = "reboot") -> dict[str, object]:
    return {
        "check": "xid",
        "component": "gpu3",
        "severity": "fatal",
        "action": action,
        "evidence": "XID 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS (RESTART_BM) x1",
        "firstSeen": "2026-11-18T10:02:11Z",
        "lastSeen": "2026-11-18T10:02:11Z",
        "actionable": True,
    }


class World:
    def __init__(self) -> None:
        self.now = START
        self.store = ObjectStore(clock=lambda: self.now)
        shape = ClusterShape(
            p5_nodes=2, ultraserver_nodes=0, teams=("a",), arrivals_per_minute=0.0,
            initial_workloads=0,
        )  # fmt: skip
        self.cluster = SimulatedCluster(
            self.store, shape, seed=1, start=START, admission_checks=AdmissionChecks()
        )
        self.cluster.bootstrap()

    def step(self) -> None:
        self.now += 1.0
        self.cluster.step(self.now)

    def reserved(self, name: str) -> tuple[str, str]:
        wl = self.cluster.submit("a", name, 8, 1, "training-priority", now=self.now)
        key = f"{namespace('a')}/{wl}"
        self.step()
        holding = self.cluster._state.holdings[key]  # type: ignore[attr-defined]
        [node] = {n for ps in holding.sets() for n, _ in ps.placement}
        return key, node

    def publish(self, node: str, found: dict[str, object]) -> None:
        self.cluster._findings[node] = [found]  # type: ignore[attr-defined]
        self.cluster._write_node(self.cluster.nodes()[self.node_index(node)])  # type: ignore[attr-defined]

    def node_index(self, node: str) -> int:
        return [n.name for n in self.cluster.nodes()].index(node)

    def verdict(self, key: str, state: str, message: str) -> None:
        """A check controller's merge patch of status.admissionChecks."""
        namespace, name = key.split("/", 1)
        obj: Any = self.store.get("workloads", namespace, name)
        [entry] = obj["status"]["admissionChecks"]
        entry.update(state=state, message=message, lastTransitionTime="2026-11-18T10:03:00Z")
        if state == ck.RETRY:
            entry["requeueAfterSeconds"] = 30
        self.store.upsert("workloads", obj)


def test_only_what_the_node_object_shows_is_the_truth() -> None:
    """A finding found but not yet reported, one asking for no action, or a garbled
    annotation: the Node shows nothing a check could act on. A published actionable finding,
    HyperPod's Unschedulable label: it does."""
    world = World()
    cluster: Any = world.cluster
    node = cluster.nodes()[0].name
    cluster._reports[node] = [finding()]
    assert cluster.observable_problem(node) is None  # the agent has not written it yet
    world.publish(node, finding("none"))
    assert cluster.observable_problem(node) is None  # XID 13-like: the application's error
    world.publish(node, finding())
    assert "xid gpu3 action=reboot" in cluster.observable_problem(node)
    cluster._garbled.add(node)
    assert cluster.observable_problem(node) is None  # the annotation does not parse
    other = cluster.nodes()[1].name
    cluster.cordon(other, "UnschedulablePendingReboot")
    assert "UnschedulablePendingReboot" in cluster.observable_problem(other)


def test_each_written_verdict_is_logged_once_with_the_truth_of_that_moment() -> None:
    world = World()
    key, node = world.reserved("bad")
    world.publish(node, finding())
    world.verdict(key, ck.RETRY, f"node {node}: XID 79 on GPU 3 since 10:02:11Z")
    [logged] = world.cluster.note_check_verdicts()
    assert (logged.kind, logged.cause, logged.verdict) == ("admission", "Retry", "Retry")
    assert logged.domains == (node,) and "action=reboot" in logged.detail
    assert world.cluster.note_check_verdicts() == []  # the same verdict: logged once
    world.step()  # Kueue acts on it: evicted, quota released (and, the backoff past, again)
    step = world.cluster.step_index
    kinds = [d.kind for d in world.cluster.decisions.decisions if d.step == step]
    assert kinds[0] == "evicted"
    assert world.cluster.note_check_verdicts() == []  # reset to Pending by the simulation


def test_a_ready_before_the_finding_is_published_is_right() -> None:
    """The fault happened, the agent found it, the Node does not show it yet: Ready is what
    any check must answer, so the truth says Ready too."""
    world = World()
    key, node = world.reserved("early")
    world.cluster._reports[node] = [finding()]  # type: ignore[attr-defined]
    world.verdict(key, ck.READY, "topowatch: 1 assigned node(s) healthy")
    [logged] = world.cluster.note_check_verdicts()
    assert (logged.cause, logged.verdict) == ("Ready", "Ready")


def test_the_stand_in_answers_from_the_truth_and_kueue_carries_it_out() -> None:
    world = World()
    good, _ = world.reserved("good")
    bad, node = world.reserved("bad")
    world.publish(node, finding())
    assert world.cluster.stand_in_checks() == 2
    namespace, name = bad.split("/", 1)
    [entry] = world.store.get("workloads", namespace, name)["status"]["admissionChecks"]  # type: ignore[index]
    assert (entry["state"], entry["requeueAfterSeconds"]) == ("Retry", 30)
    world.step()
    kinds = {d.workload: d.kind for d in world.cluster.decisions.decisions if d.step == 3}
    assert kinds == {good: "admitted", bad: "evicted"}


def test_the_demo_prints_a_line_when_the_check_steers_a_workload() -> None:
    log = DecisionLog()
    out = io.StringIO()
    steering = SteeringLog(log, out, lambda key: ["hyperpod-i-0c0d"] if key == "ns/wl" else [])
    held = "node hyperpod-i-0a1b: XID 79 on GPU 3 since 10:02:11Z"
    message = f'Evicted due to AdmissionCheck in Retry state: "topowatch-node-health" ({held})'
    log.add(Decision(0, 1, 0.0, "evicted", "ns/wl", "u", "cq", ck.CAUSE, message=message))
    log.add(Decision(0, 2, 0.0, "admitted", "ns/other", "u2", "cq"))
    steering()
    log.add(Decision(0, 3, 0.0, "admitted", "ns/wl", "u", "cq", domains=("nn-e955",)))
    steering()
    assert out.getvalue().splitlines() == [
        f"admission steered ns/wl away from {held}",
        "  ns/wl admitted after the check's Retry, on hyperpod-i-0c0d",
    ]
