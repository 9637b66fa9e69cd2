"""The interruption ledger: each stop of a running job, one entry, its cause from evidence."""

from __future__ import annotations

import pytest

from exporter.cluster.goodput.attribution import SETTLE_S
from exporter.sim import synthetic as syn
from tests.cluster.goodput.harness import CQ, NS, T0, World, finding, xid79


def world_with_nodes(*names: str) -> World:
    w = World()
    for name in names:
        w.node(name)
    return w


def settle(w: World, t: float) -> None:
    w.at(t)
    w.book.tick(t)


def test_a_fatal_xid_on_its_node_is_a_gpu_fault_with_the_whole_timeline() -> None:
    w = world_with_nodes("a", "b", "c")
    w.run_job("train", ["a", "b"])
    assert (good := w.book.job_goodput(NS, "train", T0)) is not None and good.phase == "running"
    # t+100: XID 79 on a's gpu3, the pods die with it
    w.at(T0 + 100).node("a", findings=[xid79(T0 + 100)])
    w.delete_pod("train-0")
    w.delete_pod("train-1")
    # t+130: HyperPod marks a for replacement; t+900: it is back; t+960 the job runs again
    w.at(T0 + 130).node("a", findings=[xid79(T0 + 100)], health="UnschedulablePendingReplacement")
    w.at(T0 + 900).node("a", findings=[])
    w.at(T0 + 930)
    w.pod("train-2", "a", "train", "train", ready=False)
    w.pod("train-3", "b", "train", "train", ready=False)
    good = w.book.job_goodput(NS, "train", T0 + 930)
    assert good is not None and good.phase == "restarting"
    w.at(T0 + 960)
    w.pod("train-2", "a", "train", "train")
    w.pod("train-3", "b", "train", "train")
    (entry,) = w.entries("train")
    assert (entry.cause, entry.component) == ("node_fault", "gpu")
    assert (entry.node, entry.check, entry.finding_component) == ("a", "xid", "gpu3")
    assert entry.detected_at == T0 + 100
    assert entry.action_at == T0 + 130 and entry.action == "replace"
    assert entry.node_back_at == T0 + 900
    assert entry.resumed_at == T0 + 960
    assert entry.settled and entry.uncertain == ""
    assert entry.lost_gpu_seconds(T0 + 5000) == 16 * 860
    assert entry.waiting_s == 830 and entry.restarting_s == 30
    good = w.book.job_goodput(NS, "train", T0 + 1060)
    assert good is not None
    assert good.seconds["running"] == 200
    assert good.seconds["waiting"] == 830 and good.seconds["restarting"] == 30
    assert good.wall == 1060
    assert good.ettr == pytest.approx(200 / 1060)
    assert good.lost_gpu_seconds_by_cause == {"node_fault": 16 * 860}


def test_a_preemption_names_the_preemption_and_its_wait_is_reported_as_preempted() -> None:
    w = world_with_nodes("a")
    w.run_job("low", ["a"])
    w.at(T0 + 50)
    message = syn.preemption_message_v015(
        "uid-hi", "job-hi", "/hyperpod-cohort/x", f"/hyperpod-cohort/{CQ}", "reclamation"
    )
    evicted = syn.preempted_conditions(message, "InCohortReclamation", T0 + 50)
    w.workload("low", 1, admitted=False, conditions=evicted, created=T0)
    w.delete_pod("low-0")
    w.apply("Event", syn.preemption_event(NS, "low", message, T0 + 50))
    settle(w, T0 + 50 + SETTLE_S)
    (entry,) = w.entries("low")
    assert entry.cause == "preempted"
    good = w.book.job_goodput(NS, "low", T0 + 250)
    assert good is not None and good.seconds["preempted"] == 200
    assert good.seconds["waiting"] == 0


def test_a_remediation_the_job_ran_through_its_finding_for_is_remediation() -> None:
    w = world_with_nodes("a")
    w.run_job("job", ["a"])
    warn = finding("row_remap_pending", "gpu1", T0 + 10, "warning", "reboot")
    w.at(T0 + 10).node("a", findings=[warn])
    w.at(T0 + 700).node("a", findings=[warn], health="UnschedulablePendingReboot")
    w.at(T0 + 705).delete_pod("job-0")
    settle(w, T0 + 705 + SETTLE_S)
    (entry,) = w.entries("job")
    assert (entry.cause, entry.component, entry.action) == ("remediation", "hbm", "reboot")
    assert entry.action_at == T0 + 700 and entry.detected_at == T0 + 10
    assert "row_remap_pending" in entry.detail


def test_a_finding_after_the_pods_died_is_a_node_fault_marked_uncertain() -> None:
    w = world_with_nodes("a")
    w.run_job("job", ["a"])
    w.at(T0 + 100).delete_pod("job-0")
    late = finding("nvlink_down", "gpu0:link3", T0 + 140, "critical", "reboot")
    w.at(T0 + 141).node("a", findings=[late])
    settle(w, T0 + 100 + SETTLE_S)
    (entry,) = w.entries("job")
    assert (entry.cause, entry.component) == ("node_fault", "nvlink")
    assert "40 s after" in entry.uncertain and entry.settled


def test_garbage_findings_crash_nothing_and_are_said_to_be_uncertain() -> None:
    w = world_with_nodes("a")
    w.run_job("job", ["a"])
    w.at(T0 + 10).node("a", raw_findings="{not json")
    w.at(T0 + 20).delete_pod("job-0")
    settle(w, T0 + 20 + SETTLE_S)
    (entry,) = w.entries("job")
    assert entry.cause == "unknown"
    assert "unreadable" in entry.uncertain
    assert "no finding" in entry.missing
    assert w.book.problems["findings_unreadable"] == 1
    assert w.model.problems.get(("Node", "observer"), 0) == 0


def test_nothing_is_counted_twice_when_the_same_objects_arrive_again() -> None:
    w = world_with_nodes("a")
    w.run_job("job", ["a"])
    fault = [xid79(T0 + 100)]
    w.at(T0 + 100).node("a", findings=fault)
    w.delete_pod("job-0")
    for _ in range(3):  # re-lists repeat the node and the deletion
        w.node("a", findings=fault)
        w.delete_pod("job-0")
    settle(w, T0 + 100 + SETTLE_S)
    assert len(w.entries("job")) == 1
    assert len(w.book.reliability_book.incidents("a")) == 1


def test_user_deletion_completion_and_an_operator_restart() -> None:
    w = world_with_nodes("a", "b", "c")
    w.run_job("gone", ["a"])
    w.at(T0 + 10).delete_workload("gone")
    w.delete_pod("gone-0")
    w.run_job("done", ["b"])
    w.at(T0 + 20)
    finished = syn.condition("Finished", "True", "Succeeded", "Job finished successfully", T0 + 20)
    w.workload("done", 1, conditions=[finished], created=T0 + 10)
    w.delete_pod("done-0")
    # an operator restarts job "resumed" with a new Workload after a fatal fault
    w.at(T0 + 30).workload("resumed-w1", 1, owner="resumed")
    w.pod("r-0", "c", "resumed", "resumed-w1")
    w.at(T0 + 40).node("c", findings=[xid79(T0 + 40)])
    w.delete_workload("resumed-w1")
    w.delete_pod("r-0")
    w.workload("resumed-w2", 1, owner="resumed")
    w.at(T0 + 100).node("c", findings=[])
    w.pod("r-1", "c", "resumed", "resumed-w2")
    settle(w, T0 + 40 + SETTLE_S)
    assert [e.cause for e in w.entries("gone")] == ["user"]
    assert [e.cause for e in w.entries("done")] == ["completed"]
    (entry,) = w.entries("resumed")
    assert (entry.cause, entry.resumed_at) == ("node_fault", T0 + 100)
    good = w.book.job_goodput(NS, "done", T0 + 500)
    assert good is not None and good.phase == "finished" and good.interruptions == 0


def test_a_checkpoint_annotation_gives_the_work_lost_and_a_malformed_one_says_so() -> None:
    w = world_with_nodes("a", "b")
    key = "topowatch.io/last-checkpoint"
    w.workload("ok", 1, annotations={key: syn.rfc3339(T0 - 600)})
    w.pod("ok-0", "a", "ok", "ok")
    w.workload("bad", 1, annotations={key: "yesterday-ish"})
    w.pod("bad-0", "b", "bad", "bad")
    w.at(T0 + 100)
    w.delete_pod("ok-0")
    w.delete_pod("bad-0")
    settle(w, T0 + 100 + SETTLE_S)
    (ok,) = w.entries("ok")
    (bad,) = w.entries("bad")
    assert ok.work_lost_gpu_seconds == 8 * 700
    assert bad.work_lost_gpu_seconds is None
    assert "not a time" in bad.checkpoint_note


def test_the_rules_on_evidence_alone() -> None:
    """The attribution rules, pure: elastic scale-downs, a NotReady host beside an older
    warning, and evidence from before the job last started belonging to an earlier stop."""
    from exporter.cluster.goodput.attribution import (
        NodeEvent,
        PreemptionEvidence,
        ScaleDownEvidence,
        Stop,
        WorkloadEvent,
        attribute,
    )
    from exporter.cluster.goodput.evidence import NodeFinding

    t = T0 + 1000
    preempted = PreemptionEvidence(t, "scale-up-2", "quota", "8 more GPUs", "ns/other")
    elastic = Stop(t, ("a",), ("base", "scale-up-2"), elastic=True, continues=True)
    verdict = attribute(elastic, [], [], [preempted])
    assert (verdict.cause, verdict.preemptor) == ("elastic_scale_down", "ns/other")
    faulty = ScaleDownEvidence(t, "scale-up-2", "faulty_pod")
    assert attribute(elastic, [], [], [], [faulty]).cause == "elastic_scale_down"
    assert attribute(Stop(t, ("a",), ("w",)), [], [], [preempted]).cause == "preempted"

    warning = NodeFinding(
        "a", "row_remap_pending", "gpu1", "warning", "reboot", "x", t - 400, "hbm"
    )
    down = NodeEvent(t, "a", "not_ready")
    verdict = attribute(
        Stop(t, ("a",), ("w",)), [NodeEvent(t - 400, "a", "finding", finding=warning), down], []
    )
    assert (verdict.cause, verdict.component) == ("node_fault", "host")

    earlier = PreemptionEvidence(t - 60, "w", "quota", "", "ns/x")
    done = WorkloadEvent(t, "w", "finished", "Succeeded")
    again = Stop(t, ("a",), ("w",), since=t - 30)  # re-admitted after that preemption
    assert attribute(again, [], [done], [earlier]).cause == "completed"
