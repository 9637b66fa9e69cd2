"""One verdict per UltraServer: the NVLink domain of a p6e-gb200 UltraServer judged as a unit.

An UltraServer (Node label `topology.k8s.aws/ultraserver-id`) is up to 18 nodes whose GPUs
share one multi-node NVLink domain. A job placed on it needs the domain, not just the nodes:
every GPU of the domain registers with the same fabric (one NVLink cluster UUID, one clique),
and a node whose GPUs did not register, or registered into another clique, is cut off from its
peers' NVLink however healthy it looks alone. This module is plain data in, plain data out,
shared by the cluster service (verdicts, metrics, explain, the topology page) and remediation
(rack-level escalation); the node agent's summary of its GPUs travels in the Node annotation
`FABRIC_ANNOTATION`.

NVML semantics the judgment follows (NVML API reference, "Fabric definitions" and
`nvmlGpuFabricInfo_t` / `_v2_t` / `_v3_t`, read by exporter/sources/nvml.py; per-GPU rules in
healthcheck/detection/checks/fabric.py):
* `state` NVML_GPU_FABRIC_STATE_COMPLETED (3) says the GPU's registration probe ended; only
  then may `status` be read ("Must be checked only if state returns complete"), and only
  COMPLETED with NVML_SUCCESS is a registered GPU. NOT_STARTED / IN_PROGRESS: not (yet) in the
  domain.
* `clusterUuid` and `cliqueId`: "Uuid of the cluster to which this GPU belongs" and "ID of the
  fabric clique to which this GPU belongs". GPUs can talk over NVLink only inside one clique of
  one cluster, so a domain is *agreed* when every node reporting its fabric names the same
  (cluster UUID, clique id). A node naming another pair is cut off from the rest (a partition
  misconfigured, a tray re-cabled: NVIDIA's IMEX/ComputeDomain docs place a workload only on
  nodes of one clique).
* `healthMask` (NVML_GPU_FABRIC_HEALTH_MASK_*, v2 on): a route marked unhealthy or an incorrect
  configuration makes the GPU's registration unusable (judged by the node agent with the same
  rules as its `gpu_fabric` check); degraded bandwidth alone does not.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

# The Node annotation the node agent writes with its GPUs' fabric summary (NodeFabric JSON).
FABRIC_ANNOTATION = "topowatch.io/nvlink-fabric"

Verdict = Literal["healthy", "degraded", "failed"]
VERDICTS: tuple[Verdict, ...] = ("healthy", "degraded", "failed")
MAX_PROBLEM_CHARS = 200


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Where an UltraServer's verdict changes. One place, because the verdict, the admission
    check and remediation's escalation must agree on what "half the rack is bad" means.

    * **degraded** as soon as one node counts against the domain (unhealthy, or its fabric
      disagrees): a job sized for the whole domain no longer fits, and the admins should know,
      but smaller jobs still run on the rest of the NVLink domain.
    * **failed** when the share of bad nodes reaches `failed_share` (default 0.5), or the
      domain's fabric has no majority clique (no (cluster UUID, clique) pair is reported by
      more than half the nodes that report a fabric: there is no domain left to place a
      multi-node job in), or fewer GPUs are usable than `min_usable_gpus` (the smallest job
      that needs this UltraServer: 0 disables it). At half the rack bad the fault is most
      likely shared (a switch tray, the rack's power shelf, the fabric manager) and per-node
      repair is the wrong tool: this is the same share at which remediation escalates to one
      rack-level request (`escalate_share`; NVIDIA/NVSentinel#367 asks for exactly "escalate
      to the whole rack when half its nodes are bad").
    """

    failed_share: float = 0.5
    escalate_share: float = 0.5
    min_usable_gpus: int = 0

    def escalates(self, bad: int, total: int) -> bool:
        """At least `escalate_share` of `total` nodes bad (and at least one)."""
        return total > 0 and bad > 0 and bad >= math.ceil(self.escalate_share * total - 1e-9)


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True, slots=True)
class NodeFabric:
    """One node's GPUs' fabric registration, as its agent summarizes it for the cluster.

    `gpus`: GPUs with a fabric (state other than NOT_SUPPORTED); `registered`: of those, the
    ones COMPLETED with NVML_SUCCESS and no failing bit in the health mask. `cluster_uuid` and
    `clique_id`: the pair most of its registered GPUs report ("" / None when none registered
    or the UUID is all zero: a one-node NVSwitch fabric); `mixed`: its registered GPUs do not
    all report that pair. `problem`: the first failing GPU's reason, in words.
    """

    gpus: int
    registered: int
    cluster_uuid: str = ""
    clique_id: int | None = None
    mixed: bool = False
    problem: str = ""

    @property
    def clique(self) -> tuple[str, int | None]:
        return (self.cluster_uuid, self.clique_id)

    @property
    def complete(self) -> bool:
        return self.gpus > 0 and self.registered == self.gpus and not self.mixed

    def to_json(self) -> str:
        body: dict[str, Any] = {"gpus": self.gpus, "registered": self.registered}
        if self.cluster_uuid:
            body["clusterUuid"] = self.cluster_uuid
        if self.clique_id is not None:
            body["cliqueId"] = self.clique_id
        if self.mixed:
            body["mixed"] = True
        if self.problem:
            body["problem"] = self.problem[:MAX_PROBLEM_CHARS]
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(raw: object) -> NodeFabric:
        """Read the annotation; ValueError (with why) when it is not a NodeFabric."""
        if not isinstance(raw, str):
            raise ValueError(f"expected a string, got {type(raw).__name__}")
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"not JSON ({type(exc).__name__})") from None
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        gpus, registered = data.get("gpus"), data.get("registered")
        for key, value in (("gpus", gpus), ("registered", registered)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key}: expected a count, got {value!r}"[:120])
        assert isinstance(gpus, int) and isinstance(registered, int)
        if registered > gpus:
            raise ValueError(f"registered {registered} > gpus {gpus}")
        uuid = data.get("clusterUuid", "")
        clique = data.get("cliqueId")
        problem = data.get("problem", "")
        if not isinstance(uuid, str) or len(uuid) > 64:
            raise ValueError("clusterUuid: expected a UUID string")
        if clique is not None and (isinstance(clique, bool) or not isinstance(clique, int)):
            raise ValueError(f"cliqueId: expected an integer, got {clique!r}"[:120])
        return NodeFabric(
            gpus=gpus,
            registered=registered,
            cluster_uuid=uuid,
            clique_id=clique,
            mixed=data.get("mixed") is True,
            problem=str(problem)[:MAX_PROBLEM_CHARS] if problem else "",
        )


def summarize(gpus: Iterable[tuple[int, str, bool, str, int | None, str]]) -> NodeFabric | None:
    """A node's NodeFabric from its GPUs: (index, state, registered, cluster UUID, clique id,
    problem) each, `registered` and `problem` as the caller's per-GPU rules judge them. None
    when no GPU has a fabric (NOT_SUPPORTED everywhere: nothing to say)."""
    rows = [g for g in gpus if g[1] != "not_supported"]
    if not rows:
        return None
    ok = [g for g in rows if g[2]]
    pairs = Counter((g[3] or "", g[4]) for g in ok)
    (uuid, clique), _ = pairs.most_common(1)[0] if pairs else (("", None), 0)
    problem = next((f"GPU {g[0]}: {g[5]}" for g in rows if not g[2] and g[5]), "")
    if not problem and len(pairs) > 1:
        problem = "GPUs report different fabric cliques"
    return NodeFabric(
        gpus=len(rows),
        registered=len(ok),
        cluster_uuid=uuid,
        clique_id=clique,
        mixed=len(pairs) > 1,
        problem=problem[:MAX_PROBLEM_CHARS],
    )


@dataclass(frozen=True, slots=True)
class Member:
    """One node of an UltraServer, as the cluster sees it. `healthy`: usable for new work
    (Ready, no actionable finding, not marked by HyperPod, not in a deep health check);
    `why` says what is wrong when not. `fabric` None: its agent reported no fabric summary."""

    name: str
    gpus: int
    healthy: bool
    why: str = ""
    fabric: NodeFabric | None = None


@dataclass(frozen=True, slots=True)
class UltraServerVerdict:
    ultraserver: str
    verdict: Verdict
    reason: str  # in words: what made the verdict
    nodes_total: int
    nodes_healthy: int  # healthy and in the agreed fabric
    gpus_total: int
    gpus_usable: int  # on nodes that count for the domain
    fabric_agreed: bool | None  # None: no node reported its fabric
    clique: tuple[str, int | None] | None  # the majority (cluster UUID, clique id)
    bad: tuple[tuple[str, str], ...] = ()  # (node, why) of each node against the domain

    @property
    def bad_nodes(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.bad)

    def summary(self) -> str:
        """ "degraded, 14 of 18 nodes healthy" — what explain and the page say."""
        return f"{self.verdict}, {self.nodes_healthy} of {self.nodes_total} nodes healthy"

    def as_dict(self) -> dict[str, Any]:
        return {
            "ultraserver": self.ultraserver,
            "verdict": self.verdict,
            "reason": self.reason,
            "nodes": {"total": self.nodes_total, "healthy": self.nodes_healthy},
            "gpus": {"total": self.gpus_total, "usable": self.gpus_usable},
            "fabric_agreed": self.fabric_agreed,
            "clique": None
            if self.clique is None
            else {"cluster_uuid": self.clique[0], "clique_id": self.clique[1]},
            "bad_nodes": [{"node": n, "why": w} for n, w in self.bad],
        }


def judge(
    ultraserver: str, members: Sequence[Member], thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> UltraServerVerdict:
    """The verdict of one UltraServer from its members (see `Thresholds` for the rules)."""
    reporting = [m for m in members if m.fabric is not None and m.fabric.gpus > 0]
    pairs = Counter(m.fabric.clique for m in reporting if m.fabric and m.fabric.registered)
    clique: tuple[str, int | None] | None = None
    majority = False
    if pairs:
        clique, count = sorted(pairs.items(), key=lambda kv: (-kv[1], str(kv[0])))[0]
        majority = count * 2 > len(reporting)
    bad: list[tuple[str, str]] = []
    usable = 0
    for m in sorted(members, key=lambda m: m.name):
        why = _against(m, clique)
        if why:
            bad.append((m.name, why))
        else:
            usable += m.gpus
    total = len(members)
    healthy = total - len(bad)
    agreed: bool | None = None
    if reporting:
        agreed = majority and all(
            m.fabric is not None and m.fabric.complete and m.fabric.clique == clique
            for m in reporting
        )
    verdict: Verdict
    if total == 0:
        verdict, reason = "failed", "no nodes"
    elif reporting and not majority:
        verdict = "failed"
        reason = f"no fabric clique shared by most nodes ({len(pairs)} cliques reported)"
    elif bad and len(bad) >= math.ceil(thresholds.failed_share * total - 1e-9):
        verdict = "failed"
        reason = (
            f"{len(bad)} of {total} nodes bad (failed at {thresholds.failed_share:.0%}):"
            f" {_list(bad)}"
        )
    elif thresholds.min_usable_gpus and usable < thresholds.min_usable_gpus:
        verdict = "failed"
        reason = f"{usable} GPUs usable, fewer than the {thresholds.min_usable_gpus} needed"
    elif bad:
        verdict, reason = "degraded", f"{len(bad)} of {total} nodes bad: {_list(bad)}"
    else:
        verdict = "healthy"
        reason = f"all {total} nodes healthy" + (
            ", fabric agreed" if agreed else ", fabric not reported"
        )
    return UltraServerVerdict(
        ultraserver=ultraserver,
        verdict=verdict,
        reason=reason,
        nodes_total=total,
        nodes_healthy=healthy,
        gpus_total=sum(m.gpus for m in members),
        gpus_usable=usable,
        fabric_agreed=agreed,
        clique=clique,
        bad=tuple(bad),
    )


def _against(m: Member, clique: tuple[str, int | None] | None) -> str:
    """Why node `m` counts against its domain, "" when it does not."""
    if not m.healthy:
        return m.why or "unhealthy"
    f = m.fabric
    if f is None or f.gpus == 0:
        return ""  # no fabric reported: judged by its health alone
    if f.registered < f.gpus:
        detail = f": {f.problem}" if f.problem else ""
        return f"fabric: {f.registered} of {f.gpus} GPUs registered{detail}"
    if f.mixed:
        return "fabric: its GPUs report different cliques"
    if clique is not None and f.clique != clique:
        cluster = f.cluster_uuid or "none"
        return f"fabric: clique {f.clique_id} of cluster {cluster}, not the domain's"
    return ""


def _list(bad: Sequence[tuple[str, str]], limit: int = 3) -> str:
    shown = "; ".join(f"{n} ({w})" for n, w in bad[:limit])
    return shown + (f"; and {len(bad) - limit} more" if len(bad) > limit else "")


def judge_all(
    members: Mapping[str, Sequence[Member]], thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> dict[str, UltraServerVerdict]:
    return {us: judge(us, ms, thresholds) for us, ms in sorted(members.items())}
