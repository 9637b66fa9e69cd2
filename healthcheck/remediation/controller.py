"""The remediation controller: Node reports and alerts in, policy decisions out, carried out safely.

Threads: `observe_node` and `handle_alerts` only enqueue (they run in informer and HTTP threads
and must never block); one worker thread parses, decides, writes state and calls providers.
Ordering per action: decide → audit → write state `requested` to the node annotation → call the
providers → write the outcome. If the state cannot be written the action is not taken, so a
restart can never repeat an action it does not know about.

Each finding's action is its step on the action ladder (policy.climb), from the ladder marks in
the node's state annotation, so a restarted controller continues a ladder where it stood. The
rest of a node's lifecycle (policy.settle: recovered, healthy since, attempts reset, expired
marks) is written back in act mode and kept in memory in observe mode, which writes nothing to
Nodes. An alert that ends (resolved, or its endsAt or time to live passed) withdraws what it
asked for and is audited; a deleted node's state is audited and dropped. Every audit record about
a known node becomes an Event in either mode; an Event that cannot be written is counted
(`topowatch_remediation_event_write_failures_total`) and logged.

The optional deep-check step: the DeepCheck record (with the node's deep-health label as it was)
goes into the state annotation with `requested`, before the StartClusterHealthCheck call, so a
restarted controller waits for that check instead of starting another. Each round reads the
label back (policy.read_deep_check) and records the verdict in the annotation; only providers
that can run a deep check take part in it. A check the API defers (ConflictException: another
on-demand check runs on the cluster) is not an attempt: counted, logged once per node until a
check starts, asked again after deep_check.retry_seconds.

Issue 28. Alert replays: a resolve is remembered per alert fingerprint, in memory and (in act
mode) in the Node's `topowatch.io/remediation-alerts` annotation, so a restarted or failed-over
controller still knows it; a firing whose startsAt is not newer than that resolve is a peer's late
notification, ignored and audited (`alert_replayed`), and a resolve for an older episode than the
firing held cancels nothing (`alert_stale_resolve`). Stale findings: the state records the node's
boot ID with each action (`status.nodeInfo.bootID`; on Slurm the node's BootTime is read
instead); once the node has booted since, findings first seen before that boot ask for nothing
(policy.climb, `boot`), and a node whose findings are all from before it after AGENT_GRACE_S is
audited once as its own outcome (`agent_silent_after_boot`): the agent did not come back, which
is no hardware recurrence.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from exporter.core.exposition import GAUGE, HISTOGRAM, Family
from exporter.core.findings import (
    FINDINGS_ANNOTATION,
    HEALTH_CONDITION,
    decode_findings,
    format_time,
)
from exporter.core.provenance import screen_node
from exporter.topology.labels import DEEP_HEALTH_CHECK_KEY, ULTRASERVER_KEY
from healthcheck.remediation.alerts import (
    ALERTS_ANNOTATION,
    AlertSignal,
    ParsedAlerts,
    ResolvedAlert,
    dump_resolves,
    older_episode,
    parse_resolves,
    remember_resolve,
    replayed,
    resolve_of,
)
from healthcheck.remediation.audit import Auditor, AuditRecord, node_event
from healthcheck.remediation.fanout import Outcome, deep_checks, fan_out
from healthcheck.remediation.node_report import NodeReport, report_of
from healthcheck.remediation.policy import (
    HYPERPOD_HEALTH,
    HYPERPOD_PENDING,
    OPT_OUT_LABEL,
    OPT_OUT_VALUE,
    Boot,
    Breaker,
    ClusterFacts,
    Decision,
    Ladder,
    NodeRequest,
    PolicyConfig,
    Rung,
    climb,
    decide,
    escalate_repeat_offender,
    live_marks,
    mark_ladder,
    read_deep_check,
    record_onsets,
    reset_breaker,
    settle,
    strongest,
)
from healthcheck.remediation.providers.base import ActionRequest, ActionResult, Provider
from healthcheck.remediation.rack import (
    RackConfig,
    RackDecision,
    RackRequest,
    decide_racks,
    escalate,
    facts_after,
)
from healthcheck.remediation.state import (
    ACTIONS,
    Action,
    DeepCheck,
    LadderMark,
    RemediationState,
    dump_state,
    parse_state,
)
from healthcheck.remediation.state import ANNOTATION as STATE_ANNOTATION

TO_ACTION_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
MERGE_PATCH = "application/merge-patch+json"
# After the node booted, how long its agent may take to report again before its silence is
# audited (a DaemonSet pod needs the kubelet, an image pull and a few polls of damping).
AGENT_GRACE_S = 600.0


# --- reading a Node (pure) --------------------------------------------------------------------


def read_node(obj: Mapping[str, Any]) -> NodeReport | None:
    """None when the object has no name (nothing can be said about it)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return None
    name: str = meta["name"]
    labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
    assert isinstance(labels, Mapping) and isinstance(annotations, Mapping)
    raw_findings = annotations.get(FINDINGS_ANNOTATION)
    findings, problems = decode_findings(raw_findings if isinstance(raw_findings, str) else None)
    if not findings and not problems and _condition_false(obj):
        problems.append(f"condition {HEALTH_CONDITION}=False but no {FINDINGS_ANNOTATION}")
    raw_state = annotations.get(STATE_ANNOTATION)
    state, state_problem = parse_state(raw_state if isinstance(raw_state, str) else None)
    if raw_state is not None and not isinstance(raw_state, str):
        state_problem = f"{STATE_ANNOTATION} is not a string"
    raw_resolves = annotations.get(ALERTS_ANNOTATION)
    resolves, resolves_problem = parse_resolves(
        raw_resolves if isinstance(raw_resolves, str) else None
    )
    if resolves_problem is not None:
        problems.append(resolves_problem)
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    capacity = status.get("capacity") if isinstance(status.get("capacity"), Mapping) else {}
    assert isinstance(capacity, Mapping)
    info = status.get("nodeInfo") if isinstance(status.get("nodeInfo"), Mapping) else {}
    assert isinstance(info, Mapping)
    boot_id = info.get("bootID")
    return report_of(
        name,
        findings,
        problems,
        opted_out=labels.get(OPT_OUT_LABEL) == OPT_OUT_VALUE,
        hyperpod_status=str(labels.get(HYPERPOD_HEALTH) or ""),
        is_gpu=_positive(capacity.get(GPU_RESOURCE)),
        state=state,
        state_problem=state_problem,
        deep_health=str(labels.get(DEEP_HEALTH_CHECK_KEY) or ""),
        boot_id=boot_id if isinstance(boot_id, str) else "",
        resolved_alerts=resolves,
        ultraserver=str(labels.get(ULTRASERVER_KEY) or ""),
    )


def _condition_false(obj: Mapping[str, Any]) -> bool:
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for cond in conditions if isinstance(conditions, list) else []:
        if isinstance(cond, Mapping) and cond.get("type") == HEALTH_CONDITION:
            return bool(cond.get("status") == "False")
    return False


def _positive(value: Any) -> bool:
    try:
        return int(str(value)) > 0
    except ValueError:
        return False


# --- edges ------------------------------------------------------------------------------------


class NodeWriter(Protocol):
    """Where state and events go: the Kubernetes API in production, a dict in tests."""

    def write_state(self, node: str, state: RemediationState) -> None: ...

    def post_event(self, record: AuditRecord) -> None: ...

    # Optional (looked up with getattr): `write_alerts(node, resolves)` keeps the alert
    # resolves the controller remembers for the node where its state lives.


class KubeNodeWriter:
    """Merge-patches the state annotation and creates core/v1 Events, with the official client."""

    def __init__(self, core_v1: Any) -> None:
        self.core_v1 = core_v1

    def write_state(self, node: str, state: RemediationState) -> None:
        body = {"metadata": {"annotations": {STATE_ANNOTATION: dump_state(state)}}}
        self.core_v1.patch_node(node, body, _content_type=MERGE_PATCH)

    def post_event(self, record: AuditRecord) -> None:
        event = node_event(record)
        self.core_v1.create_namespaced_event(event["metadata"]["namespace"], event)

    def write_alerts(self, node: str, resolves: Iterable[ResolvedAlert]) -> None:
        body = {"metadata": {"annotations": {ALERTS_ANNOTATION: dump_resolves(resolves)}}}
        self.core_v1.patch_node(node, body, _content_type=MERGE_PATCH)


# --- the controller ---------------------------------------------------------------------------


@dataclass(slots=True)
class _NodeView:
    report: NodeReport
    obj: dict[str, Any]
    alerts: dict[str, AlertSignal] = field(default_factory=dict)
    alert_seen: dict[str, float] = field(default_factory=dict)  # fingerprint → last received
    resolved: dict[str, ResolvedAlert] = field(default_factory=dict)  # fingerprint → its resolve
    # (boot, when this controller first saw the node booted since its action, audited yet)
    boot_noticed: tuple[str, float, bool] | None = None

    def boot(self, state: RemediationState | None) -> Boot | None:
        """The node's boot since its last action, if it has booted since: by its BootTime
        where the report has one (Slurm), else by a boot ID other than the action's (Kubernetes
        publishes no boot time: findings first seen before the action began are then the ones
        from before that boot)."""
        report = self.report
        if state is None:
            return None
        if report.booted_at is not None:
            if report.booted_at > state.started_at:
                return Boot(report.booted_at, f"BootTime {format_time(report.booted_at)}")
            return None
        if state.boot_id and report.boot_id and report.boot_id != state.boot_id:
            return Boot(
                state.started_at,
                f"boot ID {report.boot_id[:8]}, not {state.boot_id[:8]} as when the"
                f" {state.action} began at {format_time(state.started_at)}",
            )
        return None

    def request(
        self, ladder: Ladder, state: RemediationState | None, now: float, active_timeout_s: float
    ) -> NodeRequest:
        """What the node asks for now: its findings' ladder steps and its firing alerts."""
        marks = state.ladder if state is not None else ()
        boot = self.boot(state)
        busy = state is not None and state.is_active(now, active_timeout_s) and boot is None
        deep = state.deep_check if state is not None else None
        rungs = climb(self.report.findings, marks, ladder, now, busy, deep, boot)
        firing = [a for a in self.alerts.values() if a.action is not None]
        asking = [r.action for r in rungs if not r.hold]
        action = strongest([*asking, *(a.action for a in firing)])
        reasons = self.report.reasons + tuple(sorted(f"alert:{a.name}" for a in firing))
        return NodeRequest(
            self.report.name,
            action,
            reasons,
            self.onset(),
            self.report.opted_out,
            self.report.hyperpod_status,
            rungs,
            holding=any(r.hold for r in rungs),
            hold=self.report.hold,
            booted=boot is not None,
        )

    def onset(self) -> float | None:
        firing = [a for a in self.alerts.values() if a.action is not None]
        onsets = [t for t in [self.report.onset, *(a.starts_at for a in firing)] if t is not None]
        return min(onsets, default=None)


@dataclass(frozen=True, slots=True)
class _Planned:
    """One decided action before the providers are called: its `requested` state, its request,
    and what settling it needs (the node's state before, the ladder steps behind it)."""

    state: RemediationState
    request: ActionRequest
    prior: RemediationState | None
    rungs: tuple[Rung, ...]


class RemediationController:
    def __init__(
        self,
        config: PolicyConfig,
        providers: Sequence[Provider],
        writer: NodeWriter | None = None,
        auditor: Auditor | None = None,
        clock: Callable[[], float] = time.time,
        recheck_s: float = 10.0,
        leading: Callable[[], bool] | None = None,
    ) -> None:
        self.config = config
        # With several replicas only the leader decides and acts; the others keep their views
        # current (reading the state the leader writes to each Node) so one can take over warm.
        self.leading = leading
        self._was_leading = False
        self.providers = list(providers)
        self.writer = writer
        self.auditor = auditor or Auditor()
        self.clock = clock
        self.recheck_s = recheck_s
        self._inbox: queue.SimpleQueue[tuple[str, Any, float]] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards everything below against status()/families()
        # Asked of each node with findings: (node, now) -> why it is a repeat offender ("" when
        # it is not). The cluster service sets it from its goodput ledger (issue 29); None: no
        # node is (the ladder climbs as usual).
        self.repeat_offender: Callable[[str, float], str] | None = None
        self._views: dict[str, _NodeView] = {}
        self._states: dict[str, RemediationState] = {}
        self._bad_state: dict[str, str] = {}
        self._requested: dict[str, Action | None] = {}
        self._rungs: dict[str, tuple[Rung, ...]] = {}  # the ladder steps behind each request
        self._departed: dict[str, float] = {}  # deleted node → its last action's start
        self._last_audited: dict[str, tuple[str, str, str | None]] = {}
        self._dirty: set[str] = set()
        self._unwritten: list[tuple[str, RemediationState]] = []
        self._alerts_unwritten: set[str] = set()  # nodes whose remembered resolves changed
        self._last_recheck = 0.0
        self._deferred: set[str] = set()  # nodes whose deferred deep check was logged already
        self.breaker = Breaker()
        self.suppressed_repeats = 0
        # Seconds from a failure's first sighting on the node to the provider call, per action.
        # Kept as cumulative bucket counts, sum and count: bounded however long it runs.
        self._to_action: dict[str, tuple[list[int], float, int]] = {
            action: ([0] * len(TO_ACTION_BUCKETS), 0.0, 0) for action in ACTIONS
        }
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        # Rack-level decisions (rack.py) of the last round that audited any, for status/tests.
        self.rack_decisions: list[RackDecision] = []

    # -- inputs (any thread, never block) --

    def observe_node(self, obj: dict[str, Any], now: float, deleted: bool = False) -> None:
        self._inbox.put(("deleted" if deleted else "node", obj, now))

    def observe_report(self, report: NodeReport, obj: dict[str, Any], now: float) -> None:
        """A node read by other means than a Node object (a Slurm node and its agent's health
        API): taken as it is, with `obj` passed to the providers."""
        self._inbox.put(("report", (report, obj), now))

    def adopt_state(self, node: str, state: RemediationState) -> None:
        """Replace what the controller holds for `node` with a state settled elsewhere (a Slurm
        action found `requested` after a restart, now confirmed or withdrawn)."""
        with self._lock:
            self._states[node] = state
            self._dirty.add(node)

    def handle_alerts(self, parsed: ParsedAlerts, now: float) -> None:
        self._inbox.put(("alerts", parsed, now))

    def reset_breaker(self, now: float, who: str = "admin") -> dict[str, Any]:
        with self._lock:
            before = self.breaker
            self.breaker = reset_breaker(before)
            self._dirty |= set(self._views)
        self.auditor.breaker("reset", f"reset by {who}; was: {before.reason or 'closed'}", now)
        self._inbox.put(("wake", None, now))
        return self.breaker.as_dict()

    def wake(self) -> None:
        """Run a round now (leadership was just won: act without waiting for the next tick)."""
        self._inbox.put(("wake", None, 0.0))

    # -- worker --

    def start(self) -> RemediationController:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(
                target=self._loop, name="topowatch-remediation", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._inbox.put(("wake", None, 0.0))
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.run_once(timeout=1.0)
            except Exception:  # one bad round must not end remediation for good
                log.exception("remediation round failed")

    def run_once(self, timeout: float = 0.0) -> list[Decision]:
        """Drain the inbox, decide, act. Returns the decisions audited this round."""
        items = self._drain(timeout)
        now = self.clock()
        records: list[AuditRecord] = []
        with self._lock:
            for kind, payload, _ in items:
                if kind == "node":
                    self._take_node(payload, now, records)
                elif kind == "report":
                    report, obj = payload
                    self._take_report(report, obj, now, records)
                elif kind == "deleted":
                    self._forget_node(payload, now, records)
                elif kind == "alerts":
                    self._take_alerts(payload, now, records)
            leads = self.leading is None or self.leading()
            if leads and not self._was_leading:  # took over: decide every node now
                self._dirty |= set(self._views)
            self._was_leading = leads
            if not leads:
                self._dirty.clear()
                return []
            if now - self._last_recheck >= self.recheck_s:
                self._last_recheck = now
                self._dirty |= {n for n, r in self._requested.items() if r is not None}
                self._dirty |= set(self._states) & set(self._views)  # lifecycle clocks
                self._expire_alerts(now, records)
            decisions, acts, rack_acts = self._decide(now, records)
            unwritten, self._unwritten = self._unwritten, []
            remembered = self._resolves_to_write()
        for name, state in unwritten:
            self._store(name, state, now, records)
        self._store_resolves(remembered, now, records)
        self._act(acts, now, records)
        for rack in rack_acts:
            self._act_rack(rack, now, records)
        self._post_events(records)
        return decisions

    def _drain(self, timeout: float) -> list[tuple[str, Any, float]]:
        items: list[tuple[str, Any, float]] = []
        try:
            items.append(
                self._inbox.get(timeout=timeout) if timeout > 0 else self._inbox.get_nowait()
            )
            while True:
                items.append(self._inbox.get_nowait())
        except queue.Empty:
            pass
        return items

    def _take_node(self, obj: Any, now: float, records: list[AuditRecord]) -> None:
        obj, refused = screen_node(obj)  # findings count only if the node's own agent wrote them
        if refused is not None:
            records.append(self.auditor.problem(refused.node, refused.reason, refused.detail, now))
        report = read_node(obj) if isinstance(obj, dict) else None
        if report is None:
            records.append(self.auditor.problem("", "malformed_node", "Node without a name", now))
            return
        self._take_report(report, obj, now, records)

    def _take_report(
        self, report: NodeReport, obj: dict[str, Any], now: float, records: list[AuditRecord]
    ) -> None:
        name = report.name
        for problem in report.problems:
            records.append(self.auditor.problem(name, "malformed_findings", problem, now))
        if report.state_problem is not None:
            if self._bad_state.get(name) != report.state_problem:
                records.append(
                    self.auditor.problem(name, "malformed_state", report.state_problem, now)
                )
            self._bad_state[name] = report.state_problem
        else:
            self._bad_state.pop(name, None)
        known = self._states.get(name)
        if report.state is not None and (
            known is None
            or report.state.started_at > known.started_at
            # A standby writes nothing: the Node's annotation is the truth, including the
            # outcome of the action it already knows (requested -> done, same started_at),
            # or it would take over holding `requested` and never settle the action.
            or (not self._was_leading and report.state != known)
        ):
            self._states[name] = report.state  # read back after a restart, or written by a peer
        view = self._views.get(name)
        if view is None:
            view = self._views[name] = _NodeView(report, obj)
        else:
            view.report, view.obj = report, obj
        for resolved in report.resolved_alerts:  # written by this controller, or before a restart
            remember_resolve(view.resolved, resolved, now)
        self._dirty.add(name)

    def _forget_node(self, obj: Any, now: float, records: list[AuditRecord]) -> None:
        """A deleted Node: audit what we held about it, then drop it all. Only the start time of
        its last action stays (no longer than the budget window), for the hourly budget."""
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            return
        view = self._views.pop(name, None)
        requested = self._requested.pop(name, None)
        self._rungs.pop(name, None)
        self._bad_state.pop(name, None)
        self._last_audited.pop(name, None)
        self._dirty.discard(name)
        state = self._states.pop(name, None)
        if state is None and requested is None and not (view and view.alerts):
            return
        held = []
        if state is not None:
            if state.started_at > now - self.config.budget_window_s:
                self._departed[name] = state.started_at
            held.append(
                f"last action {state.action} {state.outcome} (attempt {state.attempts},"
                f" {len(state.ladder)} ladder marks)"
            )
        if requested is not None:
            held.append(f"was asking for {requested}")
        if view is not None and view.alerts:
            held.append(f"{len(view.alerts)} firing alerts")
        detail = "Node deleted; its remediation state is dropped: " + "; ".join(held)
        records.append(
            self.auditor.lifecycle(
                name, "node_deleted", detail, now, state.action if state else requested
            )
        )

    def _take_alerts(self, parsed: ParsedAlerts, now: float, records: list[AuditRecord]) -> None:
        for why in parsed.ignored:
            records.append(self.auditor.problem("", "alert_ignored", why, now))
        for signal in parsed.signals:
            view = self._views.get(signal.node)
            over = signal.resolved(now)
            if view is None:
                if over:  # nothing was asked for there: counted and logged, never an error
                    records.append(
                        self.auditor.alert(
                            signal.node,
                            "unknown_node",
                            f"{signal.name} ended for a node that does not exist: no-op",
                            now,
                            signal.action,
                        )
                    )
                else:
                    records.append(
                        self.auditor.problem(
                            signal.node, "unknown_node", f"alert {signal.name}: no such Node", now
                        )
                    )
                continue
            if not over:
                if self._replay(view, signal, now, records):
                    continue
                view.alerts[signal.fingerprint] = signal
                view.alert_seen[signal.fingerprint] = now
            elif signal.status == "resolved":
                if remember_resolve(view.resolved, resolve_of(signal, now), now):
                    self._alerts_unwritten.add(signal.node)
                held = view.alerts.get(signal.fingerprint)
                if held is not None and older_episode(signal, held):
                    records.append(
                        self.auditor.alert(
                            signal.node,
                            "stale_resolve",
                            f"{signal.name} resolved for its episode that started"
                            f" {_stamp(signal.starts_at)}, older than the firing held (started"
                            f" {_stamp(held.starts_at)}): a late notification; that firing"
                            " stands",
                            now,
                            held.action,
                        )
                    )
                    continue
                self._end_alert(view, signal, "resolved", "Alertmanager resolved it", now, records)
            else:
                ended = f"its endsAt {signal.ends_at:.0f} has passed"
                self._end_alert(view, signal, "expired", ended, now, records)
            self._dirty.add(signal.node)

    def _replay(
        self, view: _NodeView, signal: AlertSignal, now: float, records: list[AuditRecord]
    ) -> bool:
        """A firing for an episode this controller saw resolved: a late notification from an
        Alertmanager peer (at-least-once, unordered), ignored and audited."""
        resolved = view.resolved.get(signal.fingerprint)
        if not replayed(signal, resolved):
            return False
        assert resolved is not None
        records.append(
            self.auditor.alert(
                signal.node,
                "replayed",
                f"{signal.name} firing since {_stamp(signal.starts_at)} is not newer than its"
                f" resolve (episode started {_stamp(resolved.starts_at)}, ended"
                f" {_stamp(resolved.ended_at)}): a late notification, ignored; a new episode"
                " (a later startsAt) would count",
                now,
                signal.action,
            )
        )
        return True

    def _resolves_to_write(self) -> list[tuple[str, tuple[ResolvedAlert, ...]]]:
        """Nodes whose remembered resolves changed, to be written (act mode, leader only: a
        standby and observe mode write nothing to Nodes; their memory stays in the process)."""
        changed, self._alerts_unwritten = self._alerts_unwritten, set()
        if self.config.mode != "act" or not self._was_leading:
            return []
        return [
            (name, tuple(view.resolved.values()))
            for name in sorted(changed)
            if (view := self._views.get(name)) is not None
        ]

    def _store_resolves(
        self,
        items: list[tuple[str, tuple[ResolvedAlert, ...]]],
        now: float,
        records: list[AuditRecord],
    ) -> None:
        write = getattr(self.writer, "write_alerts", None)
        if write is None:
            return
        for name, resolves in items:
            try:
                write(name, resolves)
            except Exception as exc:  # the memory stays in the process (the next resolve for
                # the node writes it all again); a restart before then would not know it
                records.append(
                    self.auditor.problem(name, "alert_memory_write_failed", str(exc), now)
                )

    def _end_alert(
        self,
        view: _NodeView,
        signal: AlertSignal,
        result: str,
        why: str,
        now: float,
        records: list[AuditRecord],
    ) -> None:
        """Withdraw what an ended alert asked for, and audit it; an action already started is
        not undone (nothing can un-reboot a node), and the audit says so."""
        asked = view.alerts.pop(signal.fingerprint, None)
        view.alert_seen.pop(signal.fingerprint, None)
        if asked is None:
            records.append(
                self.auditor.alert(
                    signal.node,
                    "not_firing",
                    f"{signal.name} ended ({why}); it was not firing here: nothing to cancel",
                    now,
                    signal.action,
                )
            )
            return
        detail = f"{asked.name} ended ({why}): its request for {asked.action or 'no action'} is"
        detail += " withdrawn"
        state = self._states.get(signal.node)
        if state is not None and state.is_active(now, self.config.active_timeout_s):
            detail += (
                f"; the {state.action} started {now - state.started_at:.0f} s ago"
                f" ({state.outcome}) is not undone"
            )
        records.append(self.auditor.alert(signal.node, result, detail, now, asked.action))

    def _expire_alerts(self, now: float, records: list[AuditRecord]) -> None:
        """Firing alerts whose endsAt passed, or not sent again within the time to live (a lost
        resolve must not keep asking for an action)."""
        ttl = self.config.alert_ttl_s
        for name, view in self._views.items():
            for fingerprint, signal in list(view.alerts.items()):
                seen = view.alert_seen.get(fingerprint, now)
                if signal.ends_at is not None and signal.ends_at <= now:
                    why = f"its endsAt {signal.ends_at:.0f} has passed"
                elif ttl > 0 and now - seen > ttl:
                    why = f"not sent again for {now - seen:.0f} s (alert_ttl_seconds {ttl:g})"
                else:
                    continue
                self._end_alert(view, signal, "expired", why, now, records)
                self._dirty.add(name)

    def _racks(self) -> dict[str, list[str]]:
        """UltraServer id -> the nodes this controller knows in it (from their labels)."""
        racks: dict[str, list[str]] = {}
        for name, view in self._views.items():
            if view.report.ultraserver:
                racks.setdefault(view.report.ultraserver, []).append(name)
        return racks

    def _decide(
        self, now: float, records: list[AuditRecord]
    ) -> tuple[list[Decision], list[tuple[Decision, _NodeView]], list[RackDecision]]:
        requests: list[NodeRequest] = []
        onsets: list[tuple[str, float]] = []
        audited: list[Decision] = []
        # Only where some provider can take a rack request (else per node, as before).
        takes = any(_takes_racks(p) for p in self.providers)
        racks = self._racks() if self.config.rack_escalation and takes else {}
        if racks:
            # The share is of the whole rack: decide a dirty node's rack-mates with it.
            touched = {self._views[n].report.ultraserver for n in self._dirty if n in self._views}
            self._dirty |= {n for rack in touched if rack for n in racks[rack]}
        for name in sorted(self._dirty):
            view = self._views.get(name)
            if view is None:
                continue
            state = self._states.get(name)
            if state is not None and state.deep_check_waiting():
                state = self._read_deep_check(name, state, view.report.deep_health, now, records)
            request = view.request(self.config.ladder, state, now, self.config.active_timeout_s)
            request = self._repeat_offender(request, now)
            self._agent_silence(view, state, request, now, records)
            before = self._requested.get(name)
            self._requested[name] = request.action
            self._rungs[name] = request.rungs
            if state is not None:
                self._settle(name, state, request, now, records)
            if request.action is None:
                self._last_audited.pop(name, None)
                continue
            if before is None:
                onsets.append((name, request.onset if request.onset is not None else now))
            if name in self._bad_state:
                # Unknown history: acting could repeat an action; a person must fix the note.
                decision = Decision(
                    name,
                    request.action,
                    "skip",
                    "malformed_state",
                    self._bad_state[name],
                    self.config.mode,
                    now,
                    request.reasons,
                )
                if self._audit(decision, records):
                    audited.append(decision)
                continue
            requests.append(request)
        self._dirty.clear()
        rack_requests: list[RackRequest] = []
        if racks:
            opted = [n for n, v in self._views.items() if v.report.opted_out]
            requests, rack_requests = escalate(
                requests, racks, RackConfig(self.config.rack_share), opted
            )
        folded = {n for r in rack_requests for n in r.bad}
        # The onsets a rack request answers are counted after the rack is decided (rack.py):
        # they must not trip the breaker against that very request.
        self._record_onsets([o for o in onsets if o[0] not in folded], now, records)
        horizon = now - self.config.budget_window_s
        self._departed = {n: t for n, t in self._departed.items() if t > horizon}
        facts = ClusterFacts(
            gpu_nodes=sum(1 for v in self._views.values() if v.report.is_gpu),
            pending_elsewhere=frozenset(
                n for n, v in self._views.items() if v.report.hyperpod_status in HYPERPOD_PENDING
            ),
            started_elsewhere=frozenset(self._departed),
        )
        # A member with an unreadable state annotation holds its rack, as it holds itself:
        # unknown history, and the rack's action would overwrite the note a person must fix.
        held = [r for r in rack_requests if any(m in self._bad_state for m in r.members)]
        rack_decisions = [
            RackDecision(
                r.rack,
                r.action,
                "skip",
                "malformed_state",
                f"state of {', '.join(m for m in r.members if m in self._bad_state)}:"
                f" {next(self._bad_state[m] for m in r.members if m in self._bad_state)}",
                self.config.mode,
                now,
                r.members,
                r.bad,
                r.reasons,
            )
            for r in held
        ]
        rack_decisions += decide_racks(
            [r for r in rack_requests if r not in held],
            self._states,
            facts,
            self.breaker,
            self.config,
            now,
        )
        self._record_onsets([o for o in onsets if o[0] in folded], now, records)
        facts = facts_after(facts, rack_decisions)
        rack_audited = [d for d in rack_decisions if self._audit_rack(d, records)]
        if rack_audited:
            self.rack_decisions = rack_audited
        decisions = decide(requests, self._states, facts, self.breaker, self.config, now)
        audited += [d for d in decisions if self._audit(d, records)]
        acts = [(d, self._views[d.node]) for d in decisions if d.verdict == "act"]
        return audited, acts, [d for d in rack_decisions if d.verdict == "act"]

    def _record_onsets(
        self, onsets: list[tuple[str, float]], now: float, records: list[AuditRecord]
    ) -> None:
        was_tripped = self.breaker.tripped
        self.breaker = record_onsets(self.breaker, onsets, now, self.config)
        if self.breaker.tripped and not was_tripped:
            records.append(self.auditor.breaker("tripped", self.breaker.reason, now))
            log.error("remediation circuit breaker tripped: %s", self.breaker.reason)

    def _audit_rack(self, decision: RackDecision, records: list[AuditRecord]) -> bool:
        """Audit a rack decision once (one record naming its members), unless it repeats the
        rack's last one; its members' own last decisions are forgotten (the rack spoke)."""
        key = (decision.verdict, decision.reason, decision.action)
        slot = f"ultraserver:{decision.rack}"
        if decision.verdict == "skip" and self._last_audited.get(slot) == key:
            self.suppressed_repeats += 1
            return False
        self._last_audited[slot] = key
        for node in decision.members:
            self._last_audited.pop(node, None)
        records.append(self.auditor.rack(decision))
        log.warning(
            "UltraServer %s: %s %s (%s); nodes: %s",
            decision.rack,
            decision.verdict,
            decision.action,
            decision.detail,
            ", ".join(decision.members),
        )
        return True

    def _repeat_offender(self, request: NodeRequest, now: float) -> NodeRequest:
        """A repeat offender's reset and reboot steps become replace (policy's
        `escalate_repeat_offender`): rebooting a node that fails again and again only spends
        the jobs placed on it in between."""
        if self.repeat_offender is None or not request.rungs:
            return request
        try:
            why = self.repeat_offender(request.node, now)
        except Exception:  # the ledger's answer is advice: never a reason to stop deciding
            log.exception("repeat offender check failed for %s", request.node)
            return request
        if not why:
            return request
        rungs = escalate_repeat_offender(request.rungs, why)
        if rungs == request.rungs:
            return request
        asking = [r.action for r in rungs if not r.hold]
        return replace(request, rungs=rungs, action=strongest([*asking, request.action]))

    def _agent_silence(
        self,
        view: _NodeView,
        state: RemediationState | None,
        request: NodeRequest,
        now: float,
        records: list[AuditRecord],
    ) -> None:
        """A node that booted after its action while every finding it shows is from before that
        boot: its agent has not reported since. After AGENT_GRACE_S that is audited, once per
        boot, as what it is (the agent did not come back), not as the fault returning."""
        boot = view.boot(state)
        stale = [r for r in request.rungs if r.stale]
        if boot is None or not stale or len(stale) != len(request.rungs):
            view.boot_noticed = None
            return
        key = view.report.boot_id or f"{boot.before:.0f}"
        if view.boot_noticed is None or view.boot_noticed[0] != key:
            view.boot_noticed = (key, now, False)
        _, noticed, audited = view.boot_noticed
        if audited or now - noticed < AGENT_GRACE_S:
            return
        view.boot_noticed = (key, noticed, True)
        assert state is not None
        detail = (
            f"the node booted after the {state.action} of {format_time(state.started_at)}"
            f" ({boot.how}) and its agent has not reported since ({now - noticed:.0f} s):"
            f" {len(stale)} findings from before that boot are stale, not the fault returning;"
            " check the node agent"
        )
        records.append(
            self.auditor.lifecycle(
                view.report.name, "agent_silent_after_boot", detail, now, state.action
            )
        )

    def _read_deep_check(
        self, name: str, state: RemediationState, label: str, now: float, records: list[AuditRecord]
    ) -> RemediationState:
        """A waiting deep check against the node's label now; a change is written and audited."""
        updated, change, detail = read_deep_check(state, label, now, self.config)
        if not change:
            return state
        self._states[name] = updated
        if self.config.mode == "act":  # observe writes nothing to Nodes (a check left from act)
            self._unwritten.append((name, updated))
        records.append(self.auditor.lifecycle(name, change, detail, now, "deep-check"))
        if change == "deep_check_timeout":
            log.warning("deep health check of %s timed out: %s", name, detail)
        return updated

    def _audit(self, decision: Decision, records: list[AuditRecord]) -> bool:
        """Audit a decision unless it repeats the node's last one (skips recur every round)."""
        key = (decision.verdict, decision.reason, decision.action)
        if decision.verdict == "skip" and self._last_audited.get(decision.node) == key:
            self.suppressed_repeats += 1
            return False
        self._last_audited[decision.node] = key
        records.append(self.auditor.decision(decision))
        return True

    def _settle(
        self,
        name: str,
        state: RemediationState,
        request: NodeRequest,
        now: float,
        records: list[AuditRecord],
    ) -> None:
        """Bring the node's state up to now (policy.settle); audit what people want to know."""
        pending = request.hyperpod_status in HYPERPOD_PENDING
        requesting = request.action is not None or request.holding
        settled, changes = settle(state, requesting, pending, now, self.config)
        if not changes:
            return
        self._states[name] = settled
        if self.config.mode == "act":  # observe writes nothing to Nodes; memory has it
            self._unwritten.append((name, settled))  # written after the lock is released
        for change in changes:
            if change == "recovered":
                detail = (
                    f"{state.action} {state.outcome} {now - state.started_at:.0f} s ago;"
                    " the node reports healthy"
                )
            elif change == "attempts_reset":
                assert state.healthy_since is not None
                detail = (
                    f"healthy for {(now - state.healthy_since) / 3600:.1f} h (reset after"
                    f" {self.config.healthy_reset_s / 3600:g} h): {state.attempts} attempts"
                    " back to 0"
                )
            elif change == "ladder_expired":
                kept = {m.key for m in settled.ladder}
                gone = [f"{m.rule}@{m.component}" for m in state.ladder if m.key not in kept]
                detail = (
                    f"ladder marks past their window dropped: {', '.join(gone)};"
                    " the next failure starts from the first step"
                )
            else:
                continue  # healthy/unhealthy: the clock of healthy_since, in the state only
            records.append(self.auditor.lifecycle(name, change, detail, now, state.action))

    # -- carrying decisions out (outside the lock) --

    def _act(
        self, acts: list[tuple[Decision, _NodeView]], now: float, records: list[AuditRecord]
    ) -> None:
        planned = self._plan(acts, now)
        # No record of it → no action (a restart could repeat it).
        stored = self._store_many([(p.request.node, p.state) for p in planned], now, records)
        ready = [p.request for p in planned if p.request.node in stored]
        if not ready:
            return
        self._record_to_action(acts, self.clock())
        outcomes = fan_out(self.providers, ready)
        plans = {p.request.node: p for p in planned}
        finals: list[tuple[str, RemediationState]] = []
        for request in ready:
            final = self._settle_outcome(plans[request.node], outcomes[request.node], now, records)
            if final is not None:
                finals.append((request.node, final))
        self._store_many(finals, now, records)

    def _act_rack(self, decision: RackDecision, now: float, records: list[AuditRecord]) -> None:
        """Carry out one rack decision: every member's state `requested` first (attempt
        counted, so cooldown, attempts and budget see it; none written, nothing done), then one
        call per provider that takes racks (the webhook's `post_rack`: one POST for the rack;
        HyperPod: each member's label, as one batch), then every member's outcome."""
        takers = [p for p in self.providers if _takes_racks(p)]
        members = decision.members
        with self._lock:
            priors = {m: self._states.get(m) for m in members}
            objs = {m: self._views[m].obj if m in self._views else {} for m in members}
            boots = {m: self._views[m].report.boot_id if m in self._views else "" for m in members}
            rungs = {m: self._rungs.get(m, ()) for m in decision.bad}
        ladder = self.config.ladder
        # The bad members' ladder steps are marked taken, as for a node's own action, so their
        # next failure climbs on from the rack's remedy.
        marks = {
            m: mark_ladder(
                p.ladder if p is not None else (), rungs[m], decision.action, ladder, now
            )
            if m in rungs
            else (p.ladder if p is not None else ())
            for m, p in priors.items()
        }
        anchor = decision.bad[0] if decision.bad else members[0]
        where = f"UltraServer {decision.rack} ({len(members)} nodes)"
        requested = [
            (
                m,
                RemediationState(
                    action=decision.action,
                    started_at=now,
                    provider=",".join(p.name for p in takers) or "none",
                    attempts=(prior.attempts if prior is not None else 0) + 1,
                    outcome="requested",
                    ladder=marks[m],
                    deep_check=prior.deep_check if prior is not None else None,
                    boot_id=boots[m],
                ),
            )
            for m, prior in priors.items()
        ]
        stored = self._store_many(requested, now, records)
        if stored != set(members):
            missing = sorted(set(members) - stored)
            detail = (
                f"{where}: the state of {', '.join(missing)} could not be written;"
                " the rack was not acted on"
            )
            self._store_many(
                [(m, st.finished("failed", now, detail)) for m, st in requested if m in stored],
                now,
                records,
            )
            records.append(self.auditor.outcome(anchor, decision.action, False, detail, now))
            return
        results: list[tuple[str, ActionResult]] = []
        for provider in takers:
            try:
                if hasattr(provider, "post_rack"):
                    result = provider.post_rack(decision)
                else:
                    batch = [
                        ActionRequest(m, decision.action, objs[m], decision.as_dict())
                        for m in members
                    ]
                    answers = provider.execute(batch)
                    failed = [a for a in answers if not a.ok]
                    done = len(answers) - len(failed)
                    result = ActionResult(
                        decision.rack,
                        done == len(members) and not failed,
                        f"{done} of {len(members)} nodes"
                        + (f"; {failed[0].node}: {failed[0].detail}" if failed else ""),
                    )
            except Exception as exc:  # a provider's bug is that provider's failure
                result = ActionResult(decision.rack, False, f"{type(exc).__name__}: {exc}")
            results.append((provider.name, result))
        ok = bool(results) and all(r.ok for _, r in results)
        said = "; ".join(f"{name}: {r.detail}" for name, r in results)
        detail = f"{where}: {said or 'no provider takes rack requests (webhook, hyperpod)'}"
        finished = self.clock()
        finals = []
        for m, st in requested:
            final = st.finished("done" if ok else "failed", finished, detail[:500])
            if not ok:  # not taken: the step is tried again after the cooldown, not skipped
                prior = priors[m]
                final = replace(
                    final, ladder=live_marks(prior.ladder, ladder, now) if prior else ()
                )
            finals.append((m, replace(final, finished_at=None) if ok else final))
        self._store_many(finals, now, records)
        records.append(self.auditor.outcome(anchor, decision.action, ok, detail, now))

    def _plan(self, acts: list[tuple[Decision, _NodeView]], now: float) -> list[_Planned]:
        """Each decided action's `requested` state (attempt counted, ladder step marked, deep
        check recorded) and its provider request, in the order of `acts`."""
        planned: list[_Planned] = []
        ladder = self.config.ladder
        for decision, view in acts:
            assert decision.action is not None
            with self._lock:
                prior = self._states.get(decision.node)
            priors = prior.ladder if prior is not None else ()
            checking = decision.action == "deep-check"
            attempts = prior.attempts if prior is not None else 0
            state = RemediationState(
                action=decision.action,
                started_at=now,
                provider=",".join(p.name for p in self.providers) or "none",
                # A deep check mends nothing: not an attempt (so reboot, deep-check, replace
                # still fits in max_attempts 3, and a deferred check costs nothing).
                attempts=attempts if checking else attempts + 1,
                outcome="requested",
                # Marked before the call: after a crash here the step counts as taken.
                ladder=mark_ladder(priors, decision.rungs, decision.action, ladder, now),
                # Before the call, with the label as it is now: a restart waits for this check.
                deep_check=(
                    DeepCheck(now, self._deep_checks(), view.report.deep_health)
                    if checking
                    else (prior.deep_check if prior is not None else None)
                ),
                boot_id=view.report.boot_id,
            )
            request = ActionRequest(decision.node, decision.action, view.obj, decision.as_dict())
            planned.append(_Planned(state, request, prior, decision.rungs))
        return planned

    def _record_to_action(self, acts: list[tuple[Decision, _NodeView]], called: float) -> None:
        """Observe each action's seconds from the failure's first sighting to the provider call
        (topowatch_remediation_detection_to_action_seconds)."""
        with self._lock:
            for decision, view in acts:
                onset = view.onset()
                if onset is not None and decision.action in self._to_action:
                    seconds = max(0.0, called - onset)
                    counts, total, n = self._to_action[decision.action]
                    for i, bound in enumerate(TO_ACTION_BUCKETS):
                        if seconds <= bound:
                            counts[i] += 1
                    self._to_action[decision.action] = (counts, total + seconds, n + 1)

    def _settle_outcome(
        self, plan: _Planned, outcome: Outcome, now: float, records: list[AuditRecord]
    ) -> RemediationState | None:
        """The node's final state after the providers answered, its outcome audited; None when
        the action was deferred (stored and audited by `_defer` already)."""
        request = plan.request
        ok = outcome.ok
        detail = outcome.detail
        if outcome.deferred:
            self._defer(request.node, request.action, plan.prior, detail, now, records)
            return None
        self._deferred.discard(request.node)
        did = outcome.performed
        ladder = self.config.ladder
        priors = plan.prior.ladder if plan.prior is not None else ()
        # The ladder records what some provider did; with none, the step was not taken and
        # is tried again (after the cooldown), not skipped.
        marks = (
            mark_ladder(priors, plan.rungs, did, ladder, now)
            if did is not None
            else live_marks(priors, ladder, now)
        )
        with self._lock:
            state = self._states[request.node]
        final = replace(
            state.finished("done" if ok else "failed", self.clock(), detail), ladder=marks
        )
        if ok:
            final = replace(final, finished_at=None)
        elif request.action == "deep-check":  # no check started: the last one stands
            prior = plan.prior
            final = replace(final, deep_check=prior.deep_check if prior else None)
        records.append(self.auditor.outcome(request.node, request.action, ok, detail, now))
        return final

    def _deep_checks(self) -> tuple[str, ...]:
        """The deep health checks the providers that can run one ask for (empty: none can)."""
        return deep_checks(self.providers)

    def _defer(
        self,
        node: str,
        action: Action,
        prior: RemediationState | None,
        detail: str,
        now: float,
        records: list[AuditRecord],
    ) -> None:
        """An action the provider will not carry out yet (a deep check while another runs on the
        cluster; a Slurm node someone else took out of service since it was read): back to
        where the node stood, outcome `deferred` (not an attempt, no cooldown, no budget; a deep
        check is asked again after deep_check.retry_seconds), counted every time, logged once
        until an action starts."""
        with self._lock:
            state = self._states[node]
        deferred = replace(
            state,
            outcome="deferred",
            finished_at=now,
            message=detail[:500],
            attempts=prior.attempts if prior is not None else 0,
            ladder=live_marks(prior.ladder, self.config.ladder, now) if prior is not None else (),
            deep_check=prior.deep_check if prior is not None else None,
        )
        self._store(node, deferred, now, records)
        first = node not in self._deferred
        self._deferred.add(node)
        record = self.auditor.deferred(node, action, detail, now, first)
        if record is not None:
            records.append(record)

    def _store(
        self, node: str, state: RemediationState, now: float, records: list[AuditRecord]
    ) -> bool:
        if self.writer is not None:
            try:
                self.writer.write_state(node, state)
            except Exception as exc:
                records.append(self.auditor.problem(node, "state_write_failed", str(exc), now))
                return False
        with self._lock:
            self._states[node] = state
        return True

    def _store_many(
        self, items: list[tuple[str, RemediationState]], now: float, records: list[AuditRecord]
    ) -> set[str]:
        """Store several nodes' states; the nodes whose state was written. A writer that can
        write them at once (`write_states`: the Slurm state file, one atomic replacement
        instead of one per node) is asked once, and then all or none are written."""
        write_states = getattr(self.writer, "write_states", None)
        if write_states is None or len(items) < 2:
            return {node for node, state in items if self._store(node, state, now, records)}
        try:
            write_states(items)
        except Exception as exc:
            for node, _ in items:
                records.append(self.auditor.problem(node, "state_write_failed", str(exc), now))
            return set()
        with self._lock:
            self._states.update(items)
        return {node for node, _ in items}

    def _post_events(self, records: Iterable[AuditRecord]) -> None:
        """An Event per record about a node we know, in observe mode too. Events never hold up
        remediation; one that cannot be written is counted and logged, never dropped silently."""
        if self.writer is None:
            return
        with self._lock:
            known = set(self._views)
        for record in records:
            if not record.node or record.node not in known or record.verdict == "noop":
                continue  # no Node to attach it to (unknown or deleted), or nothing happened
            try:
                self.writer.post_event(record)
            except Exception as exc:
                self.auditor.event_failed(record, exc)

    # -- views --

    def status(self) -> dict[str, Any]:
        now = self.clock()
        with self._lock:
            gpu_nodes = sum(1 for v in self._views.values() if v.report.is_gpu)
            active = sorted(
                n for n, s in self._states.items() if s.is_active(now, self.config.active_timeout_s)
            )
            nodes = [
                {
                    "node": name,
                    "requested": self._requested.get(name),
                    # each finding's step on its ladder now, and what comes next if it recurs
                    "ladder": [r.as_dict() for r in self._rungs.get(name, ())],
                    "state": None if state is None else _state_dict(state, self.config),
                    "last_decision": self._last_audited.get(name, (None, None, None))[1],
                }
                for name in sorted(set(self._states) | {n for n, r in self._requested.items() if r})
                for state in [self._states.get(name)]
            ]
            breaker = self.breaker.as_dict()
            racks = [d.as_dict() for d in self.rack_decisions]
        return {
            "mode": self.config.mode,
            "providers": [p.name for p in self.providers],
            "budget": {
                "limit": self.config.budget(gpu_nodes),
                "in_remediation": active,
                "gpu_nodes": gpu_nodes,
            },
            "breaker": breaker,
            "lifecycle": {
                "max_attempts": self.config.max_attempts,
                "healthy_reset_seconds": self.config.healthy_reset_s,
                "alert_ttl_seconds": self.config.alert_ttl_s,
            },
            "deep_check": {
                "timeout_seconds": self.config.deep_check_timeout_s,
                "on_timeout": self.config.deep_check_on_timeout,
                "retry_seconds": self.config.deep_check_retry_s,
                "checks": list(self._deep_checks()),
            },
            "ladder": self.config.ladder.as_list(),
            # What was escalated to a whole UltraServer (rack.py), for which rack and why: the
            # last round's rack decisions that were audited (their records are in `recent`).
            "rack_escalation": {
                "enabled": self.config.rack_escalation,
                "share": self.config.rack_share,
                "decisions": racks,
            },
            "nodes": nodes,
            "recent": self.auditor.recent(100),
        }

    def families(self) -> list[Family]:
        now = self.clock()
        tripped = Family(
            "topowatch_remediation_breaker_tripped",
            GAUGE,
            "1 while the circuit breaker stops all remediation (an admin must reset it).",
        )
        mode = Family("topowatch_remediation_mode", GAUGE, "1 for the mode in force.")
        active = Family(
            "topowatch_remediation_nodes_active", GAUGE, "Nodes in remediation right now."
        )
        limit = Family(
            "topowatch_remediation_budget_nodes", GAUGE, "Nodes allowed in remediation at once."
        )
        asking = Family(
            "topowatch_remediation_nodes_requesting", GAUGE, "Nodes asking for an action."
        )
        with self._lock:
            tripped.add([], 1 if self.breaker.tripped else 0)
            gpu_nodes = sum(1 for v in self._views.values() if v.report.is_gpu)
            in_flight = sum(
                1 for s in self._states.values() if s.is_active(now, self.config.active_timeout_s)
            )
            by_action: dict[str, int] = dict.fromkeys(ACTIONS, 0)
            for action in self._requested.values():
                if action is not None:
                    by_action[action] += 1
        for name in ("observe", "act"):
            mode.add([("mode", name)], 1 if self.config.mode == name else 0)
        active.add([], in_flight)
        limit.add([], self.config.budget(gpu_nodes))
        for action_name, count in sorted(by_action.items()):
            asking.add([("action", action_name)], count)
        return [
            tripped,
            mode,
            active,
            limit,
            asking,
            self._to_action_family(),
            *self.auditor.families(),
        ]

    def _to_action_family(self) -> Family:
        family = Family(
            "topowatch_remediation_detection_to_action_seconds",
            HISTOGRAM,
            "Time from a failure's first sighting on the node (the finding's firstSeen, damping "
            "included) to the provider call, by action.",
        )
        with self._lock:
            observed = {a: (list(c), total, n) for a, (c, total, n) in self._to_action.items()}
        for action, (counts, total, n) in sorted(observed.items()):
            buckets = list(zip(TO_ACTION_BUCKETS, counts, strict=True))
            family.add_histogram([("action", action)], buckets, total, n)
        return family


def _takes_racks(provider: Provider) -> bool:
    """Providers with a rack-level request: the webhook (`post_rack`), and HyperPod, which has
    no rack API: its members' labels, one batch. Others take no rack requests."""
    return callable(getattr(provider, "post_rack", None)) or provider.name == "hyperpod"


def _state_dict(state: RemediationState, config: PolicyConfig) -> dict[str, Any]:
    healthy = state.healthy_since
    return {
        "action": state.action,
        "outcome": state.outcome,
        "provider": state.provider,
        "attempts": state.attempts,
        "started_at": state.started_at,
        "finished_at": state.finished_at,
        "message": state.message,
        "healthy_since": healthy,
        "deep_check": None
        if state.deep_check is None
        else {
            "started_at": state.deep_check.started_at,
            "checks": list(state.deep_check.checks),
            "label_before": state.deep_check.before or None,
            "seen_in_progress": state.deep_check.seen_in_progress,
            "verdict": state.deep_check.verdict or None,
            "verdict_at": state.deep_check.verdict_at,
            "replace_allowed": state.deep_check.replace,
            "times_out_at": state.deep_check.started_at + config.deep_check_timeout_s
            if state.deep_check.waiting
            else None,
        },
        "attempts_reset_at": (
            healthy + config.healthy_reset_s if healthy is not None and state.attempts else None
        ),
        "ladder": [
            {
                "rule": m.rule,
                "component": m.component,
                "step": m.step + 1,
                "action": m.action,
                "performed": m.performed,
                "at": m.at,
                "expires_at": m.at + _window(m, config.ladder),
            }
            for m in state.ladder
        ],
    }


def _window(mark: LadderMark, ladder: Ladder) -> float:
    rule = ladder.rule_named(mark.rule)
    return 0.0 if rule is None else rule.steps[min(mark.step, len(rule.steps) - 1)].within_s


def _stamp(at: float | None) -> str:
    return "(no time)" if at is None else format_time(at)
