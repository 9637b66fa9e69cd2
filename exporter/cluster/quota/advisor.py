"""Quota advice from what the cluster did: nominal quota, borrowing and lending limits, and
whether the teams' topology requests fit the domains the cluster has.

Pure: a model (for quotas, nodes and the topology), a QuotaHistory (for what happened over the
window) and a config in; recommendations out. Each recommendation carries a reason from a small
fixed set (a metric label) and the numbers that led to it, so an admin can check the advice
rather than trust it. Rules, per ClusterQueue (a HyperPod team):

- nominal up toward observed demand (GPUs used + GPUs waiting on *quota*), down when used plus
  everything waiting stays well under it; never down while the team's jobs wait on topology
  (their demand is hidden), and the total per flavor kept within the flavor's GPUs, shared by
  fair-share weight when demand exceeds it;
- topology fit: jobs requiring their pods inside one domain of a level where no domain can hold
  them, even with nothing else running, can never run, whatever the quota. Judged as Kueue's
  TAS places pods: whole pods per node (a node of 8 GPUs holds one pod of 8, never two of 5),
  on the nodes the queue's flavors select and their pods may use (`ClusterModel.eligibility`),
  one flavor at a time;
- topology mode: jobs waiting on topology whose pods a preferred request would have placed on
  their flavor's free capacity: it would have started them;
- borrowing limit for teams that borrow in most of the window; lending limit for quota that
  idles;
- every other resource of the quota (HyperPod task governance allocates vCPU and memory per
  team beside GPUs): where jobs wait on a resource's quota (Kueue's flavor assigner found it
  short, `fitsResourceQuota`), nominal up to what the queue uses plus what waits, in that
  resource's units; those jobs count as no demand for GPU quota, and a team whose jobs wait
  on another resource is never told to cut its GPU quota (what it would use is not observed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from exporter.cluster.capacity.placement import Fit, NodeFreeMap, fit
from exporter.cluster.capacity.quota import kueue_quantity
from exporter.cluster.model import ClusterModel
from exporter.cluster.objects import GPU_RESOURCE, ClusterQueue, FlavorQuota, Node, team_of
from exporter.cluster.parse.core import parse_quantity as core_parse_quantity
from exporter.cluster.quota.history import JobShape, QueueSummary, QuotaHistory
from exporter.topology.labels import LAYER_KEYS, Placement
from exporter.topology.tree import level_of_label_key

Kind = Literal["nominal", "topology_fit", "borrowing_limit", "lending_limit", "topology_mode"]
KINDS: tuple[Kind, ...] = (
    "nominal",
    "topology_fit",
    "borrowing_limit",
    "lending_limit",
    "topology_mode",
)

# The reason label's whole vocabulary: the metric's cardinality is queues x these.
DEMAND_ABOVE_NOMINAL = "demand_above_nominal"
NOMINAL_IDLE = "nominal_idle"
OVER_CAPACITY = "over_capacity"
UNPLACEABLE_AT_LEVEL = "unplaceable_at_level"
PERSISTENT_BORROWING = "persistent_borrowing"
IDLE_QUOTA_NOT_LENT = "idle_quota_not_lent"
TOPOLOGY_WAIT_PREFERRED_FITS = "topology_wait_preferred_fits"
REASONS = (
    DEMAND_ABOVE_NOMINAL,
    NOMINAL_IDLE,
    OVER_CAPACITY,
    UNPLACEABLE_AT_LEVEL,
    PERSISTENT_BORROWING,
    IDLE_QUOTA_NOT_LENT,
    TOPOLOGY_WAIT_PREFERRED_FITS,
)


@dataclass(frozen=True, slots=True)
class Recommendation:
    """One change for one ClusterQueue.

    GPUs throughout. `current`/`recommended` mean, by kind: nominal, borrowing_limit,
    lending_limit: the quota field now and advised (`current` None: no limit set);
    topology_fit: GPUs the team's jobs need inside one domain, and the GPUs of the most of
    their pods (whole pods per node) one domain of that level can ever hold; topology_mode:
    GPUs on average waiting on topology, and 0 (what a preferred request would leave waiting).
    `flavor` is the ResourceFlavor (a HyperPod instance type) the change applies to, "" for
    advice about jobs rather than quota.
    """

    cluster_queue: str
    team: str
    kind: Kind
    current: int | None
    recommended: int
    reason: str
    detail: str
    evidence: Mapping[str, float] = field(default_factory=dict)
    flavor: str = ""
    level: str = ""  # the topology level a topology_* recommendation is about
    # The quota's resource; `current` and `recommended` are in its Kueue units (GPUs,
    # millicores of cpu, bytes of memory).
    resource: str = GPU_RESOURCE


@dataclass(frozen=True, slots=True)
class AdvisorConfig:
    """Thresholds. `granularity` rounds GPU figures (8: whole p5 nodes); `headroom` is the
    margin kept above observed demand when cutting quota; changes smaller than
    `change_tolerance` of the current value (and than one granule) are not worth an edit."""

    granularity: int = 8
    headroom: float = 1.25
    change_tolerance: float = 0.25
    persistent_borrowing_fraction: float = 0.5
    idle_fraction: float = 0.5
    topology_wait_fraction: float = 0.25
    weights: Mapping[str, float] = field(default_factory=dict)  # ClusterQueue -> weight


def advise(
    model: ClusterModel, history: QuotaHistory, now: float, config: AdvisorConfig | None = None
) -> list[Recommendation]:
    """Every recommendation for every queue, sorted by queue then kind; at most one per
    (queue, kind, resource), so metric series never collide."""
    config = config or AdvisorConfig()
    summaries = history.summaries()
    shapes = ShapeCapacity(model)
    recs: list[Recommendation] = []
    wants: dict[str, _Want] = {}
    for name in sorted(model.cluster_queues):
        cq = model.cluster_queues[name]
        summary = summaries.get(name)
        if summary is None or not cq.gpu_quotas:
            continue
        unplaceable = _unplaceable_quota_wait(shapes, cq, summary)
        wants[name] = _nominal_want(cq, summary, config, unplaceable)
    for name in sorted(summaries):
        queue = model.cluster_queues.get(name)
        if queue is not None:
            recs.extend(_resource_recs(queue, summaries[name], config))
    recs.extend(
        _with_idle_evidence(model, r, now) for r in _nominal_recs(model, wants, summaries, config)
    )
    advised_nominal = {r.cluster_queue: r.recommended for r in recs if r.kind == "nominal"}
    for name, want in sorted(wants.items()):
        cq = model.cluster_queues[name]
        summary = summaries[name]
        nominal = advised_nominal.get(name, want.quota.nominal)
        recs.extend(_limit_recs(cq, want.quota, summary, nominal, config))
    for name in sorted(summaries):
        recs.extend(_topology_recs(model, shapes, name, summaries[name], config))
    order = {kind: i for i, kind in enumerate(KINDS)}
    recs.sort(key=lambda r: (r.cluster_queue, order[r.kind]))
    return recs


# --- nominal ----------------------------------------------------------------------------------


def _with_idle_evidence(model: ClusterModel, rec: Recommendation, now: float) -> Recommendation:
    """A nominal change, with the flavor's idle GPU-hours since the service started that Kueue
    held back for quota and that waiting or elastic work could have claimed: raising a quota
    that kept GPUs idle costs no other team its own."""
    if rec.kind != "nominal" or not rec.flavor:
        return rec
    hours: dict[str, float] = {"quota": 0.0, "claimable": 0.0}
    for (flavor, _, reason), seconds in model.idle.totals(now).items():
        if flavor == rec.flavor and reason in hours:
            hours[reason] += seconds / 3600.0
    evidence = {
        **rec.evidence,
        "flavor_idle_gpu_hours_quota_blocked": round(hours["quota"], 2),
        "flavor_idle_gpu_hours_claimable": round(hours["claimable"], 2),
    }
    detail = rec.detail
    if rec.reason == DEMAND_ABOVE_NOMINAL and hours["quota"] >= 1.0:
        detail += (
            f"; meanwhile {hours['quota']:.0f} GPU-hours of {rec.flavor} sat idle, held by quota"
        )
    return replace(rec, evidence=evidence, detail=detail)


@dataclass(frozen=True, slots=True)
class _Want:
    quota: FlavorQuota  # the flavor the advice changes (the queue's largest GPU flavor)
    target: int  # nominal the demand asks for; == quota.nominal when no change is due
    reason: str
    detail: str
    evidence: Mapping[str, float]


def _unplaceable_quota_wait(shapes: ShapeCapacity, cq: ClusterQueue, s: QueueSummary) -> float:
    """Average GPUs waiting on quota in jobs no domain of their required level can ever hold,
    on any of the queue's flavors: more quota would not start them, so they are not demand
    for quota."""
    flavors = [q.flavor for q in cq.gpu_quotas]
    gpu_s = 0.0
    for shape, seconds in s.shapes.items():
        if shape.state != "pending" or shape.pending_cause != "quota" or shape.mode != "required":
            continue
        best = shapes.best(flavors, shape)
        if best is not None and best[1].status == "too-small":
            gpu_s += shape.gpus * seconds
    return gpu_s / s.seconds if s.seconds > 0 else 0.0


def _nominal_want(
    cq: ClusterQueue, s: QueueSummary, config: AdvisorConfig, unplaceable: float = 0.0
) -> _Want:
    quota = max(cq.gpu_quotas, key=lambda q: (q.nominal, q.flavor))
    others = cq.nominal - quota.nominal  # other GPU flavors keep their quota
    gran = max(1, config.granularity)
    quota_wait = max(0.0, s.avg_pending_quota - unplaceable)
    # Elastic jobs grow into whatever is idle (the HyperPod operator asks up to maxReplicas):
    # what they run above their minimum is opportunistic, so it is not demand for guaranteed
    # quota. Raising nominal for it would take quota other teams are promised.
    guaranteed_use = max(0.0, s.avg_used - s.avg_absorbed)
    quota_demand = guaranteed_use + quota_wait
    all_demand = quota_demand + s.avg_pending_topology
    largest_quota_wait = max(
        (sh.gpus for sh in s.shapes if sh.state == "pending" and sh.pending_cause == "quota"),
        default=0,
    )
    if unplaceable > 0:
        largest_quota_wait = 0  # the largest may be the unplaceable one; demand covers the rest
    evidence = {
        "nominal": float(cq.nominal),
        "avg_used_gpus": round(s.avg_used, 2),
        "avg_borrowed_gpus": round(s.avg_borrowed, 2),
        "avg_pending_quota_gpus": round(s.avg_pending_quota, 2),
        "avg_unplaceable_pending_gpus": round(unplaceable, 2),
        "avg_pending_topology_gpus": round(s.avg_pending_topology, 2),
        "avg_elastic_absorbed_gpus": round(s.avg_absorbed, 2),
        "elastic_absorbed_gpu_hours": round(s.avg_absorbed * s.seconds / 3600.0, 2),
        "pending_quota_gpu_hours": round(s.pending_quota_gpu_hours, 2),
        "busiest_hour_used_gpus": round(s.busiest_used, 2),
        "window_hours": round(s.seconds / 3600.0, 2),
        "samples": float(s.samples),
    }
    keep = _Want(quota, quota.nominal, "", "", evidence)
    window = _window_words(s)
    if quota_demand > cq.nominal:
        target = _round_up(max(quota_demand, largest_quota_wait + guaranteed_use), gran) - others
        if _worth_changing(quota.nominal, target, config):
            return _Want(
                quota,
                target,
                DEMAND_ABOVE_NOMINAL,
                f"used {s.avg_used:.0f} GPUs on average ({s.avg_borrowed:.0f} of them borrowed"
                f"{_absorbed_words(s)}) and kept {quota_wait:.0f} more waiting on quota "
                f"({s.pending_quota_gpu_hours:.1f} GPU-hours) {window}, against a nominal quota "
                f"of {cq.nominal}",
                evidence,
            )
        return keep
    if s.topology_waiting_fraction >= config.topology_wait_fraction or unplaceable > 0:
        return keep  # its jobs wait on topology: what it would use is not observed
    if any(f >= config.topology_wait_fraction for f in s.resource_waiting_fraction.values()):
        return keep  # its jobs wait on another resource's quota: GPU use is not observed
    floor = max(s.busiest_used, all_demand * config.headroom, largest_quota_wait, gran)
    target = _round_up(floor, gran) - others
    if target < quota.nominal and _worth_changing(quota.nominal, target, config):
        idle = 1.0 - (s.avg_used / cq.nominal) if cq.nominal else 0.0
        return _Want(
            quota,
            max(0, target),
            NOMINAL_IDLE,
            f"used {s.avg_used:.0f} of its {cq.nominal} nominal GPUs on average "
            f"({idle:.0%} idle; busiest hour {s.busiest_used:.0f}) with "
            f"{s.avg_pending_quota + s.avg_pending_topology:.0f} waiting {window}; "
            f"{target + others} keeps a {config.headroom - 1:.0%} margin",
            evidence,
        )
    return keep


def _absorbed_words(s: QueueSummary) -> str:
    if s.avg_absorbed < 0.5:
        return ""
    return f", {s.avg_absorbed:.0f} by elastic jobs above their minimum, not counted as demand"


def _nominal_recs(
    model: ClusterModel,
    wants: Mapping[str, _Want],
    summaries: Mapping[str, QueueSummary],
    config: AdvisorConfig,
) -> list[Recommendation]:
    """Apply the wants, then keep each flavor's total within its GPUs, by fair-share weight."""
    by_flavor: dict[str, list[str]] = {}
    for name, want in wants.items():
        by_flavor.setdefault(want.quota.flavor, []).append(name)
    # Queues the advisor has no figures for still hold their nominal quota of the flavor.
    held: dict[str, int] = {}
    for name, cq in model.cluster_queues.items():
        for quota in cq.gpu_quotas:
            if name not in wants or wants[name].quota.flavor != quota.flavor:
                held[quota.flavor] = held.get(quota.flavor, 0) + quota.nominal
    recs: list[Recommendation] = []
    for flavor, names in sorted(by_flavor.items()):
        capacity = flavor_capacity(model, flavor)
        unavailable = flavor_unavailable(model, flavor)
        asked = {n: wants[n].target for n in names}
        budget = max(0, capacity - held.get(flavor, 0))
        capped = capacity > 0 and sum(asked.values()) > budget
        weights = {n: fair_share_weight(config.weights, n) for n in names}
        granted = fair_split(asked, weights, budget, config.granularity) if capped else asked
        for name in sorted(names):
            rec = _nominal_rec(wants[name], name, granted[name], capped, config)
            if rec is None:
                continue
            if unavailable and rec.reason == NOMINAL_IDLE:
                note = (
                    f"{unavailable} GPUs of {flavor} are unavailable now (deep health check or "
                    "EC2 scheduled event): part of the idle quota may be capacity it could not use"
                )
                rec = replace(
                    rec,
                    detail=f"{rec.detail}; {note}" if rec.detail else note,
                    evidence={**rec.evidence, "flavor_unavailable_gpus": float(unavailable)},
                )
            if capped:
                total = sum(asked.values()) + held.get(flavor, 0)
                out_now = f" ({unavailable} of them unavailable now)" if unavailable else ""
                share = (
                    f"{flavor} has {capacity} GPUs{out_now} and the queues ask for {total}; "
                    f"by fair-share weight {weights[name]:g} its share is {rec.recommended}"
                )
                evidence = {
                    **rec.evidence,
                    "capacity_gpus": float(capacity),
                    "unavailable_gpus": float(unavailable),
                    "asked_total_gpus": float(total),
                    "fair_share_weight": weights[name],
                }
                detail = f"{rec.detail}; {share}" if rec.detail else share
                rec = replace(rec, detail=detail, evidence=evidence)
            recs.append(rec)
    return recs


def _nominal_rec(
    want: _Want, name: str, value: int, capped: bool, config: AdvisorConfig
) -> Recommendation | None:
    current = want.quota.nominal
    if value == current:
        return None
    if value < min(current, want.target):
        reason, detail = OVER_CAPACITY, ""  # cut below demand: the flavor is oversubscribed
    elif want.reason and _worth_changing(current, value, config):
        reason, detail = want.reason, want.detail
    else:
        return None
    return Recommendation(
        cluster_queue=name,
        team=team_of(name),
        kind="nominal",
        current=current,
        recommended=value,
        reason=reason,
        detail=detail,
        evidence=dict(want.evidence),
        flavor=want.quota.flavor,
    )


def fair_split(
    asked: Mapping[str, int], weights: Mapping[str, float], budget: int, granularity: int = 1
) -> dict[str, int]:
    """Weighted max-min fair shares of `budget`: a queue asking less than its weighted share
    gets what it asks and leaves the rest to the others (water filling)."""
    gran = max(1, granularity)
    granted: dict[str, int] = {}
    active = sorted(asked)
    remaining = float(budget)
    while active:
        total_weight = sum(max(0.0, weights.get(n, 1.0)) for n in active)
        shares = {
            n: remaining * max(0.0, weights.get(n, 1.0)) / total_weight
            if total_weight > 0
            else remaining / len(active)
            for n in active
        }
        satisfied = [n for n in active if asked[n] <= shares[n]]
        if not satisfied:
            for name in active:
                granted[name] = int(shares[name] // gran) * gran
            break
        for name in satisfied:
            granted[name] = asked[name]
            remaining -= asked[name]
            active.remove(name)
    return granted


# --- other resources --------------------------------------------------------------------------

# What a quota of each resource is rounded up to: whole cores, whole GiB, whole units.
_GRANULE = {"cpu": 1000, "memory": 2**30, "ephemeral-storage": 2**30}


def _resource_recs(
    cq: ClusterQueue, s: QueueSummary, config: AdvisorConfig
) -> list[Recommendation]:
    """Nominal quota of a resource other than GPUs, where the queue's jobs waited on it.

    Demand is Kueue's own count for that (flavor, resource): what the queue's workloads hold
    (usage, clusterqueue.go updateWorkloadUsage) plus what the workloads waiting on that
    resource's quota request (flavorassigner.go `fitsResourceQuota` found it short), averaged
    over the window; the advice is that, rounded up to whole cores or GiB, when it exceeds the
    nominal quota by at least one granule and `change_tolerance`."""
    recs: list[Recommendation] = []
    window = _window_words(s)
    for fr, waiting in sorted(s.avg_resource_wait.items()):
        flavor, resource = fr
        if waiting <= 0:
            continue
        used = s.avg_resource_used.get(fr, 0.0)
        nominal = s.resource_nominal.get(fr, 0)
        granule = _GRANULE.get(resource, 1)
        target = _round_up(used + waiting, granule)
        diff = target - nominal
        if diff < granule or diff < config.change_tolerance * nominal:
            continue
        fraction = s.resource_waiting_fraction.get(fr, 0.0)

        def amount(value: float, resource: str = resource) -> str:
            return kueue_quantity(resource, math.ceil(value))

        recs.append(
            Recommendation(
                cluster_queue=cq.name,
                team=team_of(cq.name),
                kind="nominal",
                current=nominal,
                recommended=target,
                reason=DEMAND_ABOVE_NOMINAL,
                detail=(
                    f"jobs waited on {resource} quota in {flavor} {fraction:.0%} of the time"
                    f" {window}: it used {amount(used)} of {resource} on average and kept"
                    f" {amount(waiting)} more waiting on that quota, against a nominal quota of"
                    f" {amount(nominal)}; {amount(target)} covers them (more GPUs would not"
                    " start them)"
                ),
                evidence={
                    "avg_used": round(used, 2),
                    "avg_waiting": round(waiting, 2),
                    "waiting_fraction": round(fraction, 3),
                    "nominal": float(nominal),
                    "window_hours": round(s.seconds / 3600.0, 2),
                },
                flavor=flavor,
                resource=resource,
            )
        )
    return recs


# --- borrowing and lending limits -------------------------------------------------------------


def _limit_recs(
    cq: ClusterQueue, quota: FlavorQuota, s: QueueSummary, nominal: int, config: AdvisorConfig
) -> list[Recommendation]:
    if not cq.cohort:
        return []  # limits only mean something inside a cohort
    recs: list[Recommendation] = []
    gran = max(1, config.granularity)
    team = team_of(cq.name)
    window = _window_words(s)
    if s.borrowing_fraction >= config.persistent_borrowing_fraction:
        burst = _round_up(max(gran, s.peak_used - nominal), gran)
        current = quota.borrowing_limit
        if current is None or current < burst:  # unbounded, or too tight for its bursts
            reclaimed = (
                f"; it suffered {s.preemptions_suffered} preemption(s) in the window"
                if s.preemptions_suffered
                else ""
            )
            recs.append(
                Recommendation(
                    cluster_queue=cq.name,
                    team=team,
                    kind="borrowing_limit",
                    current=current,
                    recommended=burst,
                    reason=PERSISTENT_BORROWING,
                    detail=(
                        f"borrowed in {s.borrowing_fraction:.0%} of the time {window} "
                        f"({s.avg_borrowed:.0f} GPUs on average, peak {s.peak_borrowed}); with a "
                        f"nominal quota of {nominal}, a borrowing limit of {burst} covers its "
                        f"peak of {s.peak_used} without leaning on others' idle GPUs{reclaimed}"
                    ),
                    evidence={
                        "borrowing_fraction": round(s.borrowing_fraction, 3),
                        "avg_borrowed_gpus": round(s.avg_borrowed, 2),
                        "peak_borrowed_gpus": float(s.peak_borrowed),
                        "peak_used_gpus": float(s.peak_used),
                        "nominal_after_advice": float(nominal),
                        "preemptions_suffered": float(s.preemptions_suffered),
                    },
                    flavor=quota.flavor,
                )
            )
    idle = 1.0 - s.avg_used / s.avg_nominal if s.avg_nominal > 0 else 0.0
    if quota.lending_limit is not None and idle >= config.idle_fraction:
        lendable = max(0, nominal - _round_up(s.busiest_used, gran))
        lendable = min(lendable, nominal)
        if lendable > quota.lending_limit:
            recs.append(
                Recommendation(
                    cluster_queue=cq.name,
                    team=team,
                    kind="lending_limit",
                    current=quota.lending_limit,
                    recommended=lendable,
                    reason=IDLE_QUOTA_NOT_LENT,
                    detail=(
                        f"{idle:.0%} of its quota idled {window} (busiest hour used "
                        f"{s.busiest_used:.0f} GPUs) while it lends at most "
                        f"{quota.lending_limit}; lending {lendable} of a nominal {nominal} "
                        "lets the cohort use them and reclaims them when the team needs them"
                    ),
                    evidence={
                        "idle_fraction": round(idle, 3),
                        "avg_used_gpus": round(s.avg_used, 2),
                        "busiest_hour_used_gpus": round(s.busiest_used, 2),
                        "nominal_after_advice": float(nominal),
                    },
                    flavor=quota.flavor,
                )
            )
    return recs


# --- topology ---------------------------------------------------------------------------------


def _topology_recs(
    model: ClusterModel,
    shapes: ShapeCapacity,
    name: str,
    s: QueueSummary,
    config: AdvisorConfig,
) -> list[Recommendation]:
    cq = model.cluster_queues.get(name)
    flavors = [q.flavor for q in cq.gpu_quotas] if cq is not None else []
    team = team_of(name)
    required: dict[str, dict[_PodShape, float]] = {}  # level key -> pod shape -> seconds seen
    for shape, seconds in s.shapes.items():
        if shape.mode == "required" and shape.level_key and shape.gpus > 0:
            sizes = required.setdefault(shape.level_key, {})
            size = _PodShape.of(shape)
            sizes[size] = sizes.get(size, 0.0) + seconds
    recs: list[Recommendation] = []
    unplaceable_levels: set[str] = set()
    # (excess GPUs, level key, pod shape, (flavor, fit), seconds unplaceable at that level)
    worst: tuple[int, str, _PodShape, tuple[str, Fit], float] | None = None
    for key, sizes in sorted(required.items()):
        too_big: dict[_PodShape, tuple[str, Fit]] = {}
        for size in sorted(sizes):
            best = shapes.best_for(flavors, key, size)
            if best is not None and best[1].status == "too-small":
                too_big[size] = best
        if not too_big:
            continue  # every shape fits, or no node carries the level's label: nothing to judge
        unplaceable_levels.add(key)
        seconds = sum(sizes[size] for size in too_big)
        for size, best in too_big.items():
            excess = size.gpus - best[1].pods_fit * size.gpus_per_pod
            if worst is None or excess > worst[0]:
                worst = (excess, key, size, best, seconds)
    if worst is not None:
        _, key, size, (flavor, fitted), seconds = worst
        needed = size.gpus
        largest = fitted.pods_fit * size.gpus_per_pod
        level = _level_name(key)
        higher = _level_above_that_fits(shapes, key, size, flavors)
        fix = (
            f"require {higher} instead (a domain there holds them), or prefer {level}"
            if higher
            else f"prefer {level} rather than require it, or split the job"
        )
        where = f" of flavor {flavor}" if flavor else ""
        recs.append(
            Recommendation(
                cluster_queue=name,
                team=team,
                kind="topology_fit",
                current=needed,
                recommended=largest,
                reason=UNPLACEABLE_AT_LEVEL,
                detail=(
                    f"jobs of {size.words} ({needed} GPUs) require one {level} domain, but the "
                    f"largest {level} domain{where} holds {fitted.pods_fit} of those pods "
                    f"({largest} GPUs) with nothing else running, counting whole pods per "
                    f"node: no quota can place them; {fix}"
                ),
                evidence={
                    "job_gpus": float(needed),
                    "job_pods": float(size.pods),
                    "gpus_per_pod": float(size.gpus_per_pod),
                    "largest_domain_gpus": float(largest),
                    "largest_domain_pods": float(fitted.pods_fit),
                    "pending_topology_gpu_hours": round(s.pending_topology_gpu_hours, 2),
                    "unplaceable_job_hours": round(seconds / 3600.0, 2),
                },
                level=level,
            )
        )
    waiting = s.topology_waiting_fraction >= config.topology_wait_fraction
    if waiting and s.avg_topology_fit_if_preferred > 0:
        keys = [k for k in required if k not in unplaceable_levels]
        if keys:
            key = max(keys, key=lambda k: sum(required[k].values()))
            level = _level_name(key)
            waiting_gpus = math.ceil(s.avg_pending_topology)
            recs.append(
                Recommendation(
                    cluster_queue=name,
                    team=team,
                    kind="topology_mode",
                    current=waiting_gpus,
                    recommended=0,
                    reason=TOPOLOGY_WAIT_PREFERRED_FITS,
                    detail=(
                        f"jobs waited on topology {s.topology_waiting_fraction:.0%} of the time "
                        f"{_window_words(s)} ({s.pending_topology_gpu_hours:.1f} GPU-hours) "
                        f"although enough {level} GPUs were free in total: quota is not the "
                        f"limit, free GPUs are split across {level} domains; a preferred "
                        f"{level} request would have started them (or defragment the domains)"
                    ),
                    evidence={
                        "topology_waiting_fraction": round(s.topology_waiting_fraction, 3),
                        "avg_pending_topology_gpus": round(s.avg_pending_topology, 2),
                        "avg_fit_if_preferred_gpus": round(s.avg_topology_fit_if_preferred, 2),
                        "pending_topology_gpu_hours": round(s.pending_topology_gpu_hours, 2),
                        "avg_pending_quota_gpus": round(s.avg_pending_quota, 2),
                    },
                    level=level,
                )
            )
    return recs


# --- capacity ---------------------------------------------------------------------------------


# Why a node a flavor selects is out of its pods' reach only for now: quota is planned for the
# cluster's structure, not for this hour's repairs (`placement.ExclusionCause`).
_UNDER_REPAIR = frozenset({"cordoned", "unhealthy", "not-ready"})
# Out only while a deep health check runs (or until a failed one is dealt with) or around an EC2
# scheduled event: capacity the cluster has, unavailable now.
_UNAVAILABLE = frozenset({"deep-health-check", "scheduled-event"})


def flavor_nodes(model: ClusterModel, flavor: str) -> list[Node]:
    """The nodes whose GPUs quota for ResourceFlavor `flavor` may plan on, sorted by name.

    `ClusterModel.eligibility`: the flavor's nodeLabels (and its Topology's level labels) select
    them, and its pods may use them: Ready, not cordoned or marked unhealthy, every blocking
    taint tolerated. Nodes out only for repair (cordoned, not Ready, unhealthy) or unavailable
    for now (a deep health check, an EC2 scheduled event) count too; nodes behind a taint the
    flavor does not tolerate do not. A flavor no ResourceFlavor
    describes selects every node, as it does for pending causes; one that selects none has
    no capacity.
    """
    eligibility = model.eligibility(flavor)
    names = set(eligibility.nodes)
    names.update(
        e.node for e in eligibility.excluded if e.cause in _UNDER_REPAIR or e.cause in _UNAVAILABLE
    )
    return [model.nodes[n] for n in sorted(names) if n in model.nodes]


def flavor_capacity(model: ClusterModel, flavor: str) -> int:
    """Allocatable GPUs of the flavor's nodes (`flavor_nodes`), cordoned and unavailable ones
    included."""
    return sum(max(0, n.allocatable_gpus) for n in flavor_nodes(model, flavor))


def flavor_unavailable(model: ClusterModel, flavor: str) -> int:
    """Allocatable GPUs of the flavor's nodes that are unavailable now: in a deep health check
    (or failed one) or with an EC2 scheduled event due. Part of `flavor_capacity`, never free."""
    eligibility = model.eligibility(flavor)
    return sum(
        max(0, model.nodes[e.node].allocatable_gpus)
        for e in eligibility.excluded
        if e.cause in _UNAVAILABLE and e.node in model.nodes
    )


def _plannable_nodes(model: ClusterModel, flavor: str) -> frozenset[str]:
    """The nodes a flavor's pods may use, plus those unavailable only for now."""
    eligibility = model.eligibility(flavor)
    back = [e.node for e in eligibility.excluded if e.cause in _UNAVAILABLE]
    return eligibility.nodes | frozenset(back) if back else eligibility.nodes


@dataclass(frozen=True, slots=True, order=True)
class _PodShape:
    """The pod set a topology request is about: `pods` of `gpus_per_pod`, maybe in slices."""

    pods: int
    gpus_per_pod: int
    slice_level: str = ""
    slice_size: int = 0

    @classmethod
    def of(cls, shape: JobShape) -> _PodShape:
        if shape.pods > 0 and shape.gpus_per_pod > 0:
            return cls(shape.pods, shape.gpus_per_pod, shape.slice_level, shape.slice_size)
        return cls(1, shape.gpus)  # a shape recorded without its pod set: one pod of it all

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod

    @property
    def words(self) -> str:
        pods = f"{self.pods} pod{'s' if self.pods != 1 else ''}"
        return f"{pods} of {self.gpus_per_pod} GPU{'s' if self.gpus_per_pod != 1 else ''}"


class ShapeCapacity:
    """Whether a job shape can ever be placed: Kueue's TAS rules (`placement.fit`) on the
    nodes each flavor's pods may use (`ClusterModel.eligibility`, plus those out only for a deep
    health check or an EC2 scheduled event), with every GPU of them free, so what is running
    or being checked now does not count. Answers are cached for one advice run."""

    def __init__(self, model: ClusterModel) -> None:
        self._model = model
        self._empty: NodeFreeMap | None = None
        self._fits: dict[tuple[str, str, _PodShape], Fit] = {}

    def _capacity(self) -> NodeFreeMap:
        """Every node's allocatable GPUs free (what a domain holds with nothing running)."""
        if self._empty is None:
            tree = self._model.tree
            free: dict[str, int] = {}
            places: dict[str, Placement] = {}
            for name, node in self._model.nodes.items():
                place = tree.placement(name)
                if place is not None:
                    free[name] = max(0, node.allocatable_gpus)
                    places[name] = place
            self._empty = NodeFreeMap(free, places)
        return self._empty

    def fit(self, flavor: str, level_key: str, shape: _PodShape) -> Fit:
        key = (flavor, level_key, shape)
        found = self._fits.get(key)
        if found is None:
            found = self._fits[key] = fit(
                self._capacity(),
                _plannable_nodes(self._model, flavor),
                level_key,
                shape.pods,
                shape.gpus_per_pod,
                slice_level=shape.slice_level or None,
                slice_size=(shape.slice_size or None) if shape.slice_level else None,
            )
        return found

    def best_for(
        self, flavors: Iterable[str], level_key: str, shape: _PodShape
    ) -> tuple[str, Fit] | None:
        """The shape's best (flavor, `Fit`) over the flavors: the first where it fits, else
        the one whose largest domain holds the most of its pods; None when no flavor has a
        domain of the level to judge by (no eligible node, none with the level's label, or a
        shape that cannot be judged). Kueue tries a queue's flavors in turn, and a job runs on
        one flavor: domains of different flavors are never added together."""
        best: tuple[str, Fit] | None = None
        for flavor in dict.fromkeys(flavors):
            found = self.fit(flavor, level_key, shape)
            if found.fits:
                return flavor, found
            if found.status == "too-small" and (best is None or found.pods_fit > best[1].pods_fit):
                best = (flavor, found)
        return best

    def best(self, flavors: Iterable[str], shape: JobShape) -> tuple[str, Fit] | None:
        """`best_for` a recorded job shape at the level it asked for."""
        if not shape.level_key or shape.gpus <= 0:
            return None
        return self.best_for(flavors, shape.level_key, _PodShape.of(shape))


def _level_above_that_fits(
    shapes: ShapeCapacity, level_key: str, shape: _PodShape, flavors: Iterable[str]
) -> str:
    """The nearest broader network level where one domain holds every pod, "" when none does."""
    level = level_of_label_key(level_key)
    if level is None or not level.startswith("network-node-layer-"):
        return ""
    depth = int(level.rsplit("-", 1)[1])
    flavor_list = list(flavors)
    for up in range(depth - 1, 0, -1):
        found = shapes.best_for(flavor_list, LAYER_KEYS[up - 1], shape)
        if found is not None and found[1].fits:
            return f"network-node-layer-{up}"
    return ""


# --- fair-share weights -----------------------------------------------------------------------


def fair_share_weight(weights: Mapping[str, float], cluster_queue: str) -> float:
    return weights.get(cluster_queue, 1.0)


def fair_share_weights(model: ClusterModel) -> dict[str, float]:
    """spec.fairSharing.weight of each ClusterQueue, as the parser read it (1 when absent or
    unreadable), for AdvisorConfig.weights."""
    return {name: cq.fair_share_weight for name, cq in model.cluster_queues.items()}


def parse_quantity(value: object) -> float | None:
    """A Kubernetes quantity as a non-negative float; None where core.parse_quantity refuses it
    or it is negative (quota figures cannot be)."""
    try:
        number = core_parse_quantity(value)  # type: ignore[arg-type]
    except ValueError:
        return None
    return number if number >= 0 else None


# --- helpers ----------------------------------------------------------------------------------


def _round_up(value: float, granularity: int) -> int:
    return math.ceil(value / granularity - 1e-9) * granularity if value > 0 else 0


def _worth_changing(current: int, target: int, config: AdvisorConfig) -> bool:
    diff = abs(target - current)
    return diff >= max(1, config.granularity) and diff >= config.change_tolerance * current


def _level_name(key: str) -> str:
    return level_of_label_key(key) or key


def _window_words(s: QueueSummary) -> str:
    hours = s.seconds / 3600.0
    if s.samples <= 1:
        return "in the one snapshot seen"
    return f"over {hours:.1f} h ({s.samples} samples)"


def shapes_of(s: QueueSummary, state: str) -> dict[JobShape, float]:
    """The job shapes of one state ("admitted" or "pending") and the seconds each was seen."""
    return {shape: t for shape, t in s.shapes.items() if shape.state == state}
