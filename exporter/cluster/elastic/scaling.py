"""Elastic jobs and their scale events, derived from the objects a watcher sees.

Neither HyperPod's training operator nor Kueue publishes scale events, so they are derived,
like the preemption ledger, from what changes (reference/hyperpod/elastic-training-and-deep-
health.md, 1.4 to 1.7):

- **HyperPod** (`HyperPodPyTorchJob`, several admitted Workloads per job, one per world-size
  increment): a Workload owned by the job created while an older one exists is a scale-up;
  its phases are requested (Workload created) → admitted (its Admitted condition) → scheduled
  (the job has that many pods bound) → ready (that many pods Ready) → restarted (the operator's
  `lastRestartTime` after the pods were ready: the job restarted at the new world size).
  An owned Workload evicted with reason Preempted is a scale-down caused by preemption; one
  deleted while admitted is a scale-down whose cause the job's status settles:
  `isFaultyPodScaleDown` → faulty pod, a new `metadata.generation` → user change, else unknown.
  A scale-up Workload deleted before admission, or evicted before its pods were ready, failed.
- **Kueue** elastic Jobs (ElasticJobsViaWorkloadSlices): a Workload with
  `workload-slice-replacement-for` is a scale-up from the replaced slice's size; it is done
  when that many pods are Ready (a batch Job does not restart). Kueue scales down by lowering
  the count of the Workload in place (elastic_workload.md), which is a scale-down here. Slices
  are resized by changing the Job's parallelism, so their cause is a user change.

Counting is restart-safe as the preemption counters are: only events that happened while
this process watched (`live`) are counted; history rebuilt from a first list is kept in the
ledger, uncounted, and the same Workload never makes two events.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterator
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

JobKey = tuple[str, str, str]  # (namespace, kind, name)


@dataclass(slots=True)
class ScaleEvent:
    """One resize of an elastic job. Phase times are Unix seconds."""

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
    phases: dict[str, float] = field(default_factory=dict)
    failed: str = ""  # why it failed, "" when it did not
    failed_phase: str = ""  # the phase it never reached
    counted: bool = False
    dedupe: tuple[str, str] = ("", "")  # its key in ElasticBook._event_of

    @property
    def done(self) -> bool:
        if self.direction == "down" or self.failed:
            return True
        last = "restarted" if self.job[1] == HYPERPOD_KIND else "ready"
        return last in self.phases

    @property
    def next_phase(self) -> str:
        for phase in PHASES:
            if phase not in self.phases:
                return phase
        return ""

    def seconds_to(self, phase: str) -> float | None:
        at = self.phases.get(phase)
        return None if at is None else max(0.0, at - self.phases.get("requested", self.time))


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
    events: deque[ScaleEvent] = field(default_factory=lambda: deque(maxlen=EVENTS_PER_JOB))
    sizes: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=SIZES_PER_JOB))
    problems: dict[str, str] = field(default_factory=dict)  # source -> why its size is unknown
    generation_changed: float | None = None
    gpus_seen_per_replica: int = 0

    @property
    def key(self) -> JobKey:
        return (self.namespace, self.kind, self.name)

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
        return "; ".join(self.problems[k] for k in sorted(self.problems))

    @property
    def absorbed_replicas(self) -> int:
        """Replicas running above the minimum: capacity the job took that would be idle."""
        low = self.min_replicas
        if low is None or self.unknown:
            return 0
        return max(0, self.ready - low)

    def summary(self) -> str:
        """ "elastic 3/8 replicas (min 2, target 4)" or "elastic: unknown: <why>"."""
        if self.unknown:
            return f"elastic {self.kind} {self.name}: unknown: {self.unknown}"
        high = self.max_replicas
        bounds = []
        if self.min_replicas is not None:
            bounds.append(f"min {self.min_replicas}")
        if self.target is not None:
            bounds.append(f"target {self.target}")
        if self.kind != HYPERPOD_KIND:
            bounds.append(f"{self.admitted} admitted")
        size = f"{self.ready}/{high}" if high is not None else f"{self.ready}"
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
                job.spec = None
                job.problems.pop("spec", None)
                self._forget_if_empty(job)
            return None
        job = self._job(job_key)
        old = job.spec
        job.spec = spec
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
        self._settle_from_status(job, old, spec, now)
        self._advance(job, now)
        return job

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
    ) -> JobState | None:
        """A Workload added, changed or (new None) deleted; returns its elastic job, if any."""
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
            self._lost(job, current, now, live)
            job.workloads.pop(current.name, None)
            self._forget_if_empty(job)
            return job if job.key in self.jobs else None
        before = job.admitted
        job.workloads[new.name] = new
        self._check_owner(job)
        if job.kind == HYPERPOD_KIND:
            self._hyperpod_workload(job, old, new, before, now, live)
        else:
            self._slice_workload(job, old, new, now, live)
        self._advance(job, now)
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
            self._maybe_scale_up(job, new, before, now, live)
        event = self._event_of.get((new.uid, "up"))
        evicted = new.condition("Evicted")
        if (
            evicted is not None
            and evicted.status == "True"
            and (old is None or not old.is_true("Evicted"))
        ):
            if event is not None and not event.done:
                self._fail(event, f"evicted ({evicted.reason}) before ready", now)
            if (old is not None and _holds_quota(old)) or (old is None and new.is_true("Admitted")):
                time = evicted.last_transition or now
                cause = "preemption" if evicted.reason == "Preempted" else ""
                self._down(job, new, before, before - _count(new), cause, time, live)

    def _maybe_scale_up(
        self, job: JobState, new: Workload, before: int, now: float, live: bool
    ) -> None:
        """A scale-up is any owned Workload created after another the job still has. A first
        list may deliver the newer one first: then the older one is the base, and the newer
        one gets its event when the older arrives."""
        created = new.created if new.created is not None else now
        others = [w for w in job.workloads.values() if w.name != new.name]
        older = [w for w in others if _created(w, now) < created or (
            _created(w, now) == created and w.name < new.name)]  # fmt: skip
        if older:
            self._up(job, new, before, before + _count(new), created, live)
        for w in others:
            if (w.uid, "up") in self._event_of or w.is_true("Finished"):
                continue
            if _created(w, now) > created or (_created(w, now) == created and w.name > new.name):
                base = job.admitted - (_count(w) if _holds_quota(w) else 0)
                self._up(job, w, base, base + _count(w), _created(w, now), live)

    def _slice_workload(
        self, job: JobState, old: Workload | None, new: Workload, now: float, live: bool
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

    def _lost(self, job: JobState, gone: Workload, now: float, live: bool) -> None:
        event = self._event_of.get((gone.uid, "up"))
        if event is not None and not event.done:
            phase = event.next_phase
            why = "withdrawn before admission" if phase == "admitted" else f"deleted before {phase}"
            self._fail(event, why, now)
        if job.kind == HYPERPOD_KIND and _holds_quota(gone):
            before = job.admitted
            cause = "faulty_pod" if job.spec is not None and job.spec.faulty_scale_down else ""
            changed = job.generation_changed
            if not cause and changed is not None and now - changed <= USER_CHANGE_WINDOW_S:
                cause = "user_change"
            self._down(job, gone, before, before - _count(gone), cause, now, live)

    def _check_owner(self, job: JobState) -> None:
        if job.kind == HYPERPOD_KIND and self.hyperpod_served and job.spec is None:
            job.problems["owner"] = (
                f"its Workloads name owner {HYPERPOD_KIND}/{job.name}, which does not exist"
            )

    def owners_listed(self) -> None:
        """The HyperPodPyTorchJob kind listed: from now on a missing owner is a problem."""
        self.hyperpod_served = True
        for job in self.jobs.values():
            self._check_owner(job)

    # --- pods -----------------------------------------------------------------------------

    def on_pods(self, job: JobState, bound: int, ready: int, ready_at: float, now: float) -> None:
        """The job's pod counts changed: phases advance, the size history grows."""
        job.bound, job.ready = bound, ready
        if not job.sizes or job.sizes[-1][1] != ready:
            job.sizes.append((ready_at if ready_at > 0 else now, ready))
        self._advance(job, now, ready_at)

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
    ) -> None:
        if (workload.uid, "up") in self._event_of:
            return
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
    ) -> None:
        key = (f"{workload.uid}:{end}" if tag == "resize" else workload.uid, "down")
        if key in self._event_of:
            return
        event = self._new(job, key, start, max(0, end), workload.name, time, live)
        if cause:
            self._settle(event, cause)
        else:
            self._unsettled.append(event)

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
        if event.failed:
            return
        event.failed = why
        event.failed_phase = event.next_phase
        if event.live:
            self.failures_total[(event.cluster_queue, _failure_phase(event.failed_phase))] += 1

    def _reach(self, event: ScaleEvent, phase: str, at: float) -> None:
        if phase in event.phases or event.failed:
            return
        event.phases[phase] = max(at, event.phases.get("requested", at))
        if event.live:
            seconds = event.seconds_to(phase) or 0.0
            self.phase_sum[phase] += seconds
            self.phase_count[phase] += 1
            buckets = self.phase_buckets[phase]
            for i, bound in enumerate(PHASE_BUCKETS):
                if seconds <= bound:
                    buckets[i] += 1

    def _advance(self, job: JobState, now: float, ready_at: float = 0.0) -> None:
        """Move every open scale-up of the job through the phases the facts allow."""
        for event in job.events:
            if event.direction != "up" or event.done:
                continue
            workload = job.workloads.get(event.workload)
            admitted = workload.condition("Admitted") if workload is not None else None
            if "admitted" not in event.phases:
                if admitted is None or admitted.status != "True":
                    continue
                self._reach(event, "admitted", admitted.last_transition or now)
            want = event.to_replicas
            if want is None:
                continue
            if "scheduled" not in event.phases:
                if job.bound < want:
                    continue
                self._reach(event, "scheduled", now)
            if "ready" not in event.phases:
                if job.ready < want:
                    continue
                self._reach(event, "ready", ready_at or now)
            if job.kind == HYPERPOD_KIND and "restarted" not in event.phases:
                spec = job.spec
                if spec is None or spec.last_restart is None:
                    continue
                if spec.last_restart + READY_SLACK_S < event.phases["ready"]:
                    continue
                if spec.target is not None and spec.target < want:
                    continue
                self._reach(event, "restarted", spec.last_restart)

    # --- bookkeeping ----------------------------------------------------------------------

    def _job(self, key: JobKey) -> JobState:
        job = self.jobs.get(key)
        if job is None:
            job = self.jobs[key] = JobState(key[0], key[1], key[2])
        return job

    def _forget_if_empty(self, job: JobState) -> None:
        if job.spec is None and not job.workloads:
            self.jobs.pop(job.key, None)
            if job.uid and self._by_uid.get(job.uid) == job.key:
                del self._by_uid[job.uid]
            for event in job.events:
                self._event_of.pop(event.dedupe, None)


def _created(workload: Workload, now: float) -> float:
    return workload.created if workload.created is not None else now


def _failure_phase(phase: str) -> str:
    return {
        "admitted": "admission",
        "scheduled": "scheduling",
        "ready": "ready",
        "restarted": "restart",
    }.get(phase, "admission")
