"""One job's life as the goodput ledger keeps it: its phase at every moment, and its stops.

A job is what its Workloads belong to: their owner (a batch Job, a HyperPodPyTorchJob, a
PyTorchJob), so a HyperPod auto-resume or a training-operator restart, even one that makes a
new Workload, continues the same job. A Workload with no owner is its own job.

From its first admission on, the job's wall time is split into phases, integer milliseconds,
closed at each change (so they add up to the wall time exactly):
- running: it has run (every pod it expects bound and Ready) and lost no Ready pod since;
- restarting: not running, pods bound but not all Ready (starting, or restarting);
- waiting: not running and no pod bound: pending in Kueue (quota, topology), or admitted and
  waiting for its pods (a node being replaced); `ettr` reports the waiting that followed a
  preemption as "preempted";
- suspended: a Workload of the job deactivated by its owner (spec.active false): time the
  owner chose to wait, left out of ETTR's denominator;
- unobserved: time no process watched (between a restart's last write and its first list).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Final

from exporter.cluster.goodput.attribution import WorkloadEvent
from exporter.core.goodput.interruptions import Interruption, JobKey, job_id

PHASES: Final = ("running", "restarting", "waiting", "suspended", "unobserved")
UNCOUNTED: Final = frozenset({"queued", "finished"})
MAX_WORKLOAD_EVENTS: Final = 64


@dataclass(slots=True)
class PodFact:
    """What the ledger keeps of one pod."""

    job: JobKey | None
    node: str
    gpus: int
    ready: bool
    holds: bool  # bound, not terminated, holds GPUs
    workload: str  # the Workload it belongs to, "" when unknown
    slot: tuple[str, str] | None = None  # (team, category) its GPUs count under on its node
    # What its job was found from (`GoodputBook._job_of_pod`): the pod's phase and owners,
    # and the epoch of the book's job maps then (a pod event that changes none of them, at
    # the same epoch, finds the same job without looking).
    phase: str = ""
    owner: str = ""
    owner_uid: str = ""
    job_uid: str = ""
    epoch: int = -1
    # Its job's track while it is one of that track's pods (`GoodputBook._attach`), else None:
    # a pod bound anew reaches its job without a lookup by key.
    track: JobTrack | None = field(default=None, repr=False, compare=False)


@dataclass(slots=True)
class JobTrack:
    key: JobKey
    team: str = ""
    cluster_queue: str = ""
    flavor: str = ""
    gpus: int = 0
    first_admitted: float | None = None
    finished_at: float | None = None
    running: bool = False
    run_since: float | None = None  # when its current (or last) run began
    running_nodes: set[str] = field(default_factory=set)
    phase: str = "queued"
    phase_since_ms: int = 0
    phase_ms: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))
    interruptions: list[Interruption] = field(default_factory=list)
    open: int | None = None  # index of the interruption not yet resumed from
    lost: set[str] = field(default_factory=set)  # nodes of Ready pods lost while running
    pods: set[tuple[str, str]] = field(default_factory=set)
    workloads: dict[str, float] = field(default_factory=dict)  # live Workloads -> created
    workload_events: deque[WorkloadEvent] = field(
        default_factory=lambda: deque(maxlen=MAX_WORKLOAD_EVENTS)
    )
    checkpoint_at: float | None = None
    checkpoint_note: str = ""
    elastic: bool = False
    absorbing: bool = False  # an elastic job with a minimum: pods above the base absorb
    base_workload: str = ""
    ended: bool = False  # finished or every Workload deleted
    # Kept up to date as pods and Workloads change, so a pod event costs O(1):
    bound: int = 0  # its pods holding GPUs
    ready: int = 0  # those of them Ready
    expected: int = 0  # pods its admitted, unfinished, unevicted Workloads expect
    holding: int = 0  # such Workloads
    all_finished: bool = False  # it has Workloads and every one is Finished
    suspended: bool = False  # one is deactivated and none holds quota

    @property
    def namespace(self) -> str:
        return self.key[0]

    @property
    def name(self) -> str:
        return self.key[2]

    def set_phase(self, phase: str, now_ms: int) -> bool:
        """Close the current phase at `now_ms` and enter `phase`; True when it changed."""
        if phase == self.phase:
            return False
        self._close(now_ms)
        self.phase = phase
        return True

    def _close(self, now_ms: int) -> None:
        held = max(0, now_ms - self.phase_since_ms)
        if self.phase not in UNCOUNTED and held:
            self.phase_ms[self.phase] = self.phase_ms.get(self.phase, 0) + held
            if self.open is not None and self.phase in ("restarting", "waiting"):
                entry = self.interruptions[self.open]
                if self.phase == "restarting":
                    entry = replace(entry, restarting_s=entry.restarting_s + held / 1000)
                else:
                    entry = replace(entry, waiting_s=entry.waiting_s + held / 1000)
                self.interruptions[self.open] = entry
        self.phase_since_ms = max(self.phase_since_ms, now_ms)

    def phases_at(self, now_ms: int) -> dict[str, int]:
        """Milliseconds per phase, the current one counted up to `now_ms`."""
        out = dict(self.phase_ms)
        if self.phase not in UNCOUNTED and now_ms > self.phase_since_ms:
            out[self.phase] = out.get(self.phase, 0) + now_ms - self.phase_since_ms
        return out

    def open_interruption(
        self,
        now: float,
        now_ms: int,
        workload: str,
        nodes: tuple[str, ...],
    ) -> Interruption:
        """The job stopped running at `now`: a new ledger entry, unattributed yet."""
        self._close(now_ms)
        entry = Interruption(
            id=f"{job_id(self.key)}#{len(self.interruptions) + 1}",
            namespace=self.key[0],
            job_kind=self.key[1],
            job=self.key[2],
            workload=workload,
            cluster_queue=self.cluster_queue,
            team=self.team,
            flavor=self.flavor,
            gpus=self.gpus,
            nodes=nodes,
            stopped_at=now,
            checkpoint_at=self.checkpoint_at
            if self.checkpoint_at is not None and self.checkpoint_at <= now
            else None,
            run_started=self.run_since,
            checkpoint_note=self.checkpoint_note
            or (
                "checkpoint time is later than the stop"
                if self.checkpoint_at is not None and self.checkpoint_at > now
                else ""
            ),
        )
        self.interruptions.append(entry)
        self.open = len(self.interruptions) - 1
        self.running = False
        self.lost.clear()
        return entry

    def resume(self, now: float, now_ms: int) -> Interruption | None:
        """The job runs again: the open entry (if any) gets its resume time."""
        self._close(now_ms)
        self.running = True
        self.run_since = now
        index = self.open
        if index is None:
            return None
        self.open = None
        entry = self.interruptions[index]
        if not entry.counted:
            return None
        entry = replace(entry, resumed_at=now)
        self.interruptions[index] = entry
        return entry
