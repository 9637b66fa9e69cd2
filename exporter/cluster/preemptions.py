"""The preemption judge: why Kueue preempted a Workload, as the model saw the cluster then.

Kueue tells of a preemption twice: the victim's condition (`Preempted` True, or `Evicted` True
with reason `Preempted`) and a `Preempted` Event on the victim, a second or two apart; both
carry Kueue's preemption message, which names the preemptor by UID (and JobUID, and from v0.15
its queue path). For each copy the judge pairs victim and preemptor, records the pair in the
`PreemptionLedger` (which merges the copies), and decides the verdict:

- "quota": the preemptor's ClusterQueue could not reserve some resource it needed (GPUs,
  cpu, memory, ...: Kueue checks each, flavorassigner.go `fitsResourceQuota`), named in the
  record with its flavor, or no pod set of it goes through TAS (it asked for no topology on a
  queue that is not TAS-only), so only quota could block it;
- "topology": its queue had the quota for every resource, but TAS could not place a pod set:
  no domain of its required level held its pods, or a preferred, unconstrained or implied
  request (a TAS-only ClusterQueue, tas_flavorassigner.go `isTASImplied`) found no room, on
  the nodes its flavor selects and its pods may use (their tolerations, nodeSelector and
  required affinity; every requested resource counted);
- "unknown": anything else, with the reason (the preemptor not seen, the preemption older
  than `VERDICT_FRESHNESS_S`, the informers' first lists not all in, a model built from a dump).

That is Kueue's own rule (scheduler.go: a workload that does not fit its flavors' quota preempts
for quota; a TAS workload whose quota fits but whose pods no domain of the required level can
hold preempts to make room there, tas_flavor_snapshot.go `FindTopologyAssignmentsForFlavor`
with preemption), written in `analysis.preemption_verdict`. The judge reconstructs what Kueue
saw when it chose: quota from the model's own accounting of reservations at the preemption's
time (clusterqueue.go `updateWorkloadUsage`: victims still holding theirs, the preemptor not
yet; `exporter.cluster.reservations`), free capacity from the pods then (the victims' pods
already deleted still held theirs, the preemptor's pods already bound had not taken theirs,
and workloads admitted by then, the same scheduling cycle included, held their topology
assignment's nodes before their pods were bound), judged once the victim's eviction has
arrived (`AWAITING_VICTIM`: what Kueue wrote before it is then in),
both in the preemptor's own world: the flavors of its admission, else those Kueue's flavor
assigner would try for it (`ClusterModel.assignment`: never a flavor its nodeSelector rules
out), and only the domains its pods could use there. No ClusterQueue status is read, so the
same events in any order give the same verdict.

It also keeps `topowatch_preemptions_total`'s counts: a preemption is counted once, when it is
live (`ClusterModel.observed_live`) and its preemptor's labels are settled, so a counter never
has to be taken back.

The judge reads the model through `ClusterView` and never writes to it; the model calls it
from its handlers (`on_workload`, `on_event`, `pod_released`) and its event loop
(`judge_deferred`, `expire`).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from exporter.cluster import analysis
from exporter.cluster.capacity.flavors import QuotaAssignment, tas_pod_sets
from exporter.cluster.capacity.placement import (
    Eligibility,
    Fit,
    FreeCapacity,
    NodeResourcesFree,
    PlacementAnswer,
    fit,
    place,
)
from exporter.cluster.capacity.quota import Answer, QuotaTree
from exporter.cluster.ledger import PreemptionLedger, PreemptionRecord, Verdict
from exporter.cluster.objects import (
    GPU_RESOURCE,
    PODS_RESOURCE,
    KubeEvent,
    Node,
    Pod,
    PodSetRequest,
    Resources,
    Workload,
)
from exporter.cluster.parse.kueue import parse_preemption_message, reason_for_cause
from exporter.cluster.reservations import ReservationBook
from exporter.topology.labels import HOSTNAME_KEY
from exporter.topology.tree import Placement, TopologyTree, level_of_label_key

WorkloadKey = tuple[str, str]

# A preemption seen later than this after it happened (a restart, a long disconnect) gets no
# verdict: the free capacity it was decided against is gone.
VERDICT_FRESHNESS_S = 120.0
# How long a pod's released GPUs (and a workload's released reservation, for the model's
# ReservationBook) are remembered: a verdict may judge a moment this far back.
RELEASE_MEMORY_S = 300.0
AWAIT_PREEMPTOR_S = 60.0
AWAITING_LISTS = "awaiting the informers' first lists; judged once every kind has listed"
# A `Preempted` Event may arrive before the victim's Workload update that evicted it. Kueue
# writes the workloads admitted earlier in the same scheduling cycle, and those that finished
# before it, ahead of that eviction (scheduler.go `processEntry`: each admission adds its usage
# to the cycle's snapshot, `AddUsage`, before later entries preempt), and one Workload watch
# keeps the order of writes: the verdict waits for the eviction, so the quota and capacity it
# judges include them. After AWAIT_PREEMPTOR_S it is judged with what has arrived.
AWAITING_VICTIM = (
    "awaiting the victim's Workload update that evicted it (the workloads admitted earlier in"
    " the same scheduling cycle are written before it); judged then"
)

# Victim, preemptor ClusterQueue, reason, verdict.
CountKey = tuple[str, str, str, str]
# A pod that gave its node's resources back: node, GPUs, when, requests, its key.
_Release = tuple[str, int, float, Resources, tuple[str, str]]


class HoldsWorkload(Protocol):
    @property
    def workload(self) -> Workload: ...


class ClusterView(Protocol):
    """What the judge reads from the model (`ClusterModel` is one); it writes nothing there."""

    @property
    def tree(self) -> TopologyTree: ...

    @property
    def nodes(self) -> Mapping[str, Node]: ...

    @property
    def workloads(self) -> Mapping[WorkloadKey, HoldsWorkload]: ...

    @property
    def caught_up_at(self) -> float | None:
        """When every expected kind had listed (None: not yet, or none expected)."""
        ...

    def caught_up(self, now: float) -> bool: ...

    def observed_live(self, time: float) -> bool: ...

    def find_workload(self, uid: str, job_uid: str) -> Workload | None: ...

    def cluster_queue_of(self, workload: Workload | None) -> str: ...

    def pods_of(self, workload: Workload) -> list[Pod]: ...

    def pod_groups(self, pod: Pod) -> list[object]: ...

    def workload_groups(self, workload: Workload) -> list[object]: ...

    def quota_tree(
        self,
        at: float | None = None,
        exclude: Iterable[WorkloadKey] = (),
        written_before: int | None = None,
    ) -> QuotaTree: ...

    def quota_for(self, workload: Workload, tree: QuotaTree) -> tuple[str, Answer | None]: ...

    def assignment(self, workload: Workload, tree: QuotaTree) -> QuotaAssignment | None: ...

    def eligibility(self, flavor: str, pod_set: PodSetRequest | None = None) -> Eligibility: ...

    def flavor_levels(self, flavor: str) -> tuple[str, ...] | None:
        """The levels (node label keys, highest first) of the flavor's Topology, if known."""
        ...

    def replaced_slice(self, workload: Workload) -> Workload | None:
        """The slice a Kueue elastic Workload replaces, while it holds its quota."""
        ...

    def node_requested(self, node: str) -> Mapping[str, int]: ...

    @property
    def reservations(self) -> ReservationBook:
        """Who held quota when, each with its Workload as last seen holding it."""
        ...


class PreemptionJudge:
    """Ledgers, judges and counts the preemptions the model is told of.

    `enabled=False` for a model built from a dump: a dump shows the cluster after its
    preemptions, so it cannot tell quota-driven from topology-driven ones. `report(kind,
    problem, detail)` counts an object problem (an unrecognised preemption message)."""

    def __init__(
        self,
        cluster: ClusterView,
        ledger: PreemptionLedger,
        report: Callable[[str, str, str], None],
        *,
        enabled: bool = True,
    ) -> None:
        self._cluster = cluster
        self.ledger = ledger
        self._report = report
        self.enabled = enabled
        self.counts: Counter[CountKey] = Counter()
        # The quota-driven ones again, by the resource whose quota was short (victim queue,
        # preemptor queue, reason, resource): counted with `counts`, never on their own.
        self.resource_counts: Counter[CountKey] = Counter()
        # Pods that gave back GPUs lately, by group: a preemption verdict must judge the
        # capacity Kueue saw, and the victims' pods may be gone before their condition arrives.
        # (node, GPUs, when, requests, pod key): the key tells two pods of one shape apart.
        self._released: dict[object, list[_Release]] = {}
        self._released_order: deque[tuple[float, object]] = deque()
        # Ledger entries whose preemptor is not known yet, by preemptor UID: counted once it is.
        self._awaiting: dict[str, set[int]] = {}
        self._awaiting_since: deque[tuple[float, str, int]] = deque()
        # Entries whose verdict waits for the informers' first lists (AWAITING_LISTS).
        self._unjudged: set[int] = set()
        # Entries whose verdict waits for the victim's eviction (AWAITING_VICTIM): since when.
        self._awaiting_victim: dict[int, float] = {}

    # --- what the model tells the judge ---------------------------------------------------

    def on_workload(self, old: Workload | None, new: Workload, now: float) -> None:
        """A Workload added or changed: its victim condition if it turned up or changed, then
        the victims that waited for it as their preemptor."""
        self._record_preemption_from_status(old, new, now)
        self._settle_awaiting(new, now)

    def on_event(self, event: KubeEvent, now: float) -> PreemptionRecord | None:
        """A core/v1 Event added or changed: a Workload's `Preempted` Event is one copy of a
        preemption. Returns the record when it is a preemption the ledger did not hold."""
        if event.involved_kind != "Workload" or event.reason != "Preempted":
            return None
        time = event.first_seen or event.last_seen or now
        record = self._preemption_record(
            victim_key=(event.involved_namespace, event.involved_name),
            victim_uid=event.involved_uid,
            message=event.message,
            reason_hint="",
            time=time,
            now=now,
            source="event",
        )
        if record is not None and self._record(record, now):
            return record
        return None

    def pod_released(self, pod: Pod, now: float) -> None:
        """A pod bound to a node is gone: remember where and what it requested (GPUs and
        every other resource), for verdicts on the moment before."""
        for group in self._cluster.pod_groups(pod):
            release = (pod.node, pod.gpus, now, pod.requests, pod.key)
            self._released.setdefault(group, []).append(release)
            self._released_order.append((now, group))
        while self._released_order and now - self._released_order[0][0] > RELEASE_MEMORY_S:
            _, group = self._released_order.popleft()
            kept = [r for r in self._released.get(group, ()) if now - r[2] <= RELEASE_MEMORY_S]
            if kept:
                self._released[group] = kept
            else:
                self._released.pop(group, None)

    def expire(self, now: float) -> None:
        """Called with every event applied: victims whose preemptor has not shown up within
        AWAIT_PREEMPTOR_S are counted as they are."""
        if self._awaiting_since:
            self._flush_awaiting(now)
        if self._awaiting_victim:
            self._flush_awaiting_victim(now)

    def judge_deferred(self, now: float) -> None:
        """Every kind has listed: judge what waited for it, and count the live ones whose
        preemptor is settled (the others are counted when it arrives, `_settle_awaiting`)."""
        if not self._unjudged:
            return
        for rid in sorted(self._unjudged):
            known = self.ledger.get(rid)
            if known is None or known.verdict_detail != AWAITING_LISTS:
                continue
            victim = self._workload((known.victim_namespace, known.victim_name))
            preemptor = self._cluster.find_workload(known.preemptor_uid, known.preemptor_job_uid)
            verdict, detail, short = self._verdict(preemptor, victim, known.time, now)
            judged = replace(
                known, verdict=verdict, verdict_detail=detail, resource=short[0], flavor=short[1]
            )
            self.ledger.update(rid, judged)
            if judged.observed == "live" and rid not in self._uncounted_ids(known.preemptor_uid):
                self._count(judged)
        self._unjudged.clear()

    # --- recording ------------------------------------------------------------------------

    def _record_preemption_from_status(
        self, old: Workload | None, new: Workload, now: float
    ) -> None:
        preempted = new.condition("Preempted")
        evicted = new.condition("Evicted")
        cond = None
        if preempted is not None and preempted.status == "True":
            cond = preempted
        elif evicted is not None and evicted.status == "True" and evicted.reason == "Preempted":
            cond = evicted
        if cond is None:
            return
        if old is not None:
            before = old.condition(cond.type)
            if (
                before is not None
                and before.status == cond.status
                and before.last_transition == cond.last_transition
                and before.message == cond.message
            ):
                return
        reason_hint = preempted.reason if preempted is not None else ""
        record = self._preemption_record(
            victim_key=new.key,
            victim_uid=new.uid,
            message=cond.message,
            reason_hint=reason_hint,
            time=cond.last_transition if cond.last_transition is not None else now,
            now=now,
            source="condition",
        )
        if record is not None:
            self._record(record, now)

    def _preemption_record(
        self,
        victim_key: WorkloadKey,
        victim_uid: str,
        message: str,
        reason_hint: str,
        time: float,
        now: float,
        source: str,
    ) -> PreemptionRecord | None:
        note = parse_preemption_message(message)
        if note is None:
            self._report(
                "Workload",
                "unknown_preemption_message",
                f"{victim_key[0]}/{victim_key[1]}: unrecognised preemption message "
                f"{message[:200]!r}",
            )
        cluster = self._cluster
        victim = self._workload(victim_key)
        preemptor = (
            cluster.find_workload(note.preemptor_uid, note.preemptor_job_uid) if note else None
        )
        reason = reason_hint if reason_hint.startswith("In") else ""
        if not reason and note is not None:
            reason = reason_for_cause(note.cause)
        preemptor_uid = note.preemptor_uid if note is not None else ""
        verdict: Verdict
        if source == "event" and self.enabled and not _evicted(victim, preemptor_uid, time):
            verdict, detail, short = "unknown", AWAITING_VICTIM, ("", "")
        else:
            verdict, detail, short = self._verdict(preemptor, victim, time, now)
        return PreemptionRecord(
            time=time,
            victim_namespace=victim_key[0],
            victim_name=victim_key[1],
            victim_uid=victim_uid or (victim.uid if victim else ""),
            victim_cluster_queue=cluster.cluster_queue_of(victim) if victim else "",
            victim_priority=victim.priority if victim else None,
            preemptor_uid=note.preemptor_uid if note else "",
            preemptor_job_uid=note.preemptor_job_uid if note else "",
            preemptor_namespace=preemptor.namespace if preemptor else "",
            preemptor_name=preemptor.name if preemptor else "",
            preemptor_cluster_queue=(
                cluster.cluster_queue_of(preemptor)
                if preemptor
                else _queue_from_path(note.preemptor_path if note else ())
            ),
            preemptor_priority=preemptor.priority if preemptor else None,
            reason=reason or "Unknown",
            gpus_freed=self._gpus_held(victim) if victim is not None else 0,
            verdict=verdict,
            verdict_detail=detail,
            message=message,
            source=source,
            resource=short[0],
            flavor=short[1],
        )

    def _record(self, record: PreemptionRecord, now: float) -> bool:
        """Ledger it; count it once it is live (`observed_live`) and its preemptor is known
        (or can never be), so the counter moves only for what happened while we watched and
        with settled labels: a counter must never be taken back."""
        rid, new = self.ledger.record(replace(record, observed="history"))
        stored = self.ledger.get(rid)
        if stored is None:
            return new
        settled = False
        if new and stored.preemptor_uid and not stored.preemptor_name:
            self._awaiting.setdefault(stored.preemptor_uid, set()).add(rid)
            self._awaiting_since.append((now, stored.preemptor_uid, rid))
        elif rid in self._uncounted_ids(stored.preemptor_uid) and stored.preemptor_name:
            self._settled(stored.preemptor_uid, rid)
            settled = True
        elif new:
            settled = True
        became_live = stored.observed == "history" and self._cluster.observed_live(stored.time)
        if became_live:
            stored = replace(stored, observed="live")
            self.ledger.update(rid, stored)
        waiting = rid in self._uncounted_ids(stored.preemptor_uid)
        if stored.verdict_detail == AWAITING_VICTIM:
            self._awaiting_victim.setdefault(rid, now)
            waiting = True  # counted once judged (the victim's copy, or _flush_awaiting_victim)
        elif self._awaiting_victim.pop(rid, None) is not None:
            settled = True  # judged now: counted below unless something else still waits
        if stored.verdict_detail == AWAITING_LISTS:
            self._unjudged.add(rid)
            waiting = True  # counted once judged (judge_deferred)
        if stored.observed == "live" and not waiting and (settled or became_live):
            self._count(stored)
        self._flush_awaiting(now)
        return new

    def _uncounted_ids(self, uid: str) -> set[int]:
        return self._awaiting.get(uid, set()) if uid else set()

    def _settled(self, uid: str, rid: int) -> None:
        waiting = self._awaiting.get(uid)
        if waiting is not None:
            waiting.discard(rid)
            if not waiting:
                del self._awaiting[uid]

    def _count(self, record: PreemptionRecord) -> None:
        key = (
            record.victim_cluster_queue,
            record.preemptor_cluster_queue,
            record.reason,
            record.verdict,
        )
        self.counts[key] += 1
        if record.verdict == "quota":
            by_resource = (*key[:3], record.resource)
            self.resource_counts[by_resource] += 1

    def _settle_awaiting(self, preemptor: Workload, now: float) -> None:
        """The preemptor of earlier-seen victims arrived: name it, judge, count the live ones."""
        rids = self._awaiting.pop(preemptor.uid, None) if preemptor.uid else None
        for rid in sorted(rids or ()):
            known = self.ledger.get(rid)
            if known is None:
                continue
            victim = self._workload((known.victim_namespace, known.victim_name))
            verdict, detail = known.verdict, known.verdict_detail
            short = (known.resource, known.flavor)
            awaiting_victim = rid in self._awaiting_victim
            if now - known.time <= VERDICT_FRESHNESS_S and not awaiting_victim:
                verdict, detail, short = self._verdict(preemptor, victim, known.time, now)
            settled = replace(
                known,
                preemptor_namespace=preemptor.namespace,
                preemptor_name=preemptor.name,
                preemptor_cluster_queue=self._cluster.cluster_queue_of(preemptor)
                or known.preemptor_cluster_queue,
                preemptor_priority=preemptor.priority,
                verdict=verdict,
                verdict_detail=detail,
                resource=short[0],
                flavor=short[1],
            )
            self.ledger.update(rid, settled)
            if settled.verdict_detail == AWAITING_LISTS:
                self._unjudged.add(rid)
            elif awaiting_victim:
                pass  # judged and counted with the victim's eviction
            elif settled.observed == "live":
                self._count(settled)

    def _flush_awaiting_victim(self, now: float) -> None:
        """A victim whose eviction has not arrived within AWAIT_PREEMPTOR_S (deleted at
        once, or a slow watch): judge its preemption with what has arrived, and count it."""
        for rid, since in list(self._awaiting_victim.items()):
            if now - since <= AWAIT_PREEMPTOR_S:
                continue
            del self._awaiting_victim[rid]
            known = self.ledger.get(rid)
            if known is None or known.verdict_detail != AWAITING_VICTIM:
                continue
            victim = self._workload((known.victim_namespace, known.victim_name))
            preemptor = self._cluster.find_workload(known.preemptor_uid, known.preemptor_job_uid)
            verdict, detail, short = self._verdict(preemptor, victim, known.time, now)
            judged = replace(
                known, verdict=verdict, verdict_detail=detail, resource=short[0], flavor=short[1]
            )
            self.ledger.update(rid, judged)
            if detail == AWAITING_LISTS:
                self._unjudged.add(rid)
            elif judged.observed == "live" and rid not in self._uncounted_ids(known.preemptor_uid):
                self._count(judged)

    def _flush_awaiting(self, now: float) -> None:
        """A preemptor that never shows up (deleted already) leaves its live victims counted
        as they are."""
        while self._awaiting_since and now - self._awaiting_since[0][0] > AWAIT_PREEMPTOR_S:
            _, uid, rid = self._awaiting_since.popleft()
            waiting = self._awaiting.get(uid)
            if waiting is None or rid not in waiting:
                continue
            waiting.discard(rid)
            if not waiting:
                del self._awaiting[uid]
            record = self.ledger.get(rid)
            if record is not None and record.observed == "live":
                self._count(record)

    # --- judging --------------------------------------------------------------------------

    def _verdict(
        self, preemptor: Workload | None, victim: Workload | None, time: float, now: float
    ) -> tuple[Verdict, str, tuple[str, str]]:
        """Judged in the preemptor's own world, against the cluster at the preemption's
        `time`: quota from the model's own accounting of reservations then (victims still
        holding theirs, the preemptor not yet), every resource it requests, on the flavors
        Kueue gave it (its admission's, else the ones Kueue's flavor assigner would try, never
        one its pods cannot use); capacity from the pods then, on the nodes that flavor selects
        and its pods may use. The same events in any order give the same verdict. Returns the
        verdict, its sentence, and for a quota verdict the short (resource, flavor)."""
        none = ("", "")
        cluster = self._cluster
        if not self.enabled:
            return "unknown", "read from a dump, which shows the cluster only after it", none
        if not cluster.caught_up(now):
            return "unknown", AWAITING_LISTS, none
        caught_up_at = cluster.caught_up_at
        if caught_up_at is not None and time < caught_up_at:
            # Some kind was listed after the preemption: a victim's pods or a workload's quota
            # may have come and gone unseen, and a guess could be a wrong definite answer.
            return (
                "unknown",
                "happened before every informer had listed; what it was decided against may"
                " have changed unseen",
                none,
            )
        if now - time > VERDICT_FRESHNESS_S:
            return (
                "unknown",
                "happened before topowatch was watching; free capacity then unknown",
                none,
            )
        if preemptor is None:
            return "unknown", "the preemptor is not known to topowatch", none
        victims = [victim] if victim is not None else []
        for earlier in self.ledger.caused_by(preemptor.uid):
            if abs(earlier.time - time) <= 10.0 and earlier.victim_name != (
                victim.name if victim else ""
            ):
                state = cluster.workloads.get((earlier.victim_namespace, earlier.victim_name))
                if state is not None:
                    victims.append(state.workload)
        # What was released in the same second but written before the first victim's eviction
        # was gone when Kueue decided (`ReservationBook.held_at`). Kueue marks a victim
        # evicted before it gives its quota back: a victim still holding has every release
        # that arrived so far before it.
        book = cluster.reservations
        seqs = [book.release_seq(v.key, time) for v in victims]
        written_before = min((n for n in seqs if n is not None), default=None)
        if written_before is None and victims:
            written_before = book.next_seq
        tree = cluster.quota_tree(at=time, exclude=(preemptor.key,), written_before=written_before)
        flavor, quota = cluster.quota_for(preemptor, tree)
        assignment = cluster.assignment(preemptor, tree)
        tas = tas_pod_sets(preemptor, assignment, flavor, cluster.replaced_slice(preemptor))
        level: str | None = None
        fitted: Fit | None = None
        placed: PlacementAnswer | None = None
        quota_fits = assignment is None or assignment.fits
        if tas and not quota_fits:
            level = ""  # TAS is asked for, but Kueue never tried it: quota was short
        if tas and quota is not None and quota_fits:
            capacity = self._capacity_before(preemptor, victims, time, written_before)
            level, fitted, placed = self._tas(tas, capacity)
        verdict, detail = analysis.preemption_verdict(
            preemptor.gpus_requested, level, quota, fitted, assignment, placed
        )
        short = none
        if verdict == "quota" and assignment is not None and assignment.short:
            first = assignment.short[0]
            short = (first.resource, first.flavor)
        return verdict, detail, short

    def _capacity_before(
        self,
        preemptor: Workload,
        victims: list[Workload],
        time: float | None = None,
        written_before: int | None = None,
    ) -> FreeCapacity:
        """Free capacity per node as Kueue saw it when it chose to preempt: victims' pods
        already deleted still held their GPUs (and every other resource) then, the
        preemptor's pods already bound had not taken theirs yet, and workloads that held a
        topology assignment then (admitted earlier, in the same scheduling cycle too) held
        its nodes' resources even where their pods are not bound yet: Kueue's TAS counts a
        workload's TopologyAssignment from its admission (scheduler.go `processEntry` adds
        each admission's usage to the cycle's snapshot, `AddUsage`; tas_flavor_snapshot.go
        counts admitted workloads by assignment, pods only for non-TAS usage)."""
        cluster = self._cluster
        delta_by_node: Counter[str] = Counter()
        other: dict[str, Counter[str]] = {}
        released: dict[WorkloadKey, set[_Release]] = {}
        for victim in victims:
            seen = released.setdefault(victim.key, set())
            for group in cluster.workload_groups(victim):
                for release in self._released.get(group, ()):
                    if release not in seen:
                        seen.add(release)
                        delta_by_node[release[0]] -= release[1]
                        _add_requests(other, release[0], release[3], -1)
        if time is not None:
            for node, gpus, requests in _unbound_assignments(
                cluster, {preemptor.key}, time, released, written_before
            ):
                delta_by_node[node] -= gpus
                _add_requests(other, node, requests, -1, count=0)
        for pod in cluster.pods_of(preemptor):
            if pod.bound:
                delta_by_node[pod.node] += pod.gpus
                _add_requests(other, pod.node, pod.requests, 1)
        before = _FreeBefore(cluster.tree, cluster.nodes, dict(delta_by_node))

        def used_then(node: str) -> Mapping[str, int]:
            now_used = cluster.node_requested(node)
            delta = other.get(node)
            if not delta:
                return now_used
            return {
                name: now_used.get(name, 0) - delta.get(name, 0) for name in {*now_used, *delta}
            }

        return NodeResourcesFree(before, cluster.nodes, used_then)

    def _tas(
        self, tas: Sequence[tuple[PodSetRequest, str]], capacity: FreeCapacity
    ) -> tuple[str, Fit | None, PlacementAnswer | None]:
        """Kueue's TAS on each pod set it places (`tas_pod_sets`), against `capacity`: the
        first that does not fit (else the first that asks for a required level, else the
        first), as (its level name, or "" when not a required level; the required level's
        `Fit`; or where `place` would put any other request, the implied one included)."""
        chosen: tuple[str, Fit | None, PlacementAnswer | None] | None = None
        for pod_set, flavor in tas:
            request = pod_set.topology
            one: tuple[str, Fit | None, PlacementAnswer | None]
            if request.mode == "required" and request.level:
                fitted = self._fit(pod_set, flavor, capacity)
                ok = fitted is not None and fitted.fits
                one = (level_of_label_key(request.level) or request.level, fitted, None)
            else:
                placed = place(
                    capacity,
                    self._cluster.eligibility(flavor, pod_set).nodes,
                    request,
                    pod_set.count,
                    pod_set.gpus_per_pod,
                    levels=self._cluster.flavor_levels(flavor),
                    requests=pod_set.per_pod,
                )
                ok = placed.placeable
                one = ("", None, placed)
            if not ok:
                return one
            if chosen is None or (chosen[1] is None and one[1] is not None):
                chosen = one
        return chosen if chosen is not None else ("", None, None)

    def _fit(self, pod_set: PodSetRequest, flavor: str, capacity: FreeCapacity) -> Fit | None:
        request = pod_set.topology
        if not request.level:
            return None
        return fit(
            capacity,
            self._cluster.eligibility(flavor, pod_set).nodes,
            request.level,
            pod_set.count,
            pod_set.gpus_per_pod,
            slice_level=request.slice_level,
            slice_size=request.slice_size,
            requests=pod_set.per_pod,
        )

    def _workload(self, key: WorkloadKey) -> Workload | None:
        state = self._cluster.workloads.get(key)
        return state.workload if state is not None else None

    def _gpus_held(self, workload: Workload) -> int:
        held = sum(p.gpus for p in self._cluster.pods_of(workload) if p.holds_gpus)
        return held or workload.gpus_requested


def _add_requests(
    into: dict[str, Counter[str]], node: str, requests: Resources, sign: int, count: int = 1
) -> None:
    """A pod's requests (and itself, as `count` pods) on `node`, added with `sign`."""
    delta = into.get(node)
    if delta is None:
        delta = into[node] = Counter()
    delta[PODS_RESOURCE] += sign * count
    for name, amount in requests:
        if name != GPU_RESOURCE:  # GPUs go through _FreeBefore, which the tree backs
            delta[name] += sign * amount


def _unbound_assignments(
    cluster: ClusterView,
    skip: set[WorkloadKey],
    time: float,
    released: Mapping[WorkloadKey, Iterable[_Release]],
    written_before: int | None = None,
) -> list[tuple[str, int, Resources]]:
    """What workloads holding a topology assignment at `time` (quota reserved then, those in
    `skip` aside) hold on each node beyond what their pods request there: their pods not
    created or not bound yet (the Workload waits for an AdmissionCheck, or its pods are gated
    or pending), counted from the assignment as the Workload showed it while it held quota
    (Kueue clears status.admission on eviction: a victim's comes from the reservation book).
    Per node: (node, GPUs, every resource and `pods`).

    Kueue's rule: the TAS cache counts a workload's usage from its TopologyAssignment from the
    moment it holds quota in the cache, bound pods or not (pkg/cache/scheduler
    tas_flavor_snapshot.go `addUsage` per assigned domain, fed from each cached workload's
    podSetAssignments[].topologyAssignment), and counts pods only for non-TAS usage
    (tas_non_tas_pod_cache.go skips the pods of TAS workloads), so the same resources are never
    counted twice. The model's tree counts bound pods, so what is added here is the
    assignment minus the workload's pods bound now (counted by the tree) and minus its pods
    released since (`released`, the victims' pods the caller already counts back)."""
    out: list[tuple[str, int, Resources]] = []
    by_hostname: dict[str, str] | None = None
    for reservation in cluster.reservations.held_at(time, skip, written_before):
        workload = reservation.workload
        if workload is None or not workload.placements:
            continue
        expected: dict[str, Counter[str]] = {}
        per_pod = {p.name: p.per_pod for p in workload.pod_sets}
        for placement in workload.placements:
            if not placement.levels or placement.levels[-1] != HOSTNAME_KEY:
                continue
            for domain in placement.domains:
                if not domain.values:
                    continue
                node = domain.values[-1]
                if node not in cluster.nodes:
                    if by_hostname is None:
                        by_hostname = {
                            dict(n.labels).get(HOSTNAME_KEY, name): name
                            for name, n in cluster.nodes.items()
                        }
                    node = by_hostname.get(node, node)
                into = expected.setdefault(node, Counter())
                into[PODS_RESOURCE] += domain.count
                for name, amount in per_pod.get(placement.name, ()):
                    into[name] += amount * domain.count
        if not expected:
            continue
        for node_name, _gpus, _when, requests, _key in released.get(workload.key, ()):
            if node_name in expected:
                into = expected[node_name]
                into[PODS_RESOURCE] -= 1
                for name, amount in requests:
                    into[name] -= amount
        for pod in cluster.pods_of(workload):
            if pod.bound and pod.node in expected:
                into = expected[pod.node]
                into[PODS_RESOURCE] -= 1
                for name, amount in pod.requests:
                    into[name] -= amount
        for node, left in expected.items():
            if left[PODS_RESOURCE] <= 0:
                continue
            gpus = max(0, left.get(GPU_RESOURCE, 0))
            rest = tuple(
                (name, amount)
                for name, amount in sorted(left.items())
                if name not in (GPU_RESOURCE, PODS_RESOURCE) and amount > 0
            )
            out.append((node, gpus, (*rest, (PODS_RESOURCE, left[PODS_RESOURCE]))))
    return out


def _evicted(victim: Workload | None, preemptor_uid: str, time: float) -> bool:
    """Whether the Workload watch has shown the victim's eviction by `preemptor_uid` (its
    Preempted or Evicted condition names the preemptor), or anything written after `time`:
    then every Workload write before the preemption has arrived too. An unknown victim
    (deleted already, or never listed) has nothing more to wait for."""
    if victim is None:
        return True
    for cond in victim.conditions:
        if cond.last_transition is not None and cond.last_transition > time:
            return True
        if (
            cond.type in ("Preempted", "Evicted")
            and cond.status == "True"
            and preemptor_uid
            and preemptor_uid in cond.message
        ):
            return True
    return False


def _queue_from_path(path: tuple[str, ...]) -> str:
    return path[-1] if path else ""


class _FreeBefore:
    """The topology tree's free GPUs per node plus `delta`, the change back to an earlier
    moment (a `FreeCapacity`).

    A node with a delta is recomputed from its allocatable GPUs and its use then (use now
    minus `delta`), not from the tree's free GPUs now: those are clamped at 0, so a node
    briefly over-committed in the model (the preemptor's pod seen bound before the victim's
    pod seen deleted) would otherwise look free before the preemption."""

    def __init__(
        self, tree: TopologyTree, nodes: Mapping[str, Node], delta: Mapping[str, int]
    ) -> None:
        self._tree = tree
        self._nodes = nodes
        self._delta = delta

    def node_free(self, node: str) -> int:
        delta = self._delta.get(node, 0)
        if not delta:
            return self._tree.node_free(node)
        spec = self._nodes.get(node)
        if (
            spec is None
            or not spec.schedulable
            or spec.unavailable
            or self._tree.placement(node) is None
        ):
            return 0
        used_then = max(0, self._tree.node_used(node) - delta)
        return max(0, spec.allocatable_gpus - used_then)

    def placement(self, node: str) -> Placement | None:
        return self._tree.placement(node)
