"""ClusterModel: the cluster as the informers describe it, updated one event at a time.

Every event costs O(its object + topology depth): GPU usage moves along one path of the
topology tree, a workload's timeline grows by what changed, a preemption lands in the ledger
(judged by `exporter.cluster.preemptions`, which the model calls from its handlers).
Derived views that span many objects (locality, pending causes, fragmentation) are computed
when asked, and cached where they are asked often. No I/O, no clock: callers pass `now`.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, Protocol

from exporter.cluster import analysis
from exporter.cluster.analysis import PendingCause
from exporter.cluster.capacity import flavors as flavor_assigner
from exporter.cluster.capacity.flavors import QuotaAssignment
from exporter.cluster.capacity.placement import (
    Eligibility,
    Exclusion,
    FreeCapacity,
    NodeResourcesFree,
    PlacementAnswer,
    place,
    screen_nodes,
)
from exporter.cluster.capacity.quota import Answer, QuotaTree
from exporter.cluster.elastic import idle
from exporter.cluster.elastic.idle import IdleAccountant
from exporter.cluster.elastic.scaling import ElasticBook, JobState, job_of
from exporter.cluster.ledger import SAME_PREEMPTION_WINDOW_S, PreemptionLedger
from exporter.cluster.objects import (
    GPU_RESOURCE,
    PODS_RESOURCE,
    ClusterQueue,
    Cohort,
    KueueTopology,
    LocalQueue,
    Node,
    ObjectKey,
    Pod,
    PodSetRequest,
    PriorityClass,
    ResourceFlavor,
    Workload,
    team_of,
)
from exporter.cluster.parse.core import parse_event, parse_node, parse_pod
from exporter.cluster.parse.hyperpod import admission_evidence, parse_hyperpod_job
from exporter.cluster.parse.kueue import (
    parse_cluster_queue,
    parse_cohort,
    parse_local_queue,
    parse_priority_class,
    parse_resource_flavor,
    parse_topology,
    parse_workload,
)
from exporter.cluster.preemptions import RELEASE_MEMORY_S, PreemptionJudge
from exporter.cluster.reservations import ReservationBook
from exporter.cluster.timeline import TimelineEntry, timeline_changes
from exporter.core.findings import FINDINGS_ANNOTATION
from exporter.sources.ec2_events import ScheduledEvent
from exporter.topology.labels import DEEP_HEALTH_CHECK_KEY, INSTANCE_TYPE_KEY, PLACEMENT_KEYS
from exporter.topology.locality import Locality, locality
from exporter.topology.tree import Placement, TopologyTree

log = logging.getLogger(__name__)

WorkloadKey = tuple[str, str]
UNKNOWN_TOPOLOGY = "\0unknown"  # the Topology of a flavor a dump does not describe
_EMPTY_USAGE: Mapping[str, int] = {}

KINDS = (
    "Node",
    "Pod",
    "Event",
    "Workload",
    "ClusterQueue",
    "LocalQueue",
    "Cohort",
    "ResourceFlavor",
    "Topology",
    "WorkloadPriorityClass",
    "HyperPodPyTorchJob",
)

# Object timestamps have whole seconds, and a kind's first list may be taken a moment before the
# model's first event: a preemption stamped this little before the watch began can be live.
LIVE_SLACK_S = 2.0
# Informers list their kinds in any order at start-up; a preemption seen before every kind has
# listed is judged once they all have (or after this long, should a kind never list).
SYNC_GRACE_S = 120.0
# An EC2 scheduled event this close (or already begun) makes its node unavailable: a job placed
# there now would be cut short by the reboot, maintenance or retirement.
EVENT_HORIZON_S = 48 * 3600.0
# `placement.ExclusionCause`s that make a node unavailable rather than unschedulable.
UNAVAILABLE_CAUSES = ("deep-health-check", "scheduled-event")
ADMISSION_WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
# Every Node field but our agent's EFA findings, which it rewrites every few minutes and
# which move no placement answer: what `_nodes_epoch` watches.
_PLACEMENT_FIELDS = attrgetter(
    *(f.name for f in fields(Node) if f.name not in ("efa_findings", "findings_read"))
)


@dataclass(slots=True)
class WaitHistogram:
    buckets: list[int] = field(default_factory=lambda: [0] * len(ADMISSION_WAIT_BUCKETS))
    total: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> None:
        self.total += seconds
        self.count += 1
        for i, bound in enumerate(ADMISSION_WAIT_BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1

    def cumulative(self) -> list[tuple[float, int]]:
        return list(zip(ADMISSION_WAIT_BUCKETS, self.buckets, strict=True))


class ChangeObserver(Protocol):
    """Told of each watch event once the model has applied it (exporter.cluster.goodput's
    `GoodputBook`: the interruption and GPU-second ledgers read the model from there)."""

    def observe(
        self, kind: str, event_type: str, obj: Mapping[str, Any], key: ObjectKey, now: float
    ) -> None:
        """`key` is the object's as the model derived it (`_object_key`), so a listener need
        not read the object's metadata again."""


@dataclass(slots=True)
class WorkloadState:
    """A workload plus what only a watcher knows about it."""

    workload: Workload
    timeline: list[TimelineEntry]
    observed_admission: float | None = None
    locality_cache: tuple[tuple[int, ...], Locality] | None = None


class ClusterModel:
    def __init__(
        self,
        ledger_capacity: int = 10_000,
        timeline_limit: int = 64,
        problem_log_limit: int = 200,
        judge_preemptions: bool = True,
    ) -> None:
        """`judge_preemptions=False` for a model built from a dump: a dump shows the cluster
        after its preemptions, so it cannot tell quota-driven from topology-driven ones."""
        self.tree = TopologyTree()
        self.nodes: dict[str, Node] = {}
        self.pods: dict[tuple[str, str], Pod] = {}
        self.workloads: dict[WorkloadKey, WorkloadState] = {}
        self.cluster_queues: dict[str, ClusterQueue] = {}
        self.local_queues: dict[tuple[str, str], LocalQueue] = {}
        self.cohort_specs: dict[str, Cohort] = {}  # Cohort objects, with their own quotas
        self.flavors: dict[str, ResourceFlavor] = {}
        self.topologies: dict[str, KueueTopology] = {}
        self.priority_classes: dict[str, PriorityClass] = {}
        self.ledger = PreemptionLedger(ledger_capacity)
        self.timeline_limit = timeline_limit
        self.wait_histograms: dict[tuple[str, str], WaitHistogram] = {}
        self.problems: Counter[tuple[str, str]] = Counter()  # (kind, problem) -> count
        self.recent_problems: deque[str] = deque(maxlen=problem_log_limit)
        self.events_applied: Counter[str] = Counter()
        self._versions: dict[str, dict[Any, str]] = {kind: {} for kind in KINDS}
        # EC2 scheduled events by instance id (`set_scheduled_events`), and how far ahead an
        # event makes its node unavailable.
        self._scheduled_events: dict[str, tuple[ScheduledEvent, ...]] = {}
        self.event_horizon_s = EVENT_HORIZON_S
        self._wl_by_uid: dict[str, WorkloadKey] = {}
        self._wl_by_job: dict[str, WorkloadKey] = {}  # job-uid label and owner UID
        self._pods_by_group: dict[object, set[tuple[str, str]]] = {}
        self._group_epoch: Counter[object] = Counter()
        self._labels_epoch = 0
        self._nodes_epoch = 0  # any change to a Node: labels, taints, schedulable, GPUs
        self._queues_epoch = 0  # ClusterQueues, Cohorts, ResourceFlavors
        self.reservations = ReservationBook(RELEASE_MEMORY_S)
        self._quota_cache: tuple[tuple[int, int], QuotaTree] | None = None
        # Eligibility per (flavor, the pod set's tolerations, nodeSelector and affinity).
        self._eligibility_cache: dict[tuple[str, Any], tuple[tuple[int, int], Eligibility]] = {}
        self._quota_problems_seen: set[tuple[str, str, str]] = set()
        self._placement_cache: dict[tuple[Any, ...], PlacementAnswer] = {}
        self._placement_stamp: tuple[int, int, int, int] | None = None
        # Flavor assignments per (queue, workload shape), for the quota tree they were made on.
        self._assignment_cache: dict[tuple[Any, ...], QuotaAssignment] = {}
        self._gpu_answers: dict[tuple[str, str], Answer] = {}  # (queue, flavor), same tree
        self._assignment_tree: QuotaTree | None = None
        # What bound pods request on each node, every resource and "pods" (their count):
        # allocatable minus this is a node's free capacity for Kueue's TAS.
        self._node_used: dict[str, dict[str, int]] = {}
        self._usage_epoch = 0
        # Ledgers, judges and counts preemptions; reads this model, writes only the ledger.
        self._judge = PreemptionJudge(self, self.ledger, self._problem, enabled=judge_preemptions)
        # Only preemptions seen happening are counted (observed_live): when the model first
        # heard anything, the kinds listed once already, and whether a first list is applying.
        self.watch_start: float | None = None
        self._listed: set[str] = set()
        # Kinds whose first list the model waits for before judging (set by the service from
        # its informers; empty for a model fed by hand or from a dump), and the entries waiting.
        self._expected_lists: frozenset[str] = frozenset()
        self._sync_deadline: float | None = None
        self._caught_up_at: float | None = None
        # Kinds a dump did not hold (kubectl get ... lists no Cohorts or ResourceFlavors unless
        # asked): answers that need them say so instead of taking them for absent.
        self.missing_kinds: frozenset[str] = frozenset()
        self._replaying_history = False
        # Elastic jobs (HyperPod's and Kueue's) and their scale events; idle and absorbed
        # GPU-seconds, told of every change to a node's idle GPUs, a pending demand or an
        # elastic job's size (exporter.cluster.elastic).
        self.elastic = ElasticBook()
        self.idle = IdleAccountant()
        self._node_flavor: dict[str, str] = {}
        # The labels a node's place or flavor is read from (`_put_node`): PLACEMENT_KEYS and
        # every key a ResourceFlavor selects on.
        self._placing_keys = PLACEMENT_KEYS
        # Told when a workload finishes (deleted=False) or is deleted (True) while this model
        # watches: the history feed keeps its explain view. A workload already finished in a
        # kind's first list is not news (whoever watched it finish wrote it).
        self.on_workload_ended: Callable[[WorkloadState, bool, float], None] | None = None
        # Told of every event after it is applied (`ChangeObserver`), None when none listens.
        self.observer: ChangeObserver | None = None
        self._handlers: dict[str, Callable[[str, Mapping[str, Any], float], None]] = {
            "Node": self._apply_node,
            "Pod": self._apply_pod,
            "Event": self._apply_event,
            "Workload": self._apply_workload,
            "ClusterQueue": self._apply_cluster_queue,
            "LocalQueue": self._apply_local_queue,
            "Cohort": self._apply_cohort,
            "ResourceFlavor": self._apply_flavor,
            "Topology": self._apply_topology,
            "WorkloadPriorityClass": self._apply_priority_class,
            "HyperPodPyTorchJob": self._apply_hyperpod_job,
        }

    @property
    def judge_preemptions(self) -> bool:
        return self._judge.enabled

    @judge_preemptions.setter
    def judge_preemptions(self, value: bool) -> None:
        self._judge.enabled = value

    @property
    def preemption_counts(self) -> Counter[tuple[str, str, str, str]]:
        """Live preemptions by (victim ClusterQueue, preemptor ClusterQueue, reason, verdict)."""
        return self._judge.counts

    @property
    def quota_preemption_counts(self) -> Counter[tuple[str, str, str, str]]:
        """Live quota-driven preemptions by (victim ClusterQueue, preemptor ClusterQueue,
        reason, the resource whose quota was short; "" when not known)."""
        return self._judge.resource_counts

    # --- ingestion ------------------------------------------------------------------------

    def expect_lists(self, kinds: Iterable[str], now: float) -> None:
        """The kinds informers will list: preemption verdicts wait until each has (at most
        SYNC_GRACE_S from now), so which kind listed first cannot change a verdict."""
        self._expected_lists = frozenset(kinds)
        self._sync_deadline = now + SYNC_GRACE_S

    @property
    def caught_up_at(self) -> float | None:
        """When every expected kind had listed (None: not yet, or none expected)."""
        return self._caught_up_at

    def caught_up(self, now: float) -> bool:
        """Every expected kind has delivered its first list (or the grace period is over)."""
        if self._caught_up_at is not None:
            return True
        done = self._expected_lists <= self._listed or (
            self._sync_deadline is not None and now >= self._sync_deadline
        )
        if done and self._expected_lists:
            self._caught_up_at = now
        return done

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any], now: float) -> None:
        """One watch event. Unknown kinds and malformed objects are counted, never raised."""
        if self.watch_start is None:
            self.watch_start = now
        if self._caught_up_at is not None or self.caught_up(now):
            self._judge.judge_deferred(now)
        handler = self._handlers.get(kind)
        if handler is None:
            self._problem(kind, "unknown_kind", f"ignored an object of unknown kind {kind!r}")
            return
        if type(obj) is not dict and not isinstance(obj, Mapping):
            self._problem(kind, "malformed", f"{kind} event carried no object")
            return
        key = _object_key(obj)
        if key is None:
            self._problem(kind, "malformed", f"{kind} without metadata.name ignored")
            return
        versions = self._versions[kind]
        if event_type == "DELETED":
            versions.pop(key, None)
        else:
            rv = _resource_version(obj)
            if rv and versions.get(key) == rv:
                return  # a re-list repeating what we already hold
            versions[key] = rv
        self.events_applied[kind] += 1
        self._judge.expire(now)
        self.elastic.tick(now)
        try:
            handler(event_type, obj, now)
        except Exception as exc:  # a parser or analysis bug must not stop the informers
            self._problem(kind, "internal", f"{kind} {key}: {type(exc).__name__}: {exc}")
            log.exception("cluster model failed on %s %s", kind, key)
        if self.observer is not None:
            try:
                self.observer.observe(kind, event_type, obj, key, now)
            except Exception as exc:  # nor may a bug of whoever listens
                self._problem(kind, "observer", f"{kind} {key}: {type(exc).__name__}: {exc}")
                log.exception("cluster model observer failed on %s %s", kind, key)

    def replace(self, kind: str, items: Iterable[Mapping[str, Any]], now: float) -> None:
        """The full current set after a (re)list: apply what changed, delete what vanished.

        A kind's first list is history: it shows what was there before this process watched
        the kind, so the preemptions in it are ledgered uncounted (see `observed_live`)."""
        if self.watch_start is None:
            self.watch_start = now
        seen: set[Any] = set()
        self._replaying_history = kind not in self._listed
        try:
            for obj in items:
                key = _object_key(obj) if isinstance(obj, Mapping) else None
                if key is not None:
                    seen.add(key)
                self.apply(kind, "ADDED", obj, now)
            versions = self._versions.get(kind, {})
            for key in [k for k in versions if k not in seen]:
                self.apply(kind, "DELETED", _stub(key), now)
        finally:
            self._replaying_history = False
        self._listed.add(kind)
        if kind == "HyperPodPyTorchJob":
            self.elastic.owners_listed()
        if self.caught_up(now):  # caught_up first: it notes when
            self._judge.judge_deferred(now)

    # --- handlers -------------------------------------------------------------------------

    def _apply_node(self, event_type: str, obj: Mapping[str, Any], now: float) -> None:
        name = _name(obj)
        if event_type == "DELETED":
            if self.nodes.pop(name, None) is not None:
                self.tree.remove_node(name)
                self._labels_epoch += 1
                self._nodes_epoch += 1
                self.idle.remove_node(name, now)
                self._node_flavor.pop(name, None)
            return
        notes: list[str] = []
        node = parse_node(obj, notes)
        for note in notes:
            if DEEP_HEALTH_CHECK_KEY in note:
                self._problem("Node", "deep_health_unreadable", f"{name}: {note}")
            elif note.startswith(FINDINGS_ANNOTATION):
                self._problem("Node", "findings_unreadable", f"{name}: {note}")
            else:
                log.warning("malformed Node %s: %s", name, note)
        note = self._event_note(node.instance_id, now)
        if note:
            node = replace(node, scheduled_event=note)
        self._put_node(name, node, now)

    def _put_node(self, name: str, node: Node, now: float) -> None:
        old = self.nodes.get(name)
        self.nodes[name] = node
        if old is None or old.labels != node.labels:
            self._labels_epoch += 1
            self._nodes_epoch += 1
            # HyperPod's health label flips on every reboot it plans: a change to no label a
            # node's place or flavor is read from moves neither (only what `set_state` does).
            placed = old is not None and _same_at(old.labels, node.labels, self._placing_keys)
            if not placed:
                self._node_flavor[name] = idle.flavor_of(node, self.flavors.values())
        else:
            placed = True
            # The agent's EFA findings (rewritten every few minutes) move no placement answer.
            if _PLACEMENT_FIELDS(old) != _PLACEMENT_FIELDS(node):
                self._nodes_epoch += 1
        if not placed or not self.tree.set_state(
            name, node.allocatable_gpus, node.schedulable, available=not node.unavailable
        ):
            self.tree.set_node(
                name,
                dict(node.labels),
                node.allocatable_gpus,
                node.schedulable,
                available=not node.unavailable,
            )
        self._idle_node(name, now)

    # --- EC2 scheduled events ----------------------------------------------------------------

    def set_scheduled_events(
        self,
        events: Mapping[str, Sequence[ScheduledEvent]],
        now: float,
        horizon_s: float | None = None,
    ) -> int:
        """The open EC2 scheduled events by instance id, as last polled (the whole set: an
        instance left out has none). A node whose instance (spec.providerID) has an event that
        starts within `horizon_s` of `now` (or has started) is unavailable; events of instances
        no Node names are ignored. Returns how many nodes have one."""
        self._scheduled_events = {k: tuple(v) for k, v in events.items()}
        if horizon_s is not None:
            self.event_horizon_s = horizon_s
        marked = 0
        for name, node in list(self.nodes.items()):
            note = self._event_note(node.instance_id, now)
            marked += bool(note)
            if note != node.scheduled_event:
                self._put_node(name, replace(node, scheduled_event=note), now)
        return marked

    def _event_note(self, instance_id: str, now: float) -> str:
        """ "system-reboot from 2026-11-25T02:00:00Z" for the earliest event of the instance
        that starts within the horizon and has not ended, "" when none."""
        if not instance_id or not self._scheduled_events:
            return ""
        due = [
            event
            for event in self._scheduled_events.get(instance_id, ())
            if (event.not_before is None or event.not_before <= now + self.event_horizon_s)
            and (event.not_after is None or event.not_after > now)
        ]
        if not due:
            return ""
        first = min(due, key=lambda e: (e.not_before or 0.0, e.code))
        when = "" if first.not_before is None else f" from {_iso(first.not_before)}"
        return f"{first.code}{when}"

    def _apply_pod(self, event_type: str, obj: Mapping[str, Any], now: float) -> None:
        key = (_namespace(obj), _name(obj))
        old = self.pods.pop(key, None)
        pod = parse_pod(obj) if event_type != "DELETED" else None
        # nodes whose idle GPUs changed: told once, after both moves
        left = joined = ""
        if old is not None and old.bound:
            if old.gpus > 0:  # holds_gpus
                self.tree.add_used(old.node, -old.gpus)
                left = old.node
            self._use_node(old, -1)
        if pod is not None:
            self.pods[key] = pod
            if pod.bound:
                if pod.gpus > 0:
                    self.tree.add_used(pod.node, pod.gpus)
                    joined = pod.node
                self._use_node(pod, 1)
        elif old is not None and old.bound:  # any resource it held, GPUs or not
            self._judge.pod_released(old, now)
        self._regroup(old, pod)
        if left:
            self._idle_used(left, now)
        if joined and joined != left:
            self._idle_used(joined, now)
        if pod is not None:
            self._elastic_pods(pod.owner_uid, now)
        if old is not None and (pod is None or old.owner_uid != pod.owner_uid):
            self._elastic_pods(old.owner_uid, now)

    def _use_node(self, pod: Pod, sign: int) -> None:
        """Count a bound pod's requests (and itself, as one of the node's pods) on its node.
        GPUs are the topology tree's to count (`NodeResourcesFree` reads them there)."""
        used = self._node_used.get(pod.node)
        if used is None:
            used = self._node_used[pod.node] = {PODS_RESOURCE: 0}
        used[PODS_RESOURCE] += sign
        for name, amount in pod.requests:
            if name != GPU_RESOURCE:
                used[name] = used.get(name, 0) + sign * amount
        self._usage_epoch += 1

    def node_flavor(self, name: str) -> str:
        """The ResourceFlavor that selects node `name` (else its instance type; "" when the
        node is unknown), as `idle.flavor_of` decided at its last relabel or flavor change."""
        return self._node_flavor.get(name, "")

    def node_requested(self, node: str) -> Mapping[str, int]:
        """What the bound pods on `node` request, every resource, and how many they are."""
        return self._node_used.get(node, _EMPTY_USAGE)

    def resources_free(self, gpus: FreeCapacity | None = None) -> NodeResourcesFree:
        """Every resource free per node (allocatable minus what bound pods request), GPUs
        from `gpus` (the topology tree by default): Kueue's TAS capacity."""
        return NodeResourcesFree(gpus or self.tree, self.nodes, self.node_requested)

    def _apply_workload(self, event_type: str, obj: Mapping[str, Any], now: float) -> None:
        key = (_namespace(obj), _name(obj))
        if event_type == "DELETED":
            state = self.workloads.pop(key, None)
            if state is not None:
                if self.on_workload_ended is not None:
                    self.on_workload_ended(state, True, now)
                self._unindex_workload(state.workload)
                self.idle.remove_demand(key, now)
                self._elastic_workload(state.workload, None, now)
            self.reservations.forget(key, now)
            return
        workload = parse_workload(obj)
        self.reservations.observe(workload, now)
        for problem in workload.problems:
            self._problem("Workload", "malformed", f"{key[0]}/{key[1]}: {problem}")
        state = self.workloads.get(key)
        old = state.workload if state is not None else None
        if state is None:
            state = WorkloadState(workload, [])
            self.workloads[key] = state
        else:
            self._unindex_workload(old)  # type: ignore[arg-type]
            state.workload = workload
        self._index_workload(workload)
        for entry in timeline_changes(old, workload):
            self._add_timeline(state, entry)
        self._observe_admission(state)
        self._judge.on_workload(old, workload, now)
        self._idle_demand(workload, now)
        self._elastic_workload(old, workload, now, obj)
        if (
            self.on_workload_ended is not None
            and workload.is_true("Finished")
            and not (old is not None and old.is_true("Finished"))
            and not self._replaying_history
        ):
            self.on_workload_ended(state, False, now)

    def _apply_event(self, event_type: str, obj: Mapping[str, Any], now: float) -> None:
        if event_type == "DELETED":
            return  # the ledger outlives the Events it was built from
        event = parse_event(obj)
        record = self._judge.on_event(event, now)
        if record is not None:
            state = self.workloads.get((event.involved_namespace, event.involved_name))
            if state is not None:
                self._add_timeline(
                    state, TimelineEntry(record.time, "preempted", record.reason, event.message)
                )

    def _apply_cluster_queue(self, event_type: str, obj: Mapping[str, Any], now: float) -> None:
        if event_type == "DELETED":
            self.cluster_queues.pop(_name(obj), None)
        else:
            cq = parse_cluster_queue(obj)
            self.cluster_queues[cq.name] = cq
        self._queues_epoch += 1

    def _apply_local_queue(self, event_type: str, obj: Mapping[str, Any], now: float) -> None:
        key = (_namespace(obj), _name(obj))
        if event_type == "DELETED":
            self.local_queues.pop(key, None)
        else:
            self.local_queues[key] = parse_local_queue(obj)

    def _apply_cohort(self, event_type: str, obj: Mapping[str, Any], now: float) -> None:
        self._queues_epoch += 1
        if event_type == "DELETED":
            self.cohort_specs.pop(_name(obj), None)
            return
        problems: list[str] = []
        cohort = parse_cohort(obj, problems)
        for problem in problems:
            self._problem("Cohort", "malformed", f"{cohort.name}: {problem}")
        name = cohort.name or _name(obj)
        self.cohort_specs[name] = replace(cohort, name=name)

    def _apply_flavor(self, event_type: str, obj: Mapping[str, Any], now: float) -> None:
        self._queues_epoch += 1
        if event_type == "DELETED":
            self.flavors.pop(_name(obj), None)
        else:
            flavor = parse_resource_flavor(obj)
            self.flavors[flavor.name] = flavor
        self._placing_keys = PLACEMENT_KEYS.union(
            *({key for key, _ in f.node_labels} for f in self.flavors.values())
        )
        for name, node in self.nodes.items():  # rare: which flavor selects a node may change
            self._node_flavor[name] = idle.flavor_of(node, self.flavors.values())
            self._idle_node(name, now)

    def _apply_topology(self, event_type: str, obj: Mapping[str, Any], now: float) -> None:
        self._queues_epoch += 1  # flavor assignment and eligibility read a Topology's levels
        if event_type == "DELETED":
            self.topologies.pop(_name(obj), None)
        else:
            topology = parse_topology(obj)
            self.topologies[topology.name] = topology

    def _apply_priority_class(self, event_type: str, obj: Mapping[str, Any], now: float) -> None:
        if event_type == "DELETED":
            self.priority_classes.pop(_name(obj), None)
        else:
            pc = parse_priority_class(obj)
            self.priority_classes[pc.name] = pc

    def _apply_hyperpod_job(self, event_type: str, obj: Mapping[str, Any], now: float) -> None:
        key = (_namespace(obj), _name(obj))
        if event_type == "DELETED":
            self.elastic.on_hyperpod_job(key, None, now, live=False)
            job_key = (key[0], "HyperPodPyTorchJob", key[1])
            self.idle.set_absorbed(job_key, "", "", 0, now)
            self.idle.remove_demand(("elastic", *job_key), now)
            return
        notes: list[str] = []
        spec = parse_hyperpod_job(obj, notes)
        for note in notes:
            self._problem("HyperPodPyTorchJob", "malformed", f"{key[0]}/{key[1]}: {note}")
        if spec.problems:
            self._problem(
                "HyperPodPyTorchJob", "unknown", f"{key[0]}/{key[1]}: {'; '.join(spec.problems)}"
            )
        job = self.elastic.on_hyperpod_job(key, spec, now, self.observed_live(now))
        if job is not None:
            self._elastic_accounting(job, now)

    # --- elastic jobs and idle GPUs -------------------------------------------------------

    def _idle_node(self, name: str, now: float) -> None:
        node = self.nodes.get(name)
        if node is None:
            return
        place_of = self.tree.placement(name)
        domain = place_of.layers[-1] if place_of is not None and place_of.layers else ""
        flavor = self._node_flavor.get(name, "")
        self.idle.set_node(
            name,
            flavor,
            domain,
            idle.node_state(node),
            node.allocatable_gpus,
            self.tree.node_used(name),
            now,
        )

    def _idle_used(self, name: str, now: float) -> None:
        """Only the pods on `name` changed: its idle GPUs, the rest as `_idle_node` last said
        (every change of a node's labels, state or flavor goes through `_idle_node`)."""
        if not self.idle.set_used(name, self.tree.node_used(name), now):
            self._idle_node(name, now)

    def _idle_demand(self, workload: Workload, now: float) -> None:
        """A pending Workload is demand for its flavor, by the cause Kueue gave; an admitted,
        finished or inactive one is none."""
        cause = idle.demand_cause(workload) if is_pending(workload) else None
        if cause is None:
            self.idle.remove_demand(workload.key, now)
            return
        cq = self.cluster_queues.get(self.cluster_queue_of(workload))
        flavors = [q.flavor for q in cq.gpu_quotas] if cq is not None else []
        flavor = idle.demand_flavor(workload, flavors)
        self.idle.set_demand(workload.key, flavor, cause, workload.gpus_requested, now)

    def _elastic_workload(
        self,
        old: Workload | None,
        new: Workload | None,
        now: float,
        obj: Mapping[str, Any] | None = None,
    ) -> None:
        current = new if new is not None else old
        if current is None or job_of(current) is None:
            return  # not an elastic job's Workload: the book would ignore it (on_workload)
        time = now
        if new is not None and old is None and new.created is not None:
            time = new.created
        flavor = ""
        for placement in current.placements:
            for resource, name in placement.flavors:
                if resource == GPU_RESOURCE:
                    flavor = name
        job = self.elastic.on_workload(
            old,
            new,
            self.cluster_queue_of(current),
            flavor,
            now,
            self.observed_live(time),
            _evidence(obj),
        )
        if job is not None:
            self._elastic_accounting(job, now)

    def _elastic_pods(self, owner_uid: str, now: float) -> None:
        job = self.elastic.by_uid(owner_uid) if owner_uid else None
        if job is None:
            return
        bound = 0
        ready: list[float] = []
        own: dict[str, tuple[int, list[float]]] = {}  # by the Workload each pod names
        for key in self._pods_by_group.get(owner_uid, ()):
            pod = self.pods.get(key)
            if pod is None or not pod.holds_gpus or pod.gated:
                continue
            bound += 1
            count, times = own.get(pod.workload) or (0, [])
            if pod.ready_since is not None:
                ready.append(pod.ready_since)
                times.append(pod.ready_since)
            own[pod.workload] = (count + 1, times)
        ready.sort()
        by_workload = {name: (n, tuple(sorted(t))) for name, (n, t) in own.items() if name}
        if bound != job.bound or tuple(ready) != job.ready_times or by_workload != job.by_workload:
            self.elastic.on_pods(
                job, bound, tuple(ready), now, self.observed_live(now), by_workload
            )
            self._elastic_accounting(job, now)

    def _elastic_accounting(self, job: JobState, now: float) -> None:
        """The job's GPUs above its minimum (absorbed), and the room to its maximum, which is
        claimable demand while it has no scale-up Workload waiting (the operator will ask)."""
        team = team_of(job.cluster_queue)
        gpus = job.gpus_per_replica
        self.idle.set_absorbed(job.key, job.flavor, team, job.absorbed_replicas * gpus, now)
        high = job.max_replicas
        waiting = any(is_pending(w) for w in job.workloads.values())
        room = 0 if high is None or job.unknown or waiting else max(0, high - job.admitted)
        if room and job.workloads:
            self.idle.set_demand(("elastic", *job.key), job.flavor, "claimable", room * gpus, now)
        else:
            self.idle.remove_demand(("elastic", *job.key), now)

    # --- workloads: indexes, timeline, admissions -----------------------------------------

    def _index_workload(self, workload: Workload) -> None:
        key = workload.key
        if workload.uid:
            self._wl_by_uid[workload.uid] = key
        for uid in (workload.job_uid, workload.owner_uid):
            if uid:
                self._wl_by_job[uid] = key

    def _unindex_workload(self, workload: Workload) -> None:
        key = workload.key
        if self._wl_by_uid.get(workload.uid) == key:
            del self._wl_by_uid[workload.uid]
        for uid in (workload.job_uid, workload.owner_uid):
            if uid and self._wl_by_job.get(uid) == key:
                del self._wl_by_job[uid]

    def _add_timeline(self, state: WorkloadState, entry: TimelineEntry) -> None:
        # A preemption arrives as a condition and as an Event, a second or two apart.
        window = SAME_PREEMPTION_WINDOW_S if entry.step == "preempted" else 0.0
        for known in reversed(state.timeline[-8:]):
            if known.step != entry.step:
                continue
            if known.time == entry.time or (
                known.time is not None
                and entry.time is not None
                and abs(known.time - entry.time) <= window
            ):
                return
        state.timeline.append(entry)
        state.timeline.sort(key=lambda e: (e.time is None, e.time or 0.0))
        if len(state.timeline) > self.timeline_limit:
            # keep "created" (the first entry) and the most recent steps
            del state.timeline[1 : len(state.timeline) - self.timeline_limit + 1]

    def _observe_admission(self, state: WorkloadState) -> None:
        workload = state.workload
        admitted = workload.condition("Admitted")
        if admitted is None or admitted.status != "True" or admitted.last_transition is None:
            return
        if state.observed_admission == admitted.last_transition:
            return
        state.observed_admission = admitted.last_transition
        queued_since = workload.created
        for cond_type in ("Requeued", "Evicted"):
            cond = workload.condition(cond_type)
            if (
                cond is not None
                and cond.last_transition is not None
                and cond.last_transition <= admitted.last_transition
                and (queued_since is None or cond.last_transition > queued_since)
            ):
                queued_since = cond.last_transition
        if queued_since is None:
            return
        request = analysis.workload_request(workload)
        mode = request.mode if request is not None else "none"
        hist_key = (self.cluster_queue_of(workload), mode)
        hist = self.wait_histograms.get(hist_key)
        if hist is None:
            hist = self.wait_histograms[hist_key] = WaitHistogram()
        hist.observe(max(0.0, admitted.last_transition - queued_since))

    # --- what the preemption judge reads (exporter.cluster.preemptions) --------------------

    def observed_live(self, time: float) -> bool:
        """Whether a preemption that happened at `time`, reaching the model now, was seen
        happening by this process, as opposed to rebuilt from history. Only live ones count.

        The rule: a copy (a victim's condition or a `Preempted` Event) is live unless
        - it arrives in the first list of its kind (the start-up list, applied through
          `replace` before that kind's first watch event): those objects were already there
          when this process began to watch, whatever their timestamps say; or
        - the preemption (the earliest timestamp of its copies: the condition's
          lastTransitionTime, the Event's firstTimestamp or eventTime) is older than the
          watch's start, `watch_start` (the `now` of the model's first list or event),
          by more than `LIVE_SLACK_S`: a watch event or a later re-list (after 410 Gone) that
          carries it is an old object updated, not a preemption happening.
        A preemption is live when any of its copies is: with the Events listed before it and
        the Workloads after, its condition arrives in a first list but its Event is watched.
        Counted exactly once: when it is first live with its labels settled (the judge's
        `PreemptionJudge._record`), so a copy arriving later, in either order, or a re-list
        repeating it, moves nothing. A preemption during a broken watch, seen first in the
        re-list, is counted then; one that happened while no process ran is in no process's
        counter (it stays in the ledger)."""
        if self._replaying_history:
            return False
        return self.watch_start is None or time >= self.watch_start - LIVE_SLACK_S

    def find_workload(self, uid: str, job_uid: str) -> Workload | None:
        """A Workload by its UID, else by its job's UID (job-uid label or owner UID)."""
        key = self._wl_by_uid.get(uid) if uid else None
        if key is None and job_uid:
            key = self._wl_by_job.get(job_uid)
        state = self.workloads.get(key) if key is not None else None
        return state.workload if state is not None else None

    # --- pods of a workload ---------------------------------------------------------------

    def pod_groups(self, pod: Pod) -> list[object]:
        groups: list[object] = []
        if pod.workload:
            groups.append((pod.namespace, pod.workload))
        if pod.owner_uid:
            groups.append(pod.owner_uid)
        if pod.job_uid and pod.job_uid != pod.owner_uid:
            groups.append(pod.job_uid)
        return groups

    def _regroup(self, old: Pod | None, new: Pod | None) -> None:
        """`old` (the pod as last seen) leaves its groups and `new` joins its own; a pod that
        stays in the same groups (most events) only moves their epochs."""
        if (
            old is not None
            and new is not None
            and old.workload == new.workload
            and old.owner_uid == new.owner_uid
            and old.job_uid == new.job_uid
        ):
            epoch = self._group_epoch
            for group in self.pod_groups(new):
                epoch[group] += 1
            return
        if old is not None:
            self._ungroup(old)
        if new is not None:
            self._group(new)

    def _group(self, pod: Pod) -> None:
        for group in self.pod_groups(pod):
            self._pods_by_group.setdefault(group, set()).add(pod.key)
            self._group_epoch[group] += 1

    def _ungroup(self, pod: Pod) -> None:
        for group in self.pod_groups(pod):
            members = self._pods_by_group.get(group)
            if members is not None:
                members.discard(pod.key)
                if not members:
                    del self._pods_by_group[group]
            self._group_epoch[group] += 1

    def workload_groups(self, workload: Workload) -> list[object]:
        groups: list[object] = [workload.key]
        for uid in (workload.owner_uid, workload.job_uid):
            if uid and uid not in groups:
                groups.append(uid)
        return groups

    def pods_of(self, workload: Workload) -> list[Pod]:
        """The Workload's pods: by its key, its owner's UID and its job-uid label, less those
        whose `kueue.x-k8s.io/workload` annotation names another live Workload (the Workloads of
        an elastic HyperPodPyTorchJob share one owner, reference 1.4). A Kueue elastic slice
        that finished (replaced: WorkloadSliceReplaced) owns none: its quota and its running
        pods passed to the slice that replaced it (reference 1.6)."""
        if (workload.elastic or workload.slice_name) and workload.is_true("Finished"):
            return []
        keys: set[tuple[str, str]] = set()
        for group in self.workload_groups(workload):
            keys.update(self._pods_by_group.get(group, ()))
        pods = [self.pods[k] for k in keys if k in self.pods]
        return [
            p for p in pods if p.namespace == workload.namespace and self._pod_is_of(p, workload)
        ]

    def _pod_is_of(self, pod: Pod, workload: Workload) -> bool:
        if not pod.workload or pod.workload == workload.name:
            return True
        named = self.workloads.get((pod.namespace, pod.workload))
        return named is None or named.workload.is_true("Finished")

    def locality_of(self, state: WorkloadState) -> Locality:
        workload = state.workload
        stamp = (
            self._labels_epoch,
            workload.is_true("Finished"),  # a finished slice's pods are no longer its own
            *(self._group_epoch.get(g, 0) for g in self.workload_groups(workload)),
        )
        cached = state.locality_cache
        if cached is not None and cached[0] == stamp:
            return cached[1]
        placements = {}
        placed = 0
        for pod in self.pods_of(workload):
            if not pod.holds_gpus:
                continue
            placed += 1
            place = self.tree.placement(pod.node)
            if place is not None:
                placements[pod.node] = place
        value = locality(placements, analysis.workload_request(workload), placed)
        state.locality_cache = (stamp, value)
        return value

    # --- queues ---------------------------------------------------------------------------

    def cluster_queue_of(self, workload: Workload | None) -> str:
        if workload is None:
            return ""
        if workload.cluster_queue:
            return workload.cluster_queue
        lq = self.local_queues.get((workload.namespace, workload.queue_name))
        return lq.cluster_queue if lq is not None else ""

    def quota_tree(
        self,
        at: float | None = None,
        exclude: Iterable[WorkloadKey] = (),
        written_before: int | None = None,
    ) -> QuotaTree:
        """Kueue's cohort forest with the quota held now, or at a past moment `at`
        (`written_before`: see `ReservationBook.held_at`).

        Now: the model's own accounting of reservations, raised to a ClusterQueue status that
        says more (its workloads may not all be listed yet). At a past moment: the accounting
        alone, which does not depend on when a status update arrived."""
        if at is None and not exclude:
            stamp = (self.reservations.epoch, self._queues_epoch)
            if self._quota_cache is not None and self._quota_cache[0] == stamp:
                return self._quota_cache[1]
        if at is None:
            usage = self.reservations.usage_now()
            for cq in self.cluster_queues.values():
                held = usage.setdefault(cq.name, {})
                for flavor, resource, total in cq.reservation:
                    key = (flavor, resource)
                    held[key] = max(held.get(key, 0), total)
        else:
            usage = self.reservations.usage_at(at, exclude, written_before)
        tree = QuotaTree.build(
            self.cluster_queues.values(),
            self.cohort_specs.values(),
            usage,
            flavors=set(self.flavors) or None,  # a dump lists no ResourceFlavors
        )
        if at is None and not exclude:
            self._quota_cache = ((self.reservations.epoch, self._queues_epoch), tree)
            self._note_quota_problems(tree)
        return tree

    def _note_quota_problems(self, tree: QuotaTree) -> None:
        """Count each quota problem (unknown flavor, cohort cycle, bad quantity...) once when it
        appears, under its cause, so the object-problem counter names it; answers about the
        affected queues say "unknown: <why>" meanwhile."""
        current = {(p.kind, p.name, p.cause): str(p) for p in tree.problems}
        for key, detail in current.items():
            if key not in self._quota_problems_seen:
                self._problem(key[0] if key[0] != "usage" else "Workload", key[2], detail)
        self._quota_problems_seen = set(current)

    def flavor_spec(self, flavor: str) -> ResourceFlavor | None:
        """The ResourceFlavor `flavor`; in a dump that lists none, the one HyperPod's naming
        implies (`_flavor_by_instance_type`), else None (unknown: every node)."""
        spec = self.flavors.get(flavor)
        if spec is None and flavor and "ResourceFlavor" in self.missing_kinds:
            spec = _flavor_by_instance_type(flavor, self.nodes.values())
        return spec

    def assignment(self, workload: Workload, tree: QuotaTree) -> QuotaAssignment | None:
        """Kueue's flavor assignment for the workload on `tree`'s quota, resource by resource
        (`exporter.cluster.capacity.flavors.assign`): an admitted workload keeps its
        admission's flavors, a pending one gets the flavors Kueue's flavor assigner would try,
        in order, passing over those its pods cannot use. None when its ClusterQueue is not
        known. Workloads of one shape in one queue share the answer while the tree stands."""
        queue = self.cluster_queue_of(workload)
        cq = self.cluster_queues.get(queue)
        if cq is None:
            return None
        if self._assignment_tree is not tree:
            self._assignment_cache.clear()
            self._gpu_answers.clear()
            self._assignment_tree = tree
        replaced = self.replaced_slice(workload)
        key = (
            queue,
            tuple(
                (p.name, p.count, p.per_pod, p.constraints, p.topology) for p in workload.pod_sets
            ),
            tuple((p.name, p.flavors) for p in workload.placements),
            flavor_assigner.level_mismatches(workload),  # Kueue's word where levels are unknown
            None if replaced is None else (replaced.key, replaced.placements),
        )
        found = self._assignment_cache.get(key)
        if found is None:
            found = flavor_assigner.assign(
                workload, cq, tree, self._known_flavor, self._topology_levels, replaced
            )
            if len(self._assignment_cache) < 4096:
                self._assignment_cache[key] = found
        return found

    def _known_flavor(self, flavor: str) -> ResourceFlavor | None:
        return self.flavor_spec(flavor)

    def replaced_slice(self, workload: Workload) -> Workload | None:
        """The slice a pending Kueue elastic Workload replaces (workload-slice-replacement-for)
        while it holds quota in the same ClusterQueue (workloadslicing.ReplacedWorkloadSlice:
        a Workload of the queue's snapshot, same namespace), else None."""
        if not workload.replacement_for or workload.placements:
            return None
        namespace, _, name = workload.replacement_for.partition("/")
        state = self.workloads.get((namespace, name))
        if namespace != workload.namespace or state is None:
            return None
        old = state.workload
        if not old.placements or not old.is_true("QuotaReserved") or old.is_true("Finished"):
            return None
        return old if old.cluster_queue == self.cluster_queue_of(workload) else None

    def _topology_levels(self, name: str) -> tuple[str, ...] | None:
        topology = self.topologies.get(name)
        return topology.levels if topology is not None else None

    def flavor_levels(self, flavor: str) -> tuple[str, ...] | None:
        """The levels (node label keys, highest first) of the flavor's Topology, if known."""
        spec = self.flavor_spec(flavor)
        return self._topology_levels(spec.topology_name) if spec is not None else None

    def quota_for(self, workload: Workload, tree: QuotaTree) -> tuple[str, Answer | None]:
        """The GPU flavor the workload would use and what its queue can still admit there.

        The flavor is Kueue's flavor assigner's (`assignment`): an admitted workload's is its
        assignment's; otherwise the first of the ClusterQueue's flavors its pods may use whose
        quota fits every resource it requests, else the most preferred that does not
        (flavorassigner.go: a flavor whose nodeLabels its nodeSelector rules out is never
        tried). A workload without GPUs answers for its first resource group's flavor."""
        flavor, answer, _ = self.quota_of(workload, tree)
        return flavor, answer

    def quota_of(
        self, workload: Workload, tree: QuotaTree
    ) -> tuple[str, Answer | None, QuotaAssignment | None]:
        """`quota_for` and the whole `assignment`, worked out once."""
        queue = self.cluster_queue_of(workload)
        cq = self.cluster_queues.get(queue)
        if cq is None:
            return "", None, None
        found = self.assignment(workload, tree)
        flavor = found.flavor_for(GPU_RESOURCE) if found is not None else ""
        if not flavor and found is not None and found.groups:
            chosen = found.groups[0].chosen
            flavor = chosen.flavor if chosen is not None else ""
        if not flavor:
            flavors = [q.flavor for q in cq.gpu_quotas]
            flavor = flavors[0] if flavors else ""
        if self._assignment_tree is not tree:
            self._assignment_cache.clear()
            self._gpu_answers.clear()
            self._assignment_tree = tree
        key = (queue, flavor)
        answer = self._gpu_answers.get(key)
        if answer is None:
            answer = self._dump_caveat(cq, tree.available(queue, flavor, GPU_RESOURCE))
            self._gpu_answers[key] = answer
        return flavor, answer, found

    def _dump_caveat(self, cq: ClusterQueue, answer: Answer) -> Answer:
        """An answer from a dump, saying which kinds it did not hold would change it."""
        if answer.amount is None:
            return answer
        unseen = []
        if cq.cohort and "Cohort" in self.missing_kinds:
            unseen.append(f"Cohort objects, whose quota above {cq.cohort!r} or cycle")
        if "ResourceFlavor" in self.missing_kinds:
            unseen.append("ResourceFlavor objects, whose absence for a named flavor")
        if not unseen:
            return answer
        return Answer(
            answer.amount,
            f"{answer.reason} (as far as the dump shows: it holds no"
            f" {' and no '.join(unseen)} would change this)",
            answer.cause,
        )

    def eligibility(self, flavor: str, pod_set: PodSetRequest | None = None) -> Eligibility:
        """The nodes `flavor` selects that a pod of `pod_set` may use now (and why the others
        not): the pod set's tolerations, nodeSelector and required node affinity count, as
        Kueue's TAS counts them (`screen_nodes`). A flavor no ResourceFlavor describes (a dump
        lists none) selects every node. Kept per (flavor, those constraints)."""
        constraints = pod_set.constraints if pod_set is not None else None
        key = (flavor, constraints)
        cached = self._eligibility_cache.get(key)
        stamp = (self._nodes_epoch, self._queues_epoch)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        spec = self.flavor_spec(flavor)
        topology = self.topologies.get(spec.topology_name) if spec is not None else None
        levels = topology.levels if topology is not None else ()
        if pod_set is None:
            value = screen_nodes(spec, self.nodes, topology_levels=levels)
        else:
            value = screen_nodes(
                spec,
                self.nodes,
                dict(pod_set.node_selector),
                pod_set.tolerations,
                levels,
                pod_set.affinity,
            )
        if len(self._eligibility_cache) > 1024:
            self._eligibility_cache.clear()
        self._eligibility_cache[key] = (stamp, value)
        return value

    # --- questions ------------------------------------------------------------------------

    def workload_state(self, namespace: str, name: str) -> WorkloadState | None:
        return self.workloads.get((namespace, name))

    def find_by_uid(self, uid: str) -> WorkloadState | None:
        key = self._wl_by_uid.get(uid)
        return self.workloads.get(key) if key is not None else None

    def pending_cause(self, workload: Workload) -> PendingCause | None:
        if not is_pending(workload):
            return None
        tree = self.quota_tree()
        flavor, quota, assigned = self.quota_of(workload, tree)
        pod_set: PodSetRequest | None = None
        answer: PlacementAnswer | None = None
        where = flavor
        if assigned is None or assigned.fits or assigned.limit == "unknown":
            # Kueue tries placement only once quota fits (flavorassigner.go assignFlavors)
            pod_set, where, answer = self._tas_answer(workload, assigned, flavor)
        note = nodes_note = ""
        node_problems: tuple[str, ...] = ()
        if pod_set is not None and answer is not None and not answer.placeable:
            note = self._unavailable_note(where, pod_set)
            eligibility = self.eligibility(where, pod_set)
            nodes_note, node_problems = eligibility.summary, eligibility.problems
        return analysis.pending_cause(
            workload,
            quota,
            answer,
            unavailable_note=note,
            assignment=assigned,
            flavor=flavor,
            nodes_note=nodes_note,
            node_problems=node_problems,
        )

    def _tas_answer(
        self, workload: Workload, assigned: QuotaAssignment | None, flavor: str
    ) -> tuple[PodSetRequest | None, str, PlacementAnswer | None]:
        """Kueue's TAS on each pod set it places (`flavors.tas_pod_sets`: explicit requests,
        and on a TAS-only ClusterQueue implied ones, each on its own flavor): the first it
        cannot place, else the first that asks for a topology, else the first; with the
        flavor it was placed on."""
        chosen: tuple[PodSetRequest | None, str, PlacementAnswer | None] = (None, flavor, None)
        replaced = self.replaced_slice(workload)
        for pod_set, where in flavor_assigner.tas_pod_sets(workload, assigned, flavor, replaced):
            answer = self._placement(where, pod_set)
            if not answer.placeable:
                return pod_set, where, answer
            first = chosen[0]
            if first is None or (first.topology.mode == "none" and pod_set.topology.mode != "none"):
                chosen = (pod_set, where, answer)
        return chosen

    def _unavailable_note(self, flavor: str, pod_set: PodSetRequest) -> str:
        """Why nodes the flavor selects are unavailable, when that is what blocks the pod set:
        "blocked because 3 nodes of nn-a are in a deep health check (a1, a2, a3)" when Kueue's
        TAS would place it with those nodes back, "also unavailable: ..." otherwise."""
        eligibility = self.eligibility(flavor, pod_set)
        out = [e for e in eligibility.excluded if e.cause in UNAVAILABLE_CAUSES]
        if not out:
            return ""
        names = frozenset(e.node for e in out)
        # "\0" cannot start a flavor name: these answers share the cache, not its keys.
        key = (f"\0back:{flavor}", *_shape_key(pod_set))
        back = self._placement_cache.get(key)  # the cache is cleared when the tree changes
        if back is None:
            spec = self.flavor_spec(flavor)
            topology = self.topologies.get(spec.topology_name) if spec is not None else None
            back = place(
                self.resources_free(_AvailableAgain(self.tree, self.nodes, names)),
                eligibility.nodes | names,
                pod_set.topology,
                pod_set.count,
                pod_set.gpus_per_pod,
                levels=topology.levels if topology is not None else None,
                requests=pod_set.per_pod,
            )
            self._placement_cache[key] = back
        if back.placeable and back.domains:
            chosen = set(back.domains)
            inside = [e for e in out if self._domain_of(e.node, back.level) in chosen]
            if inside:
                held = sorted({self._domain_of(e.node, back.level) or "" for e in inside})
                where = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
                return f"blocked because {_unavailable_words(inside, where)}"
        return f"also unavailable: {_unavailable_words(out, '')}"

    def _domain_of(self, node: str, level: str) -> str | None:
        if level == "node":
            return node
        place_of = self.tree.placement(node)
        return None if place_of is None else place_of.domain_at(level)

    def _placement(self, flavor: str, pod_set: PodSetRequest) -> PlacementAnswer:
        """Where Kueue's TAS could place the pod set now: on the nodes its flavor selects and
        its pods may use, counting every resource a pod requests against what each node has
        left. Many pending workloads share a few shapes: answers are kept per (flavor, shape)
        until the tree, the nodes or what their pods request change."""
        stamp = (self.tree.version, self._nodes_epoch, self._queues_epoch, self._usage_epoch)
        if self._placement_stamp != stamp:
            self._placement_cache.clear()
            self._placement_stamp = stamp
        key = (flavor, *_shape_key(pod_set))
        answer = self._placement_cache.get(key)
        if answer is None:
            spec = self.flavor_spec(flavor)
            topology = self.topologies.get(spec.topology_name) if spec is not None else None
            answer = place(
                self.resources_free(),
                self.eligibility(flavor, pod_set).nodes,
                pod_set.topology,
                pod_set.count,
                pod_set.gpus_per_pod,
                levels=topology.levels if topology is not None else None,
                requests=pod_set.per_pod,
            )
            self._placement_cache[key] = answer
        return answer

    def preferred_would_place(self, workload: Workload, flavor: str) -> bool:
        """Whether a preferred request at the level the workload requires could place its
        pods now on its flavor's nodes (`place`: the level, each level up, then spread; every
        resource counted): only then would relaxing required to preferred start it."""
        pod_set = next(
            (p for p in workload.pod_sets if p.topology.mode == "required" and p.topology.level),
            None,
        )
        if pod_set is None:
            return False
        relaxed = replace(pod_set, topology=replace(pod_set.topology, mode="preferred"))
        return self._placement(flavor, relaxed).placeable

    def pending(self) -> list[tuple[Workload, PendingCause]]:
        out = []
        for state in self.workloads.values():
            cause = self.pending_cause(state.workload)
            if cause is not None:
                out.append((state.workload, cause))
        return out

    def live(self) -> list[WorkloadState]:
        return [s for s in self.workloads.values() if is_live(s.workload)]

    # --- problems -------------------------------------------------------------------------

    def _problem(self, kind: str, problem: str, detail: str) -> None:
        self.problems[(kind, problem)] += 1
        self.recent_problems.append(detail)

    def drain_problems(self) -> list[str]:
        out = list(self.recent_problems)
        self.recent_problems.clear()
        return out


def is_live(workload: Workload) -> bool:
    return workload.is_true("Admitted") and not workload.is_true("Finished")


def is_pending(workload: Workload) -> bool:
    return not workload.is_true("QuotaReserved") and not workload.is_true("Finished")


# These run for every event: `type(x) is dict` first, since isinstance against the Mapping ABC
# costs a Python-level __instancecheck__ call each time.
def _object_key(obj: Mapping[str, Any]) -> ObjectKey | None:
    meta = obj.get("metadata")
    if type(meta) is not dict and not isinstance(meta, Mapping):
        return None
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    namespace = meta.get("namespace")
    return (namespace, name) if isinstance(namespace, str) and namespace else name


def _resource_version(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if type(meta) is dict or isinstance(meta, Mapping) else None
    return rv if isinstance(rv, str) else ""


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name", "") if type(meta) is dict or isinstance(meta, Mapping) else ""
    return name if isinstance(name, str) else ""


def _namespace(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    ns = meta.get("namespace", "") if type(meta) is dict or isinstance(meta, Mapping) else ""
    return ns if isinstance(ns, str) else ""


def _same_at(
    old: tuple[tuple[str, str], ...], new: tuple[tuple[str, str], ...], keys: frozenset[str]
) -> bool:
    """Whether two nodes' labels (sorted (key, value) pairs, as `Node.labels`) agree on every
    key in `keys`. A label added or removed anywhere answers False (cheaper than finding out
    where): only an equal key set is compared pair by pair."""
    if len(old) != len(new):
        return False
    for a, b in zip(old, new, strict=True):
        if a != b and (a[0] in keys or b[0] in keys):
            return False
    return True


def _evidence(obj: Mapping[str, Any] | None) -> tuple[int | None, int | None] | None:
    """What a Workload's status keeps of its past admissions, for its elastic job."""
    found = admission_evidence(obj) if obj is not None else None
    return None if found is None else (found.admitted_s, found.evictions)


def _stub(key: Any) -> dict[str, Any]:
    if isinstance(key, tuple):
        return {"metadata": {"namespace": key[0], "name": key[1]}}
    return {"metadata": {"name": key}}


def _shape_key(pod_set: PodSetRequest) -> tuple[Any, ...]:
    """What a placement answer depends on besides the flavor and the cluster."""
    return (pod_set.topology, pod_set.count, pod_set.per_pod, pod_set.constraints)


class _AvailableAgain:
    """The tree's free GPUs, with the `back` nodes (out for a deep health check or an EC2
    event) counted free again: allocatable minus use (a `FreeCapacity`)."""

    def __init__(self, tree: TopologyTree, nodes: Mapping[str, Node], back: frozenset[str]) -> None:
        self._tree = tree
        self._nodes = nodes
        self._back = back

    def node_free(self, node: str) -> int:
        if node not in self._back:
            return self._tree.node_free(node)
        spec = self._nodes.get(node)
        if spec is None or self._tree.placement(node) is None:
            return 0
        return max(0, spec.allocatable_gpus - self._tree.node_used(node))

    def placement(self, node: str) -> Placement | None:
        return self._tree.placement(node)


def _unavailable_words(excluded: Sequence[Exclusion], where: str) -> str:
    """ "3 nodes of nn-a are in a deep health check (a1, a2, a3) and 1 has an EC2 scheduled
    event (a4: system-reboot from ...)"; `where` "" leaves out the "of <domain>"."""
    parts: list[str] = []
    of = f" of {where}" if where else ""
    for cause in UNAVAILABLE_CAUSES:
        found = [e for e in excluded if e.cause == cause]
        if not found:
            continue
        count = len(found)
        if cause == "deep-health-check":
            verb = "is" if count == 1 else "are"
            what = f"{verb} in a deep health check"
            names = ", ".join(e.node for e in found[:5])
        else:
            what = "has an EC2 scheduled event" if count == 1 else "have EC2 scheduled events"
            names = ", ".join(f"{e.node}: {e.detail}" for e in found[:5])
        more = ", ..." if count > 5 else ""
        noun = "node" if count == 1 else "nodes"
        head = f"{count} {noun}{of}" if not parts else f"{count}"
        parts.append(f"{head} {what} ({names}{more})")
    return " and ".join(parts)


def _flavor_by_instance_type(flavor: str, nodes: Iterable[Node]) -> ResourceFlavor | None:
    """A dump without ResourceFlavors: HyperPod names each flavor after the instance type it
    selects (`ml.p5.48xlarge` selects node.kubernetes.io/instance-type=ml.p5.48xlarge), so a
    flavor whose name some node carries as its instance type is taken to select those nodes.
    Any other name stays unknown (None: every node)."""
    if not any(node.label(INSTANCE_TYPE_KEY) == flavor for node in nodes):
        return None
    # Its Topology is unknown too: a name no Topology has, so none is taken for it (and the
    # flavor assigner does not take it for a flavor without TAS).
    return ResourceFlavor(flavor, ((INSTANCE_TYPE_KEY, flavor),), UNKNOWN_TOPOLOGY)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
