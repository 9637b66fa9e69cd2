"""Elastic jobs and their scale events, derived from the objects a watcher sees.

Neither HyperPod's training operator nor Kueue publishes scale events, so they are derived,
like the preemption ledger, from what changes (reference/hyperpod/elastic-training-and-deep-
health.md, 1.4 to 1.7):

- **HyperPod** (`HyperPodPyTorchJob`, several admitted Workloads per job, one per world-size
  increment): a Workload owned by the job created while an older one exists is a scale-up;
  its phases are requested (Workload created) → admitted (its Admitted condition) → scheduled
  (the job has that many pods bound, or its own pods, those naming its Workload, all are) →
  ready (likewise Ready: an older replica down meanwhile does not hold it back) → restarted
  (the operator's `lastRestartTime` after the pods were ready: the job restarted at the new
  world size).
  An owned Workload evicted with reason Preempted is a scale-down caused by preemption; one
  deleted while admitted is a scale-down whose cause the job's status settles:
  `isFaultyPodScaleDown` → faulty pod, a new `metadata.generation` → user change, the job's
  base Workload preempted → preemption (1.4: the operator "removes the corresponding Workload
  object"), else unknown. A scale-up Workload deleted before admission (by the operator, or by
  the garbage collector after its job's deletion), or evicted before its pods were ready,
  failed.
  A scale-up evicted after its pods were Ready did not fail: it ended ("preempted after
  ready"), and its eviction is a scale-down of its own.
- **Only elastic jobs scale** (1.2: `spec.elasticPolicy`; `elasticWorkloadRef` is "only set
  when ElasticPolicy is present"): a HyperPodPyTorchJob without `elasticPolicy` is no elastic
  job (its preemption is a preemption, not a scale event), and one whose object has not been
  seen (a dump without the kind, a kind not listed yet) is neither called elastic nor given
  scale events until its spec says so; then its Workloads are judged as a first list is.
- **Kueue** elastic Jobs (ElasticJobsViaWorkloadSlices): a Workload with
  `workload-slice-replacement-for` is a scale-up from the replaced slice's size; it is done
  when that many pods are Ready (a batch Job does not restart). Kueue scales down by lowering
  the count of the Workload in place (elastic_workload.md), which is a scale-down here. Slices
  are resized by changing the Job's parallelism, so their cause is a user change. A preempted
  slice takes the whole Job down (Kueue evicts the Workload, the Job is suspended).

Evidence, not the clock, times what was not watched. Live, a phase is timed when the model sees
it happen. Rebuilt from a first list (a restart's, or a `kubectl get` dump through `topowatch
explain --from`), a phase is timed only by what the objects record and is otherwise known to be
reached but left untimed, never stamped with the dump's newest timestamp:
- admitted: the Admitted condition's lastTransitionTime while True; after an eviction, Kueue's
  `accumulatedPastExecutionTimeSeconds` before the Admitted=False transition (with one admission
  cycle: `schedulingStats.evictions`, or a HyperPod scale-up, which its operator deletes after
  one eviction, 1.4); an Admitted condition that is False, or that field, alone proves the
  admission (Kueue writes Admitted=False only when it was True, `SyncAdmittedCondition`); an
  eviction with reason Preempted proves the quota was held (Kueue preempts only Workloads that
  hold quota, pkg/scheduler/preemption);
- ready: the n-th earliest Ready time of the job's Ready pods is when it first had n;
- restarted: `lastRestartTime` is the operator's latest restart only, so it belongs to the
  newest scale event (up or down) at or before it; an older scale-up whose replicas that
  restart includes was restarted too, at a time the status no longer holds.

Counting is restart-safe as the preemption counters are: only events that happened while
this process watched (`live`) are counted; history rebuilt from a first list is kept in the
ledger, uncounted, and the same Workload never makes two events.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from exporter.cluster.objects import ElasticJob, Workload

HYPERPOD_KIND: Final = "HyperPodPyTorchJob"
KUEUE_JOB_KIND: Final = "Job"
PHASES: Final = ("requested", "admitted", "scheduled", "ready", "restarted")
CAUSES: Final = ("capacity_freed", "preemption", "faulty_pod", "user_change", "unknown")
FAILURE_PHASES: Final = ("admission", "scheduling", "ready", "restart")
PHASE_BUCKETS: Final = (5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
# A scale-down's cause is settled by the job's next status (isFaultyPodScaleDown) within this
# long; a spec change this recent makes a resize a user change.
SETTLE_S: Final = 60.0
USER_CHANGE_WINDOW_S: Final = 120.0
READY_SLACK_S: Final = 2.0  # object times have whole seconds
EVENTS_PER_JOB: Final = 256
SIZES_PER_JOB: Final = 512
NOT_IN_DUMP: Final = "the job object is not in the dump"
NOT_LISTED: Final = (
    f"its {HYPERPOD_KIND} object has not been seen (the kind is not listed yet, or not served)"
)

JobKey = tuple[str, str, str]  # (namespace, kind, name)
# What a Workload's status keeps of admissions it no longer holds (parse.hyperpod reads it):
# (accumulatedPastExecutionTimeSeconds, the number of evictions schedulingStats counts).
Evidence = tuple[int | None, int | None]


@dataclass(slots=True)
class ScaleEvent:
    """One resize of an elastic job. Phase times are Unix seconds; a phase known to be reached
    at a time no object records (rebuilt from history) maps to None."""

    id: int
    job: JobKey
    direction: str  # "up" | "down"
    from_replicas: int | None
    to_replicas: int | None
    cause: str  # capacity_freed | preemption | faulty_pod | user_change | unknown | "" (open)
    workload: str  # the Workload that asked for it (up) or was lost (down)
    time: float
    cluster_queue: str
    live: bool  # happened while this process watched: counted
    phases: dict[str, float | None] = field(default_factory=dict)
    failed: str = ""  # why it failed, "" when it did not
    failed_phase: str = ""  # the phase it never reached
    ended: str = ""  # how a scale-up that neither completed nor failed ended ("preempted ...")
    counted: bool = False
    dedupe: tuple[str, str] = ("", "")  # its key in ElasticBook._event_of

    @property
    def done(self) -> bool:
        if self.direction == "down" or self.failed or self.ended:
            return True
        last = "restarted" if self.job[1] == HYPERPOD_KIND else "ready"
        return last in self.phases

    @property
    def next_phase(self) -> str:
        for phase in PHASES:
            if phase not in self.phases:
                return phase
        return ""

    @property
    def last_phase(self) -> str:
        reached = [p for p in PHASES if p in self.phases]
        return reached[-1] if reached else ""

    def seconds_to(self, phase: str) -> float | None:
        at = self.phases.get(phase)
        if at is None:
            return None
        start = self.phases.get("requested")
        return max(0.0, at - (start if start is not None else self.time))


@dataclass(slots=True)
class JobState:
    """What is known of one elastic job: its spec (HyperPod), Workloads, pods, history."""

    namespace: str
    kind: str
    name: str
    uid: str = ""
    spec: ElasticJob | None = None
    workloads: dict[str, Workload] = field(default_factory=dict)
    cluster_queue: str = ""
    flavor: str = ""
    bound: int = 0  # pods bound to a node
    ready: int = 0  # pods Ready
    ready_times: tuple[float, ...] = ()  # the Ready pods' Ready times, earliest first
    # Per Workload its pods name (annotation kueue.x-k8s.io/workload): (bound, Ready times,
    # earliest first), so a scale-up's own pods are judged even while an older replica is down.
    by_workload: Mapping[str, tuple[int, tuple[float, ...]]] = field(default_factory=dict)
    events: deque[ScaleEvent] = field(default_factory=lambda: deque(maxlen=EVENTS_PER_JOB))
    # Size history: what a first list's objects say (rebuilt as they arrive), then what was
    # watched happening.
    history_sizes: list[tuple[float, int]] = field(default_factory=list)
    live_sizes: deque[tuple[float, int]] = field(
        default_factory=lambda: deque(maxlen=SIZES_PER_JOB)
    )
    problems: dict[str, str] = field(default_factory=dict)  # source -> why its size is unknown
    unseen: str = ""  # why its HyperPodPyTorchJob spec is unknown (not a problem: unseen)
    # Its HyperPodPyTorchJob was elastic when deleted: Workloads still listed are judged as
    # the job's (see on_hyperpod_job).
    deleted_elastic: bool = False
    generation_changed: float | None = None
    gpus_seen_per_replica: int = 0
    # Per Workload: whether it was first seen live, and the admission its status remembers.
    live_seen: dict[str, bool] = field(default_factory=dict)
    evidence: dict[str, Evidence] = field(default_factory=dict)
    derived: bool = False  # its Workloads' scale events are derived (its elasticity is known)
    # Events derived from a Workload's state when first seen, by (Workload, direction): their
    # sizes count the job's other Workloads, which a first list may deliver later.
    first_seen: dict[tuple[str, str], ScaleEvent] = field(default_factory=dict)
    pods_unseen: str = ""  # why its pods are unknown (a dump without pods), "" when seen

    @property
    def key(self) -> JobKey:
        return (self.namespace, self.kind, self.name)

    @property
    def elastic(self) -> bool | None:
        """True for a Kueue elastic Job and a HyperPodPyTorchJob with spec.elasticPolicy, False
        for one without, None while its spec is unseen."""
        if self.kind != HYPERPOD_KIND:
            return True
        return None if self.spec is None else self.spec.elastic

    @property
    def admitted(self) -> int:
        """Replicas Kueue admitted: every admitted, unfinished Workload of the job."""
        return sum(_count(w) for w in self.workloads.values() if _holds_quota(w))

    @property
    def min_replicas(self) -> int | None:
        return self.spec.min_replicas if self.spec is not None else None

    @property
    def max_replicas(self) -> int | None:
        return self.spec.max_replicas if self.spec is not None else None

    @property
    def target(self) -> int | None:
        return self.spec.target if self.spec is not None else None

    @property
    def gpus_per_replica(self) -> int:
        if self.spec is not None and self.spec.gpus_per_replica:
            return self.spec.gpus_per_replica
        return self.gpus_seen_per_replica

    @property
    def unknown(self) -> str:
        """ "" when the job's size can be judged, else why not (for "unknown: <why>")."""
        if self.problems:
            return "; ".join(self.problems[k] for k in sorted(self.problems))
        return self.unseen if self.kind == HYPERPOD_KIND and self.spec is None else ""

    @property
    def absorbed_replicas(self) -> int:
        """Replicas running above the minimum: capacity the job took that would be idle."""
        low = self.min_replicas
        if low is None or self.unknown or not self.elastic:
            return 0
        return max(0, self.ready - low)

    @property
    def sizes(self) -> list[tuple[float, int]]:
        return [*self.history_sizes, *self.live_sizes]

    def summary(self) -> str:
        """ "elastic 3/8 replicas (min 2, target 4)", "elastic <kind> <name>: unknown: <why>",
        "not elastic (...)" or, spec unseen, "unknown whether elastic: <why> (...)"."""
        running = "?" if self.pods_unseen else str(self.ready)
        if self.kind == HYPERPOD_KIND and self.spec is None:
            why = self.unknown or NOT_LISTED
            return (
                f"unknown whether elastic: {why} ({running} replicas running, "
                f"{self.admitted} admitted)"
            )
        if self.unknown:
            return f"elastic {self.kind} {self.name}: unknown: {self.unknown}"
        if self.elastic is False:
            asked = sum(r.replicas for r in self.spec.replica_specs) if self.spec else 0
            return f"not elastic (no spec.elasticPolicy): {running}/{asked} replicas running"
        high = self.max_replicas
        bounds = [f"running unknown: {self.pods_unseen}"] if self.pods_unseen else []
        if self.min_replicas is not None:
            bounds.append(f"min {self.min_replicas}")
        if self.target is not None:
            bounds.append(f"target {self.target}")
        if self.kind != HYPERPOD_KIND:
            bounds.append(f"{self.admitted} admitted")
        size = f"{running}/{high}" if high is not None else running
        return f"elastic {size} replicas" + (f" ({', '.join(bounds)})" if bounds else "")


def _count(workload: Workload) -> int:
    return sum(p.count for p in workload.pod_sets)


def _holds_quota(workload: Workload) -> bool:
    return (
        workload.is_true("Admitted")
        and not workload.is_true("Finished")
        and not workload.is_true("Evicted")
    )


def job_of(workload: Workload) -> JobKey | None:
    """The elastic job a Workload belongs to: its HyperPodPyTorchJob owner, or the Job owning a
    Kueue elastic slice. None for every other Workload."""
    kind, _, name = workload.owner.partition("/")
    if kind == HYPERPOD_KIND and name:
        return (workload.namespace, HYPERPOD_KIND, name)
    if (workload.elastic or workload.slice_name) and name:
        return (workload.namespace, kind or KUEUE_JOB_KIND, name)
    return None


class ElasticBook:
    """Every elastic job, its scale events and size history; the counters they feed."""

    def __init__(self) -> None:
        self.jobs: dict[JobKey, JobState] = {}
        self._by_uid: dict[str, JobKey] = {}
        self._event_of: dict[tuple[str, str], ScaleEvent] = {}  # (workload uid, dir) -> event
        self._unsettled: deque[ScaleEvent] = deque()
        self._next_id = 0
        self.events_total: Counter[tuple[str, str, str]] = Counter()  # (dir, cause, cq)
        self.failures_total: Counter[tuple[str, str]] = Counter()  # (cq, phase)
        self.phase_buckets: dict[str, list[int]] = {p: [0] * len(PHASE_BUCKETS) for p in PHASES[1:]}
        self.phase_sum: dict[str, float] = dict.fromkeys(PHASES[1:], 0.0)
        self.phase_count: Counter[str] = Counter()
        self.hyperpod_served = False  # the HyperPodPyTorchJob kind has listed at least once
        # Built from a dump (`topowatch explain --from`): a job object the dump lacks is "not in
        # the dump", never a job that does not exist.
        self.from_dump = False
        self.pods_unseen = ""  # why no job's pods are known (a dump without pods)
        self._rebuilding = False  # judging Workloads from their state, not their changes
        # Told of every scale event opened (the history feed writes it as its phases fill in).
        self.on_event: Callable[[ScaleEvent], None] | None = None

    # --- lookups --------------------------------------------------------------------------

    def by_uid(self, uid: str) -> JobState | None:
        key = self._by_uid.get(uid)
        return self.jobs.get(key) if key is not None else None

    def named(self, namespace: str, name: str) -> list[JobState]:
        return [j for j in self.jobs.values() if j.namespace == namespace and j.name == name]

    def for_workload(self, workload: Workload) -> JobState | None:
        key = job_of(workload)
        return self.jobs.get(key) if key is not None else None

    def events(self) -> Iterator[ScaleEvent]:
        for job in self.jobs.values():
            yield from job.events

    # --- HyperPodPyTorchJob ---------------------------------------------------------------

    def on_hyperpod_job(
        self, key: tuple[str, str], spec: ElasticJob | None, now: float, live: bool
    ) -> JobState | None:
        """A HyperPodPyTorchJob added, changed or (spec None) deleted."""
        job_key = (key[0], HYPERPOD_KIND, key[1])
        if spec is None:
            job = self.jobs.get(job_key)
            if job is not None:
                # One informer per kind: the job's watch has no order against its Workloads',
                # so an eviction Kueue made while the job was elastic can arrive after the
                # job's deletion (its owner deleting it right after a preemption). The job was
                # elastic then; its deletion does not undo that: an owned Workload evicted
                # with reason Preempted is still a scale-down (issue 16; reference 1.7). Its
                # Workloads' own deletions that follow are the garbage collector's, not scale
                # events (`_derives` reads the live spec only).
                job.deleted_elastic = job.spec is not None and job.spec.elastic
                job.spec = None
                job.problems.pop("spec", None)
                self._check_owner(job)
                self._forget_if_empty(job)
            return None
        job = self._job(job_key)
        old = job.spec
        job.spec = spec
        job.unseen = ""
        job.deleted_elastic = False
        if spec.uid:
            job.uid = spec.uid
            self._by_uid[spec.uid] = job_key
        job.problems.pop("owner", None)
        if spec.problems:
            job.problems["spec"] = "; ".join(spec.problems)
        else:
            job.problems.pop("spec", None)
        if old is not None and spec.generation > old.generation:
            job.generation_changed = now
        derive = spec.elastic and not job.derived
        if derive:
            self._derive(job, now)
        self._settle_from_status(job, old, spec, now)
        self._advance(job, now, live and not derive)  # judged from their state: evidence only
        return job

    def _derive(self, job: JobState, now: float) -> None:
        """The job's spec says it is elastic: judge the Workloads that arrived before it, each
        as first seen (the same rules as a first list), in the order they were created."""
        job.derived = True
        self._rebuilding = True
        try:
            for workload in sorted(
                job.workloads.values(), key=lambda w: (_created(w, now), w.name)
            ):
                live = job.live_seen.get(workload.name, False)
                self._hyperpod_workload(job, None, workload, 0, now, live)
        finally:
            self._rebuilding = False
        self._refresh_first_seen(job, now)
        if not all(job.live_seen.values()):
            self._history_sizes(job)

    def _settle_from_status(
        self, job: JobState, old: ElasticJob | None, spec: ElasticJob, now: float
    ) -> None:
        if old is not None and spec.consecutive_failures > old.consecutive_failures:
            open_up = [e for e in job.events if e.direction == "up" and not e.done]
            if open_up:
                self._fail(open_up[-1], "the operator counted a scaling failure", now)
        if spec.faulty_scale_down:
            for event in job.events:
                if event.direction == "down" and not event.cause:
                    self._settle(event, "faulty_pod")

    # --- Workloads ------------------------------------------------------------------------

    def on_workload(
        self,
        old: Workload | None,
        new: Workload | None,
        cluster_queue: str,
        flavor: str,
        now: float,
        live: bool,
        evidence: Evidence | None = None,
    ) -> JobState | None:
        """A Workload added, changed or (new None) deleted; returns its elastic job, if any.
        `evidence` is what its status keeps of past admissions (parse.hyperpod)."""
        current = new if new is not None else old
        if current is None:
            return None
        job_key = job_of(current)
        if job_key is None:
            return None
        job = self._job(job_key)
        if cluster_queue:
            job.cluster_queue = cluster_queue
        if flavor:
            job.flavor = flavor
        if current.owner_uid and not job.uid:
            job.uid = current.owner_uid
            self._by_uid[job.uid] = job_key
        for pod_set in current.pod_sets:
            if pod_set.gpus_per_pod:
                job.gpus_seen_per_replica = pod_set.gpus_per_pod
        if new is None:
            if _derives(job):
                self._lost(job, current, now, live)
            elif job.deleted_elastic:  # the garbage collector's: no scale-down, but a
                self._withdrawn(current, now)  # scale-up still open never will be admitted
            job.workloads.pop(current.name, None)
            job.live_seen.pop(current.name, None)
            job.evidence.pop(current.name, None)
            job.first_seen.pop((current.name, "up"), None)
            job.first_seen.pop((current.name, "down"), None)
            self._forget_if_empty(job)
            return job if job.key in self.jobs else None
        before = job.admitted
        job.workloads[new.name] = new
        job.live_seen.setdefault(new.name, live)
        if evidence is not None:
            job.evidence[new.name] = evidence
        self._check_owner(job)
        if job.kind == HYPERPOD_KIND:
            if job.elastic or job.deleted_elastic:
                job.derived = True
                self._hyperpod_workload(job, old, new, before, now, live)
            # Not elastic: no scale events. Spec unseen: judged once it is (_derive).
        else:
            job.derived = True
            self._slice_workload(job, old, new, before, now, live)
        if not live:
            self._refresh_first_seen(job, now)
        self._advance(job, now, live)
        if not live:
            self._history_sizes(job)
        return job

    def _hyperpod_workload(
        self,
        job: JobState,
        old: Workload | None,
        new: Workload,
        before: int,
        now: float,
        live: bool,
    ) -> None:
        if old is None:
            self._maybe_scale_up(job, new, now, live)
        evicted = new.condition("Evicted")
        if (
            evicted is not None
            and evicted.status == "True"
            and (old is None or not old.is_true("Evicted"))
        ):
            if old is not None:  # watched: it held quota if the version before did
                held = _holds_quota(old)
                start = before
            else:  # first seen evicted: its status says whether it held quota
                held = self._held_quota(job, new)
                at = evicted.last_transition
                start = self._holding_at(job, new, at if at is not None else now) + _count(new)
            self._evicted(job, new, evicted.reason, held, now, live)
            if held:
                time = evicted.last_transition or now
                cause = "preemption" if evicted.reason == "Preempted" else ""
                event = self._down(
                    job,
                    new,
                    start,
                    start - _count(new),
                    cause,
                    time,
                    live,
                    episode=str(evicted.last_transition or ""),
                )
                if old is None and event is not None:
                    job.first_seen[(new.name, "down")] = event

    def _refresh_first_seen(self, job: JobState, now: float) -> None:
        """Recount the sizes of events rebuilt from a first list now that more of the job's
        Workloads are known: the replicas the older ones held when a scale-up was asked for,
        and those the others held when an eviction took one away."""
        for (name, direction), event in job.first_seen.items():
            workload = job.workloads.get(name)
            if event.live or workload is None:
                continue
            count = _count(workload)
            if direction == "up":
                start = self._holding_at(job, workload, event.time, older_only=True)
                event.from_replicas, event.to_replicas = start, start + count
            else:
                start = self._holding_at(job, workload, event.time) + count
                event.from_replicas, event.to_replicas = start, max(0, start - count)

    def _maybe_scale_up(self, job: JobState, new: Workload, now: float, live: bool) -> None:
        """A scale-up is any owned Workload created after another of the job's, from the
        replicas the older ones held when it was created. A first list may deliver the newer
        one first: then the older one is the base, and the newer one gets its event when the
        older arrives."""
        created = _created(new, now)
        others = [w for w in job.workloads.values() if w.name != new.name]
        if any(_order(w, now) < _order(new, now) for w in others):
            start = self._holding_at(job, new, created, older_only=True)
            event = self._up(job, new, start, start + _count(new), created, live)
            job.first_seen[(new.name, "up")] = event
        for w in others:
            if (w.uid, "up") in self._event_of or w.is_true("Finished"):
                continue
            if _order(w, now) > _order(new, now):
                at = _created(w, now)
                start = self._holding_at(job, w, at, older_only=True)
                seen_live = job.live_seen.get(w.name, live)
                job.first_seen[(w.name, "up")] = self._up(
                    job, w, start, start + _count(w), at, seen_live
                )
                self._late_eviction(job, w, now)

    def _late_eviction(self, job: JobState, workload: Workload, now: float) -> None:
        """A newer Workload judged after an older one arrived: if it is already evicted, its
        event ends as a first-seen eviction's does."""
        evicted = workload.condition("Evicted")
        if evicted is not None and evicted.status == "True":
            held = self._held_quota(job, workload)
            self._evicted(job, workload, evicted.reason, held, now, False)

    def _holding_at(
        self, job: JobState, workload: Workload, at: float, older_only: bool = False
    ) -> int:
        """Replicas the job's other Workloads held at `at`, from their status: one holding quota
        now held it then if it was created by then (with `older_only`, before `workload`); one
        evicted after `at` held it until then."""
        total = 0
        for other in job.workloads.values():
            if other.name == workload.name:
                continue
            if older_only and _order(other, at) >= _order(workload, at):
                continue
            if _created(other, at) > at:
                continue
            if _holds_quota(other):
                total += _count(other)
                continue
            evicted = other.condition("Evicted")
            if (
                evicted is not None
                and evicted.status == "True"
                and evicted.last_transition is not None
                and evicted.last_transition > at
                and self._held_quota(job, other)
            ):
                total += _count(other)
        return total

    def _held_quota(self, job: JobState, workload: Workload) -> bool:
        """Whether the Workload held quota before its eviction, by its status alone."""
        admitted, _ = self._admitted_at(job, workload)
        evicted = workload.condition("Evicted")
        return admitted or (
            evicted is not None and evicted.status == "True" and evicted.reason == "Preempted"
        )

    def _admitted_at(self, job: JobState, workload: Workload | None) -> tuple[bool, float | None]:
        """(admitted ever, when): see the module's "Evidence" rules."""
        if workload is None:
            return False, None
        cond = workload.condition("Admitted")
        if cond is not None and cond.status == "True":
            return True, cond.last_transition
        seconds, evictions = job.evidence.get(workload.name, (None, None))
        if cond is None and not seconds:
            return False, None
        one_cycle = (
            evictions == 1
        ) or (  # a HyperPod scale-up is deleted after its one eviction (1.4)
            job.kind == HYPERPOD_KIND
            and evictions is None
            and (workload.uid, "up") in self._event_of
        )
        if (
            seconds is not None
            and one_cycle
            and cond is not None
            and cond.status == "False"
            and cond.last_transition is not None
        ):
            return True, cond.last_transition - seconds
        return True, None

    def _evicted(
        self, job: JobState, workload: Workload, reason: str, held: bool, now: float, live: bool
    ) -> None:
        """A scale-up Workload evicted: failed if before its pods were Ready (seen live: the
        README's rule), else ended; first seen evicted, what its pods reached is unknown."""
        event = self._event_of.get((workload.uid, "up"))
        if event is None or event.done:
            return
        what = "preempted" if reason == "Preempted" else f"evicted ({reason})"
        if held and "admitted" not in event.phases:
            _, at = self._admitted_at(job, workload)
            self._reach(event, "admitted", at)
        if not held:
            self._fail(event, f"{what} before admitted", now)
        elif "ready" in event.phases:
            event.ended = f"{what} after {event.last_phase}"
        elif live and not self._rebuilding:
            self._fail(event, f"{what} before its pods were Ready", now)
        else:
            event.ended = (
                f"{what} after admitted (its pods are gone: whether they were scheduled and "
                "Ready is unknown)"
            )

    def _slice_workload(
        self,
        job: JobState,
        old: Workload | None,
        new: Workload,
        before: int,
        now: float,
        live: bool,
    ) -> None:
        if new.replacement_for:
            if new.replacement_for == f"{new.namespace}/{new.name}":
                job.problems["slice"] = f"slice {new.name} names itself as the slice it replaces"
                return
            if old is None or not old.replacement_for:
                _, _, replaced = new.replacement_for.partition("/")
                was = job.workloads.get(replaced)
                start = _count(was) if was is not None else None
                created = new.created if new.created is not None else now
                self._up(job, new, start, _count(new), created, live, cause="user_change")
        if old is not None and _holds_quota(new) and _count(new) < _count(old):
            self._down(job, new, _count(old), _count(new), "user_change", now, live, tag="resize")
        evicted = new.condition("Evicted")
        if (
            evicted is not None
            and evicted.status == "True"
            and (old is None or not old.is_true("Evicted"))
        ):
            held = _holds_quota(old) if old is not None else self._held_quota(job, new)
            self._evicted(job, new, evicted.reason, held, now, live)
            if held and evicted.reason == "Preempted":  # the whole Job goes: Kueue evicts it
                time = evicted.last_transition or now
                self._down(
                    job,
                    new,
                    _count(new),
                    0,
                    "preemption",
                    time,
                    live,
                    episode=str(evicted.last_transition or ""),
                )

    def _lost(self, job: JobState, gone: Workload, now: float, live: bool) -> None:
        self._withdrawn(gone, now)
        if job.kind == HYPERPOD_KIND and _holds_quota(gone):
            before = job.admitted
            cause = "faulty_pod" if job.spec is not None and job.spec.faulty_scale_down else ""
            changed = job.generation_changed
            if not cause and changed is not None and now - changed <= USER_CHANGE_WINDOW_S:
                cause = "user_change"
            if not cause and _base_preempted(job, gone, now):
                # 1.4: "Kueue preempts one, operator signals, deletes those pods and removes
                # the corresponding Workload object": the job's base Workload was preempted.
                cause = "preemption"
            self._down(job, gone, before, before - _count(gone), cause, now, live)

    def _withdrawn(self, gone: Workload, now: float) -> None:
        """The Workload is deleted: its scale-up, if still open, failed at the phase it had
        not reached."""
        event = self._event_of.get((gone.uid, "up"))
        if event is not None and not event.done:
            phase = event.next_phase
            why = "withdrawn before admission" if phase == "admitted" else f"deleted before {phase}"
            self._fail(event, why, now)

    def _check_owner(self, job: JobState) -> None:
        """Why a HyperPod job's spec is unknown: a dump without it, a kind not listed yet (not
        problems), or a job the listed kind does not have (a problem: "unknown")."""
        if job.kind != HYPERPOD_KIND or job.spec is not None:
            return
        if self.from_dump:
            job.unseen = NOT_IN_DUMP
        elif self.hyperpod_served:
            job.problems["owner"] = (
                f"its Workloads name owner {HYPERPOD_KIND}/{job.name}, which does not exist"
            )
        else:
            job.unseen = NOT_LISTED

    def dump_lacks(self, kinds: Iterable[str]) -> None:
        """This book is built from a dump (`topowatch explain --from`) holding no object of
        `kinds`: a job object it lacks is "not in the dump"; without Pods, no job's running
        replicas are known (never 0)."""
        self.from_dump = True
        self.pods_unseen = "the dump holds no pods" if "Pod" in set(kinds) else ""

    def owners_listed(self) -> None:
        """The HyperPodPyTorchJob kind listed: from now on a missing owner is a problem."""
        self.hyperpod_served = True
        for job in self.jobs.values():
            self._check_owner(job)

    # --- pods -----------------------------------------------------------------------------

    def on_pods(
        self,
        job: JobState,
        bound: int,
        ready_times: tuple[float, ...],
        now: float,
        live: bool = True,
        by_workload: Mapping[str, tuple[int, tuple[float, ...]]] | None = None,
    ) -> None:
        """The job's pods changed (`ready_times`: its Ready pods' Ready times, sorted;
        `by_workload`: the same per Workload its pods name): phases advance, the size history
        grows (live) or is rebuilt from the objects (a first list)."""
        ready = len(ready_times)
        grew = ready > job.ready
        job.bound, job.ready, job.ready_times = bound, ready, ready_times
        if by_workload is not None:
            job.by_workload = by_workload
        if live:
            last = job.live_sizes[-1] if job.live_sizes else None
            if last is None and job.history_sizes:
                last = job.history_sizes[-1]
            if last is None or last[1] != ready:
                at = ready_times[-1] if grew and ready_times else now
                if last is not None:
                    at = max(at, last[0])
                if job.live_sizes and job.live_sizes[-1][0] == at:
                    job.live_sizes[-1] = (at, ready)  # one moment, one size
                else:
                    job.live_sizes.append((at, ready))
        else:
            self._history_sizes(job)
        self._advance(job, now, live)

    def _history_sizes(self, job: JobState) -> None:
        """The size history a first list's objects show: each Ready pod from its Ready time,
        and each evicted Workload's replicas from its admission to its eviction (its pods are
        gone, but its status says when it held them)."""
        steps: list[tuple[float, int]] = [(t, 1) for t in job.ready_times]
        for workload in job.workloads.values():
            evicted = workload.condition("Evicted")
            if evicted is None or evicted.status != "True" or evicted.last_transition is None:
                continue
            if workload.is_true("Admitted"):  # quota not yet released: its pods are counted
                continue
            admitted, at = self._admitted_at(job, workload)
            if not admitted or at is None or at > evicted.last_transition:
                continue
            steps += [(at, _count(workload)), (evicted.last_transition, -_count(workload))]
        steps.sort()
        sizes: list[tuple[float, int]] = []
        total = 0
        for at, delta in steps:
            total += delta
            if sizes and sizes[-1][0] == at:
                sizes[-1] = (at, total)
            else:
                sizes.append((at, total))
        job.history_sizes = sizes[-SIZES_PER_JOB:]

    # --- time -----------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Settle scale-downs whose cause no status explained within SETTLE_S."""
        while self._unsettled and now - self._unsettled[0].time >= SETTLE_S:
            event = self._unsettled.popleft()
            if not event.cause:
                self._settle(event, "unknown")

    # --- events ---------------------------------------------------------------------------

    def _up(
        self,
        job: JobState,
        workload: Workload,
        start: int | None,
        end: int | None,
        time: float,
        live: bool,
        cause: str = "",
    ) -> ScaleEvent:
        known = self._event_of.get((workload.uid, "up"))
        if known is not None:
            return known
        if not cause:
            recent = job.generation_changed
            cause = (
                "user_change"
                if recent is not None and 0 <= time - recent <= USER_CHANGE_WINDOW_S
                else "capacity_freed"
            )
        event = self._new(job, (workload.uid, "up"), start, end, workload.name, time, live)
        event.phases["requested"] = time
        self._settle(event, cause)
        return event

    def _down(
        self,
        job: JobState,
        workload: Workload,
        start: int,
        end: int,
        cause: str,
        time: float,
        live: bool,
        tag: str = "down",
        episode: str = "",
    ) -> ScaleEvent | None:
        """One scale-down per Workload, whichever path sees it (its eviction, its deletion, a
        relist). `episode` names an eviction (its Evicted condition's transition time): a
        Workload requeued, admitted again and evicted again keeps its UID (Kueue's
        workload.go: a requeue is not a new Workload), and that second eviction is a second
        scale-down."""
        key = (f"{workload.uid}:{end}" if tag == "resize" else workload.uid, "down")
        if key in self._event_of and episode:
            key = (f"{workload.uid}@{episode}", "down")
        if key in self._event_of:
            return None
        event = self._new(job, key, start, max(0, end), workload.name, time, live)
        if cause:
            self._settle(event, cause)
        else:
            self._unsettled.append(event)
        return event

    def _new(
        self,
        job: JobState,
        key: tuple[str, str],
        start: int | None,
        end: int | None,
        workload: str,
        time: float,
        live: bool,
    ) -> ScaleEvent:
        self._next_id += 1
        event = ScaleEvent(
            self._next_id,
            job.key,
            key[1],
            start,
            end,
            "",
            workload,
            time,
            job.cluster_queue,
            live,
            dedupe=key,
        )
        if len(job.events) == job.events.maxlen:  # the oldest leaves the ledger: forget its key
            self._event_of.pop(job.events[0].dedupe, None)
        job.events.append(event)
        self._event_of[key] = event
        if self.on_event is not None:
            self.on_event(event)
        return event

    def _settle(self, event: ScaleEvent, cause: str) -> None:
        event.cause = cause
        if event.live and not event.counted:
            event.counted = True
            self.events_total[(event.direction, cause, event.cluster_queue)] += 1

    def _fail(self, event: ScaleEvent, why: str, now: float) -> None:
        if event.failed or event.ended:
            return
        event.failed = why
        event.failed_phase = event.next_phase
        if event.live:
            self.failures_total[(event.cluster_queue, _failure_phase(event.failed_phase))] += 1

    def _reach(self, event: ScaleEvent, phase: str, at: float | None) -> None:
        """`at` None: reached at a time no object records (a first list's evidence)."""
        if phase in event.phases or event.failed:
            return
        if at is not None:
            start = event.phases.get("requested")
            at = max(at, start if start is not None else at)
        was_done = event.done
        event.phases[phase] = at
        if event.live and event.direction == "up" and at is not None:
            seconds = event.seconds_to(phase) or 0.0
            self.phase_sum[phase] += seconds
            self.phase_count[phase] += 1
            buckets = self.phase_buckets[phase]
            for i, bound in enumerate(PHASE_BUCKETS):
                if seconds <= bound:
                    buckets[i] += 1
        if was_done and self.on_event is not None:  # a done event's row is written again
            self.on_event(event)

    def _advance(self, job: JobState, now: float, live: bool = True) -> None:
        """Move every open scale-up of the job through the phases the facts allow; give the
        operator's latest restart to the scale event it belongs to."""
        for event in job.events:
            if event.direction != "up" or event.done:
                continue
            workload = job.workloads.get(event.workload)
            if "admitted" not in event.phases:
                admitted, at = self._admitted_at(job, workload)
                if not admitted or (workload is not None and not _holds_quota(workload)):
                    continue
                self._reach(event, "admitted", at if at is not None or not live else now)
            want = event.to_replicas
            if want is None:
                continue
            # The job at its new size, or else the scale-up's own pods (the README's rule is
            # about its pods: an older replica lost meanwhile does not hold its phases back).
            own_bound, own_ready = job.by_workload.get(event.workload, (0, ()))
            own = _pod_count(workload)
            if "scheduled" not in event.phases:
                if job.bound < want and not (own and own_bound >= own):
                    continue
                self._reach(event, "scheduled", now if live else None)
            if "ready" not in event.phases:
                if job.ready >= want:
                    self._reach(event, "ready", job.ready_times[want - 1])
                elif own and len(own_ready) >= own:
                    self._reach(event, "ready", own_ready[own - 1])
                else:
                    continue
            if job.kind == HYPERPOD_KIND and "restarted" not in event.phases:
                self._restarted(job, event)
        if job.kind == HYPERPOD_KIND:
            self._restarted_down(job)

    def _restarted(self, job: JobState, event: ScaleEvent) -> None:
        """A scale-up was restarted at its new size by the restart the status records if that
        came after its pods were Ready at a target holding its replicas; the restart is its
        own only if no later scale event came between (else it restarted earlier, untimed)."""
        spec = job.spec
        if spec is None or spec.last_restart is None or event.to_replicas is None:
            return
        ready = event.phases.get("ready")
        if ready is None or spec.last_restart + READY_SLACK_S < ready:
            return
        if spec.target is not None and spec.target < event.to_replicas:
            return
        later = any(
            other is not event and event.time < other.time <= spec.last_restart + READY_SLACK_S
            for other in job.events
        )
        self._reach(event, "restarted", None if later else spec.last_restart)

    def _restarted_down(self, job: JobState) -> None:
        """The latest restart after a scale-down, with no scale event between, is the job
        restarting at its smaller size (1.4: the operator signals, then restarts)."""
        spec = job.spec
        if spec is None or spec.last_restart is None or not job.events:
            return
        restart = spec.last_restart + READY_SLACK_S
        times = [e.time for e in job.events if e.time <= restart]
        if not times:
            return
        newest = max(times)
        for event in job.events:
            if event.direction == "down" and event.time == newest:
                self._reach(event, "restarted", max(spec.last_restart, event.time))

    # --- bookkeeping ----------------------------------------------------------------------

    def _job(self, key: JobKey) -> JobState:
        job = self.jobs.get(key)
        if job is None:
            job = self.jobs[key] = JobState(key[0], key[1], key[2])
            job.pods_unseen = self.pods_unseen
        return job

    def _forget_if_empty(self, job: JobState) -> None:
        if job.spec is None and not job.workloads:
            self.jobs.pop(job.key, None)
            if job.uid and self._by_uid.get(job.uid) == job.key:
                del self._by_uid[job.uid]
            for event in job.events:
                self._event_of.pop(event.dedupe, None)


def _derives(job: JobState) -> bool:
    """Whether the job's Workloads make scale events: a Kueue elastic Job, or a HyperPod job
    known to be elastic."""
    return job.kind != HYPERPOD_KIND or job.elastic is True


def _created(workload: Workload, now: float) -> float:
    return workload.created if workload.created is not None else now


def _order(workload: Workload, now: float) -> tuple[float, str]:
    return (_created(workload, now), workload.name)


def _failure_phase(phase: str) -> str:
    return {
        "admitted": "admission",
        "scheduled": "scheduling",
        "ready": "ready",
        "restarted": "restart",
    }.get(phase, "admission")


def _pod_count(workload: Workload | None) -> int:
    """The pods a Workload asks for (0 when unknown)."""
    return 0 if workload is None else sum(p.count for p in workload.pod_sets)


def _base_preempted(job: JobState, gone: Workload, now: float) -> bool:
    """Whether the job's base Workload (its earliest, the minimum it first asked for) is held
    out of quota by a preemption Kueue made: the scale-up Workloads it then removes go because
    of that preemption."""
    others = [w for name, w in job.workloads.items() if name != gone.name]
    if not others:
        return False
    base = min(others, key=lambda w: _order(w, now))
    evicted = base.condition("Evicted")
    return (
        evicted is not None
        and evicted.status == "True"
        and evicted.reason == "Preempted"
        and not _holds_quota(base)
    )
