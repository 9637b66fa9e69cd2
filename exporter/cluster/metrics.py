"""The cluster service's /metrics: model state rendered into metric families, cardinality capped.

Per-workload series exist only for live (admitted, unfinished) workloads, the largest first, up
to `workload_cap`; the number left out is exported so a dashboard can say so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from exporter.cluster.analysis import lent_by_queue
from exporter.cluster.model import ClusterModel
from exporter.exposition import COUNTER, GAUGE, HISTOGRAM, Family
from exporter.topology.tree import LEVELS

DOMAIN_STATES = ("allocatable", "used", "free", "unschedulable")
HYPERPOD_QUEUE_PREFIX = "hyperpod-ns-"
HYPERPOD_QUEUE_SUFFIX = "-clusterqueue"


def team_of(cluster_queue: str) -> str:
    """HyperPod names a team's queue hyperpod-ns-<team>-clusterqueue; other queues are teams."""
    if cluster_queue.startswith(HYPERPOD_QUEUE_PREFIX) and cluster_queue.endswith(
        HYPERPOD_QUEUE_SUFFIX
    ):
        return cluster_queue[len(HYPERPOD_QUEUE_PREFIX) : -len(HYPERPOD_QUEUE_SUFFIX)]
    return cluster_queue


def render(model: ClusterModel, workload_cap: int = 2000) -> list[Family]:
    return [
        *_topology_families(model),
        *_workload_families(model, workload_cap),
        *_preemption_families(model),
        *_queue_families(model),
        *_model_families(model),
    ]


def _levels(model: ClusterModel) -> list[str]:
    present = set(model.tree.levels_present())
    return [lvl for lvl in (*LEVELS, "ultraserver") if lvl in present]


def _topology_families(model: ClusterModel) -> Iterable[Family]:
    gpus = Family(
        "topowatch_cluster_domain_gpus",
        GAUGE,
        "GPUs in each topology domain by state (free counts schedulable nodes only).",
    )
    free = Family("topowatch_cluster_free_gpus", GAUGE, "Free GPUs at each topology level.")
    largest = Family(
        "topowatch_cluster_largest_free_block_gpus",
        GAUGE,
        "Free GPUs in the single domain with the most free GPUs, per level.",
    )
    frag = Family(
        "topowatch_cluster_fragmentation_ratio",
        GAUGE,
        "1 - largest free block / free GPUs, per level: 0 when all free GPUs sit in one domain.",
    )
    domains = Family("topowatch_cluster_domains", GAUGE, "Topology domains per level.")
    for level in _levels(model):
        for usage in model.tree.domains(level):
            values = (usage.allocatable, usage.used, usage.free, usage.unschedulable)
            for state, value in zip(DOMAIN_STATES, values, strict=True):
                gpus.add([("level", level), ("domain", usage.domain), ("state", state)], value)
        summary = model.tree.fragmentation(level)
        labels = [("level", level)]
        free.add(labels, summary.free)
        largest.add(labels, summary.largest_free)
        frag.add(labels, summary.ratio)
        domains.add(labels, summary.domains)
    return [gpus, free, largest, frag, domains]


def _workload_families(model: ClusterModel, cap: int) -> Iterable[Family]:
    spanned = Family(
        "topowatch_workload_domains",
        GAUGE,
        "Distinct topology domains a live workload's pods span, per level.",
    )
    hops = Family(
        "topowatch_workload_worst_pair_hops",
        GAUGE,
        "Largest network hop distance between two of a live workload's nodes.",
    )
    met = Family(
        "topowatch_workload_topology_satisfied",
        GAUGE,
        "1 when a live workload's pods sit in one domain of the level it asked for.",
    )
    gpus = Family("topowatch_workload_gpus", GAUGE, "GPUs held by a live workload's pods.")
    capped = Family(
        "topowatch_cluster_workload_series_dropped",
        GAUGE,
        "Live workloads left without per-workload series by the cardinality cap.",
    )
    live = model.live()
    live.sort(key=lambda s: (-s.workload.gpus_requested, s.workload.namespace, s.workload.name))
    for state in live[:cap]:
        wl = state.workload
        loc = model.locality_of(state)
        base = [
            ("namespace", wl.namespace),
            ("workload", wl.name),
            ("cluster_queue", model.cluster_queue_of(wl)),
        ]
        for level, count in loc.domains.items():
            spanned.add([*base, ("level", level)], count)
        if loc.worst_pair_hops is not None:
            hops.add(base, loc.worst_pair_hops)
        if loc.topology_met is not None and loc.topology_level is not None:
            met.add(
                [*base, ("mode", loc.topology_mode), ("level", loc.topology_level)],
                loc.topology_met,
            )
        gpus.add(base, sum(p.gpus for p in model.pods_of(wl) if p.holds_gpus))
    capped.add([], max(0, len(live) - cap))
    return [spanned, hops, met, gpus, capped]


def _preemption_families(model: ClusterModel) -> Iterable[Family]:
    total = Family(
        "topowatch_preemptions",
        COUNTER,
        "Preemptions seen, by victim queue, preempting queue, Kueue reason and cause "
        "(quota, topology, or unknown when seen too late to judge).",
    )
    for (victim_cq, preemptor_cq, reason, cause), count in sorted(model.preemption_counts.items()):
        total.add(
            [
                ("cluster_queue", victim_cq),
                ("preempting_cluster_queue", preemptor_cq),
                ("reason", reason),
                ("cause", cause),
            ],
            count,
        )
    entries = Family("topowatch_preemption_ledger_entries", GAUGE, "Entries in the ledger.")
    entries.add([], len(model.ledger))
    dropped = Family(
        "topowatch_preemption_ledger_dropped",
        COUNTER,
        "Oldest ledger entries dropped to stay within capacity.",
    )
    dropped.add([], model.ledger.dropped)
    return [total, entries, dropped]


def _queue_families(model: ClusterModel) -> Iterable[Family]:
    pending = Family(
        "topowatch_pending_workloads",
        GAUGE,
        "Workloads waiting for quota, by ClusterQueue and what blocks them.",
    )
    counts: Counter[tuple[str, str]] = Counter()
    for workload, why in model.pending():
        counts[(model.cluster_queue_of(workload), why.cause)] += 1
    for (queue, cause), count in sorted(counts.items()):
        pending.add([("cluster_queue", queue), ("cause", cause)], count)

    wait = Family(
        "topowatch_admission_wait_seconds",
        HISTOGRAM,
        "Time from queueing (creation or last requeue) to admission.",
    )
    for (queue, mode), hist in sorted(model.wait_histograms.items()):
        wait.add_histogram(
            [("cluster_queue", queue), ("topology_mode", mode)],
            hist.cumulative(),
            hist.total,
            hist.count,
        )

    team = Family(
        "topowatch_team_gpus",
        GAUGE,
        "GPU quota per team (ClusterQueue): nominal, used, borrowed from and lent to the cohort.",
    )
    lent: dict[str, int] = {}
    cohorts: dict[str, list[str]] = {}
    for cq in model.cluster_queues.values():
        cohorts.setdefault(cq.cohort or f"\0{cq.name}", []).append(cq.name)
    for members in cohorts.values():
        lent.update(lent_by_queue([model.cluster_queues[m] for m in members]))
    for name in sorted(model.cluster_queues):
        cq = model.cluster_queues[name]
        labels = [("cluster_queue", name), ("team", team_of(name)), ("cohort", cq.cohort)]
        for state, value in (
            ("nominal", cq.nominal),
            ("used", cq.used),
            ("borrowed", cq.borrowed),
            ("lent", lent.get(name, 0)),
        ):
            team.add([*labels, ("state", state)], value)
    return [pending, wait, team]


def _model_families(model: ClusterModel) -> Iterable[Family]:
    objects = Family("topowatch_cluster_objects", GAUGE, "Objects the model holds, by kind.")
    for kind, count in (
        ("Node", len(model.nodes)),
        ("Pod", len(model.pods)),
        ("Workload", len(model.workloads)),
        ("ClusterQueue", len(model.cluster_queues)),
        ("LocalQueue", len(model.local_queues)),
    ):
        objects.add([("kind", kind)], count)
    problems = Family(
        "topowatch_cluster_object_problems",
        COUNTER,
        "Objects or messages the model could not fully understand, by kind and problem.",
    )
    for (kind, problem), count in sorted(model.problems.items()):
        problems.add([("kind", kind), ("problem", problem)], count)
    events = Family("topowatch_cluster_model_events", COUNTER, "Watch events applied, by kind.")
    for kind, count in sorted(model.events_applied.items()):
        events.add([("kind", kind)], count)
    return [objects, problems, events]
