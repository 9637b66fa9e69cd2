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

Right before writing, the nodes are read again from slurmctld (one node-list call per batch):
the decision rests on a node list read up to a cycle earlier, and `scontrol update state=...
reason=...` replaces a node's state and Reason (scontrol(1), "Reason": "the reason ... will
replace any previous reason"), so an admin's drain made in between would be overwritten. A node
found out of service by then is left as it is: deferred (not an attempt), with what slurmctld
shows and who set it in the audit; one that already shows our own request counts as asked.
Slurm has no conditional update, so this narrows the window to milliseconds; it cannot close it.
A node the list does not name is left to scontrol to refuse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from exporter.sources.slurm.commands import SlurmCli, SlurmCommandError, safe_node_name
from exporter.sources.slurm.nodes import SlurmNode, parse_nodes
from healthcheck.remediation.providers.base import ActionRequest, ActionResult

REASON = {"reboot": "Action:Reboot", "replace": "Action:Replace"}
OUR_REASON_PREFIX = "topowatch:"
Method = Literal["hyperpod", "drain", "reboot-asap"]
METHODS: tuple[Method, ...] = ("hyperpod", "drain", "reboot-asap")


def our_reason(action: str, triggers: Sequence[str]) -> str:
    return f"{OUR_REASON_PREFIX} {action}: {', '.join(triggers) or 'requested'}"


def _asked(node: SlurmNode, action: str) -> bool:
    """Out of service with this very request's Reason (HyperPod's word for the action, or ours):
    asked already (a call that timed out after slurmctld took it, or another controller)."""
    reason = node.reason.strip()
    hyperpod = REASON.get(action)
    return (hyperpod is not None and reason.startswith(hyperpod)) or reason.startswith(
        f"{OUR_REASON_PREFIX} {action}"
    )


def _taken(node: SlurmNode) -> str:
    who = f" (reason set by {node.reason_set_by})" if node.reason_set_by else ""
    return (
        f"not written: slurmctld now shows {node.describe()}{who}, out of service since the"
        " node list the decision rests on was read; scontrol would replace its state and"
        " reason, so they are left as they are"
    )


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
        """One scontrol call per distinct (command, state, reason): with the hyperpod method that
        is one call per action however many nodes turned bad in the round (each call takes
        slurmctld's node lock; one at a time, 40 nodes cost seconds on a 2,000-node cluster).
        A failed call is retried node by node, so one bad name fails only its own node (the
        same update twice is harmless: the same state and reason)."""
        results: list[ActionResult] = []
        groups: dict[tuple[str, str, str, str], list[tuple[ActionRequest, str]]] = {}
        named: list[tuple[ActionRequest, str]] = []
        for request in requests:
            name = self.slurm_name(request)
            if not safe_node_name(name):
                results.append(
                    ActionResult(request.node, False, f"unusable Slurm node name {name!r}")
                )
                continue
            named.append((request, name))
        writable, held = self._recheck(named)
        results += held
        for request, name in writable:
            groups.setdefault(self._plan(request), []).append((request, name))
        for plan, members in groups.items():
            try:
                self._call(plan, [name for _, name in members])
            except SlurmCommandError as exc:
                if len(members) > 1:
                    results += self._one_by_one(plan, members)
                    continue
                results.append(ActionResult(members[0][0].node, False, str(exc)))
                continue
            results += [ActionResult(r.node, True, f"slurm node {n} {plan[3]}") for r, n in members]
        return results

    def _recheck(
        self, named: list[tuple[ActionRequest, str]]
    ) -> tuple[list[tuple[ActionRequest, str]], list[ActionResult]]:
        """(still writable, results for the rest): the nodes as slurmctld shows them now."""
        if not named:
            return [], []
        try:
            nodes, problems = parse_nodes(self.cli.nodes_json())
        except SlurmCommandError as exc:
            why = f"not written: cannot read the node from slurmctld first: {exc}"
            return [], [ActionResult(r.node, False, why) for r, _ in named]
        if not nodes and problems:
            why = f"not written: cannot read the node from slurmctld first: {problems[0]}"
            return [], [ActionResult(r.node, False, why) for r, _ in named]
        now = {n.name: n for n in nodes}
        writable: list[tuple[ActionRequest, str]] = []
        held: list[ActionResult] = []
        for request, name in named:
            node = now.get(name)
            if node is None or not node.out_of_service:
                writable.append((request, name))
            elif _asked(node, request.action):
                held.append(
                    ActionResult(request.node, True, f"slurmctld already shows {node.describe()}")
                )
            else:
                held.append(ActionResult(request.node, False, _taken(node), deferred=True))
        return writable, held

    def _one_by_one(
        self, plan: tuple[str, str, str, str], members: Sequence[tuple[ActionRequest, str]]
    ) -> list[ActionResult]:
        results: list[ActionResult] = []
        for request, name in members:
            try:
                self._call(plan, [name])
            except SlurmCommandError as exc:
                results.append(ActionResult(request.node, False, str(exc)))
            else:
                results.append(ActionResult(request.node, True, f"slurm node {name} {plan[3]}"))
        return results

    def _plan(self, request: ActionRequest) -> tuple[str, str, str, str]:
        """(command, state, reason, what to say) for one request."""
        triggers = [str(t) for t in request.decision.get("triggers") or []]
        if self.method == "hyperpod":
            reason = REASON[request.action]
            return ("update", "fail", reason, f"state=fail reason={reason}")
        reason = our_reason(request.action, triggers)
        if self.method == "reboot-asap" and request.action == "reboot":
            return ("reboot", "", reason, "reboot ASAP nextstate=resume")
        return ("update", "drain", reason, "state=drain")

    def _call(self, plan: tuple[str, str, str, str], names: list[str]) -> None:
        command, state, reason, _ = plan
        if command == "reboot":
            self.cli.reboot_asap(names, reason)
        else:
            self.cli.update_nodes(names, state, reason)
