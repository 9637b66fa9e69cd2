"""What each ClusterQueue did over a window, accumulated from periodic samples of the model.

Quota advice needs time, not a snapshot: a team that borrows once is fine, one that borrows in
most samples needs more quota. The service calls `sample(model, now)` on a timer; each sample
is weighted by the time since the previous one (capped, so a stalled timer does not stretch one
observation over hours) and folded into fixed time buckets. Buckets older than the window are
dropped, so memory is bounded by buckets x queues x a capped number of job shapes, whatever the
uptime. Pure: no clock, no I/O; the caller passes `now`.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from exporter.cluster.capacity.quota import QuotaTree
from exporter.cluster.metrics.render import cohort_exchange
from exporter.cluster.model import ClusterModel
from exporter.cluster.objects import GPU_RESOURCE, PodSetRequest, Workload

log = logging.getLogger(__name__)

FlavorResource = tuple[str, str]
DAY_S = 86_400.0
MAX_SHAPES_PER_BUCKET = 64  # distinct job shapes kept per queue and bucket; the rest counted


@dataclass(frozen=True, slots=True, order=True)
class JobShape:
    """A workload as quota sees it: how many GPUs, and what it asked of the topology.

    `pods` x `gpus_per_pod` (and the slice, when one is asked) are the pod set whose topology
    request `mode`/`level_key` describe, so placement can be judged in whole pods per node as
    Kueue's TAS places them; `gpus` is the whole workload's."""

    state: str  # "admitted" | "pending"
    gpus: int
    mode: str  # required | preferred | unconstrained | none
    level_key: str  # node label key of the level asked for, "" when none
    pending_cause: str = ""  # quota | topology | ... for pending shapes
    pods: int = 0  # pods of the described pod set
    gpus_per_pod: int = 0
    slice_level: str = ""  # podset-slice-required-topology, "" when none
    slice_size: int = 0


@dataclass(slots=True)
class QueueTotals:
    """Time-weighted sums for one queue over some stretch of time (GPU-seconds, seconds)."""

    seconds: float = 0.0
    samples: int = 0
    used_gpu_s: float = 0.0
    borrowed_gpu_s: float = 0.0
    lent_gpu_s: float = 0.0
    nominal_gpu_s: float = 0.0
    pending_quota_gpu_s: float = 0.0
    pending_topology_gpu_s: float = 0.0
    # topology-pending GPUs whose pods a preferred (best-effort) request for the same level
    # could have placed on their flavor's free capacity: jobs it would have started
    topology_fit_if_preferred_gpu_s: float = 0.0
    topology_waiting_s: float = 0.0  # seconds with any workload pending on topology
    borrowing_s: float = 0.0  # seconds with borrowed > 0
    # GPUs the queue's elastic jobs ran above their minimum: opportunistic use of idle GPUs
    absorbed_gpu_s: float = 0.0
    peak_used: int = 0
    peak_borrowed: int = 0
    preemptions_suffered: int = 0
    preemptions_caused: int = 0
    shapes: dict[JobShape, float] = field(default_factory=dict)  # seconds seen
    shapes_dropped: int = 0
    # Every other resource of the queue's quota (cpu, memory, ...), per (flavor, resource) in
    # Kueue's units: usage, and what workloads waiting on that resource's quota request
    # (amount-seconds); the latest nominal quota.
    resource_used_s: dict[FlavorResource, float] = field(default_factory=dict)
    resource_wait_s: dict[FlavorResource, float] = field(default_factory=dict)
    resource_nominal: dict[FlavorResource, int] = field(default_factory=dict)
    resource_waiting_s: dict[FlavorResource, float] = field(default_factory=dict)

    def add(self, other: QueueTotals) -> None:
        self.seconds += other.seconds
        self.samples += other.samples
        self.used_gpu_s += other.used_gpu_s
        self.borrowed_gpu_s += other.borrowed_gpu_s
        self.lent_gpu_s += other.lent_gpu_s
        self.nominal_gpu_s += other.nominal_gpu_s
        self.pending_quota_gpu_s += other.pending_quota_gpu_s
        self.pending_topology_gpu_s += other.pending_topology_gpu_s
        self.topology_fit_if_preferred_gpu_s += other.topology_fit_if_preferred_gpu_s
        self.topology_waiting_s += other.topology_waiting_s
        self.borrowing_s += other.borrowing_s
        self.absorbed_gpu_s += other.absorbed_gpu_s
        self.peak_used = max(self.peak_used, other.peak_used)
        self.peak_borrowed = max(self.peak_borrowed, other.peak_borrowed)
        self.preemptions_suffered += other.preemptions_suffered
        self.preemptions_caused += other.preemptions_caused
        for shape, seconds in other.shapes.items():
            self.shapes[shape] = self.shapes.get(shape, 0.0) + seconds
        self.shapes_dropped += other.shapes_dropped
        for fr, amount_s in other.resource_used_s.items():
            self.resource_used_s[fr] = self.resource_used_s.get(fr, 0.0) + amount_s
        for fr, amount_s in other.resource_wait_s.items():
            self.resource_wait_s[fr] = self.resource_wait_s.get(fr, 0.0) + amount_s
        self.resource_nominal.update(other.resource_nominal)  # later buckets win
        for fr, seconds in other.resource_waiting_s.items():
            self.resource_waiting_s[fr] = self.resource_waiting_s.get(fr, 0.0) + seconds


@dataclass(frozen=True, slots=True)
class QueueSummary:
    """One queue over the whole window, as averages the advisor can compare with quota."""

    cluster_queue: str
    seconds: float
    samples: int
    avg_used: float
    avg_borrowed: float
    avg_lent: float
    avg_nominal: float
    avg_pending_quota: float
    avg_pending_topology: float
    avg_topology_fit_if_preferred: float
    pending_quota_gpu_hours: float
    pending_topology_gpu_hours: float
    borrowing_fraction: float  # share of the window with borrowed > 0
    topology_waiting_fraction: float
    busiest_used: float  # highest per-bucket average of GPUs used
    busiest_demand: float  # highest per-bucket average of used + quota- and topology-pending
    peak_used: int
    peak_borrowed: int
    preemptions_suffered: int
    preemptions_caused: int
    shapes: Mapping[JobShape, float]  # seconds each shape was seen (summed over workloads)
    avg_absorbed: float = 0.0  # GPUs elastic jobs used above their minimum, on average
    # Other resources per (flavor, resource), Kueue's units: average usage, average request
    # of the workloads waiting on that resource's quota, and the latest nominal quota.
    avg_resource_used: Mapping[FlavorResource, float] = field(default_factory=dict)
    avg_resource_wait: Mapping[FlavorResource, float] = field(default_factory=dict)
    resource_nominal: Mapping[FlavorResource, int] = field(default_factory=dict)
    resource_waiting_fraction: Mapping[FlavorResource, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Observation:
    """One queue in one sample, before weighting."""

    used: int
    borrowed: int
    lent: int
    nominal: int
    pending_quota: int
    pending_topology: int
    topology_fit_if_preferred: int
    shapes: tuple[JobShape, ...]
    absorbed: int = 0
    resource_used: tuple[tuple[FlavorResource, int], ...] = ()
    resource_wait: tuple[tuple[FlavorResource, int], ...] = ()
    resource_nominal: tuple[tuple[FlavorResource, int], ...] = ()


class QuotaHistory:
    """Bounded sliding window of per-queue totals, bucketed by time.

    `window_s`: how far back advice looks; `bucket_s`: the granularity of forgetting and of
    the "busiest stretch" figures; `max_step_s`: the most time one sample may stand for;
    `first_step_s`: what the first sample (or a single snapshot) stands for.
    """

    def __init__(
        self,
        window_s: float = 7 * DAY_S,
        bucket_s: float = 3600.0,
        max_step_s: float = 300.0,
        first_step_s: float = 60.0,
    ) -> None:
        if window_s <= 0 or bucket_s <= 0 or max_step_s <= 0 or first_step_s <= 0:
            raise ValueError("window, bucket and step lengths must be positive")
        self.window_s = window_s
        self.bucket_s = bucket_s
        self.max_step_s = max_step_s
        self.first_step_s = first_step_s
        self._buckets: deque[tuple[int, dict[str, QueueTotals]]] = deque()
        self._last_now: float | None = None
        self._ledger_seen = 0  # ledger arrivals (kept + dropped) already counted
        self.samples = 0
        self.skipped = 0  # samples whose `now` did not move forward

    # --- feeding ----------------------------------------------------------------------------

    @classmethod
    def from_model_only(cls, model: ClusterModel, now: float) -> QuotaHistory:
        """A one-sample history for an offline dump: averages equal the snapshot, and every
        preemption the dump still shows counts as seen in the window."""
        history = cls()
        history.sample(model, now)
        return history

    def sample(self, model: ClusterModel, now: float) -> None:
        """Fold the model's current state in, weighted by the time since the last sample."""
        if self._last_now is None:
            step = self.first_step_s
        elif now <= self._last_now:
            self.skipped += 1
            log.debug("quota history: sample at %s is not after %s; skipped", now, self._last_now)
            return
        else:
            step = min(now - self._last_now, self.max_step_s)
        self._last_now = now
        self.samples += 1
        bucket = self._bucket(now)
        for name, seen in _observe(model).items():
            totals = bucket.setdefault(name, QueueTotals())
            _accumulate(totals, seen, step)
        suffered, caused = self._new_preemptions(model)
        for name, count in suffered.items():
            bucket.setdefault(name, QueueTotals()).preemptions_suffered += count
        for name, count in caused.items():
            bucket.setdefault(name, QueueTotals()).preemptions_caused += count
        self._forget(now)

    def _bucket(self, now: float) -> dict[str, QueueTotals]:
        index = int(now // self.bucket_s)
        if not self._buckets or self._buckets[-1][0] != index:
            self._buckets.append((index, {}))
        return self._buckets[-1][1]

    def _forget(self, now: float) -> None:
        oldest = int((now - self.window_s) // self.bucket_s)
        while self._buckets and self._buckets[0][0] <= oldest:
            self._buckets.popleft()

    def _new_preemptions(self, model: ClusterModel) -> tuple[Counter[str], Counter[str]]:
        """Preemptions that reached the ledger since the last sample, by arrival order, so a
        record stamped before the last sample (a late Event) is still counted once."""
        ledger = model.ledger
        arrivals = len(ledger) + ledger.dropped
        fresh = max(0, arrivals - self._ledger_seen)
        self._ledger_seen = arrivals
        suffered: Counter[str] = Counter()
        caused: Counter[str] = Counter()
        if fresh == 0:
            return suffered, caused
        records = list(ledger)
        for record in records[max(0, len(records) - fresh) :]:
            if record.victim_cluster_queue:
                suffered[record.victim_cluster_queue] += 1
            if record.preemptor_cluster_queue:
                caused[record.preemptor_cluster_queue] += 1
        return suffered, caused

    # --- reading ----------------------------------------------------------------------------

    def queues(self) -> list[str]:
        names: set[str] = set()
        for _, bucket in self._buckets:
            names.update(bucket)
        return sorted(names)

    def summary(self, cluster_queue: str) -> QueueSummary | None:
        """The window's figures for one queue; None when it was never sampled in the window."""
        buckets = [b[cluster_queue] for _, b in self._buckets if cluster_queue in b]
        if not buckets:
            return None
        total = QueueTotals()
        for totals in buckets:
            total.add(totals)
        busiest_used = max((_avg(t.used_gpu_s, t.seconds) for t in buckets), default=0.0)
        busiest_demand = max(
            (
                _avg(t.used_gpu_s + t.pending_quota_gpu_s + t.pending_topology_gpu_s, t.seconds)
                for t in buckets
            ),
            default=0.0,
        )
        secs = total.seconds
        return QueueSummary(
            cluster_queue=cluster_queue,
            seconds=secs,
            samples=total.samples,
            avg_used=_avg(total.used_gpu_s, secs),
            avg_borrowed=_avg(total.borrowed_gpu_s, secs),
            avg_lent=_avg(total.lent_gpu_s, secs),
            avg_nominal=_avg(total.nominal_gpu_s, secs),
            avg_pending_quota=_avg(total.pending_quota_gpu_s, secs),
            avg_pending_topology=_avg(total.pending_topology_gpu_s, secs),
            avg_topology_fit_if_preferred=_avg(total.topology_fit_if_preferred_gpu_s, secs),
            pending_quota_gpu_hours=total.pending_quota_gpu_s / 3600.0,
            pending_topology_gpu_hours=total.pending_topology_gpu_s / 3600.0,
            borrowing_fraction=_avg(total.borrowing_s, secs),
            topology_waiting_fraction=_avg(total.topology_waiting_s, secs),
            busiest_used=busiest_used,
            busiest_demand=busiest_demand,
            peak_used=total.peak_used,
            peak_borrowed=total.peak_borrowed,
            preemptions_suffered=total.preemptions_suffered,
            preemptions_caused=total.preemptions_caused,
            shapes=dict(total.shapes),
            avg_absorbed=_avg(total.absorbed_gpu_s, secs),
            avg_resource_used={fr: _avg(v, secs) for fr, v in total.resource_used_s.items()},
            avg_resource_wait={fr: _avg(v, secs) for fr, v in total.resource_wait_s.items()},
            resource_nominal=dict(total.resource_nominal),
            resource_waiting_fraction={
                fr: _avg(v, secs) for fr, v in total.resource_waiting_s.items()
            },
        )

    def summaries(self) -> dict[str, QueueSummary]:
        out: dict[str, QueueSummary] = {}
        for name in self.queues():
            found = self.summary(name)
            if found is not None:
                out[name] = found
        return out

    @property
    def bucket_count(self) -> int:
        return len(self._buckets)


def _avg(total: float, seconds: float) -> float:
    return total / seconds if seconds > 0 else 0.0


def _accumulate(totals: QueueTotals, seen: _Observation, step: float) -> None:
    totals.seconds += step
    totals.samples += 1
    totals.used_gpu_s += seen.used * step
    totals.borrowed_gpu_s += seen.borrowed * step
    totals.lent_gpu_s += seen.lent * step
    totals.nominal_gpu_s += seen.nominal * step
    totals.pending_quota_gpu_s += seen.pending_quota * step
    totals.pending_topology_gpu_s += seen.pending_topology * step
    totals.topology_fit_if_preferred_gpu_s += seen.topology_fit_if_preferred * step
    totals.absorbed_gpu_s += seen.absorbed * step
    if seen.pending_topology > 0:
        totals.topology_waiting_s += step
    if seen.borrowed > 0:
        totals.borrowing_s += step
    totals.peak_used = max(totals.peak_used, seen.used)
    totals.peak_borrowed = max(totals.peak_borrowed, seen.borrowed)
    for fr, amount in seen.resource_used:
        totals.resource_used_s[fr] = totals.resource_used_s.get(fr, 0.0) + amount * step
    for fr, amount in seen.resource_wait:
        totals.resource_wait_s[fr] = totals.resource_wait_s.get(fr, 0.0) + amount * step
        if amount > 0:
            totals.resource_waiting_s[fr] = totals.resource_waiting_s.get(fr, 0.0) + step
    totals.resource_nominal.update(seen.resource_nominal)
    for shape in seen.shapes:
        if shape in totals.shapes or len(totals.shapes) < MAX_SHAPES_PER_BUCKET:
            totals.shapes[shape] = totals.shapes.get(shape, 0.0) + step
        else:
            totals.shapes_dropped += 1


def required_pod_set(workload: Workload) -> PodSetRequest | None:
    """The pod set whose required topology can block admission (preferred ones fall back)."""
    for pod_set in workload.pod_sets:
        if pod_set.topology.mode == "required" and pod_set.topology.level:
            return pod_set
    return None


def required_level_key(workload: Workload) -> str:
    """The label key of the level a pod set requires (the one that can block admission)."""
    pod_set = required_pod_set(workload)
    return (pod_set.topology.level or "") if pod_set is not None else ""


def _shape(workload: Workload, state: str, cause: str = "") -> JobShape:
    described = required_pod_set(workload)
    if described is None:
        asked = [p for p in workload.pod_sets if p.topology.mode != "none"]
        described = asked[0] if asked else None
    if described is None:
        return JobShape(state, workload.gpus_requested, "none", "", cause)
    topology = described.topology
    return JobShape(
        state,
        workload.gpus_requested,
        topology.mode,
        topology.level or "",
        cause,
        pods=described.count,
        gpus_per_pod=described.gpus_per_pod,
        slice_level=topology.slice_level or "",
        slice_size=topology.slice_size or 0,
    )


def _preferred_would_place(model: ClusterModel, workload: Workload, flavor: str) -> bool:
    """Whether a preferred request at the level the workload requires could place its pods now
    on the nodes its flavor selects (`ClusterModel.preferred_would_place`: the level, each
    level up, then spread; whole pods per node, every resource counted)."""
    return model.preferred_would_place(workload, flavor)


def _observe(model: ClusterModel) -> dict[str, _Observation]:
    """Every known ClusterQueue (and any queue a workload names) in the model's present state.

    Borrowed and lent GPUs come from the quota model (`QuotaTree.borrowed` and `.lent` per GPU
    flavor, summed); where it cannot answer, borrowed falls back to the ClusterQueue status
    and lent to 0."""
    queues = model.cluster_queues
    tree = model.quota_tree()
    shapes: dict[str, list[JobShape]] = {}
    pending_quota: Counter[str] = Counter()
    pending_topology: Counter[str] = Counter()
    fit_if_preferred: Counter[str] = Counter()
    placeable: dict[tuple[str, JobShape], bool] = {}
    for state in model.live():
        workload = state.workload
        name = model.cluster_queue_of(workload)
        if name:
            shapes.setdefault(name, []).append(_shape(workload, "admitted"))
    waiting: dict[str, Counter[FlavorResource]] = {}
    for workload, cause in model.pending():
        name = model.cluster_queue_of(workload)
        if not name:
            continue
        shapes.setdefault(name, []).append(_shape(workload, "pending", cause.cause))
        gpus = workload.gpus_requested
        if cause.cause == "quota":
            short = [c for c in cause.short if c.status in ("maximum", "unused")]
            # A job waiting on memory is no demand for GPU quota: more GPUs would not start it.
            if not short or any(c.resource == GPU_RESOURCE for c in short):
                pending_quota[name] += gpus
            asked = dict(workload.total_requests)
            for check in short:
                if check.resource != GPU_RESOURCE:
                    fr = (check.flavor, check.resource)
                    waiting.setdefault(name, Counter())[fr] += asked.get(check.resource, 0)
        elif cause.cause == "topology":
            pending_topology[name] += gpus
            flavor, _ = model.quota_for(workload, tree)
            key = (flavor, shapes[name][-1])  # workloads of one shape share the answer
            if key not in placeable:
                placeable[key] = _preferred_would_place(model, workload, flavor)
            if placeable[key]:
                fit_if_preferred[name] += gpus
    absorbed: Counter[str] = Counter()
    for job in model.elastic.jobs.values():
        if job.cluster_queue:
            absorbed[job.cluster_queue] += job.absorbed_replicas * job.gpus_per_replica
    out: dict[str, _Observation] = {}
    for name in sorted(set(queues) | set(shapes)):
        cq = queues.get(name)
        borrowed, lent = cohort_exchange(tree, cq) if cq is not None else (0, 0)
        if borrowed is None:
            borrowed = cq.borrowed if cq is not None else 0
        out[name] = _Observation(
            used=cq.used if cq is not None else 0,
            borrowed=borrowed,
            lent=lent or 0,
            nominal=cq.nominal if cq is not None else 0,
            pending_quota=pending_quota[name],
            pending_topology=pending_topology[name],
            topology_fit_if_preferred=fit_if_preferred[name],
            shapes=tuple(shapes.get(name, ())),
            absorbed=absorbed[name],
            **_other_resources(tree, name, waiting.get(name)),
        )
    return out


def _other_resources(
    tree: QuotaTree, queue: str, waiting: Counter[FlavorResource] | None
) -> dict[str, tuple[tuple[FlavorResource, int], ...]]:
    """The queue's quota of every resource but GPUs (cpu, memory, ...): usage and nominal
    from the quota tree, and what waits on each."""
    used: list[tuple[FlavorResource, int]] = []
    nominal: list[tuple[FlavorResource, int]] = []
    for flavor, resource in tree.quotas(queue):
        if resource == GPU_RESOURCE:
            continue
        held_nominal, usage = tree.held(queue, flavor, resource)
        used.append(((flavor, resource), usage))
        nominal.append(((flavor, resource), held_nominal))
    wait = tuple(sorted((waiting or Counter()).items()))
    return {
        "resource_used": tuple(used),
        "resource_wait": wait,
        "resource_nominal": tuple(nominal),
    }
