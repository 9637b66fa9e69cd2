"""What the remediation policy needs to know about one node, whatever told it (pure).

On Kubernetes it is read from the Node object (healthcheck.remediation.controller.read_node); on
Slurm from the node's state in slurmctld and its agent's health API (exporter.slurm.reports). Both
build it with `report_of`, so the same findings mean the same request either way."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from exporter.core.findings import Finding
from healthcheck.remediation.alerts import ResolvedAlert
from healthcheck.remediation.policy import strongest
from healthcheck.remediation.state import ACTIONS, Action, RemediationState


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What the controller needs from one Node object."""

    name: str
    action: Action | None  # what the checks themselves recommend (the ladder may say less)
    reasons: tuple[str, ...]
    onset: float | None
    opted_out: bool
    hyperpod_status: str
    is_gpu: bool
    state: RemediationState | None
    state_problem: str | None
    problems: tuple[str, ...]
    findings: tuple[Finding, ...] = ()  # the actionable findings that ask for an action
    deep_health: str = ""  # sagemaker.amazonaws.com/deep-health-check-status, "" when absent
    hold: tuple[str, str] = ("", "")  # (code, detail): not to be acted on now (NodeRequest.hold)
    # Which boot of the node this is: Kubernetes' status.nodeInfo.bootID, or Slurm's BootTime
    # (as text); "" when unknown. Recorded with an action, so a later one means a reboot since.
    boot_id: str = ""
    booted_at: float | None = None  # when the node booted, where that is known (Slurm's BootTime)
    # Alerts Alertmanager already resolved for this node, as the controller recorded them on it
    # (the Node's `topowatch.io/remediation-alerts` annotation): a late firing replay is ignored.
    resolved_alerts: tuple[ResolvedAlert, ...] = ()
    # The node's UltraServer (label topology.k8s.aws/ultraserver-id), "" when it is in none:
    # which nodes share one NVLink domain, for rack-level escalation (rack.py).
    ultraserver: str = ""


def report_of(
    name: str,
    findings: Sequence[Finding],
    problems: Sequence[str] = (),
    *,
    opted_out: bool = False,
    hyperpod_status: str = "",
    is_gpu: bool = False,
    state: RemediationState | None = None,
    state_problem: str | None = None,
    deep_health: str = "",
    hold: tuple[str, str] = ("", ""),
    boot_id: str = "",
    booted_at: float | None = None,
    resolved_alerts: tuple[ResolvedAlert, ...] = (),
    ultraserver: str = "",
) -> NodeReport:
    """A NodeReport from a node's findings (its annotation, or its agent's health API) and the
    facts about the node the policy needs. Only actionable findings that ask for an action
    count; the rest are the node agent's to show."""
    acting = [f for f in findings if f.actionable and f.action in ACTIONS]
    return NodeReport(
        name=name,
        action=strongest(f.action for f in acting),
        reasons=tuple(sorted({f"{f.check}@{f.component}" for f in acting})),
        onset=min((f.first_seen for f in acting), default=None),
        opted_out=opted_out,
        hyperpod_status=hyperpod_status,
        is_gpu=is_gpu,
        state=state,
        state_problem=state_problem,
        problems=tuple(problems),
        findings=tuple(acting),
        deep_health=deep_health,
        hold=hold,
        boot_id=boot_id,
        booted_at=booted_at,
        resolved_alerts=resolved_alerts,
        ultraserver=ultraserver,
    )
