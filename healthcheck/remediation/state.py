"""Remediation state per node, kept in the node's own annotation `topowatch.io/remediation`.

The controller writes the state *before* it calls a provider and again with the outcome, so a
restarted controller reads back what it already did: it never repeats an action whose call may
have gone out, and never forgets one that did. Parsing never raises: a malformed annotation is
reported as a problem and treated as "no state", which the policy then handles conservatively.

Beside the last action the state carries the node's action ladder (one mark per rule and component:
which step was last taken and when, see healthcheck/remediation/policy.py) and since when the node
has reported healthy, so a restarted controller continues a ladder where it stood and a node's
attempt count resets after a healthy period, both from the annotation alone. A HyperPod deep health
check the controller started (the optional `deep-check` step) is recorded here too, before the API
call, with what the node's deep-health label said then, so a restarted controller goes on waiting
for that check's result and never starts a second one.

Issue 28: a ladder mark names the physical GPU it was taken for (`device`: its UUID or PCI bus
id), so a GPU renumbered after another one was lost is not mistaken for it; and the state keeps
the node's boot ID as it was when the action was decided, so a restarted controller still tells
the findings from before the reboot that followed from a new failure."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, get_args

ANNOTATION = "topowatch.io/remediation"

# In ladder order: a GPU reset, a reboot of the node (resets every GPU), a HyperPod deep health
# check (diagnosis, not a remedy: it gates the replacement above it), a replacement.
Action = Literal["reset", "reboot", "deep-check", "replace"]
# requested: written before the provider call (a crash here must not lead to a repeat);
# done: the provider accepted it; failed: the provider refused or errored;
# recovered: the node reported healthy again afterwards; gone: the node object was deleted;
# deferred: a deep check the API would not start yet (one per cluster at a time, or throttled),
# tried again later, not an attempt; checked: a deep check whose result has been read.
Outcome = Literal["requested", "done", "failed", "recovered", "gone", "deferred", "checked"]
# A deep check's verdict: "" still waiting; Passed/Failed as the node's label said; timeout: no
# result within deep_check.timeout_seconds.
Verdict = Literal["", "Passed", "Failed", "timeout"]

ACTIONS: tuple[Action, ...] = get_args(Action)
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)
ACTIVE_OUTCOMES: frozenset[str] = frozenset({"requested", "done"})
MAX_LADDER_MARKS = 64  # bounds the annotation: one mark per (rule, component) on one node


def action_rank(action: str | None) -> int:
    """0 for no action, then reset < reboot < deep-check < replace (the order a ladder climbs)."""
    for rank, known in enumerate(ACTIONS, start=1):
        if action == known:
            return rank
    return 0


@dataclass(frozen=True, slots=True)
class LadderMark:
    """The last ladder step taken for one rule on one component (e.g. xid-79 on gpu3)."""

    rule: str
    component: str
    step: int  # index into the rule's steps
    action: Action  # that step's action
    performed: Action  # what the providers did for it (a reset may be done as a reboot)
    at: float  # when the action was started
    # The physical GPU the step was taken for (its UUID, else `pci:<bus id>`), when the finding
    # named one; "" (marks written before issue 28, findings from older agents): the component
    # (a GPU index, which NVML reassigns when a GPU is lost and the node boots without it).
    device: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """What the ladder follows: the rule, and the physical device or else the component."""
        return (self.rule, self.device or self.component)


@dataclass(frozen=True, slots=True)
class DeepCheck:
    """A HyperPod deep health check this controller started on the node, and what came of it.

    Its result is read back from the node's `sagemaker.amazonaws.com/deep-health-check-status`
    label. That label keeps the last check's value (often `Passed` from the cluster's creation),
    so a `Passed`/`Failed` counts as this check's result only once the label has been seen
    `InProgress` since the request, or differs from `before`, its value when the request went out.
    """

    started_at: float
    checks: tuple[str, ...] = ()  # InstanceStress, InstanceConnectivity, as the provider asked
    before: str = ""  # the label's value when the request went out ("" absent)
    seen_in_progress: bool = False
    verdict: Verdict = ""
    verdict_at: float | None = None
    replace: bool = False  # the gate: the rule's replace step may follow (Failed, or escalated)

    @property
    def waiting(self) -> bool:
        return self.verdict == ""


@dataclass(frozen=True, slots=True)
class RemediationState:
    action: Action
    started_at: float
    provider: str
    attempts: int  # actions since the node was last healthy long enough (0 after a reset)
    outcome: Outcome
    finished_at: float | None = None
    message: str = ""
    ladder: tuple[LadderMark, ...] = ()
    healthy_since: float | None = None  # reporting healthy without a break since then
    deep_check: DeepCheck | None = None  # the last deep check started on the node
    # The node's boot ID when the action was decided (Kubernetes' status.nodeInfo.bootID; on
    # Slurm its BootTime): another one later means the node has booted since the action began,
    # so findings from before that boot describe the failure it treated, not a new one.
    boot_id: str = ""

    def deep_check_waiting(self) -> bool:
        """A deep check was asked for (or accepted) and its result is not in yet."""
        return (
            self.action == "deep-check"
            and self.outcome in ACTIVE_OUTCOMES
            and self.deep_check is not None
            and self.deep_check.waiting
        )

    def is_active(self, now: float, active_timeout_s: float) -> bool:
        """Still in remediation: accepted or in flight, and not older than the timeout."""
        return self.outcome in ACTIVE_OUTCOMES and now - self.started_at < active_timeout_s

    def finished(self, outcome: Outcome, now: float, message: str = "") -> RemediationState:
        return replace(self, outcome=outcome, finished_at=now, message=message[:500])


def state_document(state: RemediationState) -> dict[str, Any]:
    """The state as a JSON object: the annotation's content, or one node's entry in the Slurm
    controller's state file."""
    raw = asdict(state)
    raw["ladder"] = [_mark_document(m) for m in sorted(state.ladder, key=lambda m: m.key)]
    if state.deep_check is None:
        del raw["deep_check"]  # annotations without a deep check stay as they were
    else:
        raw["deep_check"]["checks"] = list(state.deep_check.checks)
    if not state.boot_id:
        del raw["boot_id"]  # nor do those written without a boot ID
    return raw


def _mark_document(mark: LadderMark) -> dict[str, Any]:
    raw = asdict(mark)
    if not mark.device:
        del raw["device"]
    return raw


def dump_state(state: RemediationState) -> str:
    return json.dumps(state_document(state), sort_keys=True, separators=(",", ":"))


def parse_state(text: str | None) -> tuple[RemediationState | None, str | None]:
    """(state, problem): (None, None) when absent, (None, why) when malformed."""
    if text is None or text == "":
        return None, None
    try:
        raw = json.loads(text)
    except ValueError as exc:
        return None, f"{ANNOTATION} is not JSON: {exc}"
    if not isinstance(raw, dict):
        return None, f"{ANNOTATION} is not a JSON object"
    try:
        return state_from_document(raw), None
    except (TypeError, ValueError) as exc:
        return None, f"{ANNOTATION} is malformed: {exc}"


def state_from_document(raw: dict[str, Any]) -> RemediationState:
    """Inverse of `state_document`; TypeError or ValueError naming the first bad field."""
    action = _action(raw.get("action"), "action")
    outcome = raw.get("outcome")
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
    started = _number(raw.get("started_at"), "started_at")
    finished_raw = raw.get("finished_at")
    finished = None if finished_raw is None else _number(finished_raw, "finished_at")
    attempts = raw.get("attempts", 1)
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 0:
        raise ValueError(f"attempts {attempts!r} is not a non-negative integer")
    provider = raw.get("provider", "")
    message = raw.get("message", "")
    if not isinstance(provider, str) or not isinstance(message, str):
        raise ValueError("provider and message must be strings")
    healthy_raw = raw.get("healthy_since")
    healthy = None if healthy_raw is None else _number(healthy_raw, "healthy_since")
    marks = raw.get("ladder", [])
    if not isinstance(marks, list) or len(marks) > MAX_LADDER_MARKS:
        raise ValueError(f"ladder is not a list of at most {MAX_LADDER_MARKS} marks")
    ladder = tuple(_mark(m, i) for i, m in enumerate(marks))
    if len({m.key for m in ladder}) != len(ladder):
        raise ValueError("ladder has two marks for one rule and component")
    deep_raw = raw.get("deep_check")
    deep = None if deep_raw is None else _deep_check(deep_raw)
    boot_id = raw.get("boot_id", "")
    if not isinstance(boot_id, str):
        raise ValueError("boot_id must be a string")
    return RemediationState(
        action,
        started,
        provider,
        attempts,
        outcome,
        finished,
        message,
        ladder,
        healthy,
        deep,
        boot_id,
    )


def _deep_check(raw: Any) -> DeepCheck:
    if not isinstance(raw, dict):
        raise ValueError("deep_check is not an object")
    checks = raw.get("checks", [])
    if not isinstance(checks, list) or not all(isinstance(c, str) for c in checks):
        raise ValueError("deep_check.checks is not a list of strings")
    before, seen, verdict = (
        raw.get("before", ""),
        raw.get("seen_in_progress", False),
        raw.get("verdict", ""),
    )
    if not isinstance(before, str) or not isinstance(seen, bool):
        raise ValueError("deep_check.before must be a string, seen_in_progress a boolean")
    if verdict not in VERDICTS:
        raise ValueError(f"deep_check.verdict {verdict!r} is not one of {VERDICTS}")
    at_raw = raw.get("verdict_at")
    gate = raw.get("replace", False)
    if not isinstance(gate, bool):
        raise ValueError("deep_check.replace must be a boolean")
    return DeepCheck(
        _number(raw.get("started_at"), "deep_check.started_at"),
        tuple(checks),
        before,
        seen,
        verdict,
        None if at_raw is None else _number(at_raw, "deep_check.verdict_at"),
        gate,
    )


def _mark(raw: Any, index: int) -> LadderMark:
    if not isinstance(raw, dict):
        raise ValueError(f"ladder[{index}] is not an object")
    rule, component, step = raw.get("rule"), raw.get("component"), raw.get("step")
    if not isinstance(rule, str) or not rule or not isinstance(component, str) or not component:
        raise ValueError(f"ladder[{index}]: rule and component must be non-empty strings")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"ladder[{index}]: step {step!r} is not a non-negative integer")
    device = raw.get("device", "")
    if not isinstance(device, str):
        raise ValueError(f"ladder[{index}]: device must be a string")
    return LadderMark(
        rule,
        component,
        step,
        _action(raw.get("action"), f"ladder[{index}].action"),
        _action(raw.get("performed"), f"ladder[{index}].performed"),
        _number(raw.get("at"), f"ladder[{index}].at"),
        device,
    )


def _action(value: Any, name: str) -> Action:
    if value not in ACTIONS:
        raise ValueError(f"{name} {value!r} is not one of {', '.join(ACTIONS)}")
    return value  # type: ignore[no-any-return]


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} {value!r} is not a finite number")
    return float(value)
