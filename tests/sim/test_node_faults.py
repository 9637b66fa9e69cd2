"""Simulated node faults: Meta's rates and mix, HyperPod's repair, the operator's auto-resume,
and the ground truth they leave."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from exporter.sim.cluster import ClusterShape, SimulatedCluster
from exporter.sim.kubeapi.store import ObjectStore
from exporter.sim.node_faults import (
    META_MIX,
    META_RATE_PER_1000_NODE_DAYS,
    FaultDraw,
    FaultRates,
)

START = 1_795_000_000.0


def test_meta_rate_and_mix() -> None:
    assert round(META_RATE_PER_1000_NODE_DAYS, 2) == 3.79
    assert sum(k.share for k in META_MIX) == pytest.approx(1.0)
    shares = {k.name: k.share for k in META_MIX}
    assert (shares["faulty_gpu"], shares["gpu_hbm"], shares["software"]) == (0.30, 0.17, 0.13)
    draw = FaultDraw(FaultRates(scale=1000.0, remediation_per_1000_node_days=0.0), seed=1)
    nodes = [f"n{i}" for i in range(100)]
    seen: Counter[str] = Counter()
    for _ in range(2000):  # 100 nodes x 2000 steps of 10 minutes: ~13,900 node-days
        seen.update(kind.name for _, kind in draw.faults(nodes, 600.0))
    days = 100 * 2000 * 600 / 86_400
    rate = sum(seen.values()) / days * 1000 / 1000.0  # per 1,000 node-days, unscaled
    assert rate == pytest.approx(META_RATE_PER_1000_NODE_DAYS, rel=0.05)
    total = sum(seen.values())
    for kind in META_MIX:
        assert seen[kind.name] / total == pytest.approx(kind.share, abs=0.025), kind.name


def store_objects(store: ObjectStore, plural: str) -> list[dict[str, object]]:
    _, entries, _ = store.open_watch(plural, None, 0.0)
    return [json.loads(e.encoded(store.resource(plural).version)) for e in entries]


def test_a_faulty_gpu_stops_its_job_and_the_operator_resumes_it_after_the_replacement() -> None:
    store = ObjectStore(clock=lambda: START)
    shape = ClusterShape(p5_nodes=4, ultraserver_nodes=0, teams=("llm",), arrivals_per_minute=0,
                         initial_workloads=0)  # fmt: skip
    sim = SimulatedCluster(store, shape, start=START, elastic=False, faults=FaultRates(scale=0))
    name = sim.submit("llm", "train", 8, 2, "training-priority", runtime_s=3600.0)
    sim.step(START + 10)
    pods = [p for p in store_objects(store, "pods") if p["metadata"]["name"].startswith("train")]
    node = pods[0]["spec"]["nodeName"]
    sim.inject_node_fault(node, "faulty_gpu")
    truth = sim.truth
    assert truth is not None
    (stop,) = truth.interruptions
    assert (stop.cause, stop.component, stop.node) == ("node_fault", "gpu", node)
    assert not [
        p for p in store_objects(store, "pods") if p["metadata"]["name"].startswith("train")
    ]
    t = START + 10
    back = None
    while t < START + 3 * 3600:
        t += 30
        sim.step(t)
        nodes = {n["metadata"]["name"]: n for n in store_objects(store, "nodes")}
        meta = nodes[node]["metadata"]
        healthy = meta["labels"]["sagemaker.amazonaws.com/node-health-status"] == "Schedulable"
        cleared = json.loads(meta["annotations"]["topowatch.io/findings"]) == []
        if back is None and healthy and cleared:
            back = t
        ready = [
            p
            for p in store_objects(store, "pods")
            if p["metadata"]["name"].startswith("train") and p["status"]["phase"] == "Running"
        ]
        if len(ready) == 2:
            break
    assert back is not None and t > back  # resumed once its node was back, then started
    job = truth.jobs[("hyperpod-ns-llm", "Job", "train")]
    assert job.running_since == t and job.running_s == 0.0  # it ran 0 s before the fault
    assert sim.has_workload(f"hyperpod-ns-llm/{name}")
