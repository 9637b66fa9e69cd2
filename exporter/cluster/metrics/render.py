"""The cluster service's /metrics: model state rendered into metric families, cardinality capped.

Per-workload series exist only for live (admitted, unfinished) workloads, the largest first, up
to `workload_cap`; the number left out is exported so a dashboard can say so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from exporter.cluster import efa_remotes
from exporter.cluster.capacity.levels import LevelCapacity
from exporter.cluster.capacity.levels import flavor_levels as capacity_levels
from exporter.cluster.capacity.quota import Answer, QuotaTree
from exporter.cluster.metrics import elastic as elastic_metrics
from exporter.cluster.metrics import ultraserver as ultraserver_metrics
from exporter.cluster.model import ClusterModel
from exporter.cluster.objects import GPU_RESOURCE, ClusterQueue, team_of
from exporter.core.exposition import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    Family,
    escape_label_value,
    label_string,
)
from exporter.core.placement_metrics import workload_placement_families
from exporter.topology.tree import LEVELS

DOMAIN_STATES = ("allocatable", "used", "free", "unschedulable", "unavailable")


def render(model: ClusterModel, workload_cap: int = 2000, now: float | None = None) -> list[Family]:
    """`now` judges which node findings are current (`efa_remotes`); None: as of the newest."""
    return [
        *_topology_families(model),
        *_workload_families(model, workload_cap),
        *_efa_remote_families(model, workload_cap, now),
        *_preemption_families(model),
        *_queue_families(model),
        *_model_families(model),
        *elastic_metrics.render(model, now, workload_cap),
        *ultraserver_metrics.render(model),
    ]


def _levels(model: ClusterModel) -> list[str]:
    present = set(model.tree.levels_present())
    return [lvl for lvl in (*LEVELS, "ultraserver") if lvl in present]


def flavor_levels(model: ClusterModel, flavor: str, levels: Sequence[str]) -> list[LevelCapacity]:
    """Per level, the GPUs of the nodes ResourceFlavor `flavor` selects
    (`exporter.cluster.capacity.levels.flavor_levels` on `model.eligibility(flavor)`)."""
    return capacity_levels(model.eligibility(flavor), model.tree, model.nodes, levels)


def _topology_families(model: ClusterModel) -> Iterable[Family]:
    """Per-level capacity, per ResourceFlavor: a job on one flavor can use only its nodes, so
    free GPUs and free blocks of different instance types are never added together. With no
    ResourceFlavor known (a dump, a cluster without Kueue flavors), one set with flavor=""
    over every node, straight from the topology tree."""
    gpus = Family(
        "topowatch_cluster_domain_gpus",
        GAUGE,
        "GPUs of each ResourceFlavor in each topology domain by state (free: on nodes the "
        "flavor's pods may use now; unschedulable: on its nodes they may not; unavailable: on "
        "its nodes in a deep health check or with an EC2 scheduled event due).",
    )
    free = Family(
        "topowatch_cluster_free_gpus",
        GAUGE,
        "Free GPUs of each ResourceFlavor at each topology level.",
    )
    largest = Family(
        "topowatch_cluster_largest_free_block_gpus",
        GAUGE,
        "Free GPUs of a ResourceFlavor in the single domain with the most of them, per level.",
    )
    frag = Family(
        "topowatch_cluster_fragmentation_ratio",
        GAUGE,
        "1 - largest free block / free GPUs, per ResourceFlavor and level: 0 when all its free "
        "GPUs sit in one domain.",
    )
    domains = Family(
        "topowatch_cluster_domains",
        GAUGE,
        "Topology domains holding nodes of each ResourceFlavor, per level.",
    )
    levels = _levels(model)
    if not model.flavors:
        for level in levels:
            labels = [("flavor", ""), ("level", level)]
            head = label_string(labels)[:-1]
            for usage in model.tree.domains(level):
                values = (
                    usage.allocatable,
                    usage.used,
                    usage.free,
                    usage.unschedulable,
                    usage.unavailable,
                )
                _add_domain(gpus, head, usage.domain, values)
            summary = model.tree.fragmentation(level)
            free.add(labels, summary.free)
            largest.add(labels, summary.largest_free)
            frag.add(labels, summary.ratio)
            domains.add(labels, summary.domains)
        return [gpus, free, largest, frag, domains]
    for flavor in sorted(model.flavors):
        for capacity in flavor_levels(model, flavor, levels):
            labels = [("flavor", flavor), ("level", capacity.level)]
            head = label_string(labels)[:-1]
            for domain, (alloc, used, unsched, free_gpus, unavail) in capacity.domains.items():
                _add_domain(gpus, head, domain, (alloc, used, free_gpus, unsched, unavail))
            free.add(labels, capacity.free)
            largest.add(labels, capacity.largest_free)
            frag.add(labels, capacity.ratio)
            domains.add(labels, len(capacity.domains))
    return [gpus, free, largest, frag, domains]


def _add_domain(family: Family, head: str, domain: str, values: Sequence[int]) -> None:
    """One domain's samples, one per DOMAIN_STATES entry of `values`; `head` is the rendered
    label string of the flavor and level without its closing brace (thousands of domains:
    render each label string once)."""
    prefix = f'{head},domain="{escape_label_value(domain)}",state="'
    for state, value in zip(DOMAIN_STATES, values, strict=True):
        family.add_rendered(f'{prefix}{state}"}}', value)


def _workload_families(model: ClusterModel, cap: int) -> Iterable[Family]:
    spanned, hops, met, gpus = workload_placement_families()
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


def _efa_remote_families(model: ClusterModel, cap: int, now: float | None) -> Iterable[Family]:
    """EFA remote errors correlated across a workload's nodes (`exporter.cluster.efa_remotes`):
    the workloads the correlation holds for first, up to the per-workload cap."""
    reporters = Family(
        "topowatch_efa_remote_errors_reporters",
        GAUGE,
        "Nodes of a live workload whose node agent reports rising EFA unresponsive or impaired "
        "remote counters now (workloads with at least one).",
    )
    suspect = Family(
        "topowatch_efa_remote_errors_suspect",
        GAUGE,
        "1 while several nodes of a live workload report EFA remote errors at once, on the node "
        "they share (basis: local-efa-fault, only-silent-node, shared-silent-node), or on "
        'node="" with basis="undetermined" when nothing tells the candidates apart.',
    )
    for found in efa_remotes.from_model(model, now)[:cap]:
        base = [("namespace", found.namespace), ("workload", found.workload)]
        reporters.add(base, len(found.reporters))
        if not found.correlated:
            continue
        for named in found.suspects or (efa_remotes.Suspect("", "undetermined", ""),):
            suspect.add([*base, ("node", named.node), ("basis", named.basis)], 1)
    return [reporters, suspect]


def _preemption_families(model: ClusterModel) -> Iterable[Family]:
    total = Family(
        "topowatch_preemptions",
        COUNTER,
        "Preemptions this process saw happen, by victim queue, preempting queue, Kueue reason "
        "and cause (quota, topology, or unknown when seen too late to judge); those rebuilt "
        "from history at start-up are in the ledger only, so a restart starts this at zero.",
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
    by_resource = Family(
        "topowatch_quota_preemptions",
        COUNTER,
        "Quota-driven preemptions this process saw happen (topowatch_preemptions_total with "
        'cause="quota"), by the resource whose quota the preemptor was short of (Kueue\'s '
        'flavor assigner checks every resource, fitsResourceQuota; "" when not known).',
    )
    for (victim_cq, preemptor_cq, reason, resource), count in sorted(
        model.quota_preemption_counts.items()
    ):
        by_resource.add(
            [
                ("cluster_queue", victim_cq),
                ("preempting_cluster_queue", preemptor_cq),
                ("reason", reason),
                ("resource", resource),
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
    return [total, by_resource, entries, dropped]


def _queue_families(model: ClusterModel) -> Iterable[Family]:
    pending = Family(
        "topowatch_pending_workloads",
        GAUGE,
        "Workloads waiting for quota, by ClusterQueue and what blocks them.",
    )
    short = Family(
        "topowatch_pending_quota_workloads",
        GAUGE,
        "Workloads waiting on quota, by ClusterQueue, flavor and the resource whose quota is "
        "short (the first: maximum capacity before unused quota), and which limit binds: "
        "maximum_capacity (more than the queue can ever hold; only a quota change helps) or "
        "unused_quota (preemption or finished workloads may free it).",
    )
    counts: Counter[tuple[str, str]] = Counter()
    by_short: Counter[tuple[str, str, str, str]] = Counter()
    for workload, why in model.pending():
        queue = model.cluster_queue_of(workload)
        counts[(queue, why.cause)] += 1
        if why.cause == "quota" and why.short:
            first = why.short[0]
            limit = "maximum_capacity" if first.status == "maximum" else "unused_quota"
            by_short[(queue, first.flavor, first.resource, limit)] += 1
    for (queue, cause), count in sorted(counts.items()):
        pending.add([("cluster_queue", queue), ("cause", cause)], count)
    for (queue, flavor, resource, limit), count in sorted(by_short.items()):
        short.add(
            [
                ("cluster_queue", queue),
                ("flavor", flavor),
                ("resource", resource),
                ("limit", limit),
            ],
            count,
        )

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
        "GPU quota per team (ClusterQueue), summed over its GPU flavors: nominal, used, and "
        "borrowed from and lent to its cohort tree by Kueue's quota rules (absent when unknown).",
    )
    tree = model.quota_tree()
    for name in sorted(model.cluster_queues):
        cq = model.cluster_queues[name]
        labels = [("cluster_queue", name), ("team", team_of(name)), ("cohort", cq.cohort)]
        borrowed, lent = cohort_exchange(tree, cq)
        for state, value in (
            ("nominal", cq.nominal),
            ("used", cq.used),
            ("borrowed", borrowed),
            ("lent", lent),
        ):
            if value is not None:  # unknown (a cohort cycle, a bad quota): no sample
                team.add([*labels, ("state", state)], value)
    return [pending, short, wait, team, _quota_family(model, tree)]


def _base_units(resource: str, amount: int) -> float:
    """Kueue's integer to Prometheus's base unit: millicores to cores; bytes, GPUs and pods
    as they are."""
    return amount / 1000.0 if resource == "cpu" else float(amount)


def _quota_family(model: ClusterModel, tree: QuotaTree) -> Family:
    """Every (flavor, resource) of every ClusterQueue by Kueue's quota rules (the quota tree):
    what HyperPod task governance allocates per team beyond GPUs (vCPU, memory) included."""
    family = Family(
        "topowatch_team_quota",
        GAUGE,
        "Quota per team (ClusterQueue), flavor and resource by Kueue's quota rules, in base "
        "units (cpu in cores, memory in bytes, GPUs and pods as counts): nominal, used, "
        "borrowed from and lent to its cohort tree, available (what it can still admit before "
        "preempting), maximum_capacity (the most it could ever hold); absent when unknown.",
    )
    for name in sorted(model.cluster_queues):
        cq = model.cluster_queues[name]
        base = [("cluster_queue", name), ("team", team_of(name)), ("cohort", cq.cohort)]
        for flavor, resource in tree.quotas(name):
            line = tree.line(name, flavor, resource)
            labels = [*base, ("flavor", flavor), ("resource", resource)]
            nominal = (
                line.quota.nominal if line.quota is not None and not line.quota.cause else None
            )
            for state, value in (
                ("nominal", nominal),
                ("used", line.usage),
                ("borrowed", line.borrowed.amount),
                ("lent", line.lent.amount),
                ("available", line.available.amount),
                ("maximum_capacity", line.potential.amount),
            ):
                if value is not None:
                    family.add([*labels, ("state", state)], _base_units(resource, value))
    return family


def cohort_exchange(tree: QuotaTree, cq: ClusterQueue) -> tuple[int | None, int | None]:
    """GPUs the queue borrows from its cohort tree and lends to it, summed over its GPU
    flavors: `QuotaTree.borrowed` and `QuotaTree.lent` per (flavor, nvidia.com/gpu), which
    follow Kueue's quota rules (usage past nominalQuota; own unused nominal quota that others
    use now). Either is None when the quota model cannot answer it for some flavor."""
    flavors = list(dict.fromkeys(q.flavor for q in cq.gpu_quotas))
    return (
        _summed(tree.borrowed(cq.name, f, GPU_RESOURCE) for f in flavors),
        _summed(tree.lent(cq.name, f, GPU_RESOURCE) for f in flavors),
    )


def _summed(answers: Iterable[Answer]) -> int | None:
    total = 0
    for answer in answers:
        if answer.amount is None:
            return None
        total += answer.amount
    return total


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
    unavailable = Family(
        "topowatch_cluster_unavailable_nodes",
        GAUGE,
        "Nodes whose GPUs are unavailable, not free, by cause: deep-health-check (HyperPod's "
        "deep health check InProgress, Failed or unreadable) or scheduled-event (EC2).",
    )
    causes = Counter(node.unavailable for node in model.nodes.values() if node.unavailable)
    for cause in ("deep-health-check", "scheduled-event"):
        unavailable.add([("cause", cause)], causes.get(cause, 0))
    return [objects, problems, events, unavailable]
