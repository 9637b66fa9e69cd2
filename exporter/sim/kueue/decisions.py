"""The simulation's ground truth: every decision its Kueue and its HyperPod operator made, and
why, in the cluster service's vocabulary, so a run can be replayed and judged.

One `Decision` per scheduling decision (kind "admitted", "pending" or "preempted", one
"preempted" per victim, carrying the preemptor's cause), with the seed and the step
(`SimulatedCluster.step` calls, counted from 1; 0 is the bootstrap) that replay it. With
admission checks on (exporter/sim/kueue/checks.py) a quota reservation is kind "reserved"
(cause "admission_check", `detail` the checks pending, `domains` where it will run) and
"admitted" follows when every check is Ready; a Retry is kind "evicted" and a Rejected kind
"deactivated" (cause "admission_check", `reason` "AdmissionCheck", `message` Kueue's). Causes:

- "quota": the pod set's flavor lacks quota; `resource` and `amount` say which and how much in
  Kueue's units ("500Gi"), `detail` whether over the maximum capacity or the unused quota;
- "topology": quota fits, TAS cannot place it (tas_flavor_snapshot.go); `domains` are the
  domains of the requested `level` that came closest (for a preemption: where it will land);
- "misconfigured": no flavor of its queue matches its pods (affinity, taints, topology level).

`ScaleTruth` is one scale event of an elastic job as the simulated operator caused it:
direction, replicas from and to, cause ("capacity_freed", "preemption", "faulty_pod",
"user_change"), and its outcome. `kind` "finished" marks Workloads the operator removed
because the job completed: no scale event at all.

The log lives in memory; `write_jsonl` writes it as JSON lines.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Decision:
    seed: int
    step: int
    time: float
    # admitted | pending | preempted | reserved | evicted | deactivated | admission (a check
    # controller's verdict: `cause` the truth, Ready or Retry; `verdict` what it wrote)
    kind: str
    workload: str  # namespace/name
    uid: str
    cluster_queue: str
    cause: str = ""  # "" (admitted) | quota | topology | misconfigured
    resource: str = ""
    amount: str = ""
    flavor: str = ""
    level: str = ""
    domains: tuple[str, ...] = ()
    detail: str = ""
    message: str = ""
    preemptor: str = ""  # preempted: the preemptor's namespace/name
    preemptor_uid: str = ""
    reason: str = ""  # preempted: InClusterQueue | InCohortReclamation | ...
    verdict: str = ""  # admission: the state the check's controller wrote

    def replay(self) -> str:
        return f"--seed {self.seed} --until {self.step}"


@dataclass(slots=True)
class ScaleTruth:
    seed: int
    step: int
    time: float
    job: tuple[str, str, str]  # (namespace, kind, name), as the cluster service keys jobs
    workload: str  # the Workload that asked for it (up) or was lost (down)
    direction: str  # up | down
    from_replicas: int | None
    to_replicas: int | None
    cause: str
    kind: str = "scale"  # scale | finished (removed with the completed job: no event)
    # A scale-up: "" open, "done" (restarted at the new size; a batch Job: its pods run),
    # "ended" (admitted and Ready, then preempted or removed: issue 16's admitted-then-preempted
    # event, with a scale-down of its own), "failed" (withdrawn before admission, or lost before
    # its pods were Ready).
    outcome: str = ""
    failed: str = ""  # why it failed or ended
    admitted_at: float | None = None
    closed_step: int | None = None

    def replay(self) -> str:
        return f"--seed {self.seed} --until {self.step}"


@dataclass(slots=True)
class DecisionLog:
    seed: int = 0
    decisions: list[Decision] = field(default_factory=list)
    scale: list[ScaleTruth] = field(default_factory=list)

    def add(self, decision: Decision) -> None:
        self.decisions.append(decision)

    def add_scale(self, truth: ScaleTruth) -> ScaleTruth:
        self.scale.append(truth)
        return truth

    def since(self, index: int) -> list[Decision]:
        return self.decisions[index:]

    def write_jsonl(self, path: str | Path) -> None:
        with Path(path).open("w", encoding="utf-8") as out:
            for record in self.records():
                out.write(json.dumps(record, sort_keys=True) + "\n")

    def records(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"type": "decision", **asdict(d)} for d in self.decisions]
        out += [{"type": "scale", **asdict(s)} for s in self.scale]
        return out
