"""The remediation controller: Node reports and alerts in, policy decisions out, carried out safely.

Threads: `observe_node` and `handle_alerts` only enqueue (they run in informer and HTTP threads
and must never block); one worker thread parses, decides, writes state and calls providers.
Ordering per action: decide → audit → write state `requested` to the node annotation → call the
providers → write the outcome. If the state cannot be written the action is not taken, so a
restart can never repeat an action it does not know about.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from exporter.exposition import GAUGE, HISTOGRAM, Family
from healthcheck.actions.base import ActionRequest, ActionResult, Provider
from healthcheck.alerts import AlertSignal, ParsedAlerts
from healthcheck.audit import Auditor, AuditRecord, node_event
from healthcheck.findings import FINDINGS_ANNOTATION, HEALTH_CONDITION, decode_findings
from healthcheck.policy import (
    HYPERPOD_HEALTH,
    HYPERPOD_PENDING,
    OPT_OUT_LABEL,
    OPT_OUT_VALUE,
    Breaker,
    ClusterFacts,
    Decision,
    NodeRequest,
    PolicyConfig,
    decide,
    record_onsets,
    reset_breaker,
    strongest,
)
from healthcheck.state import ANNOTATION as STATE_ANNOTATION
from healthcheck.state import Action, RemediationState, dump_state, parse_state

TO_ACTION_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
MERGE_PATCH = "application/merge-patch+json"


# --- reading a Node (pure) --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What the controller needs from one Node object."""

    name: str
    action: Action | None
    reasons: tuple[str, ...]
    onset: float | None
    opted_out: bool
    hyperpod_status: str
    is_gpu: bool
    state: RemediationState | None
    state_problem: str | None
    problems: tuple[str, ...]


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
    acting = [f for f in findings if f.actionable and f.action in ("reboot", "replace")]
    if not acting and _condition_false(obj) and not findings and not problems:
        problems.append(f"condition {HEALTH_CONDITION}=False but no {FINDINGS_ANNOTATION}")
    raw_state = annotations.get(STATE_ANNOTATION)
    state, state_problem = parse_state(raw_state if isinstance(raw_state, str) else None)
    if raw_state is not None and not isinstance(raw_state, str):
        state_problem = f"{STATE_ANNOTATION} is not a string"
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    capacity = status.get("capacity") if isinstance(status.get("capacity"), Mapping) else {}
    assert isinstance(capacity, Mapping)
    return NodeReport(
        name=name,
        action=strongest(f.action for f in acting),
        reasons=tuple(sorted({f"{f.check}@{f.component}" for f in acting})),
        onset=min((f.first_seen for f in acting), default=None),
        opted_out=labels.get(OPT_OUT_LABEL) == OPT_OUT_VALUE,
        hyperpod_status=str(labels.get(HYPERPOD_HEALTH) or ""),
        is_gpu=_positive(capacity.get(GPU_RESOURCE)),
        state=state,
        state_problem=state_problem,
        problems=tuple(problems),
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


# --- the controller ---------------------------------------------------------------------------


@dataclass(slots=True)
class _NodeView:
    report: NodeReport
    obj: dict[str, Any]
    alerts: dict[str, AlertSignal] = field(default_factory=dict)

    def request(self) -> NodeRequest:
        firing = [a for a in self.alerts.values() if a.action is not None]
        action = strongest([self.report.action, *(a.action for a in firing)])
        reasons = self.report.reasons + tuple(sorted(f"alert:{a.name}" for a in firing))
        onsets = [t for t in [self.report.onset, *(a.starts_at for a in firing)] if t is not None]
        return NodeRequest(
            self.report.name,
            action,
            reasons,
            min(onsets, default=None),
            self.report.opted_out,
            self.report.hyperpod_status,
        )


class RemediationController:
    def __init__(
        self,
        config: PolicyConfig,
        providers: Sequence[Provider],
        writer: NodeWriter | None = None,
        auditor: Auditor | None = None,
        clock: Callable[[], float] = time.time,
        recheck_s: float = 10.0,
    ) -> None:
        self.config = config
        self.providers = list(providers)
        self.writer = writer
        self.auditor = auditor or Auditor()
        self.clock = clock
        self.recheck_s = recheck_s
        self._inbox: queue.SimpleQueue[tuple[str, Any, float]] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards everything below against status()/families()
        self._views: dict[str, _NodeView] = {}
        self._states: dict[str, RemediationState] = {}
        self._bad_state: dict[str, str] = {}
        self._requested: dict[str, Action | None] = {}
        self._last_audited: dict[str, tuple[str, str, str | None]] = {}
        self._dirty: set[str] = set()
        self._unwritten: list[tuple[str, RemediationState]] = []
        self._last_recheck = 0.0
        self.breaker = Breaker()
        self.suppressed_repeats = 0
        # Seconds from a failure's first sighting on the node to the provider call, per action.
        # Kept as cumulative bucket counts, sum and count: bounded however long it runs.
        self._to_action: dict[str, tuple[list[int], float, int]] = {
            action: ([0] * len(TO_ACTION_BUCKETS), 0.0, 0) for action in ("reboot", "replace")
        }
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # -- inputs (any thread, never block) --

    def observe_node(self, obj: dict[str, Any], now: float, deleted: bool = False) -> None:
        self._inbox.put(("deleted" if deleted else "node", obj, now))

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
                elif kind == "deleted":
                    self._forget_node(payload, now)
                elif kind == "alerts":
                    self._take_alerts(payload, now, records)
            if now - self._last_recheck >= self.recheck_s:
                self._last_recheck = now
                self._dirty |= {n for n, r in self._requested.items() if r is not None}
            decisions, acts = self._decide(now, records)
            unwritten, self._unwritten = self._unwritten, []
        for name, state in unwritten:
            self._store(name, state, now, records)
        self._act(acts, now, records)
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
        report = read_node(obj) if isinstance(obj, dict) else None
        if report is None:
            records.append(self.auditor.problem("", "malformed_node", "Node without a name", now))
            return
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
            known is None or report.state.started_at > known.started_at
        ):
            self._states[name] = report.state  # read back after a restart, or written by a peer
        view = self._views.get(name)
        if view is None:
            view = self._views[name] = _NodeView(report, obj)
        else:
            view.report, view.obj = report, obj
        self._dirty.add(name)

    def _forget_node(self, obj: Any, now: float) -> None:
        report = read_node(obj) if isinstance(obj, dict) else None
        if report is None:
            return
        self._views.pop(report.name, None)
        self._requested.pop(report.name, None)
        self._bad_state.pop(report.name, None)
        state = self._states.get(report.name)
        if state is not None and state.outcome in ("requested", "done"):
            # Kept (not written: the node is gone) so the hourly budget still counts it.
            self._states[report.name] = state.finished("gone", now, "node deleted")

    def _take_alerts(self, parsed: ParsedAlerts, now: float, records: list[AuditRecord]) -> None:
        for why in parsed.ignored:
            records.append(self.auditor.problem("", "alert_ignored", why, now))
        for signal in parsed.signals:
            view = self._views.get(signal.node)
            if view is None:
                records.append(
                    self.auditor.problem(
                        signal.node, "unknown_node", f"alert {signal.name}: no such Node", now
                    )
                )
                continue
            if signal.status == "firing":
                view.alerts[signal.fingerprint] = signal
            else:
                view.alerts.pop(signal.fingerprint, None)
            self._dirty.add(signal.node)

    def _decide(
        self, now: float, records: list[AuditRecord]
    ) -> tuple[list[Decision], list[tuple[Decision, _NodeView]]]:
        requests: list[NodeRequest] = []
        onsets: list[tuple[str, float]] = []
        audited: list[Decision] = []
        for name in sorted(self._dirty):
            view = self._views.get(name)
            if view is None:
                continue
            request = view.request()
            before = self._requested.get(name)
            self._requested[name] = request.action
            if request.action is None:
                self._note_recovery(name, view, now)
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
        was_tripped = self.breaker.tripped
        self.breaker = record_onsets(self.breaker, onsets, now, self.config)
        if self.breaker.tripped and not was_tripped:
            records.append(self.auditor.breaker("tripped", self.breaker.reason, now))
            log.error("remediation circuit breaker tripped: %s", self.breaker.reason)
        facts = ClusterFacts(
            gpu_nodes=sum(1 for v in self._views.values() if v.report.is_gpu),
            pending_elsewhere=frozenset(
                n for n, v in self._views.items() if v.report.hyperpod_status in HYPERPOD_PENDING
            ),
        )
        decisions = decide(requests, self._states, facts, self.breaker, self.config, now)
        audited += [d for d in decisions if self._audit(d, records)]
        acts = [(d, self._views[d.node]) for d in decisions if d.verdict == "act"]
        return audited, acts

    def _audit(self, decision: Decision, records: list[AuditRecord]) -> bool:
        """Audit a decision unless it repeats the node's last one (skips recur every round)."""
        key = (decision.verdict, decision.reason, decision.action)
        if decision.verdict == "skip" and self._last_audited.get(decision.node) == key:
            self.suppressed_repeats += 1
            return False
        self._last_audited[decision.node] = key
        records.append(self.auditor.decision(decision))
        return True

    def _note_recovery(self, name: str, view: _NodeView, now: float) -> None:
        state = self._states.get(name)
        if (
            state is None
            or state.outcome != "done"
            or view.report.hyperpod_status in HYPERPOD_PENDING
        ):
            return
        recovered = state.finished("recovered", now, "node reports healthy")
        self._states[name] = recovered
        self._unwritten.append((name, recovered))  # written after the lock is released

    # -- carrying decisions out (outside the lock) --

    def _act(
        self, acts: list[tuple[Decision, _NodeView]], now: float, records: list[AuditRecord]
    ) -> None:
        ready: list[ActionRequest] = []
        for decision, view in acts:
            assert decision.action is not None
            with self._lock:
                prior = self._states.get(decision.node)
            state = RemediationState(
                action=decision.action,
                started_at=now,
                provider=",".join(p.name for p in self.providers) or "none",
                attempts=(prior.attempts + 1) if prior is not None else 1,
                outcome="requested",
            )
            if not self._store(decision.node, state, now, records):
                continue  # no record of it → no action (a restart could repeat it)
            ready.append(
                ActionRequest(decision.node, decision.action, view.obj, decision.as_dict())
            )
        if not ready:
            return
        called = self.clock()
        with self._lock:
            for decision, view in acts:
                onset = view.request().onset
                if onset is not None and decision.action in self._to_action:
                    seconds = max(0.0, called - onset)
                    counts, total, n = self._to_action[decision.action]
                    for i, bound in enumerate(TO_ACTION_BUCKETS):
                        if seconds <= bound:
                            counts[i] += 1
                    self._to_action[decision.action] = (counts, total + seconds, n + 1)
        results: dict[str, list[ActionResult]] = {r.node: [] for r in ready}
        for provider in self.providers:
            try:
                answered = provider.execute(ready)
            except Exception as exc:  # a provider bug fails its nodes, never the controller
                answered = [
                    ActionResult(r.node, False, f"{provider.name} raised: {exc}") for r in ready
                ]
            seen = {a.node for a in answered}
            answered += [
                ActionResult(r.node, False, f"{provider.name} gave no result")
                for r in ready
                if r.node not in seen
            ]
            for result in answered:
                if result.node in results:
                    results[result.node].append(
                        replace(result, detail=f"{provider.name}: {result.detail}")
                    )
        for request in ready:
            got = results[request.node]
            ok = bool(got) and all(r.ok for r in got)
            detail = "; ".join(r.detail for r in got) or "no provider configured"
            with self._lock:
                state = self._states[request.node]
            final = state.finished("done" if ok else "failed", self.clock(), detail)
            if ok:
                final = replace(final, finished_at=None)
            self._store(request.node, final, now, records)
            records.append(self.auditor.outcome(request.node, request.action, ok, detail, now))

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

    def _post_events(self, records: Iterable[AuditRecord]) -> None:
        if self.writer is None:
            return
        for record in records:
            if not record.node:
                continue
            with contextlib.suppress(Exception):  # events are best effort; the log has it all
                self.writer.post_event(record)

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
                    "state": None if state is None else _state_dict(state),
                    "last_decision": self._last_audited.get(name, (None, None, None))[1],
                }
                for name in sorted(set(self._states) | {n for n, r in self._requested.items() if r})
                for state in [self._states.get(name)]
            ]
            breaker = self.breaker.as_dict()
        return {
            "mode": self.config.mode,
            "providers": [p.name for p in self.providers],
            "budget": {
                "limit": self.config.budget(gpu_nodes),
                "in_remediation": active,
                "gpu_nodes": gpu_nodes,
            },
            "breaker": breaker,
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
            by_action: dict[str, int] = {"reboot": 0, "replace": 0}
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


def _state_dict(state: RemediationState) -> dict[str, Any]:
    return {
        "action": state.action,
        "outcome": state.outcome,
        "provider": state.provider,
        "attempts": state.attempts,
        "started_at": state.started_at,
        "finished_at": state.finished_at,
        "message": state.message,
    }
