"""The goodput book: the one object the cluster model feeds and the surfaces read.

The model calls `observe(kind, event_type, obj, key, now)` after it applied each Node, Pod,
Workload, Event and HyperPodPyTorchJob event (`ClusterModel.observer`); the book reads the
model's parsed objects (through `ModelView`) and the raw object where the model keeps too
little (every finding of a node, a checkpoint annotation). From that it keeps, per job
(`jobs.JobTrack`), the phases and the interruption ledger, attributed by
`attribution.attribute` until settled; per node, the GPU-second ledger (`gpu_seconds`) and the
node time and hardware findings that reliability is counted from (`reliability`).

Costs per event are O(what the event touches): a pod's job, a node's pods, a Workload's job;
the attribution of the few interruptions not yet settled is redone only when evidence
changed. The common events take a short way: a status update that changes nothing read, a pod
bound to another node with nothing else changed (its GPUs move between the nodes' counts, its
job is left alone), a re-written Workload or Node equal to the one before; the GPU-second
ledger counts only what is held and what capacity there is, and works out the rest when read
(tests/cluster/goodput/test_cost_paths.py holds the short ways to the long ones' answers). The
figure is benchmarks/cluster_model.py's "goodput ledger attached", beside "its floor": the
least an observer keeping such a ledger adds. Memory is bounded: ended jobs are kept
`RETAIN_S` (and at most `MAX_JOBS` jobs), the history store keeps the rest.

Nothing here raises into the model: it guards its own calls (`ClusterModel._observe`).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Protocol

from exporter.cluster.elastic import idle
from exporter.cluster.elastic.scaling import ElasticBook
from exporter.cluster.goodput import durable
from exporter.cluster.goodput.attribution import (
    ACTION_WINDOW_S,
    SETTLE_S,
    SKEW_S,
    NodeEvent,
    PreemptionEvidence,
    ScaleDownEvidence,
    Stop,
    WorkloadEvent,
    attribute,
)
from exporter.cluster.goodput.ettr import GroupGoodput, JobGoodput, group_goodput, job_goodput
from exporter.cluster.goodput.evidence import (
    NodeFacts,
    checkpoint_from,
    checkpoint_of,
    checkpoint_values,
    node_facts,
)
from exporter.cluster.goodput.gpu_seconds import GpuSecondLedger, GpuSecondTotals, to_ms
from exporter.cluster.goodput.jobs import JobTrack, PodFact
from exporter.cluster.goodput.reliability import (
    DEFAULT_REPEAT_FINDINGS,
    DEFAULT_REPEAT_WINDOW_S,
    ReliabilityBook,
    ReliabilitySummary,
    RepeatOffender,
)
from exporter.cluster.ledger import PreemptionLedger
from exporter.cluster.objects import (
    GPU_RESOURCE,
    ClusterQueue,
    Node,
    ObjectKey,
    Pod,
    ResourceFlavor,
    Workload,
    team_of,
)
from exporter.core.goodput.interruptions import Interruption, JobKey
from exporter.store.records import GoodputRow
from exporter.topology.labels import INSTANCE_TYPE_KEY, ULTRASERVER_KEY, Placement
from exporter.topology.tree import TopologyTree

DEFAULT_CHECKPOINT_KEY: Final = "topowatch.io/last-checkpoint"
RETAIN_S: Final = 86_400.0  # an ended job stays in memory this long (the store keeps it)
MAX_JOBS: Final = 50_000
NODE_EVENTS: Final = 64
WATCH_S: Final = 6 * 3600.0  # an interruption's node is followed this long for "node back"
PRUNE_EVERY_S: Final = 600.0
SUCCESS_REASONS: Final = frozenset({"Succeeded", "JobFinished", "Completed", ""})


@dataclass(frozen=True, slots=True)
class GoodputConfig:
    checkpoint_key: str = DEFAULT_CHECKPOINT_KEY
    repeat_findings: int = DEFAULT_REPEAT_FINDINGS
    repeat_window_s: float = DEFAULT_REPEAT_WINDOW_S
    retain_s: float = RETAIN_S  # an ended job stays in memory this long (the store keeps it)
    max_jobs: int = MAX_JOBS


class HoldsWorkload(Protocol):
    @property
    def workload(self) -> Workload: ...


class ModelView(Protocol):
    """What the book reads of the cluster model (`ClusterModel` is one); it writes nothing
    there but its own `observer` slot."""

    observer: Any

    @property
    def nodes(self) -> Mapping[str, Node]: ...

    @property
    def pods(self) -> Mapping[tuple[str, str], Pod]: ...

    @property
    def workloads(self) -> Mapping[tuple[str, str], HoldsWorkload]: ...

    @property
    def flavors(self) -> Mapping[str, ResourceFlavor]: ...

    @property
    def cluster_queues(self) -> Mapping[str, ClusterQueue]: ...

    @property
    def ledger(self) -> PreemptionLedger: ...

    @property
    def elastic(self) -> ElasticBook: ...

    @property
    def tree(self) -> TopologyTree: ...

    def cluster_queue_of(self, workload: Workload | None) -> str: ...

    def node_flavor(self, name: str) -> str: ...


def job_key_of(workload: Workload) -> JobKey:
    """A Workload's job: its owner ("Kind/name"), else the Workload itself."""
    kind, _, name = workload.owner.partition("/")
    if kind and name:
        return (workload.namespace, kind, name)
    return (workload.namespace, "Workload", workload.name)


def is_pending(workload: Workload) -> bool:
    return not workload.is_true("QuotaReserved") and not workload.is_true("Finished")


def _holds(workload: Workload) -> bool:
    """Admitted and running its pods: not finished, not evicted."""
    return (
        workload.is_true("Admitted")
        and not workload.is_true("Finished")
        and not workload.is_true("Evicted")
    )


class GoodputBook:
    def __init__(self, config: GoodputConfig | None = None) -> None:
        self.config = config or GoodputConfig()
        self._model: ModelView | None = None
        self._model_pods: Mapping[tuple[str, str], Pod] = {}
        self.jobs: dict[JobKey, JobTrack] = {}
        self._pods: dict[tuple[str, str], PodFact] = {}
        self._workloads: dict[tuple[str, str], Workload] = {}
        # Each Workload's checkpoint annotation and label as written (`checkpoint_of` reads
        # nothing else of its metadata): compared, not parsed, on the hot path.
        self._checkpoints: dict[tuple[str, str], tuple[object, object]] = {}
        self._wl_job: dict[tuple[str, str], JobKey] = {}
        self._uid_job: dict[str, JobKey] = {}
        # GPU pods whose job is not known yet (their Workload not seen): by the groups a
        # Workload names them by (its key, owner UID, job UID), and the other way round.
        self._parked: dict[object, set[tuple[str, str]]] = {}
        self._parked_by_pod: dict[tuple[str, str], tuple[object, ...]] = {}
        self._facts: dict[str, NodeFacts] = {}
        self._node_events: dict[str, deque[NodeEvent]] = {}
        self._placed: dict[str, _Placed] = {}  # each node's place, and what was told of it
        self._why: dict[str, str] = {}  # why each node's free GPUs are unavailable ("": not)
        self._unsettled: list[JobKey] = []
        self._watch: dict[str, set[tuple[JobKey, str]]] = {}  # node -> (job, entry id)
        self._epoch = 0
        self._judged_epoch: dict[JobKey, int] = {}
        self._map_epoch = 0  # moves with every change of _wl_job, _uid_job, or which jobs exist
        # `tick` has work only when evidence changed (the epoch) or an entry is due to settle:
        # the epoch and the earliest settle time as of its last full pass.
        self._ticked_epoch = -1
        self._next_due = 0.0
        self.gpu_ledger = GpuSecondLedger()
        self.reliability_book = ReliabilityBook(
            self.config.repeat_findings, self.config.repeat_window_s
        )
        self._last_prune = -math.inf  # never
        self._latest = 0.0
        # Persistence: what changed since `dirty_rows` last collected.
        self.on_change: Callable[[], None] | None = None
        self._dirty_entries: set[tuple[JobKey, str]] = set()
        self._dirty_jobs: set[JobKey] = set()
        self._new_findings: list[Any] = []
        self.problems: dict[str, int] = {}
        # Interruptions that settled in this process by (cause, component, team), completions
        # left out, like `ClusterModel.preemption_counts`: topowatch_interruptions_total.
        self.interruptions_total: Counter[tuple[str, str, str]] = Counter()
        self._restored: set[str] = set()  # entries restored unsettled: never counted

    # --- wiring ---------------------------------------------------------------------------

    def attach(self, model: ModelView) -> None:
        """Be told of `model`'s changes (before it applies anything)."""
        self._model = model
        self._model_pods = model.pods  # (the model keeps one dict: read once per Pod event)
        model.observer = self

    def observe(
        self, kind: str, event_type: str, obj: Mapping[str, Any], key: ObjectKey, now: float
    ) -> None:
        """One watch event the model has applied; `key` as the model keys the object (a
        namespaced kind's a (namespace, name) pair, a cluster-scoped kind's its name)."""
        if self._model is None:
            return
        if now > self._latest:
            self._latest = now
        else:
            now = self._latest
        if type(key) is tuple:  # a namespaced kind's (namespace, name)
            if kind == "Pod":
                self._pod(event_type, key, now)
            elif kind == "Workload":
                self._workload(event_type, key, obj, now)
            elif kind == "HyperPodPyTorchJob":
                self._owner(event_type, (key[0], "HyperPodPyTorchJob", key[1]), obj)
            elif kind == "Event":
                self._epoch += 1  # a Preempted Event may complete a preemption's ledger entry
            else:
                return
        elif type(key) is str and kind == "Node":  # cluster-scoped: its name
            self._node(event_type, key, obj, now)
        elif kind == "ResourceFlavor":
            self._reflavor(now)
        else:
            return
        if (
            self._unsettled and (self._epoch != self._ticked_epoch or now >= self._next_due)
        ) or now - self._last_prune >= PRUNE_EVERY_S:
            self.tick(now)

    # --- reads (the public API: see the package's docstring) ------------------------------

    def interruptions_of(self, namespace: str, job: str) -> list[Interruption]:
        out: list[Interruption] = []
        for key, track in self.jobs.items():
            if key[0] == namespace and key[2] == job:
                out += track.interruptions
        return sorted(out, key=lambda e: (e.stopped_at, e.id))

    def interruptions(
        self,
        since: float | None = None,
        until: float | None = None,
        namespace: str | None = None,
        cause: str | None = None,
    ) -> list[Interruption]:
        out = [
            e
            for track in self.jobs.values()
            for e in track.interruptions
            if (since is None or e.stopped_at >= since)
            and (until is None or e.stopped_at < until)
            and (namespace is None or e.namespace == namespace)
            and (cause is None or e.cause == cause)
        ]
        return sorted(out, key=lambda e: (e.stopped_at, e.id))

    def job_for_workload(self, namespace: str, workload: str) -> JobKey | None:
        return self._wl_job.get((namespace, workload))

    def job_goodput(self, namespace: str, job: str, now: float) -> JobGoodput | None:
        tracks = [t for k, t in self.jobs.items() if k[0] == namespace and k[2] == job]
        if not tracks:
            return None
        return job_goodput(max(tracks, key=lambda t: t.first_admitted or 0.0), now)

    def jobs_goodput(self, now: float) -> list[JobGoodput]:
        return [job_goodput(t, now) for t in self.jobs.values() if t.first_admitted is not None]

    def goodput_by(self, group: str, now: float) -> list[GroupGoodput]:
        return group_goodput(self.jobs_goodput(now), group)

    def gpu_seconds(self, now: float) -> GpuSecondTotals:
        return self.gpu_ledger.totals(now)

    def reliability(self, now: float) -> ReliabilitySummary:
        return self.reliability_book.summary(now, self.interruptions())

    def repeat_offenders(self, now: float) -> list[RepeatOffender]:
        return self.reliability_book.repeat_offenders(now)

    def is_repeat_offender(self, node: str, now: float) -> bool:
        return self.reliability_book.is_repeat_offender(node, now)

    def hardware_incidents(self, now: float) -> dict[str, int]:
        """Hardware incidents per node within the repeat-offender window before `now` (only
        nodes with one): topowatch_node_hardware_incidents."""
        return self.reliability_book.hardware_incidents(now)

    def repeat_offender_reason(self, node: str, now: float) -> str:
        """Why the remediation ladder should replace `node` rather than reboot it again ("" when
        it should not): what `RemediationController.repeat_offender` asks."""
        return self.reliability_book.repeat_offender_reason(node, now)

    # --- persistence ------------------------------------------------------------------------

    def dirty_rows(self, now: float) -> list[GoodputRow]:
        """The rows that changed since the last call (for the history writer), and the
        GPU-second ledger's totals."""
        rows: list[GoodputRow] = []
        for job_key, entry_id in sorted(self._dirty_entries):
            track = self.jobs.get(job_key)
            entry = (
                next((e for e in track.interruptions if e.id == entry_id), None) if track else None
            )
            if entry is not None:
                rows.append(durable.interruption_row(entry, now))
        for job_key in sorted(self._dirty_jobs):
            track = self.jobs.get(job_key)
            if track is not None:
                rows.append(durable.job_row(track, now))
        rows += [durable.finding_row(f) for f in self._new_findings]
        rows.append(
            durable.ledger_row(self.gpu_seconds(now), self.reliability_book.node_ms(now), now)
        )
        self._dirty_entries.clear()
        self._dirty_jobs.clear()
        self._new_findings.clear()
        return rows

    def restore(
        self,
        interruptions: Iterable[dict[str, Any]],
        jobs: Iterable[dict[str, Any]] = (),
        findings: Iterable[dict[str, Any]] = (),
        ledger: Iterable[dict[str, Any]] = (),
    ) -> int:
        """Rebuild from what a previous process wrote (`SqlStore.goodput_all(kind)` for each
        kind), before the first list; returns how many documents could not be read."""
        bad = 0
        for data in jobs:
            track = durable.job_from(data)
            if track is None:
                bad += 1
                continue
            self.jobs[track.key] = track
            self._map_epoch += 1
        entries: dict[JobKey, list[Interruption]] = {}
        for data in interruptions:
            entry = durable.interruption_from(data)
            if entry is None:
                bad += 1
                continue
            entries.setdefault(entry.key, []).append(entry)
        for key, found in entries.items():
            track = self.jobs.get(key)
            if track is None:
                track = self.jobs[key] = JobTrack(key, ended=True)
                self._map_epoch += 1
            track.interruptions = sorted(found, key=lambda e: _ordinal(e.id))
            if track.open is not None and track.open >= len(track.interruptions):
                track.open = None
            for entry in track.interruptions:
                if not entry.settled:
                    self._unsettle(key)
                    self._restored.add(entry.id)
        self._ticked_epoch = -1  # the next event ticks: what was restored is judged anew
        restored = []
        for data in findings:
            finding = durable.finding_from(data)
            if finding is None:
                bad += 1
            else:
                restored.append(finding)
        node_ms: dict[str, int] = {}
        for data in ledger:
            totals = durable.ledger_from(data)
            if totals is None:
                bad += 1
                continue
            self.gpu_ledger.seed(totals[0])
            node_ms = totals[1]
        self.reliability_book.seed(node_ms, restored)
        return bad

    # --- pods -------------------------------------------------------------------------------

    def _pod(self, event_type: str, key: tuple[str, str], now: float) -> None:
        pod = None if event_type == "DELETED" else self._model_pods.get(key)
        old = self._pods.get(key)
        if old is not None and pod is not None and old.job is not None:
            node = pod.node
            if (
                node
                and old.node
                and old.phase == pod.phase
                and old.gpus == pod.gpus
                and old.ready is (old.holds and pod.ready_since is not None)
                and old.workload == pod.workload
            ):
                # On a node before and after, in the same phase with the same GPUs: it holds
                # them as it did (`Pod.holds_gpus`), and is as Ready as it was.
                if old.node == node:
                    return  # a status update the ledger does not read
                # Bound anew, nothing else the ledger reads changed: its GPUs move to the new
                # node under the same slot, its job is left as it was (its counts do not move,
                # and `_evaluate` of unchanged counts changes nothing: it ran after their last
                # change), unless it was a Ready pod of a running job (an interruption).
                track = old.track
                if (
                    track is not None
                    and not (old.ready and track.running)
                    and self._same_job(old, pod)
                ):
                    if old.slot is not None:
                        self.gpu_ledger.transfer(
                            old.node, node, old.slot, old.gpus, round(now * 1000)
                        )
                    old.node = node
                    return
            else:
                holds = pod.holds_gpus
                if (
                    old.node == node
                    and old.gpus == pod.gpus
                    and old.holds is holds
                    and old.ready is (holds and pod.ready_since is not None)
                    and old.workload == pod.workload
                ):
                    return  # a status update the ledger does not read
        self._pods.pop(key, None)
        # A pod that stays on its node with the same GPUs hands its slot to its new fact: one
        # move in the GPU-second ledger, from the old category to the new.
        same_place = (
            old is not None and pod is not None and old.node == pod.node and old.gpus == pod.gpus
        )
        if old is not None:
            self._detach(key, old)
            if not same_place:
                self._set_slot(old, None)
        for group in self._parked_by_pod.pop(key, ()):
            members = self._parked.get(group)
            if members is not None:
                members.discard(key)
                if not members:
                    del self._parked[group]
        fact = None
        if pod is not None:
            job = self._job_of_pod(pod)
            fact = PodFact(
                job,
                pod.node,
                pod.gpus,
                pod.ready_since is not None and pod.holds_gpus,
                pod.holds_gpus,
                pod.workload,
                old.slot if same_place and old is not None else None,
                pod.phase,
                pod.owner,
                pod.owner_uid,
                pod.job_uid,
                self._map_epoch,
            )
            self._pods[key] = fact
            if job is None and pod.gpus > 0:
                # (no closure over `pod`: that would make it a cell on the hot path above)
                unnamed = (pod.namespace, "")
                groups: tuple[object, ...] = tuple(
                    g
                    for g in (pod.owner_uid, pod.job_uid, (pod.namespace, pod.workload))
                    if g and g != unnamed
                )
                self._parked_by_pod[key] = groups
                for group in groups:
                    self._parked.setdefault(group, set()).add(key)
            elif job is not None and job not in self.jobs:
                fact.job = None  # its job was pruned
            self._attach(key, fact)
        if old is not None and old.ready and old.job is not None:
            still = fact is not None and fact.ready and fact.node == old.node
            track = self.jobs.get(old.job)
            if not still and track is not None and track.running:
                track.lost.add(old.node)
        for job in {f.job for f in (old, fact) if f is not None and f.job is not None}:
            self._evaluate(job, now)
        if fact is not None:
            self._set_slot(fact, self._slot(fact))

    def _same_job(self, fact: PodFact, pod: Pod) -> bool:
        """Whether `_job_of_pod(pod)` is `fact.job`: known without looking when the pod's
        owners and the book's job maps are as they were when it was looked up."""
        if (
            fact.epoch == self._map_epoch
            and fact.owner == pod.owner
            and fact.owner_uid == pod.owner_uid
            and fact.job_uid == pod.job_uid
        ):
            return True
        if self._job_of_pod(pod) != fact.job:
            return False
        fact.owner, fact.owner_uid, fact.job_uid = pod.owner, pod.owner_uid, pod.job_uid
        fact.epoch = self._map_epoch
        return True

    def _attach(self, key: tuple[str, str], fact: PodFact) -> None:
        track = self.jobs.get(fact.job) if fact.job is not None else None
        if track is None or key in track.pods:
            return
        track.pods.add(key)
        fact.track = track
        track.bound += fact.holds
        track.ready += fact.ready
        if track.running and fact.ready:
            track.running_nodes.add(fact.node)

    def _detach(self, key: tuple[str, str], fact: PodFact) -> None:
        track = self.jobs.get(fact.job) if fact.job is not None else None
        if track is None or key not in track.pods:
            return
        track.pods.discard(key)
        fact.track = None
        track.bound -= fact.holds
        track.ready -= fact.ready

    def _slot(self, fact: PodFact) -> tuple[str, str] | None:
        """What the pod's GPUs count as on its node: (team, running | restarting | absorbed)."""
        if not fact.holds or fact.gpus <= 0 or not fact.node:
            return None
        track = self.jobs.get(fact.job) if fact.job is not None else None
        if track is None:
            return ("", "running" if fact.ready else "restarting")
        if fact.ready and track.running:
            above = track.absorbing and fact.workload and fact.workload != track.base_workload
            return (track.team, "absorbed" if above else "running")
        return (track.team, "restarting")

    def _set_slot(self, fact: PodFact, slot: tuple[str, str] | None) -> None:
        if fact.slot == slot:
            return
        self.gpu_ledger.move(fact.node, fact.slot, slot, fact.gpus, self._latest)
        fact.slot = slot

    def _reslot(self, track: JobTrack) -> None:
        """Its pods' GPUs count anew (it started or stopped running, changed team)."""
        for key in track.pods:
            fact = self._pods.get(key)
            if fact is not None:
                self._set_slot(fact, self._slot(fact))

    def _job_of_pod(self, pod: Pod) -> JobKey | None:
        if pod.workload:
            job = self._wl_job.get((pod.namespace, pod.workload))
            if job is not None:
                return job
        kind, _, name = pod.owner.partition("/")
        if kind and name and (pod.namespace, kind, name) in self.jobs:
            return (pod.namespace, kind, name)
        for uid in (pod.owner_uid, pod.job_uid):
            if uid and uid in self._uid_job:
                return self._uid_job[uid]
        return None

    # --- workloads --------------------------------------------------------------------------

    def _workload(
        self, event_type: str, key: tuple[str, str], obj: Mapping[str, Any], now: float
    ) -> None:
        assert self._model is not None
        if event_type == "DELETED":
            old = self._workloads.pop(key, None)
            self._checkpoints.pop(key, None)
            job = self._wl_job.pop(key, None)
            self._map_epoch += 1
            self.gpu_ledger.remove_demand(key, now)
            if job is None or old is None:
                return
            track = self.jobs.get(job)
            if track is None:
                return
            track.workloads.pop(key[1], None)
            if not old.is_true("Finished"):
                self._workload_event(track, WorkloadEvent(now, key[1], "deleted"))
            if not track.workloads and not track.ended:
                track.ended = True
                track.finished_at = now
            self._sum_workloads(track)
            self._evaluate(job, now)
            return
        state = self._model.workloads.get(key)
        if state is None:
            return
        workload = state.workload
        old = self._workloads.get(key)
        checkpoint = checkpoint_values(obj, self.config.checkpoint_key)
        unchanged = old is not None and (old is workload or old == workload)
        # Hold the model's copy, not the old one (which only this book would keep alive).
        self._workloads[key] = workload
        if self._checkpoints.get(key) != checkpoint:
            self._checkpoints[key] = checkpoint  # (kept only when new: nothing more to collect)
            unchanged = False
        if unchanged:
            return  # a re-write the ledger reads nothing new in
        job = job_key_of(workload)
        if self._wl_job.get(key) != job:
            self._wl_job[key] = job
            self._map_epoch += 1
        track = self.jobs.get(job)
        if track is None:
            track = self.jobs[job] = JobTrack(job, phase_since_ms=to_ms(now))
            self._map_epoch += 1
        if track.ended and not workload.is_true("Finished"):
            track.ended = False  # a job resumed with a new Workload (or a re-used name)
            track.finished_at = None
        track.workloads[key[1]] = workload.created if workload.created is not None else now
        for uid in (workload.owner_uid, workload.job_uid, workload.uid):
            if uid and self._uid_job.get(uid) != job:
                self._uid_job[uid] = job
                self._map_epoch += 1
        self._claim_parked(job, workload)
        self._diff_workload(track, old, workload, now)
        slotting = (track.team, track.absorbing, track.base_workload)
        if workload.is_true("Admitted") and not workload.is_true("Finished"):
            queue = self._model.cluster_queue_of(workload)
            track.cluster_queue = queue
            track.team = team_of(queue)
            for placement in workload.placements:
                for resource, flavor in placement.flavors:
                    if resource == GPU_RESOURCE:
                        track.flavor = flavor
        at, note = checkpoint_from(checkpoint, self.config.checkpoint_key)
        if at is not None or note:
            track.checkpoint_at, track.checkpoint_note = at, note
        elastic = self._model.elastic.for_workload(workload)
        track.elastic = elastic is not None
        track.absorbing = bool(
            elastic is not None and elastic.elastic and elastic.min_replicas is not None
        )
        self._sum_workloads(track)
        self._demand(workload, now)
        if (track.team, track.absorbing, track.base_workload) != slotting:
            self._reslot(track)
        self._evaluate(job, now)

    def _sum_workloads(self, track: JobTrack) -> None:
        """What the job's Workloads add up to (O(its Workloads), on a Workload's change)."""
        namespace = track.key[0]
        live = [
            self._workloads[(namespace, n)]
            for n in track.workloads
            if (namespace, n) in self._workloads
        ]
        holding = [w for w in live if _holds(w)]
        track.holding = len(holding)
        track.expected = sum(p.count for w in holding for p in w.pod_sets)
        track.all_finished = bool(live) and all(w.is_true("Finished") for w in live)
        track.suspended = any(not w.active for w in live) and not holding
        if holding:
            track.gpus = sum(w.gpus_requested for w in holding)
            base = min(holding, key=lambda w: (track.workloads.get(w.name, 0.0), w.name))
            track.base_workload = base.name
        else:
            track.base_workload = ""

    def _diff_workload(
        self, track: JobTrack, old: Workload | None, new: Workload, now: float
    ) -> None:
        name = new.name
        for kind, cond_type in (("evicted", "Evicted"), ("finished", "Finished")):
            cond = new.condition(cond_type)
            before = old.condition(cond_type) if old is not None else None
            if cond is None or cond.status != "True":
                continue
            if (
                before is not None
                and before.status == "True"
                and (before.last_transition == cond.last_transition)
            ):
                continue
            time = cond.last_transition if cond.last_transition is not None else now
            time = min(time, now)
            event_kind = kind
            if kind == "finished" and cond.reason not in SUCCESS_REASONS:
                event_kind = "failed"
            self._workload_event(
                track,
                WorkloadEvent(time, name, event_kind, cond.reason, cond.message),  # type: ignore[arg-type]
            )
        if not new.active and (old is None or old.active):
            self._workload_event(track, WorkloadEvent(now, name, "deactivated"))
        if new.is_true("Admitted") and track.first_admitted is None:
            cond = new.condition("Admitted")
            when = cond.last_transition if cond is not None else None
            first = min(when, now) if when is not None else now
            gap = to_ms(now) - to_ms(first)
            if gap > SKEW_S * 1000:
                # admitted before this process watched: that time is unobserved
                track.phase_ms["unobserved"] += gap
            else:
                first = now
            track.first_admitted = first
            track.phase_since_ms = to_ms(now)

    def _workload_event(self, track: JobTrack, event: WorkloadEvent) -> None:
        track.workload_events.append(event)
        self._epoch += 1

    def _claim_parked(self, job: JobKey, workload: Workload) -> None:
        groups: list[object] = [(workload.namespace, workload.name)]
        groups += [uid for uid in (workload.owner_uid, workload.job_uid) if uid]
        claimed: set[tuple[str, str]] = set()
        for group in groups:
            claimed |= self._parked.pop(group, set())
        for key in claimed:
            for group in self._parked_by_pod.pop(key, ()):
                members = self._parked.get(group)
                if members is not None:
                    members.discard(key)
                    if not members:
                        del self._parked[group]
            fact = self._pods.get(key)
            if fact is not None and fact.job is None:
                fact.job = job
                self._attach(key, fact)
                self._set_slot(fact, self._slot(fact))

    def _demand(self, workload: Workload, now: float) -> None:
        assert self._model is not None
        cause = idle.demand_cause(workload) if is_pending(workload) else None
        if cause is None:
            self.gpu_ledger.remove_demand(workload.key, now)
            return
        cq = self._model.cluster_queues.get(self._model.cluster_queue_of(workload))
        flavors = [q.flavor for q in cq.gpu_quotas] if cq is not None else []
        flavor = idle.demand_flavor(workload, flavors)
        self.gpu_ledger.set_demand(workload.key, flavor, cause, workload.gpus_requested, now)

    def _owner(self, event_type: str, key: JobKey, obj: Mapping[str, Any]) -> None:
        track = self.jobs.get(key)
        if track is None or event_type == "DELETED":
            return
        at, note = checkpoint_of(obj, self.config.checkpoint_key)
        if at is not None or note:
            track.checkpoint_at, track.checkpoint_note = at, note

    # --- a job's state ----------------------------------------------------------------------

    def _evaluate(self, job: JobKey, now: float) -> None:
        """The job's state after a change: stopped, running again, and in which phase."""
        track = self.jobs.get(job)
        if track is None:
            return
        ms = to_ms(now)
        if track.all_finished and not track.ended:
            track.ended = True
            track.finished_at = now
        complete = (
            track.holding > 0 and track.bound >= track.expected > 0 and track.ready == track.bound
        )
        was_running = track.running
        if track.running and (track.lost or not track.holding or track.ended):
            bound = {f.node for f in self._facts_of(track) if f.holds}
            nodes = tuple(sorted(track.running_nodes | track.lost | bound))
            first = min(track.workloads, key=lambda n: track.workloads[n], default="")
            entry = track.open_interruption(now, ms, first, nodes)
            self._unsettle(job)
            self._next_due = min(self._next_due, entry.stopped_at + SETTLE_S)
            for node in nodes:
                self._watch.setdefault(node, set()).add((job, entry.id))
            self._dirty_entries.add((job, entry.id))
            self._judge(track, now)
        if not track.running and not track.ended and complete:
            entry_done = track.resume(now, ms)
            track.running_nodes = {f.node for f in self._facts_of(track) if f.ready}
            if entry_done is not None:
                self._dirty_entries.add((job, entry_done.id))
        if track.ended:
            phase = "finished"
        elif track.first_admitted is None:
            phase = "queued"
        elif track.suspended:
            phase = "suspended"
        elif track.running:
            phase = "running"
        elif track.bound:
            phase = "restarting"
        else:
            phase = "waiting"
        if track.set_phase(phase, ms):
            self._dirty_jobs.add(job)
            self._changed()
        if was_running != track.running:
            self._reslot(track)

    def _facts_of(self, track: JobTrack) -> list[PodFact]:
        return [self._pods[k] for k in track.pods if k in self._pods]

    # --- attribution --------------------------------------------------------------------------

    def _unsettle(self, job: JobKey) -> None:
        if job not in self._unsettled:
            self._unsettled.append(job)

    def tick(self, now: float) -> None:
        """Re-attribute what is not settled yet (new evidence) and settle what is due; prune
        ended jobs now and then. `observe` calls it when evidence changed (the epoch) or an
        entry is due to settle; call it on a timer too."""
        self._ticked_epoch = self._epoch
        next_due = float("inf")
        for job in list(self._unsettled):
            track = self.jobs.get(job)
            if track is None:
                self._unsettled.remove(job)
                continue
            due = [e for e in track.interruptions if not e.settled]
            if not due:
                self._unsettled.remove(job)
                continue
            if self._judged_epoch.get(job) != self._epoch or any(
                now >= e.stopped_at + SETTLE_S for e in due
            ):
                self._judge(track, now)
            for e in track.interruptions:
                if not e.settled and e.stopped_at + SETTLE_S < next_due:
                    next_due = e.stopped_at + SETTLE_S
        self._next_due = next_due
        if now - self._last_prune >= PRUNE_EVERY_S:
            self._last_prune = now
            self._prune(now)

    def _judge(self, track: JobTrack, now: float) -> None:
        assert self._model is not None
        self._judged_epoch[track.key] = self._epoch
        for index, entry in enumerate(track.interruptions):
            if entry.settled:
                continue
            verdict = attribute(
                self._stop_of(track, entry),
                (e for n in entry.nodes for e in self._node_events.get(n, ())),
                track.workload_events,
                self._preemptions(track, entry),
                self._scale_downs(track),
                {n: self._facts[n].findings_problem for n in entry.nodes if n in self._facts},
            )
            settled = now >= entry.stopped_at + SETTLE_S
            updated = replace(
                entry,
                cause=verdict.cause,
                component=verdict.component,
                detail=verdict.detail,
                uncertain=verdict.uncertain,
                missing=verdict.missing,
                node=verdict.node,
                check=verdict.check,
                finding_component=verdict.finding_component,
                verdict=verdict.verdict,
                preemptor=verdict.preemptor,
                action=verdict.action or entry.action,
                detected_at=verdict.detected_at,
                action_at=verdict.action_at if verdict.action_at is not None else entry.action_at,
                settled=settled,
            )
            updated = self._timeline(updated)
            if updated.cause == "completed" and index == track.open:
                track.open = None
                updated = replace(updated, resumed_at=None)
            if updated != entry:
                track.interruptions[index] = updated
                self._dirty_entries.add((track.key, entry.id))
                self._changed()
            if settled:
                if updated.counted and entry.id not in self._restored:
                    self.interruptions_total[(updated.cause, updated.component, updated.team)] += 1
                self._restored.discard(entry.id)

    def _stop_of(self, track: JobTrack, entry: Interruption) -> Stop:
        alive = [
            n
            for n in track.workloads
            if (track.key[0], n) in self._workloads
            and not self._workloads[(track.key[0], n)].is_true("Finished")
        ]
        gone = {
            e.workload
            for e in track.workload_events
            if e.kind in ("evicted", "deleted", "deactivated")
            and abs(e.time - entry.stopped_at) <= SETTLE_S
        }
        continues = any(n not in gone for n in alive)
        names = tuple(sorted(set(track.workloads) | {e.workload for e in track.workload_events}))
        index = track.interruptions.index(entry)
        since = entry.run_started
        if since is None and index > 0:
            since = track.interruptions[index - 1].resumed_at
        return Stop(entry.stopped_at, entry.nodes, names, track.elastic, continues, since)

    def _preemptions(self, track: JobTrack, entry: Interruption) -> list[PreemptionEvidence]:
        assert self._model is not None
        names = set(track.workloads) | {e.workload for e in track.workload_events}
        out = []
        for name in names:
            for record in self._model.ledger.suffered_by(track.key[0], name):
                if abs(record.time - entry.stopped_at) <= SETTLE_S:
                    out.append(
                        PreemptionEvidence(
                            record.time,
                            name,
                            record.verdict,
                            record.verdict_detail,
                            record.preemptor,
                        )
                    )
        return out

    def _scale_downs(self, track: JobTrack) -> list[ScaleDownEvidence]:
        assert self._model is not None
        if not track.elastic:
            return []
        state = self._model.elastic.jobs.get(track.key)
        if state is None:
            return []
        return [
            ScaleDownEvidence(e.time, e.workload, e.cause)
            for e in state.events
            if e.direction == "down"
        ]

    def _timeline(self, entry: Interruption) -> Interruption:
        """Detection -> action -> node back, from the events of the node that decided it."""
        node = entry.node
        if not node or entry.cause not in ("node_fault", "remediation"):
            return entry
        events = self._node_events.get(node, ())
        start = (entry.detected_at if entry.detected_at is not None else entry.stopped_at) - SKEW_S
        action_at, action = entry.action_at, entry.action
        if action_at is None:
            first = next(
                (
                    e
                    for e in events
                    if e.kind == "action"
                    and start <= e.time <= entry.stopped_at + ACTION_WINDOW_S + SETTLE_S
                ),
                None,
            )
            if first is not None:
                action_at, action = first.time, first.action
        after = action_at if action_at is not None else entry.stopped_at
        back = entry.node_back_at
        if back is None:
            found = next((e for e in events if e.kind == "back" and e.time >= after), None)
            back = found.time if found is not None else None
        return replace(entry, action_at=action_at, action=action, node_back_at=back)

    # --- nodes ------------------------------------------------------------------------------

    def _node(self, event_type: str, name: str, obj: Mapping[str, Any], now: float) -> None:
        assert self._model is not None
        if event_type == "DELETED":
            self._facts.pop(name, None)
            self._why.pop(name, None)
            self._placed.pop(name, None)
            self._events_of(name).append(NodeEvent(now, name, "deleted"))
            self._epoch += 1
            self.gpu_ledger.remove_node(name, now)
            self.reliability_book.node_gone(name, now)
            self._refresh_watchers(name)
            return
        node = self._model.nodes.get(name)
        if node is None:
            return
        before = self._facts.get(name)
        facts = node_facts(obj, node, before)
        # `node_facts` hands back what was when nothing it reads changed: its place, at most
        if facts is before:
            self._seen(name, node, self._why[name], now)
            return
        self._facts[name] = facts
        was = self._why.get(name, "")
        why = self._why[name] = facts.unavailable()
        if facts.findings_problem and (before is None or not before.findings_problem):
            self.problems["findings_unreadable"] = self.problems.get("findings_unreadable", 0) + 1
        new_events: list[NodeEvent] = []
        if before is None or facts.findings is not before.findings:
            known = {f.key for f in before.findings} if before is not None else set()
            for finding in facts.findings:
                if finding.key not in known:
                    new_events.append(
                        NodeEvent(finding.first_seen, name, "finding", finding=finding)
                    )
                    if self.reliability_book.finding(finding):
                        self._new_findings.append(finding)
        if before is None:
            self._events_of(name)  # made at first sight, as the node's other state is
        else:
            remediation = facts.remediation
            if remediation and not before.remediation:
                new_events.append(NodeEvent(now, name, "action", action=remediation))
            if facts.deep_check and not before.deep_check:
                new_events.append(NodeEvent(now, name, "action", action="deep_health_check"))
            if facts.cordoned and not before.cordoned and not remediation:
                new_events.append(NodeEvent(now, name, "action", action="cordon"))
            if before.ready and not facts.ready:
                new_events.append(NodeEvent(now, name, "not_ready"))
            if facts.ready and not before.ready:
                new_events.append(NodeEvent(now, name, "ready"))
            if was and not why:
                new_events.append(NodeEvent(now, name, "back"))
        if new_events:
            if len(new_events) > 1:
                new_events.sort(key=lambda e: e.time)
            self._events_of(name).extend(new_events)
            self._epoch += 1
        self._seen(name, node, why, now)
        if new_events:
            self._refresh_watchers(name)

    def _reflavor(self, now: float) -> None:
        """A ResourceFlavor came, changed or went: the model may select its nodes anew, so
        every node is placed again (O(nodes), on a rare event), from this moment."""
        assert self._model is not None
        for name in list(self._placed):
            node = self._model.nodes.get(name)
            if node is not None:
                self._seen(name, node, self._why.get(name, ""), now)

    def _events_of(self, node: str) -> deque[NodeEvent]:
        events = self._node_events.get(node)
        if events is None:
            events = self._node_events[node] = deque(maxlen=NODE_EVENTS)
        return events

    def _seen(self, name: str, node: Node, why: str, now: float) -> None:
        """The node's place for reliability, its state in the GPU-second ledger."""
        placed = self._place(name, node)
        allocatable = node.allocatable_gpus
        if placed.allocatable == allocatable and placed.why == why:
            return  # as told: neither would move (a Node event that changed nothing here)
        placed.allocatable, placed.why = allocatable, why
        place = placed.place
        self.reliability_book.node_seen(name, place[2], place[1], place[3], now)
        self.gpu_ledger.set_node(name, place[0], place[1], allocatable, why, now)

    def _place(self, name: str, node: Node) -> _Placed:
        """The node's place: the model's flavor of it and its place in the topology tree,
        worked out anew (and so told anew) when either moves (the tree keeps a node's
        Placement while its placement labels stay, whatever other labels do)."""
        assert self._model is not None
        placement = self._model.tree.placement(name)
        flavor = self._model.node_flavor(name)
        placed = self._placed.get(name)
        if placed is not None and placed.place[0] == flavor and placed.placement is placement:
            return placed
        domain = placement.layers[-1] if placement is not None and placement.layers else ""
        place = (flavor, domain, node.label(INSTANCE_TYPE_KEY), node.label(ULTRASERVER_KEY))
        placed = self._placed[name] = _Placed(placement, place)
        return placed

    def _refresh_watchers(self, node: str) -> None:
        watchers = self._watch.get(node)
        if not watchers:
            return
        for job, entry_id in list(watchers):
            track = self.jobs.get(job)
            entry = (
                next((e for e in track.interruptions if e.id == entry_id), None) if track else None
            )
            if entry is None or self._latest - entry.stopped_at > WATCH_S:
                watchers.discard((job, entry_id))
                continue
            if not entry.settled or track is None:
                continue
            updated = self._timeline(entry)
            if updated != entry:
                track.interruptions[track.interruptions.index(entry)] = updated
                self._dirty_entries.add((job, entry_id))
                self._changed()
            if updated.node_back_at is not None or (updated.node and updated.node != node):
                watchers.discard((job, entry_id))
        if not watchers:
            self._watch.pop(node, None)

    # --- housekeeping -----------------------------------------------------------------------

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _prune(self, now: float) -> None:
        ended = [
            (t.finished_at or 0.0, k)
            for k, t in self.jobs.items()
            if t.ended and not any(not e.settled for e in t.interruptions)
        ]
        ended.sort()
        over = max(0, len(self.jobs) - self.config.max_jobs)
        for index, (finished, key) in enumerate(ended):
            if finished > now - self.config.retain_s and index >= over:
                break
            track = self.jobs.pop(key)
            self._map_epoch += 1
            for pod in track.pods:
                fact = self._pods.get(pod)
                if fact is not None:
                    fact.job = fact.track = None
                    self._set_slot(fact, self._slot(fact))
            self._judged_epoch.pop(key, None)


@dataclass(slots=True, eq=False)
class _Placed:
    """A node's place as the book worked it out, from the topology tree's Placement, and what
    `_seen` last told the reliability book and the ledger of it (None: not yet at this place)."""

    placement: Placement | None  # the tree's, as read
    place: tuple[str, str, str, str]  # (flavor, domain, instance type, UltraServer)
    allocatable: int | None = None
    why: str = ""


def _ordinal(entry_id: str) -> int:
    _, _, number = entry_id.rpartition("#")
    return int(number) if number.isdigit() else 0
