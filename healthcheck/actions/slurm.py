"""Slurm provider: asks slurmctld, through `scontrol`, to take a node out of service.

How it asks depends on who mends Slurm nodes on the cluster (`method`):
- `hyperpod` (default): `scontrol update nodename=N state=fail reason=Action:Reboot|Action:Replace`,
  the reasons HyperPod's Slurm integration acts on ("Manually replace or reboot a node", SageMaker
  HyperPod developer guide); HyperPod resumes the node when it is done.
- `drain`: `state=drain reason="topowatch: <action>: <triggers>"`: running jobs finish, nothing
  new starts, a person decides what to do.
- `reboot-asap`: reboots as `scontrol reboot ASAP nextstate=resume reason=...` (drains, reboots
  with slurm.conf's RebootProgram once the node's jobs end, resumes when slurmd registers);
  replacements drain, since outside HyperPod only a person can replace hardware.

Reasons we write start with `topowatch:` (or are HyperPod's `Action:` words), which is how the
Slurm controller tells, after a restart, what it already asked. scontrol runs with an argument
list (no shell) and a timeout, so a hung controller costs one timeout, not a thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from exporter.slurm.commands import SlurmCli, SlurmCommandError, safe_node_name
from healthcheck.actions.base import ActionRequest, ActionResult

REASON = {"reboot": "Action:Reboot", "replace": "Action:Replace"}
OUR_REASON_PREFIX = "topowatch:"
Method = Literal["hyperpod", "drain", "reboot-asap"]
METHODS: tuple[Method, ...] = ("hyperpod", "drain", "reboot-asap")


def our_reason(action: str, triggers: Sequence[str]) -> str:
    return f"{OUR_REASON_PREFIX} {action}: {', '.join(triggers) or 'requested'}"


class SlurmNodes:
    name = "slurm"
    # HyperPod's Slurm reasons know no GPU reset; a reset is done as a reboot.
    actions: frozenset[str] = frozenset({"reboot", "replace"})

    def __init__(
        self,
        scontrol: str = "scontrol",
        timeout_s: float = 15.0,
        env: Mapping[str, str] | None = None,
        name_label: str | None = None,
        method: Method = "hyperpod",
        cli: SlurmCli | None = None,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"method {method!r} is not one of {', '.join(METHODS)}")
        self.cli = cli or SlurmCli(env=env, timeout_s=timeout_s, binaries={"scontrol": scontrol})
        self.method = method
        self.name_label = name_label  # a Node label holding the Slurm node name, if not the same

    def slurm_name(self, request: ActionRequest) -> str:
        if self.name_label:
            labels = (request.node_object.get("metadata") or {}).get("labels") or {}
            value = labels.get(self.name_label)
            if isinstance(value, str) and value:
                return value
        return request.node

    def execute(self, requests: Sequence[ActionRequest]) -> list[ActionResult]:
        return [self._act(r) for r in requests]

    def _act(self, request: ActionRequest) -> ActionResult:
        name = self.slurm_name(request)
        if not safe_node_name(name):
            return ActionResult(request.node, False, f"unusable Slurm node name {name!r}")
        triggers = [str(t) for t in request.decision.get("triggers") or []]
        reason = our_reason(request.action, triggers)
        try:
            if self.method == "hyperpod":
                self.cli.update_node(name, "fail", REASON[request.action])
                said = f"state=fail reason={REASON[request.action]}"
            elif self.method == "reboot-asap" and request.action == "reboot":
                self.cli.reboot_asap(name, reason)
                said = "reboot ASAP nextstate=resume"
            else:
                self.cli.update_node(name, "drain", reason)
                said = "state=drain"
        except SlurmCommandError as exc:
            return ActionResult(request.node, False, str(exc))
        return ActionResult(request.node, True, f"slurm node {name} {said}")
