"""Slurm provider: `scontrol update nodename=X state=fail reason=Action:Replace|Action:Reboot`.

That is how HyperPod's Slurm integration is told to replace or reboot a node. scontrol runs with
an argument list (no shell) and a timeout, so a hung controller costs one timeout, not a thread.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence

from healthcheck.actions.base import ActionRequest, ActionResult

REASON = {"reboot": "Action:Reboot", "replace": "Action:Replace"}


class SlurmNodes:
    name = "slurm"
    # HyperPod's Slurm reasons know no GPU reset.
    actions: frozenset[str] = frozenset({"reboot", "replace"})

    def __init__(
        self,
        scontrol: str = "scontrol",
        timeout_s: float = 15.0,
        env: Mapping[str, str] | None = None,
        name_label: str | None = None,
    ) -> None:
        self.scontrol = scontrol
        self.timeout_s = timeout_s
        self.env = dict(env) if env is not None else None
        self.name_label = name_label  # a Node label holding the Slurm node name, if not the same

    def slurm_name(self, request: ActionRequest) -> str:
        if self.name_label:
            labels = (request.node_object.get("metadata") or {}).get("labels") or {}
            value = labels.get(self.name_label)
            if isinstance(value, str) and value:
                return value
        return request.node

    def execute(self, requests: Sequence[ActionRequest]) -> list[ActionResult]:
        return [self._fail_node(r) for r in requests]

    def _fail_node(self, request: ActionRequest) -> ActionResult:
        name = self.slurm_name(request)
        if not name or any(c in name for c in " \t\n=,"):
            return ActionResult(request.node, False, f"unusable Slurm node name {name!r}")
        argv = [
            self.scontrol,
            "update",
            f"nodename={name}",
            "state=fail",
            f"reason={REASON[request.action]}",
        ]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=self.timeout_s, env=self.env
            )
        except subprocess.TimeoutExpired:
            return ActionResult(request.node, False, f"scontrol timed out after {self.timeout_s} s")
        except OSError as exc:
            return ActionResult(request.node, False, f"cannot run {self.scontrol}: {exc}")
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[:300]
            return ActionResult(request.node, False, f"scontrol exited {done.returncode}: {said}")
        return ActionResult(
            request.node, True, f"slurm node {name} state=fail {REASON[request.action]}"
        )
