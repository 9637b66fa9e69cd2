"""Remediation policy: what each failing node asks for, plus what is already happening → Decisions.

Pure: plain data in (per-node requests, per-node remediation state, cluster facts, the breaker,
the time), plain data out. Every safety rule of issue 4 lives here so it can be tested without
threads, sockets or clocks; the controller only gathers inputs and carries decisions out.

Rules, checked in this order (the first that applies wins, so the reason is the strongest one):
opt-out label → HyperPod already pending → an action in flight on the node → attempts exhausted →
cooldown → circuit breaker open → concurrent budget → hourly budget → observe mode → act.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from exporter.topology.labels import HEALTH_STATUS_KEY
from healthcheck.state import Action, RemediationState

Mode = Literal["observe", "act"]
Verdict = Literal["act", "skip"]

HYPERPOD_HEALTH = HEALTH_STATUS_KEY
HYPERPOD_PENDING = frozenset({"UnschedulablePendingReboot", "UnschedulablePendingReplacement"})
OPT_OUT_LABEL = "topowatch.io/remediation"
OPT_OUT_VALUE = "disabled"

_RANK: dict[str, int] = {"reboot": 1, "replace": 2}


def strongest(actions: Iterable[str | None]) -> Action | None:
    """replace > reboot > nothing: when checks disagree, the stronger remedy wins."""
    best: Action | None = None
    for action in actions:
        if action == "replace":
            return "replace"
        if action == "reboot":
            best = "reboot"
    return best


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    mode: Mode = "observe"
    budget_nodes: int = 2  # N: at least this many nodes may be in remediation at once
    budget_percent: float = 2.0  # P: ... or this share of the GPU nodes, whichever is larger
    budget_window_s: float = 3600.0  # the rolling window of the per-hour budget
    breaker_threshold: int = 5  # T: more than this many nodes newly failing ...
    breaker_window_s: float = 300.0  # W: ... within this many seconds trips the breaker
    cooldown_s: float = 3600.0  # after an action starts, the node is left alone this long
    active_timeout_s: float = 3 * 3600.0  # an unconfirmed action stops counting after this
    max_attempts: int = 3  # after this many actions on one node, a human decides

    def budget(self, gpu_nodes: int) -> int:
        return max(self.budget_nodes, math.floor(gpu_nodes * self.budget_percent / 100.0))

    @staticmethod
    def from_mapping(raw: Mapping[str, Any]) -> tuple[PolicyConfig, list[str]]:
        """Read the YAML `policy` settings; unknown or bad values are reported, defaults kept."""
        problems: list[str] = []
        defaults = PolicyConfig()
        values: dict[str, Any] = {}
        mode = raw.get("mode", "observe")
        if mode in ("observe", "act"):
            values["mode"] = mode
        else:
            problems.append(f"mode {mode!r} is not observe|act; staying in observe")
        budget = raw.get("budget") or {}
        breaker = raw.get("breaker") or {}
        numbers = {
            "budget_nodes": budget.get("nodes") if isinstance(budget, dict) else None,
            "budget_percent": budget.get("percent") if isinstance(budget, dict) else None,
            "budget_window_s": budget.get("window_seconds") if isinstance(budget, dict) else None,
            "breaker_threshold": breaker.get("threshold") if isinstance(breaker, dict) else None,
            "breaker_window_s": breaker.get("window_seconds")
            if isinstance(breaker, dict)
            else None,
            "cooldown_s": raw.get("cooldown_seconds"),
            "active_timeout_s": raw.get("active_timeout_seconds"),
            "max_attempts": raw.get("max_attempts"),
        }
        for name, value in numbers.items():
            if value is None:
                continue
            default = getattr(defaults, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                problems.append(f"{name}={value!r} is not a non-negative number; using {default}")
                continue
            values[name] = int(value) if isinstance(default, int) else float(value)
        return replace(defaults, **values), problems


@dataclass(frozen=True, slots=True)
class NodeRequest:
    """What one node's reports and alerts ask for, and the node facts the rules need."""

    node: str
    action: Action | None
    reasons: tuple[str, ...] = ()  # check ids / alert names behind the action
    onset: float | None = None  # when the failure began (earliest first_seen / startsAt)
    opted_out: bool = False
    hyperpod_status: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    node: str
    action: Action | None
    verdict: Verdict
    reason: str  # a stable code, used as a metric label
    detail: str  # for people: the numbers behind the reason
    mode: Mode
    at: float
    triggers: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "action": self.action,
            "verdict": self.verdict,
            "reason": self.reason,
            "detail": self.detail,
            "mode": self.mode,
            "at": self.at,
            "triggers": list(self.triggers),
        }


@dataclass(frozen=True, slots=True)
class Breaker:
    """Trips when more than T nodes start failing within W seconds; only an admin resets it."""

    tripped: bool = False
    tripped_at: float | None = None
    reason: str = ""
    onsets: tuple[tuple[float, str], ...] = field(default=())  # (onset, node) inside W

    def as_dict(self) -> dict[str, Any]:
        return {
            "tripped": self.tripped,
            "tripped_at": self.tripped_at,
            "reason": self.reason,
            "recent_failures": len(self.onsets),
        }


def record_onsets(
    breaker: Breaker, onsets: Iterable[tuple[str, float]], now: float, config: PolicyConfig
) -> Breaker:
    """Add newly failing nodes (node, onset time); trip when the window holds more than T."""
    horizon = now - config.breaker_window_s
    kept = {node: t for t, node in breaker.onsets if t >= horizon}
    for node, t in onsets:
        if t >= horizon and t <= now + config.breaker_window_s:
            kept[node] = min(t, kept.get(node, t))
    window = tuple(sorted((t, node) for node, t in kept.items()))
    if breaker.tripped or len(window) <= config.breaker_threshold:
        return replace(breaker, onsets=window)
    reason = (
        f"{len(window)} nodes started failing within {config.breaker_window_s:g} s"
        f" (threshold {config.breaker_threshold}): likely a shared cause"
    )
    return Breaker(tripped=True, tripped_at=now, reason=reason, onsets=window)


def reset_breaker(breaker: Breaker) -> Breaker:
    """An admin's reset: close the breaker and forget the failures that tripped it."""
    return Breaker()


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    gpu_nodes: int
    pending_elsewhere: frozenset[str] = frozenset()  # nodes HyperPod already has pending


def decide(
    requests: Sequence[NodeRequest],
    states: Mapping[str, RemediationState],
    facts: ClusterFacts,
    breaker: Breaker,
    config: PolicyConfig,
    now: float,
) -> list[Decision]:
    """One decision per request with an action, in order; earlier acts consume the budget."""
    limit = config.budget(facts.gpu_nodes)
    active = {n for n, s in states.items() if s.is_active(now, config.active_timeout_s)}
    active |= facts.pending_elsewhere
    hour_start = now - config.budget_window_s
    started = {n for n, s in states.items() if s.started_at > hour_start}
    decisions: list[Decision] = []
    for request in requests:
        if request.action is None:
            continue

        def make(verdict: Verdict, reason: str, detail: str, r: NodeRequest = request) -> Decision:
            return Decision(r.node, r.action, verdict, reason, detail, config.mode, now, r.reasons)

        state = states.get(request.node)
        if request.opted_out:
            decisions.append(make("skip", "opted_out", f"label {OPT_OUT_LABEL}={OPT_OUT_VALUE}"))
        elif request.hyperpod_status in HYPERPOD_PENDING:
            decisions.append(
                make("skip", "already_pending", f"{HYPERPOD_HEALTH}={request.hyperpod_status}")
            )
        elif state is not None and state.is_active(now, config.active_timeout_s):
            decisions.append(
                make(
                    "skip",
                    "in_progress",
                    f"{state.action} via {state.provider} {state.outcome}"
                    f" since {now - state.started_at:.0f} s",
                )
            )
        elif state is not None and state.attempts >= config.max_attempts:
            decisions.append(
                make(
                    "skip",
                    "attempts_exhausted",
                    f"{state.attempts} actions already; a person must look at this node",
                )
            )
        elif state is not None and now - state.started_at < config.cooldown_s:
            left = config.cooldown_s - (now - state.started_at)
            decisions.append(make("skip", "cooldown", f"{left:.0f} s of cooldown left"))
        elif breaker.tripped:
            decisions.append(make("skip", "breaker_open", breaker.reason))
        elif len(active) >= limit:
            decisions.append(
                make("skip", "budget_concurrent", f"{len(active)} of {limit} nodes in remediation")
            )
        elif len(started) >= limit:
            decisions.append(
                make(
                    "skip",
                    "budget_hourly",
                    f"{len(started)} of {limit} actions in the last {config.budget_window_s:g} s",
                )
            )
        else:
            # Observe mode spends the budget within one round too, so it shows what act would do.
            active.add(request.node)
            started.add(request.node)
            if config.mode == "observe":
                decisions.append(
                    make("skip", "observe", f"would {request.action}; mode is observe")
                )
            else:
                triggers = ", ".join(request.reasons) or "requested"
                decisions.append(make("act", "act", f"{request.action}: {triggers}"))
    return decisions
