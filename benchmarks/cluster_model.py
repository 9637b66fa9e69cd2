"""Cluster model figures: initial sync, watch events/s, /metrics render, explain, RSS, scaling.

Synthetic cluster of 2,000 p5 nodes (16,000 GPUs), 10,000 workloads, 50,000 pods, fed through
the ClusterModel exactly as the informers deliver it (plain dicts). Prints figures; never
passes or fails. The side-by-side baseline is the obvious design the issue rules out: recount
every domain from every pod on each event. The goodput ledger (issue 29) is weighed against the
model alone on the same stream: the per-event cost it adds, beside its floor (`LedgerFloor`).

    .venv/bin/python benchmarks/cluster_model.py [--nodes 2000] [--workloads 10000] [--pods 50000]
"""

from __future__ import annotations

import argparse
import copy
import gc
import random
import resource
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporter.cluster.explain import explain_text
from exporter.cluster.goodput import GoodputBook
from exporter.cluster.goodput.evidence import NodeFacts, node_facts
from exporter.cluster.goodput.gpu_seconds import HELD, GpuSecondLedger, GpuSecondTotals
from exporter.cluster.metrics import render as metrics
from exporter.cluster.model import ClusterModel, is_live
from exporter.cluster.objects import ObjectKey
from exporter.cluster.views.workloads import workload_view
from exporter.core.exposition import encode_text
from exporter.sim.synthetic import SyntheticShape, synthetic_cluster
from exporter.topology.tree import Placement

NOW = 1_795_100_000.0
ORDER = ("ClusterQueue", "LocalQueue", "Node", "Workload", "Pod")


def build(shape: SyntheticShape) -> dict[str, list[dict[str, Any]]]:
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for kind, obj in synthetic_cluster(shape):
        by_kind[kind].append(obj)
    return by_kind


def sync(objects: dict[str, list[dict[str, Any]]]) -> tuple[ClusterModel, float]:
    model = ClusterModel()
    t = time.perf_counter()
    for kind in ORDER:
        model.replace(kind, objects[kind], NOW)
    return model, time.perf_counter() - t


def event_stream(
    objects: dict[str, list[dict[str, Any]]], n: int, seed: int = 1
) -> list[tuple[str, str, dict[str, Any]]]:
    """A watch-like mix: pods rebinding/finishing (70 %), workload status updates (20 %),
    node label/health updates (10 %), each with a fresh resourceVersion."""
    rng = random.Random(seed)
    pods = [p for p in objects["Pod"] if p["status"]["phase"] == "Running"]
    nodes = objects["Node"]
    workloads = objects["Workload"]
    out: list[tuple[str, str, dict[str, Any]]] = []
    for i in range(n):
        roll = rng.random()
        rv = str(10_000_000 + i)
        if roll < 0.7:
            obj = copy.copy(rng.choice(pods))
            obj["metadata"] = {**obj["metadata"], "resourceVersion": rv}
            obj["spec"] = {**obj["spec"], "nodeName": rng.choice(nodes)["metadata"]["name"]}
            out.append(("Pod", "MODIFIED", obj))
        elif roll < 0.9:
            obj = copy.copy(rng.choice(workloads))
            obj["metadata"] = {**obj["metadata"], "resourceVersion": rv}
            out.append(("Workload", "MODIFIED", obj))
        else:
            obj = copy.deepcopy(rng.choice(nodes))
            obj["metadata"]["resourceVersion"] = rv
            health = rng.choice(("Schedulable", "UnschedulablePendingReboot"))
            obj["metadata"]["labels"]["sagemaker.amazonaws.com/node-health-status"] = health
            out.append(("Node", "MODIFIED", obj))
    return out


def events_per_second(model: ClusterModel, stream: list[tuple[str, str, dict[str, Any]]]) -> float:
    t = time.perf_counter()
    for kind, event_type, obj in stream:
        model.apply(kind, event_type, obj, NOW)
    return len(stream) / (time.perf_counter() - t)


def naive_recount_per_event(model: ClusterModel, events: int) -> float:
    """The baseline: recount free GPUs of every domain from every pod, once per event."""
    placements = {name: Placement.from_labels(dict(n.labels)) for name, n in model.nodes.items()}
    t = time.perf_counter()
    for _ in range(events):
        used: dict[tuple[str, str], int] = defaultdict(int)
        for pod in model.pods.values():
            if pod.holds_gpus and pod.node in placements:
                place = placements[pod.node]
                for level in (
                    "network-node-layer-1",
                    "network-node-layer-2",
                    "network-node-layer-3",
                ):
                    used[(level, place.domain_at(level) or "")] += pod.gpus
    return (time.perf_counter() - t) / events


def render_seconds(model: ClusterModel, repeats: int = 5) -> tuple[float, int]:
    times = []
    body = b""
    for _ in range(repeats):
        t = time.perf_counter()
        body = encode_text(metrics.render(model))
        times.append(time.perf_counter() - t)
    return statistics.median(times), len(body)


def with_resource_flavor(model: ClusterModel) -> ClusterModel:
    """The synthetic cluster's queues name flavor ml.p5.48xlarge; the ResourceFlavor object
    makes /metrics count capacity per flavor over the nodes it selects (the `flavor` label)."""
    flavor = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "ml.p5.48xlarge", "resourceVersion": "1"},
        "spec": {"nodeLabels": {"node.kubernetes.io/instance-type": "ml.p5.48xlarge"}},
    }
    model.apply("ResourceFlavor", "ADDED", flavor, NOW)
    return model


def explain_seconds(model: ClusterModel, samples: int = 300) -> tuple[float, float]:
    rng = random.Random(2)
    states = list(model.workloads.values())
    live = [s for s in states if is_live(s.workload)]
    times = []
    for _ in range(samples):
        state = rng.choice(live if rng.random() < 0.7 else states)
        state.locality_cache = None  # measure the cold path: as if the pods just changed
        t = time.perf_counter()
        explain_text(workload_view(model, state))
        times.append(time.perf_counter() - t)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99)]


class LedgerFloor:
    """For scale, not a ledger: the least an observer keeping an exact GPU-second ledger adds
    per event of this stream. On a Pod event it finds the pod's own record and, where the
    pod's node moved, moves its GPUs between the two nodes (`GpuSecondLedger.transfer`: held
    cells, capacity, idle count). On a Node event it reads what decides where the node's free
    GPUs count (`node_facts`: HyperPod's health label flips in this stream, moving them between
    idle and unavailable) and tells the ledger (`set_node`, a regroup when the category moved).
    Workload events move nothing it counts. No jobs, phases, interruptions, categories by team
    or node events: what `GoodputBook` does beyond this is the rest of issue 29. `agrees`
    checks that its ledger is the book's, summed over teams."""

    SLOT: Final = ("team", "running")

    def __init__(self, model: ClusterModel, nodes: list[dict[str, Any]]) -> None:
        """Told the model's pods, and `nodes` as listed (the raw objects the model synced)."""
        self.model = model
        self.pods = model.pods
        self.facts: dict[tuple[str, str], list[Any]] = {}
        self.nodes: dict[str, NodeFacts] = {}
        self.ledger = GpuSecondLedger()
        for obj in nodes:
            self.observe("Node", "ADDED", obj, obj["metadata"]["name"], NOW)
        for key in model.pods:
            self.observe("Pod", "ADDED", {}, key, NOW)
        model.observer = self

    def observe(
        self, kind: str, event_type: str, obj: Mapping[str, Any], key: ObjectKey, now: float
    ) -> None:
        if type(key) is tuple:
            if kind != "Pod":
                return
            pod = self.pods.get(key)
            if pod is None:
                return
            fact = self.facts.get(key)
            if fact is None:
                gpus = pod.gpus if pod.holds_gpus else 0  # as the book counts a pod's GPUs
                self.facts[key] = [pod.node, gpus]
                if gpus:
                    self.ledger.move(pod.node, None, self.SLOT, gpus, now)
            elif fact[0] != pod.node:
                self.ledger.transfer(fact[0], pod.node, self.SLOT, fact[1], round(now * 1000))
                fact[0] = pod.node
        elif kind == "Node" and type(key) is str:
            node = self.model.nodes.get(key)
            if node is None:
                return
            before = self.nodes.get(key)
            facts = node_facts(obj, node, before)
            if facts is before:
                return
            self.nodes[key] = facts
            placement = self.model.tree.placement(key)  # placed as the book places them
            domain = placement.layers[-1] if placement is not None and placement.layers else ""
            flavor = self.model.node_flavor(key)
            why = facts.unavailable()
            self.ledger.set_node(key, flavor, domain, node.allocatable_gpus, why, now)

    def agrees(self, book: GoodputBook, now: float) -> bool:
        """Whether its GPU-milliseconds are the book's per (flavor, domain, category), held
        ones summed over teams and categories (it keeps one slot)."""

        def summed(totals: GpuSecondTotals) -> dict[tuple[str, str, str], int]:
            out: dict[tuple[str, str, str], int] = defaultdict(int)
            for (flavor, domain, _, category), value in totals.parts.items():
                out[(flavor, domain, "held" if category in HELD else category)] += value
            return {k: v for k, v in out.items() if v}

        return summed(self.ledger.totals(now)) == summed(book.gpu_seconds(now))


def goodput_overhead(
    objects: dict[str, list[dict[str, Any]]],
    events: int = 30_000,
    chunk: int = 250,
    spacing_ms: int = 0,
) -> tuple[dict[str, tuple[float, float]], bool]:
    """Per event, the model alone ("model"), with the goodput ledger attached ("book",
    `GoodputBook`, issue 29), and with `LedgerFloor` ("floor"), in one run: three models fed
    the same objects kind by kind, then the same stream in chunks, each chunk through all
    three in rotating order, on the CPU clock. The stream's events are `spacing_ms` apart (0:
    all at one moment, as above); the book's totals are read once at the end, and counted.
    For each: (seconds per event over the whole stream, the median of its per-chunk ratio to
    the model alone). The median is the steadier figure on a shared machine: a neighbour's
    burst lands in a few chunks, not in the middle of the distribution. Also whether the floor's
    ledger came out as the book's (`LedgerFloor.agrees`): a floor that counted less would not
    be one."""
    models = {name: ClusterModel() for name in ("model", "book", "floor")}
    book = GoodputBook()
    book.attach(models["book"])
    for model in models.values():
        for kind in ORDER:
            model.replace(kind, objects[kind], NOW)
    floor = LedgerFloor(models["floor"], objects["Node"])
    stream = event_stream(objects, events, seed=3)
    gc.collect()
    gc.freeze()
    spent: dict[str, list[float]] = {name: [] for name in models}
    names = list(models)
    for i, start in enumerate(range(0, events, chunk)):
        part = stream[start : start + chunk]
        for name in names[i % 3 :] + names[: i % 3]:
            model = models[name]
            t = time.process_time()
            for j, (kind, event_type, obj) in enumerate(part, start):
                model.apply(kind, event_type, obj, NOW + j * spacing_ms / 1000)
            spent[name].append(time.process_time() - t)
    end = NOW + events * spacing_ms / 1000
    t = time.process_time()
    book.gpu_seconds(end)
    spent["book"][-1] += time.process_time() - t
    gc.unfreeze()
    base = spent["model"]
    costs = {
        name: (
            sum(times) / events,
            statistics.median(a / b for a, b in zip(times, base, strict=True) if b > 0),
        )
        for name, times in spent.items()
    }
    return costs, floor.agrees(book, end)


def per_event_cost(sizes: tuple[int, ...], events: int = 30_000, rounds: int = 3) -> list[float]:
    """Seconds per event at each cluster size, on the CPU clock: every model built first, then
    measured in alternation for `rounds` rounds (a neighbour's burst then hits every size
    alike), the median round kept per size."""
    runs = []
    for nodes in sizes:
        shape = SyntheticShape(nodes=nodes, workloads=nodes * 5, pods=nodes * 25)
        objects = build(shape)
        model, _ = sync(objects)
        runs.append((model, event_stream(objects, events)))
    gc.collect()
    gc.freeze()  # as the service does once synced (exporter.cluster.run)
    costs: list[list[float]] = [[] for _ in sizes]
    for r in range(rounds):
        for i, (model, stream) in enumerate(runs):
            part = stream[r::rounds]
            t = time.process_time()
            for kind, event_type, obj in part:
                model.apply(kind, event_type, obj, NOW)
            costs[i].append((time.process_time() - t) / len(part))
    gc.unfreeze()
    return [statistics.median(c) for c in costs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--workloads", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=50_000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--skip-scaling", action="store_true")
    args = parser.parse_args()

    shape = SyntheticShape(nodes=args.nodes, workloads=args.workloads, pods=args.pods)
    objects = build(shape)
    counts = {k: len(v) for k, v in objects.items()}
    print(f"synthetic cluster: {counts}, {args.nodes * shape.gpus_per_node} GPUs")
    model, seconds = sync(objects)
    print(f"initial sync through the model: {seconds:.2f} s  (target <= 10 s)")
    gc.collect()
    gc.freeze()
    stream = event_stream(objects, args.events)
    rate = events_per_second(model, stream)
    print(f"watch events applied: {rate:,.0f} events/s  (target >= 10,000)")
    naive = naive_recount_per_event(model, 20)
    print(
        f"baseline, recount every domain per event: {1 / naive:,.0f} events/s "
        f"-> incremental is {rate * naive:,.0f}x faster"
    )
    render, size = render_seconds(model)
    print(
        f"/metrics render+encode: {render * 1000:.0f} ms, {size / 1024:.0f} KiB  (target <= 250 ms)"
    )
    p50, p99 = explain_seconds(model)
    print(
        f"explain (view + text, cold locality): p50 {p50 * 1000:.2f} ms, "
        f"p99 {p99 * 1000:.2f} ms  (target <= 10 ms)"
    )
    flavored, flavored_size = render_seconds(with_resource_flavor(model))
    print(
        f"/metrics render+encode, capacity per ResourceFlavor: {flavored * 1000:.0f} ms, "
        f"{flavored_size / 1024:.0f} KiB  (target <= 250 ms)"
    )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process (objects + model): {rss:.0f} MiB  (target <= 1024 MiB)")
    del model
    gc.collect()
    for spacing in (0, 1):
        costs, agrees = goodput_overhead(objects, spacing_ms=spacing)
        when = "the stream above, one moment" if spacing == 0 else "each event 1 ms after the last"
        print(
            "the floor's GPU-seconds by flavor, domain and category "
            + ("are the book's" if agrees else "DIFFER from the book's: the floor is wrong")
        )
        alone = costs["model"][0]
        for name, what in (
            ("book", "goodput ledger attached"),
            ("floor", "its floor (LedgerFloor)"),
        ):
            each, median = costs[name]
            print(
                f"{what}: {(median - 1) * 100:+.0f} % per event, median of chunks "
                f"({(each / alone - 1) * 100:+.0f} % over the stream, {alone * 1e6:.1f} -> "
                f"{each * 1e6:.1f} us; {when})" + ("  (target <= +10 %)" if name == "book" else "")
            )
    if not args.skip_scaling:
        small, large = per_event_cost((500, 8000))
        print(
            f"cost per event: {small * 1e6:.1f} us at 500 nodes, {large * 1e6:.1f} us at 8,000 "
            f"nodes -> ratio {large / small:.2f}  (target <= 1.5)"
        )


if __name__ == "__main__":
    main()
