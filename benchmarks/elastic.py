"""Elastic-job figures: per-event cost with 20 % elastic workloads, idle GPU-hours against a
brute-force recount over a simulated day, explain for a job with 50 scale events.

Prints figures; never passes or fails.

    .venv/bin/python benchmarks/elastic.py [--nodes 2000] [--events 60000] [--day-events 20000]
"""

from __future__ import annotations

import argparse
import copy
import gc
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cluster_model as cm  # the cluster benchmark's synthetic cluster and event stream

from exporter.cluster.explain import job_text
from exporter.cluster.model import ClusterModel
from exporter.cluster.views.elastic import find_job, job_view
from exporter.sim import synthetic as s
from exporter.sim.synthetic import SyntheticShape
from tests.elastic_recount import recount

HP = "sagemaker.amazonaws.com/v1"
ORDER = ("ClusterQueue", "LocalQueue", "Node", "HyperPodPyTorchJob", "Workload", "Pod")


def hyperpod_job(namespace: str, name: str, low: int, high: int) -> dict[str, Any]:
    return {
        "apiVersion": HP,
        "kind": "HyperPodPyTorchJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": s.uid_for("hpjob", namespace, name),
            "generation": 1,
            "resourceVersion": "1",
            "labels": {"kueue.x-k8s.io/queue-name": f"{namespace}-localqueue"},
        },
        "spec": {
            "elasticPolicy": {"minReplicas": low, "maxReplicas": high, "replicaIncrementStep": 1},
            "replicaSpecs": [
                {
                    "name": "pods",
                    "replicas": low,
                    "template": {
                        "spec": {
                            "containers": [{"name": "p", "resources": {"requests": {s.GPU: "8"}}}]
                        }
                    },
                }
            ],
        },
        "status": {"elasticScalingStatus": {"targetReplicas": {"pods": low}}},
    }


def _own(obj: dict[str, Any], job: dict[str, Any]) -> None:
    meta = obj["metadata"]
    meta["ownerReferences"] = [
        {
            "apiVersion": HP,
            "kind": "HyperPodPyTorchJob",
            "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"],
            "controller": True,
        }
    ]


def elasticize(objects: dict[str, list[dict[str, Any]]], fraction: float) -> None:
    """Make `fraction` of the workloads the base Workloads of HyperPod elastic jobs (owned by a
    HyperPodPyTorchJob, pods owned by it too), in place."""
    rng = random.Random(3)
    jobs: list[dict[str, Any]] = []
    by_job_uid: dict[str, dict[str, Any]] = {}
    for wl in objects["Workload"]:
        if rng.random() >= fraction:
            continue
        meta = wl["metadata"]
        count = sum(p["count"] for p in wl["spec"]["podSets"])
        job = hyperpod_job(meta["namespace"], f"hp-{meta['name']}", count, count * 2)
        jobs.append(job)
        by_job_uid[meta["labels"]["kueue.x-k8s.io/job-uid"]] = job
        _own(wl, job)
    for pod in objects["Pod"]:
        ref = pod["metadata"]["ownerReferences"][0]
        job = by_job_uid.get(ref["uid"])
        if job is not None:
            _own(pod, job)
            pod["status"]["conditions"] = [
                {"type": "Ready", "status": "True", "lastTransitionTime": s.rfc3339(cm.NOW)}
            ]
    objects["HyperPodPyTorchJob"] = jobs


def sync(objects: dict[str, list[dict[str, Any]]]) -> ClusterModel:
    model = ClusterModel()
    for kind in ORDER:
        model.replace(kind, objects.get(kind, []), cm.NOW)
    return model


def event_cost(nodes: int, events: int) -> None:
    shape = SyntheticShape(nodes=nodes, workloads=nodes * 5, pods=nodes * 25)
    plain = cm.build(shape)
    elastic = copy.deepcopy(plain)
    elasticize(elastic, 0.2)
    rates: dict[str, list[float]] = {"plain": [], "elastic": []}
    models = {"plain": sync(plain), "elastic": sync(elastic)}
    streams = {
        name: cm.event_stream(objs, events)
        for name, objs in (("plain", plain), ("elastic", elastic))
    }
    gc.collect()
    gc.freeze()
    for round_ in range(3):  # interleaved, best of three: the machine is shared
        for name in ("plain", "elastic"):
            part = streams[name][round_::3]
            rates[name].append(cm.events_per_second(models[name], part))
    gc.unfreeze()
    jobs = len(elastic["HyperPodPyTorchJob"])
    best = {k: max(v) for k, v in rates.items()}
    print(
        f"watch events, {nodes} nodes, {jobs} elastic jobs (20 % of workloads): "
        f"{best['elastic']:,.0f} events/s with elastic jobs vs {best['plain']:,.0f} without "
        f"({best['elastic'] / best['plain']:.2f}x; cluster target >= 10,000 events/s)"
    )


def idle_day(events: int, nodes: int = 64) -> None:
    """A day of churn (cordons, deep health checks, pods, pending work, an elastic job); the
    service's idle GPU-seconds against rates recounted from scratch after every event."""
    rng = random.Random(11)
    start = cm.NOW
    model = ClusterModel()
    ns, cq = "hyperpod-ns-a", "hyperpod-ns-a-clusterqueue"
    for i in range(nodes):
        model.apply(
            "Node", "ADDED", s.node(f"n{i}", ("l1", f"l2-{i // 32}", f"l3-{i // 8}")), start
        )
    model.apply("ClusterQueue", "ADDED", s.cluster_queue(cq, nodes * 4), start)
    model.apply("LocalQueue", "ADDED", s.local_queue(ns, cq), start)
    job = hyperpod_job(ns, "elastic", 2, 8)
    model.apply("HyperPodPyTorchJob", "ADDED", job, start)
    base = s.workload(
        ns,
        "elastic-base",
        2,
        8,
        start,
        conditions=s.admitted_conditions(cq, start),
        cluster_queue=cq,
    )
    _own(base, job)
    model.apply("Workload", "ADDED", base, start)
    t = start
    brute = model.idle.totals(t)
    rates = recount(model)
    pods: list[str] = []
    recount_s = 0.0
    span = 86_400.0 / events
    for step in range(events):
        dt = rng.expovariate(1 / span)
        for key, gpus in rates.items():
            brute[key] = brute.get(key, 0.0) + gpus * dt
        t += dt
        i = rng.randrange(nodes)
        roll = rng.random()
        if roll < 0.15:
            node = s.node(f"n{i}", ("l1", f"l2-{i // 32}", f"l3-{i // 8}"), rv=str(step))
            node["spec"]["unschedulable"] = rng.random() < 0.2
            if rng.random() < 0.1:
                labels = node["metadata"]["labels"]
                labels["sagemaker.amazonaws.com/deep-health-check-status"] = "InProgress"
            model.apply("Node", "MODIFIED", node, t)
        elif roll < 0.55:
            name = f"p{step}"
            pod = s.pod(ns, name, f"n{i}", rng.choice([1, 2, 4, 8, 8]), "u", "j")
            if rng.random() < 0.1:  # the elastic job grows by a replica
                _own(pod, job)
                pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
            model.apply("Pod", "ADDED", pod, t)
            pods.append(name)
        elif roll < 0.9 and pods:
            gone = pods.pop(rng.randrange(len(pods)))
            model.apply("Pod", "DELETED", s.pod(ns, gone, "n0", 1, "u", "j"), t)
        else:
            message = rng.choice(
                [s.quota_message(8), 'topology "d" doesn\'t allow to fit any of 2 pod(s)', ""]
            )
            conditions = (
                [s.condition("QuotaReserved", "False", "Pending", message, t)] if message else []
            )
            wl = s.workload(
                ns, f"w{i}", rng.choice([1, 2, 4]), 8, t, conditions=conditions, rv=str(step)
            )
            model.apply("Workload", rng.choice(["ADDED", "ADDED", "DELETED"]), wl, t)
        began = time.perf_counter()
        rates = recount(model)
        recount_s += time.perf_counter() - began
    got = model.idle.totals(t)
    by_reason: dict[str, list[float]] = {}
    for key in set(got) | set(brute):
        pair = by_reason.setdefault(key[2], [0.0, 0.0])
        pair[0] += got.get(key, 0.0)
        pair[1] += brute.get(key, 0.0)
    total_got = sum(v[0] for v in by_reason.values())
    total_brute = sum(v[1] for v in by_reason.values())
    worst = max(abs(got.get(k, 0.0) - brute.get(k, 0.0)) for k in set(got) | set(brute))
    print(
        f"idle GPU-hours over a simulated day ({events:,} events, {nodes} nodes): service "
        f"{total_got / 3600:,.3f}, brute-force recount {total_brute / 3600:,.3f}, "
        f"difference {abs(total_got - total_brute) / total_brute:.2e} (target <= 1e-3); "
        f"worst (flavor, domain, reason) cell off by {worst:.2e} GPU-s"
    )
    print(
        "  by reason (GPU-hours): "
        + ", ".join(f"{r} {v[0] / 3600:,.1f}" for r, v in sorted(by_reason.items()))
    )
    print(f"  recount cost {recount_s / events * 1e3:.2f} ms per event (the service: none)")


def explain_with_scale_events(samples: int = 500) -> None:
    start = cm.NOW
    ns, cq = "hyperpod-ns-a", "hyperpod-ns-a-clusterqueue"
    model = ClusterModel()
    for i in range(16):
        model.apply("Node", "ADDED", s.node(f"n{i}", ("l1", "l2", f"l3-{i // 8}")), start)
    job = hyperpod_job(ns, "llama", 2, 16)
    model.apply("HyperPodPyTorchJob", "ADDED", job, start)
    base = s.workload(
        ns, "llama-base", 2, 8, start, conditions=s.admitted_conditions(cq, start), cluster_queue=cq
    )
    _own(base, job)
    model.apply("Workload", "ADDED", base, start)
    t = start
    for k in range(25):  # 25 scale-ups, each preempted: 50 scale events
        t += 600
        wl = s.workload(
            ns,
            f"llama-up{k}",
            1,
            8,
            t,
            conditions=s.admitted_conditions(cq, t + 5),
            cluster_queue=cq,
        )
        _own(wl, job)
        model.apply("Workload", "ADDED", wl, t + 5)
        evicted = copy.deepcopy(wl)
        evicted["metadata"]["resourceVersion"] = "2"
        evicted["status"]["conditions"].append(
            s.condition("Evicted", "True", "Preempted", "Preempted", t + 300)
        )
        model.apply("Workload", "MODIFIED", evicted, t + 300)
        model.apply("Workload", "DELETED", evicted, t + 310)
    found = find_job(model, ns, "llama")
    assert found is not None
    times = []
    for _ in range(samples):
        began = time.perf_counter()
        job_text(job_view(model, found))
        times.append(time.perf_counter() - began)
    times.sort()
    print(
        f"explain NS/JOB with {len(found.events)} scale events: p50 "
        f"{statistics.median(times) * 1e3:.2f} ms, p99 {times[int(samples * 0.99)] * 1e3:.2f} ms "
        "(target p99 <= 10 ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--day-events", type=int, default=20_000)
    args = parser.parse_args()
    explain_with_scale_events()
    idle_day(args.day_events)
    event_cost(args.nodes, args.events)


if __name__ == "__main__":
    main()
