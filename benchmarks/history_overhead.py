"""What durable history costs the model's event path: per-event cost with persistence on vs off.

The issue's load: 2,000 nodes, 10,000 workloads (50,000 pods), and every second 50 preemptions
(each a victim's Evicted+Preempted conditions and Kueue's Preempted Event) and 500 timeline
changes (450 pending workloads re-stamped QuotaReserved=False, 50 admitted workloads finishing).
The stream is applied to a freshly synced model, paced in real time (ten slices a second),
each event under the service lock as ClusterService.apply does, with persistence switched on and
off every other second (so both halves share the model's growth and the machine's other load):
  off: no history hooks at all;
  on:  the HistoryFeed attached, its pump every second (HISTORY_FLUSH_S) under the same lock,
       the HistoryWriter writing to a real SQLite file (or --database-url) in its thread.

Figures: the event thread's CPU time per event (the model's per-event cost; waiting for the lock
or the GIL is not CPU), the wall time per event including such waits, how long each pump held
the lock, and the rows written. Prints figures; never passes or fails.

    .venv/bin/python benchmarks/history_overhead.py [--seconds 20] [--database-url URL]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cluster_model import NOW, build, sync
from exporter.cluster.history.feed import HistoryFeed, open_history
from exporter.cluster.model import ClusterModel
from exporter.sim import synthetic as s
from exporter.sim.synthetic import SyntheticShape

Event = tuple[str, str, dict[str, Any]]
SLICES = 10  # per second


def _conditions(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list(obj.get("status", {}).get("conditions", []))


def _is(obj: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in _conditions(obj))


def traffic(
    objects: dict[str, list[dict[str, Any]]],
    seconds: int,
    preemptions: int,
    changes: int,
    seed: int = 3,
) -> list[list[Event]]:
    """Per second, the events of `preemptions` preemptions and `changes` timeline changes.

    A 2,000-node cluster runs only a few hundred big jobs, too few to preempt 50 a second for
    long, so the victims (and the jobs that finish) are small jobs submitted along the way:
    each second `preemptions` victims and as many finishers are created admitted (a "created"
    and an "admitted" step each) and preempted or finished a second later; the rest of the
    timeline changes re-stamp pending workloads' QuotaReserved=False."""
    rng = random.Random(seed)
    workloads = objects["Workload"]
    nodes = [n["metadata"]["name"] for n in objects["Node"]]
    pending = [w for w in workloads if not _is(w, "QuotaReserved") and not _is(w, "Finished")]
    rv = itertools.count(50_000_000)
    restamps = max(0, changes - 3 * preemptions)

    def updated(obj: dict[str, Any], conditions: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            **obj,
            "metadata": {**obj["metadata"], "resourceVersion": str(next(rv))},
            "status": {**obj["status"], "conditions": conditions},
        }

    def submitted(name: str, t: float) -> dict[str, Any]:
        ns = f"hyperpod-ns-{rng.choice('abcd')}"
        cq = f"{ns}-clusterqueue"
        made = s.workload(
            ns,
            name,
            1,
            1,
            t - 2,
            priority=10,
            conditions=s.admitted_conditions(cq, t - 1),
            cluster_queue=cq,
            assignment=[((rng.choice(nodes),), 1)],
        )
        return updated(made, _conditions(made))

    out: list[list[Event]] = []
    victims: list[dict[str, Any]] = []
    finishers: list[dict[str, Any]] = []
    for sec in range(seconds):
        t = NOW + 60 + sec
        events: list[Event] = []
        for v in victims:
            u = rng.choice(pending)
            umeta, vmeta = u["metadata"], v["metadata"]
            text = s.preemption_message_by(
                u,
                f"/{umeta['namespace']}-clusterqueue",
                f"/{vmeta['namespace']}-clusterqueue",
                "reclamation within the cohort",
            )
            evicted = [*_conditions(v), *s.preempted_conditions(text, "InCohortReclamation", t)]
            notice = s.preemption_event(vmeta["namespace"], vmeta["name"], text, t)
            events += [("Workload", "MODIFIED", updated(v, evicted)), ("Event", "ADDED", notice)]
        for w in finishers:
            done = [*_conditions(w), s.condition("Finished", "True", "Succeeded", "done", t)]
            events.append(("Workload", "MODIFIED", updated(w, done)))
        victims = [submitted(f"victim-{sec}-{i}", t) for i in range(preemptions)]
        finishers = [submitted(f"short-{sec}-{i}", t) for i in range(preemptions)]
        events += [("Workload", "ADDED", w) for w in victims + finishers]
        for i in range(restamps):
            w = rng.choice(pending)
            message = f"couldn't assign flavors (try {sec}.{i})"
            waiting = s.condition("QuotaReserved", "False", "Pending", message, t + i / 1e4)
            events.append(("Workload", "MODIFIED", updated(w, [waiting])))
        rng.shuffle(events)
        out.append(events)
    return out


def run(model: ClusterModel, stream: list[list[Event]], feed: HistoryFeed) -> dict[str, float]:
    """Apply `stream` second by second, persistence on in odd seconds and off in even ones,
    so both halves see the same model, the same traffic and the same background load."""
    lock = threading.Lock()
    stop = threading.Event()
    on = threading.Event()
    holds: list[float] = []

    def pump() -> None:
        while not stop.wait(1.0):
            if on.is_set():
                t = time.perf_counter()
                feed.pump(lock)
                holds.append(time.perf_counter() - t)

    feed.writer.start()
    threading.Thread(target=pump, daemon=True).start()
    cpu = {True: 0.0, False: 0.0}
    wall = {True: 0.0, False: 0.0}
    count = {True: 0, False: 0}
    started = time.perf_counter()
    for sec, events in enumerate(stream):
        persist = sec % 2 == 1
        with lock:
            if persist:
                feed.attach(model)
                on.set()
            else:  # detached: the event path is exactly the one without history
                model.ledger.on_change = model.on_workload_ended = model.elastic.on_event = None
                on.clear()
        now = NOW + 60 + sec
        size = -(-len(events) // SLICES)
        for part in range(SLICES):
            if (left := started + sec + part / SLICES - time.perf_counter()) > 0:
                time.sleep(left)
            for kind, event_type, obj in events[part * size : (part + 1) * size]:
                c, w = time.thread_time(), time.perf_counter()
                with lock:
                    model.apply(kind, event_type, obj, now)
                cpu[persist] += time.thread_time() - c
                wall[persist] += time.perf_counter() - w
                count[persist] += 1
    stop.set()
    feed.pump(lock)
    feed.writer.flush(60.0)
    feed.writer.stop()
    feed.store.close()
    return {
        "on_cpu_us": cpu[True] / count[True] * 1e6,
        "off_cpu_us": cpu[False] / count[False] * 1e6,
        "on_wall_us": wall[True] / count[True] * 1e6,
        "off_wall_us": wall[False] / count[False] * 1e6,
        "rows": sum(feed.writer.written.values()),
        "dropped": feed.writer.dropped,
        "pump_ms_median": statistics.median(holds) * 1e3 if holds else 0.0,
        "pump_ms_max": max(holds) * 1e3 if holds else 0.0,
    }


def fresh(objects: dict[str, list[dict[str, Any]]]) -> ClusterModel:
    gc.unfreeze()
    model, _ = sync(objects)
    model.replace("Event", [], NOW)
    gc.collect()
    gc.freeze()  # as the service does once synced
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--workloads", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=40)
    parser.add_argument("--preemptions", type=int, default=50)
    parser.add_argument("--changes", type=int, default=500)
    parser.add_argument("--database-url", default=None, help="default: a temporary SQLite file")
    args = parser.parse_args()
    objects = build(
        SyntheticShape(nodes=args.nodes, workloads=args.workloads, pods=args.workloads * 5)
    )
    stream = traffic(objects, args.seconds, args.preemptions, args.changes)
    total = sum(map(len, stream))
    print(
        f"{args.nodes:,} nodes, {args.workloads:,} workloads; {args.seconds} s of"
        f" {args.preemptions} preemptions + {args.changes} timeline changes a second"
        f" ({total:,} events)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{tmp}/history.db"
        f = run(fresh(objects), stream, open_history(url, "bench"))
    ratio = f["on_cpu_us"] / f["off_cpu_us"]
    print(
        f"  off: {f['off_cpu_us']:6.1f} µs CPU/event, {f['off_wall_us']:6.1f} µs wall/event\n"
        f"  on:  {f['on_cpu_us']:6.1f} µs CPU/event, {f['on_wall_us']:6.1f} µs wall/event;"
        f" {f['rows']:,.0f} rows written, {f['dropped']:,.0f} dropped; the pump held the lock"
        f" {f['pump_ms_median']:.1f} ms median, {f['pump_ms_max']:.1f} ms max a second\n"
        f"per-event cost, persistence on / off: {ratio:.3f} (CPU),"
        f" {f['on_wall_us'] / f['off_wall_us']:.3f} (wall, lock waits included);"
        f" within 10 %: {'yes' if ratio <= 1.10 else 'no'}"
    )


if __name__ == "__main__":
    main()
