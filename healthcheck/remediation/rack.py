"""Rack-level escalation: when half an UltraServer is bad, one request for the rack, never 18.

The nodes of a p6e-gb200 UltraServer share one NVLink domain (switch trays, the rack's power
and cooling, one fabric). When at least `escalate_share` of its nodes (default 50 %,
exporter/core/ultraserver.py `Thresholds`, the same share at which its verdict turns failed)
ask for remediation at once, the cause is most likely shared, and rebooting or replacing them
one by one would spend the budget on symptoms while the rack stays broken (NVIDIA/NVSentinel#367
asks for exactly this: escalate to the whole rack when half its nodes are bad). So their node
requests are folded into one `RackRequest`, decided by `decide_racks` and carried out by a
provider that takes racks (the webhook: `providers.webhook.rack_payload`).

Pure, like policy.py: plain data in (the node requests, which nodes form which UltraServer,
per-node states, the breaker), plain data out. It never imports exporter.cluster: the caller
passes the UltraServer membership (node label `topology.k8s.aws/ultraserver-id`) in.

How the safety rules count a rack (the issue: "budget and breaker count it as the rack's
nodes"):
* **Budget**: taking a rack down takes every node of it out of service, so a rack request
  needs room for all its member nodes, in the concurrent budget (members not already in
  remediation) and the hourly one. A rack larger than the budget is refused with
  `budget_concurrent` and the numbers: an admin raises the budget or acts by hand.
* **Breaker**: a rack request is refused while the breaker is open, like any request. The bad
  nodes' onsets count in the breaker's window, each a node as before (`rack_onsets`), but are
  recorded *after* the rack is decided: the failures one rack request answers must not trip
  the breaker against that very request, while anything failing on top of them within the
  window does.
* Opt-out: a rack with an opted-out member is not acted on (the action would reach that node).
* In progress: a rack with a member already in remediation is not asked again.
* Cooldown and attempts: as for a node, a rack with a member acted on within the cooldown (a
  failed rack request included) or out of attempts is not asked (again).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from exporter.core.ultraserver import DEFAULT_THRESHOLDS, Thresholds
from healthcheck.remediation.policy import (
    HYPERPOD_PENDING,
    OPT_OUT_LABEL,
    OPT_OUT_VALUE,
    Breaker,
    ClusterFacts,
    Mode,
    NodeRequest,
    PolicyConfig,
    Verdict,
    busy,
    strongest,
)
from healthcheck.remediation.state import Action, RemediationState

# What a rack is asked: only remedies a rack can take. A GPU reset or a deep check of half a
# rack is no rack-level remedy; their rack is rebooted.
_RACK_ACTIONS: frozenset[str] = frozenset({"reboot", "replace"})


@dataclass(frozen=True, slots=True)
class RackConfig:
    """YAML `ultraserver:` {escalate_share}: the share of an UltraServer's nodes that must be
    bad for one rack request (default: the verdict thresholds' `escalate_share`, 0.5)."""

    escalate_share: float = DEFAULT_THRESHOLDS.escalate_share

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(escalate_share=self.escalate_share)

    @staticmethod
    def from_mapping(raw: Mapping[str, Any] | None) -> tuple[RackConfig, list[str]]:
        problems: list[str] = []
        share = (raw or {}).get("escalate_share")
        if share is None:
            return RackConfig(), problems
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            problems.append(
                f"ultraserver.escalate_share={share!r} is not in (0, 1]; using"
                f" {DEFAULT_THRESHOLDS.escalate_share}"
            )
            return RackConfig(), problems
        return RackConfig(float(share)), problems


@dataclass(frozen=True, slots=True)
class RackRequest:
    rack: str  # the UltraServer id
    action: Action
    members: tuple[str, ...]  # every node of the UltraServer, sorted
    bad: tuple[str, ...]  # the members whose requests were folded in (or HyperPod has pending)
    reasons: tuple[str, ...] = ()
    onsets: tuple[tuple[str, float], ...] = ()  # (node, onset) of the bad nodes
    opted_out: tuple[str, ...] = ()  # members carrying the opt-out label

    @property
    def share(self) -> float:
        return len(self.bad) / len(self.members) if self.members else 0.0


@dataclass(frozen=True, slots=True)
class RackDecision:
    rack: str
    action: Action
    verdict: Verdict
    reason: str  # a stable code, as Decision's
    detail: str
    mode: Mode
    at: float
    members: tuple[str, ...]
    bad: tuple[str, ...]
    triggers: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "scope": "ultraserver",
            "ultraserver": self.rack,
            "action": self.action,
            "verdict": self.verdict,
            "reason": self.reason,
            "detail": self.detail,
            "mode": self.mode,
            "at": self.at,
            "nodes": list(self.members),
            "bad_nodes": list(self.bad),
            "triggers": list(self.triggers),
        }


def escalate(
    requests: Sequence[NodeRequest],
    racks: Mapping[str, Iterable[str]],
    config: RackConfig = RackConfig(),
    opted_out: Iterable[str] = (),
) -> tuple[list[NodeRequest], list[RackRequest]]:
    """Fold the requests of each UltraServer with at least `escalate_share` of its nodes bad
    into one RackRequest; the other requests pass through unchanged, in order.

    `racks`: UltraServer id -> all its nodes (healthy ones included: the share is of the
    whole rack). A node is bad when it asks for an action or HyperPod already has it pending.
    `opted_out`: nodes carrying the opt-out label that sent no request (the requests say it
    themselves)."""
    rack_of = {node: rack for rack, nodes in racks.items() for node in nodes}
    members = {rack: tuple(sorted(set(nodes))) for rack, nodes in racks.items()}
    by_rack: dict[str, list[NodeRequest]] = {}
    for r in requests:
        rack = rack_of.get(r.node)
        if rack and (r.action is not None or r.hyperpod_status in HYPERPOD_PENDING):
            by_rack.setdefault(rack, []).append(r)
    thresholds = config.thresholds
    escalated: list[RackRequest] = []
    folded: set[str] = set()
    quiet_opted = set(opted_out)
    for rack in sorted(by_rack):
        bad = by_rack[rack]
        if not thresholds.escalates(len(bad), len(members[rack])):
            continue
        wanted = strongest(r.action for r in bad)
        action: Action = wanted if wanted in _RACK_ACTIONS and wanted is not None else "reboot"
        reasons = sorted({reason for r in bad for reason in r.reasons})
        onsets = tuple(sorted((r.node, r.onset) for r in bad if r.onset is not None))
        opted = {r.node for r in requests if r.opted_out and rack_of.get(r.node) == rack}
        opted |= {n for n in members[rack] if n in quiet_opted}
        escalated.append(
            RackRequest(
                rack=rack,
                action=action,
                members=members[rack],
                bad=tuple(sorted(r.node for r in bad)),
                reasons=tuple(reasons),
                onsets=onsets,
                opted_out=tuple(sorted(opted)),
            )
        )
        folded |= {r.node for r in bad}
    return [r for r in requests if r.node not in folded], escalated


def rack_onsets(racks: Iterable[RackRequest]) -> list[tuple[str, float]]:
    """The bad nodes' onsets of decided racks, for `record_onsets` after `decide_racks`."""
    return [onset for rack in racks for onset in rack.onsets]


def decide_racks(
    racks: Sequence[RackRequest],
    states: Mapping[str, RemediationState],
    facts: ClusterFacts,
    breaker: Breaker,
    config: PolicyConfig,
    now: float,
) -> list[RackDecision]:
    """One decision per rack request, in order; each act takes budget for all its members."""
    limit = config.budget(facts.gpu_nodes)
    active = {n for n, s in states.items() if busy(s, now, config)} | set(facts.pending_elsewhere)
    hour_start = now - config.budget_window_s
    started = {
        n for n, s in states.items() if s.started_at > hour_start and s.outcome != "deferred"
    } | set(facts.started_elsewhere)
    decisions: list[RackDecision] = []
    for rack in racks:
        nodes = set(rack.members)
        share = f"{len(rack.bad)} of {len(rack.members)} nodes bad ({rack.share:.0%})"

        def make(verdict: Verdict, reason: str, detail: str, r: RackRequest = rack) -> RackDecision:
            return RackDecision(
                r.rack, r.action, verdict, reason, detail, config.mode, now, r.members, r.bad,
                r.reasons,
            )  # fmt: skip

        in_flight = sorted(n for n in rack.members if n in states and busy(states[n], now, config))
        # As for a node: a member acted on within the cooldown (a failed rack request too) or
        # out of attempts holds the rack, so a failing rack is not asked again every round.
        cooling = sorted(
            n
            for n in rack.members
            if n in states
            and now - states[n].started_at < config.cooldown_s
            and states[n].outcome != "deferred"
        )
        exhausted = sorted(
            n for n in rack.members if n in states and states[n].attempts >= config.max_attempts
        )
        if rack.opted_out:
            decisions.append(
                make(
                    "skip",
                    "opted_out",
                    f"{', '.join(rack.opted_out)} carry {OPT_OUT_LABEL}={OPT_OUT_VALUE}",
                )
            )
        elif in_flight:
            decisions.append(
                make(
                    "skip",
                    "in_progress",
                    f"{len(in_flight)} of its nodes already in remediation ({in_flight[0]}...)",
                )
            )
        elif exhausted:
            decisions.append(
                make(
                    "skip",
                    "attempts_exhausted",
                    f"{', '.join(exhausted)} had {config.max_attempts} actions already;"
                    " a person must look at this rack",
                )
            )
        elif cooling:
            left = config.cooldown_s - (now - max(states[n].started_at for n in cooling))
            decisions.append(
                make(
                    "skip",
                    "cooldown",
                    f"{len(cooling)} of its nodes acted on recently ({cooling[0]}...);"
                    f" {left:.0f} s of cooldown left",
                )
            )
        elif breaker.tripped:
            decisions.append(make("skip", "breaker_open", breaker.reason))
        elif len(active | nodes) > limit:
            decisions.append(
                make(
                    "skip",
                    "budget_concurrent",
                    f"{share}; the rack's {len(nodes)} nodes would make {len(active | nodes)}"
                    f" of {limit} nodes in remediation",
                )
            )
        elif len(started | nodes) > limit:
            decisions.append(
                make(
                    "skip",
                    "budget_hourly",
                    f"{share}; the rack's {len(nodes)} nodes would make {len(started | nodes)}"
                    f" of {limit} actions in the last {config.budget_window_s:g} s",
                )
            )
        else:
            active |= nodes
            started |= nodes
            if config.mode == "observe":
                decisions.append(make("skip", "observe", f"would {rack.action} the rack: {share}"))
            else:
                decisions.append(make("act", "act", f"{rack.action} the rack: {share}"))
    return decisions


def facts_after(facts: ClusterFacts, decisions: Iterable[RackDecision]) -> ClusterFacts:
    """`facts` with the members of each rack decided to act (or that would, in observe mode)
    counted in remediation and started: what `policy.decide` must see for the node requests
    decided after the racks, so the budget a rack took is not spent twice."""
    taken = frozenset(
        n for d in decisions if d.verdict == "act" or d.reason == "observe" for n in d.members
    )
    return replace(
        facts,
        pending_elsewhere=facts.pending_elsewhere | taken,
        started_elsewhere=facts.started_elsewhere | taken,
    )
