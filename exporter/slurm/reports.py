"""A Slurm node and its agent's answer, as the remediation policy sees a node (pure).

The policy (healthcheck/remediation/policy.py) is the same as on Kubernetes; what differs is where
the facts come from:
- findings: the agent's `/api/v1/health` (the same list the Kubernetes annotation carries);
- what was already asked: the node's Reason in slurmctld, which is the source of truth. HyperPod
  acts on `Action:Reboot` / `Action:Replace` with the node in FAIL; our own drains and ASAP
  reboots carry a `topowatch:` reason. Either, with the node out of service, means "asked and
  not finished", the way HyperPod's `UnschedulablePendingReboot|Replacement` label does on EKS:
  no second request, and the node counts against the budget;
- nodes out of service for anyone else's reason (DOWN, DRAIN, FAIL, not responding) are never
  touched: they are held, with the state and reason in the audit;
- an agent that did not answer cleanly holds its node (no action on doubt); its last good
  findings stay on view so the status page still shows what the node asked for;
- the node's BootTime (slurmd's, in the node list) tells findings from before a reboot that
  followed an action from new ones (policy.climb).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.core.findings import Finding
from exporter.slurm.poller import AgentReading
from exporter.sources.slurm.nodes import SlurmNode
from healthcheck.remediation.node_report import NodeReport, report_of
from healthcheck.remediation.providers.slurm import OUR_REASON_PREFIX, REASON
from healthcheck.remediation.state import RemediationState

PENDING_REBOOT = "UnschedulablePendingReboot"
PENDING_REPLACEMENT = "UnschedulablePendingReplacement"
OPT_OUT_FEATURE = "topowatch_remediation_disabled"


@dataclass(frozen=True, slots=True)
class Facts:
    """What one cycle knows beyond the node itself."""

    opt_out_feature: str = OPT_OUT_FEATURE
    excluded: frozenset[str] = frozenset()  # node names from the config's exclude list
    count_all_as_gpu: bool = False  # no node declares a gpu gres: every node counts for budget
    state_problem: str | None = None  # the state file cannot be trusted: act on nothing
    slurmctld_problem: str = ""  # this cycle's node list could not be read


def asked_by_reason(node: SlurmNode) -> str:
    """The pending status the node's Reason shows ("" when it shows nothing asked)."""
    if not node.out_of_service:
        return ""
    reason = node.reason.strip()
    if reason.startswith(REASON["replace"]) or reason.startswith(f"{OUR_REASON_PREFIX} replace"):
        return PENDING_REPLACEMENT
    if reason.startswith(REASON["reboot"]) or reason.startswith(OUR_REASON_PREFIX):
        return PENDING_REBOOT
    return ""


def worth_polling(node: SlurmNode) -> bool:
    """Every node whose host may answer: drained and failed nodes too (what their agents say is
    audited, though they are never touched), but not DOWN or NOT_RESPONDING ones, whose agents
    are most likely down with them (a timeout each would slow every cycle), unless it is our (or
    HyperPod's) action that took them down: their agents say when they are healthy again."""
    unreachable = node.state == "down" or "NOT_RESPONDING" in node.flags
    return not unreachable or bool(asked_by_reason(node))


def node_object(node: SlurmNode) -> dict[str, Any]:
    """What providers and the status page get as the node: its name and Slurm facts."""
    return {
        "metadata": {"name": node.name, "labels": {}},
        "slurm": {
            "address": node.address,
            "state": node.describe(),
            "partitions": list(node.partitions),
        },
    }


def report(
    node: SlurmNode,
    reading: AgentReading | None,
    last_good: tuple[Finding, ...],
    state: RemediationState | None,
    facts: Facts,
) -> NodeReport:
    """The policy's view of one node this cycle."""
    findings = reading.findings if reading is not None and reading.ok else last_good
    problems = reading.problems if reading is not None else ()
    return report_of(
        node.name,
        findings,
        problems,
        opted_out=False,  # Slurm has no opt-out label; the feature and list are holds below
        hyperpod_status=asked_by_reason(node),
        is_gpu=node.gpus > 0 or facts.count_all_as_gpu,
        state=state,
        state_problem=facts.state_problem,
        hold=_hold(node, reading, facts),
        # slurmd's BootTime: findings first seen before a boot that followed the node's last
        # action are from before it, not the fault returning (policy.climb).
        booted_at=node.boot_time,
    )


def _hold(node: SlurmNode, reading: AgentReading | None, facts: Facts) -> tuple[str, str]:
    if facts.slurmctld_problem:
        return ("slurmctld_unreachable", facts.slurmctld_problem)
    if facts.opt_out_feature and facts.opt_out_feature in node.features:
        return ("opted_out", f"node feature {facts.opt_out_feature}")
    if node.name in facts.excluded:
        return ("opted_out", "listed in the controller's exclude_nodes")
    if node.out_of_service and not asked_by_reason(node):
        who = f" by {node.reason_set_by}" if node.reason_set_by else ""
        return ("unavailable", f"slurm: {node.describe()}{who}; not ours to touch")
    if reading is None:
        return ("agent_not_polled", "no answer from its agent yet")
    if not reading.ok:
        return (f"agent_{reading.outcome}", reading.detail)
    return ("", "")


@dataclass(frozen=True, slots=True)
class Resumption:
    """What to do about an action a crashed controller had recorded as `requested`."""

    node: str
    verdict: str  # confirmed | resume | gone
    detail: str


def reconcile(
    states: Mapping[str, RemediationState], nodes: Mapping[str, SlurmNode]
) -> list[Resumption]:
    """After a restart: for each action recorded `requested` (decided, maybe not carried out),
    slurmctld says whether it ran. Confirmed when the node's Reason shows it, or the node booted
    after the decision (the action ran and HyperPod has finished it since); otherwise
    it is carried out now, once. Neither repeated nor forgotten. (A finished reboot or
    replacement clears the Reason; the new boot time tells that one apart.)"""
    out: list[Resumption] = []
    for name, state in sorted(states.items()):
        if state.outcome != "requested":
            continue
        node = nodes.get(name)
        if node is None:
            out.append(Resumption(name, "gone", "node no longer in slurmctld"))
        elif asked_by_reason(node):
            out.append(Resumption(name, "confirmed", f"slurmctld shows {node.describe()}"))
        elif node.boot_time is not None and node.boot_time >= int(state.started_at):
            detail = f"node booted after the decision; now {node.describe()}"
            out.append(Resumption(name, "confirmed", detail))
        else:
            out.append(Resumption(name, "resume", f"slurmctld shows {node.describe()}"))
    return out
