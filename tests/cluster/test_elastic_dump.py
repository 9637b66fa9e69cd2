"""Elastic jobs judged on an independent dump, offline and live.

tests/fixtures/hyperpod/dump/elastic-jobs.yaml is written by hand from the CRDs and Kueue's
ElasticJobsViaWorkloadSlices docs, not by topowatch's simulator (its header tells the story).
Every row of FACTS is one thing an admin reads from it, with the HyperPod or Kueue rule it
rests on; each is checked twice:

- offline: the dump through the path `topowatch explain --from` takes (`model_from_objects`),
  where only what the objects record is known;
- live: the same history delivered as watch events, one object version at a time, in time
  order, as the informers would have delivered it to a model that watched it all.

Rules cited: reference/hyperpod/elastic-training-and-deep-health.md (1.2 elasticPolicy, 1.3
elasticScalingStatus, 1.4 the scale-up and preemption flows, 1.6 Kueue's workload slices), and
Kueue's pkg/workload (`SyncAdmittedCondition` accumulates accumulatedPastExecutionTimeSeconds
when Admitted goes False; `UnsetQuotaReservationWithCondition` clears the admission on eviction).
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.cli import main
from exporter.cluster.elastic.scaling import PHASES, JobState, ScaleEvent
from exporter.cluster.explain import explain_text, job_text, model_from_objects
from exporter.cluster.metrics.render import render
from exporter.cluster.model import ClusterModel
from exporter.cluster.parse.core import parse_time
from exporter.cluster.views.elastic import explained_workload, find_job, job_view, jobs_view
from exporter.core.exposition import encode_text
from tests.crds import assert_valid

DUMP = Path(__file__).parents[1] / "fixtures" / "hyperpod" / "dump" / "elastic-jobs.yaml"
NS = "hyperpod-ns-llm"
GATE = "kueue.x-k8s.io/elastic-job"
Obj = dict[str, Any]


def at(clock: str) -> float:
    t = parse_time(f"2026-11-18T{clock}Z")
    assert t is not None
    return t


def stamp(t: float) -> str:
    from exporter.sim.synthetic import rfc3339

    return rfc3339(t)


def dump_objects() -> list[Obj]:
    items: list[Obj] = yaml.safe_load(DUMP.read_text())["items"]
    return copy.deepcopy(items)


def named(objects: list[Obj], name: str) -> Obj:
    [found] = [o for o in objects if o["metadata"]["name"] == name]
    return found


# --- the two ways in ---------------------------------------------------------------------------


def offline(drop: tuple[str, ...] = ()) -> ClusterModel:
    model, _ = model_from_objects([o for o in dump_objects() if o["kind"] not in drop])
    return model


def _conditions(obj: Obj, keep: Callable[[Obj], bool]) -> Obj:
    out = copy.deepcopy(obj)
    out["status"]["conditions"] = [c for c in out["status"].get("conditions", []) if keep(c)]
    return out


def _pending(workload: Obj) -> Obj:
    out = copy.deepcopy(workload)
    out["status"] = {}
    return out


def _admitted(workload: Obj, when: str) -> Obj:
    """The Workload as Kueue admitted it (QuotaReserved and Admitted True, its admission)."""
    out = _pending(workload)
    count = out["spec"]["podSets"][0]["count"]
    container = out["spec"]["podSets"][0]["template"]["spec"]["containers"][0]
    gpus = int(container["resources"]["requests"]["nvidia.com/gpu"])
    t = stamp(at(when))
    out["status"] = {
        "conditions": [
            {"type": t_, "status": "True", "reason": t_, "message": m, "lastTransitionTime": t}
            for t_, m in (
                ("QuotaReserved", "Quota reserved in ClusterQueue hyperpod-ns-llm-clusterqueue"),
                ("Admitted", "The workload is admitted"),
            )
        ],
        "admission": {
            "clusterQueue": "hyperpod-ns-llm-clusterqueue",
            "podSetAssignments": [
                {
                    "name": "main",
                    "flavors": {"nvidia.com/gpu": "ml.p5.48xlarge"},
                    "resourceUsage": {"nvidia.com/gpu": str(count * gpus)},
                    "count": count,
                }
            ],
        },
    }
    return out


def _unready(pod: Obj, started: str) -> Obj:
    out = _conditions(pod, lambda c: c["type"] == "PodScheduled")
    out["status"]["conditions"][0]["lastTransitionTime"] = stamp(at(started))
    out["status"]["phase"] = "Pending"
    out["metadata"].pop("deletionTimestamp", None)
    return out


def _gated(pod: Obj) -> Obj:
    """A Kueue elastic Job's pod before its slice is admitted: the elastic-job gate (1.6)."""
    out = copy.deepcopy(pod)
    del out["spec"]["nodeName"]
    out["spec"]["schedulingGates"] = [{"name": GATE}]
    out["status"] = {"phase": "Pending"}
    return out


def _job_status(job: Obj, target: int | None, restart: str | None, updated: str) -> Obj:
    out = copy.deepcopy(job)
    scaling = out["status"].pop("elasticScalingStatus", None)
    if target is not None and scaling is not None:
        scaling = {**scaling, "targetReplicas": {"pods": target}}
        scaling["lastUpdated"] = stamp(at(updated))
        for key in ("lastScalingTime", "lastRestartTime"):
            if restart is None:
                scaling.pop(key, None)
            else:
                scaling[key] = stamp(at(restart))
        out["status"]["elasticScalingStatus"] = scaling
    return out


def timeline(objects: list[Obj]) -> list[tuple[float, str, str, Obj]]:
    """The history the dump's objects end, as watch events (time, kind, type, object): every
    earlier version of an object is the dump's own, with the fields it had then."""
    o = {obj["metadata"]["name"]: obj for obj in objects}
    events: list[tuple[str, str, str, Obj]] = []

    def add(when: str, obj: Obj, kind: str = "", type_: str = "MODIFIED") -> None:
        events.append((when, kind or obj["kind"], type_, obj))

    # llama-elastic: base, a scale-up admitted for five hours, preempted; restarts (1.4)
    llama, base, up = (
        o["llama-elastic"],
        o["hyperpodpytorchjob-llama-elastic-7c1f0"],
        o["hyperpodpytorchjob-llama-elastic-9d2e4"],
    )
    add("08:00:00", _job_status(llama, None, None, "08:00:00"), type_="ADDED")
    add("08:00:01", _pending(base), type_="ADDED")
    add("08:00:02", base)
    for name in ("llama-elastic-pods-0-k2x7p", "llama-elastic-pods-1-r8m3q"):
        add("08:00:03", _unready(o[name], "08:00:03"), type_="ADDED")
        add("08:00:40", o[name])
    add("08:00:45", _job_status(llama, 2, None, "08:00:45"))
    add("08:10:00", _pending(up), type_="ADDED")
    add("08:10:00", _job_status(llama, 3, None, "08:10:00"))  # the operator asks for 3
    add("08:10:02", _admitted(up, "08:10:02"))
    grown = copy.deepcopy(o["llama-elastic-pods-0-k2x7p"])
    grown["metadata"].update(name="llama-elastic-pods-2-w4t6z", uid="8c1d2e3f-1b03-4a5b-9c6d-1")
    grown["metadata"]["annotations"]["kueue.x-k8s.io/workload"] = up["metadata"]["name"]
    grown["spec"]["nodeName"] = "hyperpod-i-0a1100000000000c1"
    ready = _conditions(grown, lambda c: True)
    for cond in ready["status"]["conditions"]:
        cond["lastTransitionTime"] = stamp(
            at("08:10:30" if "Ready" in cond["type"] else "08:10:03")
        )
    add("08:10:03", _unready(grown, "08:10:03"), type_="ADDED")
    add("08:10:30", ready)
    add("08:11:00", _job_status(llama, 3, "08:11:00", "08:11:00"))
    evicting = _admitted(up, "08:10:02")
    evicting["status"]["conditions"] += [
        c for c in up["status"]["conditions"] if c["type"] in ("Evicted", "Preempted")
    ]
    add("13:10:02", evicting)
    add("13:10:02", o["hyperpodpytorchjob-llama-elastic-9d2e4.18a9c3f2d0b1e4a7"], type_="ADDED")
    add("13:10:04", up)
    add("13:10:05", ready, type_="DELETED")
    add("13:10:50", llama)
    # gpt-multi: two scale-ups, each restarted after its pods were Ready
    gpt = o["gpt-multi"]
    add("09:00:00", _job_status(gpt, None, None, "09:00:00"), type_="ADDED")
    add("09:00:35", _job_status(gpt, 1, None, "09:00:35"))
    for wl, pod, created, admitted, ready_at in (
        ("1a2b3", "gpt-multi-pods-0-a1b2c", "09:00:01", "09:00:02", "09:00:30"),
        ("4c5d6", "gpt-multi-pods-1-d3e4f", "09:30:00", "09:30:01", "09:30:25"),
        ("7e8f9", "gpt-multi-pods-2-g5h6j", "10:00:00", "10:00:02", "10:00:28"),
    ):
        workload = o[f"hyperpodpytorchjob-gpt-multi-{wl}"]
        add(created, _pending(workload), type_="ADDED")
        add(admitted, workload)
        bound = o[pod]["status"]["conditions"][0]["lastTransitionTime"][11:19]
        add(bound, _unready(o[pod], bound), type_="ADDED")
        add(ready_at, o[pod])
    add("09:30:00", _job_status(gpt, 2, None, "09:30:00"))
    add("09:30:50", _job_status(gpt, 2, "09:30:50", "09:30:50"))
    add("10:00:00", _job_status(gpt, 3, "09:30:50", "10:00:00"))
    add("10:00:55", gpt)
    # bert-fixed, t5-fixed: no elasticPolicy
    add("07:30:00", o["bert-fixed"], type_="ADDED")
    add("07:30:01", _pending(o["hyperpodpytorchjob-bert-fixed-2b4d6"]), type_="ADDED")
    add("07:30:02", o["hyperpodpytorchjob-bert-fixed-2b4d6"])
    for name in ("bert-fixed-pods-0-m7n8p", "bert-fixed-pods-1-q9r0s"):
        add("07:30:03", _unready(o[name], "07:30:03"), type_="ADDED")
        add("07:30:40", o[name])
    t5, t5_wl, t5_pod = (
        o["t5-fixed"],
        o["hyperpodpytorchjob-t5-fixed-3c5e7"],
        o["t5-fixed-pods-0-e2f3g"],
    )
    add("13:10:10", t5, type_="ADDED")
    add("13:10:11", _pending(t5_wl), type_="ADDED")
    add("13:10:12", _admitted(t5_wl, "13:10:12"))
    add("13:10:13", _unready(t5_pod, "13:10:13"), type_="ADDED")
    running = copy.deepcopy(t5_pod)
    for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
        del running["metadata"][key]
    add("13:10:40", running)
    add("13:11:58", t5_wl)
    add("13:11:58", o["hyperpodpytorchjob-t5-fixed-3c5e7.18a9c41b7e2d5f08"], type_="ADDED")
    add("13:11:59", t5_pod)
    # sweep: a Kueue elastic Job resized 2 -> 4 by a replacement slice (1.6)
    first, second = o["job-sweep-3a8c1"], o["job-sweep-5b9d2"]
    for name in ("sweep-0-x4v9k", "sweep-1-b8n2w"):
        add("10:29:59", _gated(o[name]), type_="ADDED")
        add("10:30:02", _unready(o[name], "10:30:02"))
        add("10:30:20", o[name])
    add("10:30:00", _pending(first), type_="ADDED")
    add("10:30:01", _conditions(first, lambda c: c["type"] != "Finished"))
    add("11:00:00", _pending(second), type_="ADDED")
    for name in ("sweep-2-c5t6y", "sweep-3-h1j4u"):
        add("10:59:59", _gated(o[name]), type_="ADDED")
        add("11:00:06", _unready(o[name], "11:00:06"))
        add("11:00:30", o[name])
    add("11:00:04", second)
    add("11:00:05", first)
    # a stable order: by time, then as listed (each object's versions stay in order)
    ordered = sorted(enumerate(events), key=lambda item: (at(item[1][0]), item[0]))
    out = []
    for n, (_, (when, kind, type_, obj)) in enumerate(ordered):
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(n + 1)
        out.append((at(when), kind, type_, obj))
    return out


def live(drop: tuple[str, ...] = ()) -> ClusterModel:
    """A model that watched it all: the cluster's nodes and queues listed first, then every
    version of every object as a watch event at the time it happened."""
    objects = dump_objects()
    model = ClusterModel()
    start = at("07:00:00")
    for kind in ("Node", "ClusterQueue", "LocalQueue"):
        model.replace(kind, [o for o in objects if o["kind"] == kind], start)
    for kind in ("HyperPodPyTorchJob", "Workload", "Pod", "Event"):
        if kind not in drop:
            model.replace(kind, [], start)
    for t, kind, type_, obj in timeline(objects):
        if kind not in drop:
            model.apply(kind, type_, obj, t)
    model.apply("Node", "MODIFIED", named(objects, "hyperpod-i-0a1100000000000a1"), at("13:12:00"))
    return model


MODES: dict[str, Callable[[], ClusterModel]] = {"offline": offline, "live": live}


@pytest.fixture(scope="module")
def models() -> dict[str, ClusterModel]:
    return {mode: build() for mode, build in MODES.items()}


# --- what is read ----------------------------------------------------------------------------


@dataclass
class Read:
    mode: str
    model: ClusterModel

    def job(self, name: str) -> JobState:
        job = find_job(self.model, NS, name)
        assert job is not None, name
        return job

    def events(self, name: str, direction: str = "") -> list[ScaleEvent]:
        return [e for e in self.job(name).events if not direction or e.direction == direction]

    def text(self, name: str) -> str:
        return job_text(job_view(self.model, self.job(name)))

    def workload_text(self, name: str) -> str:
        state = self.model.workload_state(NS, name)
        assert state is not None, name
        return explain_text(explained_workload(self.model, state))

    def pods(self, workload: str) -> list[str]:
        state = self.model.workload_state(NS, workload)
        assert state is not None, workload
        return sorted(p.name for p in self.model.pods_of(state.workload))


def since(event: ScaleEvent, phase: str) -> float | None:
    return event.seconds_to(phase)


def check_llama_summary(r: Read) -> None:
    assert r.job("llama-elastic").summary() == "elastic 2/4 replicas (min 2, target 2)"


def check_preempted_scale_up_was_admitted(r: Read) -> None:
    [up] = r.events("llama-elastic", "up")
    assert (up.from_replicas, up.to_replicas, up.cause) == (2, 3, "capacity_freed")
    assert not up.failed, up.failed  # never "FAILED before admitted"
    assert since(up, "admitted") == 2.0  # offline: 13:10:04 - accumulatedPastExecution 18002 s
    if r.mode == "live":
        assert up.done and since(up, "ready") == 30.0 and since(up, "restarted") == 60.0
    else:  # its pod is gone: what it reached after admission is unknown, not failed
        assert up.ended.startswith("preempted after admitted")
        assert "FAILED" not in r.text("llama-elastic")


def check_preemption_scale_down(r: Read) -> None:
    [down] = r.events("llama-elastic", "down")
    assert (down.from_replicas, down.to_replicas, down.cause) == (3, 2, "preemption")
    assert down.time == at("13:10:02")
    assert "down 3 -> 2 (preemption)" in r.text("llama-elastic")


def check_size_history_reaches_its_peak(r: Read) -> None:
    sizes = r.job("llama-elastic").sizes
    running = [n for _, n in sizes]
    assert running[-3:] == [2, 3, 2] and max(running) == 3, sizes  # live starts at 0: not Ready
    assert [t for t, _ in sizes] == sorted(t for t, _ in sizes)
    assert sizes[-1][0] >= at("13:10:02")


def check_restart_goes_to_the_scale_down(r: Read) -> None:
    [up] = r.events("llama-elastic", "up")
    [down] = r.events("llama-elastic", "down")
    assert down.phases.get("restarted") == at("13:10:50")
    assert up.phases.get("restarted") != at("13:10:50")


def check_no_phase_from_the_dump_clock(r: Read) -> None:
    for job in ("llama-elastic", "gpt-multi", "sweep"):
        for event in r.events(job, "up"):
            times = [event.phases[p] for p in PHASES if event.phases.get(p) is not None]
            assert times == sorted(times), (job, event.phases)
            if r.mode == "offline" and "scheduled" in event.phases:
                assert event.phases["scheduled"] is None  # no pod-bound time is read: unknown


def check_gpt_first_restart_unknown(r: Read) -> None:
    first, _ = r.events("gpt-multi", "up")
    assert (first.from_replicas, first.to_replicas) == (1, 2)
    assert since(first, "ready") == 25.0
    assert first.done and "restarted" in first.phases
    if r.mode == "live":
        assert since(first, "restarted") == 50.0
    else:  # the status's restart (10:00:55) is the second scale-up's; this one's is gone
        assert first.phases["restarted"] is None


def check_gpt_second_restart(r: Read) -> None:
    _, second = r.events("gpt-multi", "up")
    assert (second.from_replicas, second.to_replicas) == (2, 3)
    assert since(second, "ready") == 28.0 and since(second, "restarted") == 55.0


def check_each_workload_lists_its_own_pods(r: Read) -> None:
    assert r.pods("hyperpodpytorchjob-gpt-multi-1a2b3") == ["gpt-multi-pods-0-a1b2c"]
    assert r.pods("hyperpodpytorchjob-gpt-multi-4c5d6") == ["gpt-multi-pods-1-d3e4f"]
    assert r.pods("hyperpodpytorchjob-gpt-multi-7e8f9") == ["gpt-multi-pods-2-g5h6j"]
    body = encode_text(render(r.model, now=at("13:12:00"))).decode()
    assert (
        'topowatch_workload_gpus{namespace="hyperpod-ns-llm",'
        'workload="hyperpodpytorchjob-gpt-multi-7e8f9"' in body
    )
    for line in body.splitlines():
        if line.startswith("topowatch_workload_gpus{") and "gpt-multi" in line:
            assert line.endswith(" 8"), line


def check_no_elastic_policy_no_elastic(r: Read) -> None:
    bert = r.job("bert-fixed")
    assert bert.summary() == "not elastic (no spec.elasticPolicy): 2/2 replicas running"
    assert not bert.events
    assert "bert-fixed" not in {j["name"] for j in jobs_view(r.model)}
    assert "Part of HyperPodPyTorchJob bert-fixed: not elastic" in r.workload_text(
        "hyperpodpytorchjob-bert-fixed-2b4d6"
    )
    assert 'elastic_job="bert-fixed"' not in encode_text(render(r.model, now=at("13:12"))).decode()


def check_non_elastic_preemption_is_no_scale_event(r: Read) -> None:
    assert not r.job("t5-fixed").events
    said = r.workload_text("hyperpodpytorchjob-t5-fixed-3c5e7")
    assert "Preempted 1 time(s)" in said and "-> 0" not in said


def check_finished_slice_owns_no_pods(r: Read) -> None:
    assert r.pods("job-sweep-3a8c1") == []
    assert r.pods("job-sweep-5b9d2") == [
        "sweep-0-x4v9k",
        "sweep-1-b8n2w",
        "sweep-2-c5t6y",
        "sweep-3-h1j4u",
    ]
    assert "Placement: no pods hold GPUs" in r.workload_text("job-sweep-3a8c1")


def check_slice_scale_up(r: Read) -> None:
    [up] = r.events("sweep")
    assert (up.direction, up.from_replicas, up.to_replicas, up.cause) == ("up", 2, 4, "user_change")
    assert up.done and since(up, "admitted") == 4.0 and since(up, "ready") == 30.0
    assert since(up, "scheduled") == (6.0 if r.mode == "live" else None)


def check_slice_summary(r: Read) -> None:
    assert r.job("sweep").summary() == "elastic 4 replicas (4 admitted)"


def check_unseen_job_is_not_called_elastic(r: Read) -> None:
    """Without the HyperPodPyTorchJob objects (a dump without the kind; live, a kind not
    served), a job's elasticity is unknown, said so, and no scale event is guessed."""
    build = offline if r.mode == "offline" else live
    model = build(("HyperPodPyTorchJob",))
    why = (
        "the job object is not in the dump"
        if r.mode == "offline"
        else "its HyperPodPyTorchJob object has not been seen"
    )
    for name in ("llama-elastic", "gpt-multi", "bert-fixed", "t5-fixed"):
        job = find_job(model, NS, name)
        assert job is not None and job.elastic is None
        assert job.summary().startswith(f"unknown whether elastic: {why}"), job.summary()
        assert "does not exist" not in job.summary() and not job.events
    state = model.workload_state(NS, "hyperpodpytorchjob-llama-elastic-9d2e4")
    assert state is not None
    said = explain_text(explained_workload(model, state))
    assert f"Part of HyperPodPyTorchJob llama-elastic: unknown whether elastic: {why}" in said
    assert "elastic 2" not in said


def check_the_kind_arriving_late_judges_the_workloads(r: Read) -> None:
    """The spec seen after the Workloads (an informer that lists late): the Workloads are
    judged then, as a first list's would be."""
    if r.mode == "offline":
        model = offline(("HyperPodPyTorchJob",))
        jobs = [o for o in dump_objects() if o["kind"] == "HyperPodPyTorchJob"]
        model.replace("HyperPodPyTorchJob", jobs, at("13:12:00"))
    else:
        model = live(("HyperPodPyTorchJob",))
        for obj in dump_objects():
            if obj["kind"] == "HyperPodPyTorchJob":
                model.apply("HyperPodPyTorchJob", "ADDED", obj, at("13:12:00"))
    job = find_job(model, NS, "llama-elastic")
    assert job is not None and job.summary() == "elastic 2/4 replicas (min 2, target 2)"
    assert [(e.direction, e.from_replicas, e.to_replicas) for e in job.events] == [
        ("up", 2, 3),
        ("down", 3, 2),
    ]
    bert = find_job(model, NS, "bert-fixed")
    assert bert is not None and bert.elastic is False and not bert.events


# (fact, the rule it rests on, the check)
FACTS: list[tuple[str, str, Callable[[Read], None]]] = [
    (
        "llama-elastic reads 2 of 4 replicas at target 2",
        "1.3: targetReplicas is the operator's target; running is Ready pods",
        check_llama_summary,
    ),
    (
        "(a) the preempted scale-up was admitted, not FAILED before admitted",
        "Kueue SyncAdmittedCondition: Admitted=False is written only after Admitted=True, and "
        "accumulatedPastExecutionTimeSeconds counts the admitted time; preemption takes only "
        "Workloads holding quota",
        check_preempted_scale_up_was_admitted,
    ),
    (
        "(b) its preemption is a scale-down 3 -> 2 caused by preemption",
        "1.4: Kueue preempts one of the job's Workloads; the operator restarts smaller",
        check_preemption_scale_down,
    ),
    (
        "(b) the size history reaches its peak, 3",
        "the evicted Workload held its replicas from admission to eviction (its status says)",
        check_size_history_reaches_its_peak,
    ),
    (
        "(d) the latest restart is the restart after the scale-down",
        "1.3: lastRestartTime holds the latest restart only; 1.4: the operator restarts after "
        "each scale event",
        check_restart_goes_to_the_scale_down,
    ),
    (
        "(c) offline, no phase is timed from the dump's clock; phases never run backwards",
        "a dump records no pod-bound time here: scheduled is unknown, not the newest timestamp",
        check_no_phase_from_the_dump_clock,
    ),
    (
        "(d) gpt-multi's first scale-up: ready +25 s, its own restart not the later one",
        "1.3: lastRestartTime is the second scale-up's (a later scale event came between)",
        check_gpt_first_restart_unknown,
    ),
    (
        "gpt-multi's second scale-up: ready +28 s, restarted +55 s",
        "1.4: ready, then the operator restarts at the new world size (lastRestartTime)",
        check_gpt_second_restart,
    ),
    (
        "each Workload of an elastic job lists its own pods and GPUs",
        "Kueue's kueue.x-k8s.io/workload annotation names a pod's Workload; 1.4: one Workload "
        "per increment",
        check_each_workload_lists_its_own_pods,
    ),
    (
        "(f) no elasticPolicy, no 'elastic'",
        "1.2: spec.elasticPolicy makes a job elastic (elasticWorkloadRef only set with it)",
        check_no_elastic_policy_no_elastic,
    ),
    (
        "(g) a non-elastic preempted job has no scale event",
        "1.2: only elastic jobs scale; the preemption stays in the preemption ledger",
        check_non_elastic_preemption_is_no_scale_event,
    ),
    (
        "(e) a finished slice owns no pods; its replacement owns all four",
        "1.6: the replaced slice is Finished (WorkloadSliceReplaced), its quota released; the "
        "Job's pods run under the new slice",
        check_finished_slice_owns_no_pods,
    ),
    (
        "the slice resize is a user-change scale-up 2 -> 4, done when 4 pods are Ready",
        "1.6: a replacement slice for the Job's new parallelism; a batch Job does not restart",
        check_slice_scale_up,
    ),
    (
        "sweep reads 4 replicas, 4 admitted",
        "1.6: only the replacement slice holds quota",
        check_slice_summary,
    ),
    (
        "without the job objects: 'unknown whether elastic', never 'does not exist'",
        "a dump lists what was asked for; a kind not listed yet is not a missing job",
        check_unseen_job_is_not_called_elastic,
    ),
    (
        "the job objects arriving late judge the Workloads as a first list would",
        "informers list kinds in any order; the same objects give the same answer",
        check_the_kind_arriving_late_judges_the_workloads,
    ),
]


def test_the_dump_is_valid_for_the_crds() -> None:
    checked = 0
    for obj in dump_objects():
        if obj["apiVersion"].startswith(("kueue.x-k8s.io/", "sagemaker.amazonaws.com/")):
            assert_valid(obj)
            checked += 1
    assert checked == 15  # 1 ClusterQueue, 1 LocalQueue, 4 HyperPodPyTorchJobs, 9 Workloads


def test_the_dump_states_sixteen_facts() -> None:
    assert len(FACTS) == 16


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize(("fact", "rule", "check"), FACTS, ids=[f[0][:60] for f in FACTS])
def test_fact(
    fact: str,
    rule: str,
    check: Callable[[Read], None],
    mode: str,
    models: dict[str, ClusterModel],
) -> None:
    assert rule
    check(Read(mode, models[mode]))


def test_the_live_run_counts_the_events_it_saw(models: dict[str, ClusterModel]) -> None:
    """Live, every scale event is counted once; offline (history) none is."""
    counted = {k: v for k, v in models["live"].elastic.events_total.items() if v}
    cq = "hyperpod-ns-llm-clusterqueue"
    assert counted == {
        ("up", "capacity_freed", cq): 3,
        ("down", "preemption", cq): 1,
        ("up", "user_change", cq): 1,
    }
    assert not any(models["offline"].elastic.events_total.values())
    assert not models["live"].elastic.failures_total


# --- through the command, offline --------------------------------------------------------------


def explain(args: list[str]) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["explain", *args]) == 0
    return out.getvalue()


def test_topowatch_explain_from_the_dump() -> None:
    said = explain(["--from", str(DUMP), f"{NS}/llama-elastic"])
    assert said.splitlines()[0].endswith(": elastic 2/4 replicas (min 2, target 2)")
    assert "FAILED" not in said
    assert "up 2 -> 3 (capacity_freed): admitted +2s; preempted after admitted" in said
    assert "down 3 -> 2 (preemption): restarted +48s" in said
    assert "Note:" not in said  # every kind the explanation needs is in the dump


def _without(kinds: tuple[str, ...], tmp_path: Path) -> Path:
    doc = yaml.safe_load(DUMP.read_text())
    doc["items"] = [o for o in doc["items"] if o["kind"] not in kinds]
    path = tmp_path / "dump.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_dump_without_hyperpod_jobs_says_what_is_unknown(tmp_path: Path) -> None:
    path = _without(("HyperPodPyTorchJob",), tmp_path)
    said = explain(["--from", str(path), f"{NS}/hyperpodpytorchjob-llama-elastic-7c1f0"])
    assert (
        "Part of HyperPodPyTorchJob llama-elastic: unknown whether elastic: the job object is "
        "not in the dump (2 replicas running, 2 admitted)"
    ) in said
    assert "which does not exist" not in said
    by_job = explain(["--from", str(path), f"{NS}/llama-elastic"])
    assert "unknown whether elastic: the job object is not in the dump" in by_job


def test_a_dump_missing_whole_kinds_says_so_and_guesses_nothing(tmp_path: Path) -> None:
    path = _without(("Pod", "Event"), tmp_path)
    said = explain(["--from", str(path), f"{NS}/gpt-multi"])
    assert said.splitlines()[0].endswith(
        "elastic ?/4 replicas (running unknown: the dump holds no pods, min 1, target 3)"
    )
    assert "Note: the dump holds no pods, so where workloads run and how many replicas run" in said
    assert "Note: the dump holds no Events" in said
    workload = explain(["--from", str(path), f"{NS}/hyperpodpytorchjob-gpt-multi-1a2b3"])
    assert "Note: the dump holds no pods" in workload
    assert "Note: the dump holds no Events" in workload
