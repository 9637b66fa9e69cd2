"""Remediation state per node, kept in the node's own annotation `topowatch.io/remediation`.

The controller writes the state *before* it calls a provider and again with the outcome, so a
restarted controller reads back what it already did: it never repeats an action whose call may
have gone out, and never forgets one that did. Parsing never raises: a malformed annotation is
reported as a problem and treated as "no state", which the policy then handles conservatively.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, get_args

ANNOTATION = "topowatch.io/remediation"

Action = Literal["reboot", "replace"]
# requested: written before the provider call (a crash here must not lead to a repeat);
# done: the provider accepted it; failed: the provider refused or errored;
# recovered: the node reported healthy again afterwards; gone: the node object was deleted.
Outcome = Literal["requested", "done", "failed", "recovered", "gone"]

ACTIONS: tuple[Action, ...] = get_args(Action)
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
ACTIVE_OUTCOMES: frozenset[str] = frozenset({"requested", "done"})


@dataclass(frozen=True, slots=True)
class RemediationState:
    action: Action
    started_at: float
    provider: str
    attempts: int
    outcome: Outcome
    finished_at: float | None = None
    message: str = ""

    def is_active(self, now: float, active_timeout_s: float) -> bool:
        """Still in remediation: accepted or in flight, and not older than the timeout."""
        return self.outcome in ACTIVE_OUTCOMES and now - self.started_at < active_timeout_s

    def finished(self, outcome: Outcome, now: float, message: str = "") -> RemediationState:
        return replace(self, outcome=outcome, finished_at=now, message=message[:500])


def dump_state(state: RemediationState) -> str:
    return json.dumps(asdict(state), sort_keys=True, separators=(",", ":"))


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
        return _from_mapping(raw), None
    except (TypeError, ValueError) as exc:
        return None, f"{ANNOTATION} is malformed: {exc}"


def _from_mapping(raw: dict[str, Any]) -> RemediationState:
    action = raw.get("action")
    if action not in ACTIONS:
        raise ValueError(f"action {action!r} is not one of {', '.join(ACTIONS)}")
    outcome = raw.get("outcome")
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
    started = _number(raw.get("started_at"), "started_at")
    finished_raw = raw.get("finished_at")
    finished = None if finished_raw is None else _number(finished_raw, "finished_at")
    attempts = raw.get("attempts", 1)
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        raise ValueError(f"attempts {attempts!r} is not a positive integer")
    provider = raw.get("provider", "")
    message = raw.get("message", "")
    if not isinstance(provider, str) or not isinstance(message, str):
        raise ValueError("provider and message must be strings")
    return RemediationState(action, started, provider, attempts, outcome, finished, message)


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} {value!r} is not a finite number")
    return float(value)
