"""The oracle's cluster: what `SimulatedCluster(..., fidelity=Fidelity())` adds to the default
simulation so that every judgment topowatch makes is exercised where real HyperPod clusters
live (the default simulation, the demo's, stays GPU-only and untainted):

- fine-grained quota (HyperPod task governance's compute and memory quota): each
  ClusterQueue's resource group covers nvidia.com/gpu, cpu, memory and pods, with nominal,
  borrowing and lending limits per flavor; pods request cpu and memory with their GPUs, some
  far more memory than GPUs would suggest, some no GPU at all;
- a tainted pool: the GB200 nodes carry nvidia.com/gpu=present:NoSchedule (the EKS GPU node
  group default) and their ResourceFlavor lists it in nodeTaints; pods that mean to run there
  tolerate it, a few do not;
- mixed flavors: every queue lists ml.p5.48xlarge then ml.p6e-gb200.36xlarge in one resource
  group, and some jobs name no instance type, so Kueue's flavor assignment picks;
- several pod sets: a launcher (cpu only) beside the GPU workers;
- hierarchical cohorts: some teams sit under a child Cohort with a lending limit of its own.

Each rule these exercise is Kueue's (see scheduler.py for the citations).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from exporter.sim import hyperpod_layout as layout
from exporter.sim.hyperpod_layout import ClusterShape, JobTemplate, SimNode
from exporter.sim.kueue.objects import SimPodSet, node_allocatable
from exporter.sim.kueue.resources import CPU, GI, GPU, MEMORY, PODS, Taint, Toleration
from exporter.sim.kueue.scheduler import (
    CohortSpec,
    FlavorQuotas,
    FlavorSpec,
    Mode,
    QueuePolicy,
    Quota,
    ResourceGroup,
)

GPU_TAINT = Taint(GPU, "present", "NoSchedule")
GPU_TOLERATION = Toleration(GPU, "Exists", "", "NoSchedule")
COVERED = (GPU, CPU, MEMORY, PODS)


@dataclass(frozen=True, slots=True)
class Fidelity:
    resources: bool = True  # cpu, memory and pods quota and requests
    taint_gb200: bool = True
    mixed_flavors: bool = True  # jobs that name no instance type
    pod_sets: bool = True
    org_teams: tuple[str, ...] = ("research", "audio")  # under a child cohort
    org_cohort: str = "hyperpod-research-org"
    org_lending_gpus: int = 16  # what the child cohort lends its parent of each flavor
    memory_share: float = 0.85  # of the GPU-proportional memory each team gets
    cpu_share: float = 1.25
    pods_per_gpu_share: float = 0.25  # pods quota: this many per nominal GPU
    misfits: bool = True  # a few jobs whose pods tolerate no taint of the flavor they select


@dataclass(frozen=True, slots=True)
class RichTemplate(JobTemplate):
    """A job kind with per-pod cpu and memory, tolerations and flavor choice."""

    cpu_per_gpu: int = 20_000  # millicores
    memory_per_gpu: int = 200 * GI
    cpu_per_pod: int | None = None  # replaces the per-GPU figure
    memory_per_pod: tuple[int, ...] = ()  # choices replacing the per-GPU figure
    tolerate: float = 1.0  # share of jobs whose pods tolerate the GPU taint
    any_flavor: bool = False  # the pods name no instance type
    launcher: bool = False  # a launcher pod set (cpu only) before the workers


def flavors(fidelity: Fidelity, base: Mapping[str, FlavorSpec]) -> dict[str, FlavorSpec]:
    out = dict(base)
    if fidelity.taint_gb200 and layout.GB200 in out:
        spec = out[layout.GB200]
        out[layout.GB200] = FlavorSpec(
            spec.name, spec.topology, spec.levels, spec.node_labels, (GPU_TAINT,), ()
        )
    return out


def node_taints(fidelity: Fidelity | None, instance_type: str) -> tuple[Taint, ...]:
    if fidelity is not None and fidelity.taint_gb200 and instance_type == layout.GB200:
        return (GPU_TAINT,)
    return ()


def cohort_of(fidelity: Fidelity, team: str) -> str:
    return fidelity.org_cohort if team in fidelity.org_teams else layout.COHORT


def policies(
    fidelity: Fidelity, shape: ClusterShape, nodes: Sequence[SimNode]
) -> tuple[dict[str, QueuePolicy], dict[str, CohortSpec]]:
    """Every team's ClusterQueue (one resource group, all flavors, every resource) and the
    cohort tree."""
    weights = layout.team_weights(shape.teams)
    total_weight = sum(weights.values())
    present = layout.flavors_in(list(nodes))
    per_team: dict[str, list[FlavorQuotas]] = {team: [] for team in shape.teams}
    for flavor in present:
        unit = layout.GPUS[flavor]
        members = [n for n in nodes if n.instance_type == flavor]
        capacity = sum(n.gpus for n in members)
        alloc = node_allocatable(flavor, unit)
        shares = {t: capacity * w // total_weight // unit * unit for t, w in weights.items()}
        shares[shape.teams[0]] += capacity - sum(shares.values())
        for team, gpus in shares.items():
            lend = gpus // 2 // unit * unit
            quotas = {GPU: Quota(gpus, borrowing_limit=gpus, lending_limit=lend)}
            if fidelity.resources:
                node_share = gpus / unit
                cpu = int(alloc.get(CPU, 0) * node_share * fidelity.cpu_share) // 1000 * 1000
                memory = int(alloc.get(MEMORY, 0) * node_share * fidelity.memory_share) // GI * GI
                pods = max(1, int(gpus * fidelity.pods_per_gpu_share))
                quotas[CPU] = Quota(cpu, borrowing_limit=cpu, lending_limit=cpu // 2 // 1000 * 1000)
                quotas[MEMORY] = Quota(
                    memory, borrowing_limit=memory, lending_limit=memory // 2 // GI * GI
                )
                quotas[PODS] = Quota(pods, borrowing_limit=pods, lending_limit=pods // 2)
            per_team[team].append(FlavorQuotas(flavor, quotas))
    covered = COVERED if fidelity.resources else (GPU,)
    out: dict[str, QueuePolicy] = {}
    for team in shape.teams:
        name = layout.cluster_queue(team)
        team_flavors = tuple(per_team[team])
        groups = (ResourceGroup(covered, team_flavors),)  # HyperPod: one group, every flavor
        out[name] = QueuePolicy(
            name=name,
            cohort=cohort_of(fidelity, team),
            quotas={f.name: f.quotas[GPU] for f in team_flavors},
            borrow_within_cohort_max_priority=layout.BORROW_MAX_PRIORITY,
            resource_groups=groups,
        )
    cohorts = {layout.COHORT: CohortSpec(layout.COHORT)}
    if any(team in fidelity.org_teams for team in shape.teams):
        org = {
            (flavor, GPU): Quota(0, lending_limit=fidelity.org_lending_gpus) for flavor in present
        }
        cohorts[fidelity.org_cohort] = CohortSpec(fidelity.org_cohort, layout.COHORT, org)
    return out, cohorts


_INFER, _EXPERIMENT, _TRAIN, _TUNE = (name for name, _, _ in layout.PRIORITY_CLASSES)
_L3_REQUIRED: tuple[Mode, str] = ("required", layout.LAYER3)
_L3_PREFERRED: tuple[Mode, str] = ("preferred", layout.LAYER3)
_US_REQUIRED: tuple[Mode, str] = ("required", layout.ULTRASERVER)
_US_PREFERRED: tuple[Mode, str] = ("preferred", layout.ULTRASERVER)
P5, GB200 = layout.P5, layout.GB200
_US_CPU = 30_000  # a GB200 node has 143 vCPUs for 4 GPUs


def job_mix(fidelity: Fidelity) -> tuple[JobTemplate, ...]:
    """The oracle's job kinds (shares relative to the default mix's)."""
    mix: list[JobTemplate] = [
        RichTemplate("infer", _INFER, P5, (1, 1), (8,), None, (90, 240), 0.10),
        RichTemplate("exp", _EXPERIMENT, P5, (1, 1), (1, 2, 4, 8), None, (60, 200), 0.22),
        RichTemplate("pretrain", _TRAIN, P5, (2, 4), (8,), _L3_REQUIRED, (240, 540), 0.16),
        RichTemplate("finetune", _TUNE, P5, (1, 3), (8,), _L3_PREFERRED, (180, 420), 0.18),
        RichTemplate(
            "us-train", _TRAIN, GB200, (4, 9), (4,), _US_REQUIRED, (240, 540), 0.07, "", _US_CPU
        ),
        RichTemplate(
            "us-tune", _TUNE, GB200, (1, 4), (4,), _US_PREFERRED, (180, 360), 0.05, "", _US_CPU
        ),
    ]
    if fidelity.resources:
        mix += [
            RichTemplate(
                "mem-exp",
                _EXPERIMENT,
                P5,
                (1, 1),
                (1, 2),
                None,
                (60, 240),
                0.06,
                memory_per_pod=(1200 * GI, 1600 * GI),
            ),
            RichTemplate(
                "prep",
                _TUNE,
                P5,
                (1, 4),
                (0,),
                None,
                (60, 240),
                0.04,
                cpu_per_pod=32_000,
                memory_per_pod=(128 * GI,),
            ),
        ]
    if fidelity.pod_sets:
        mix.append(
            RichTemplate(
                "launch-train",
                _TRAIN,
                P5,
                (2, 4),
                (8,),
                _L3_REQUIRED,
                (240, 540),
                0.06,
                launcher=True,
            )
        )
    if fidelity.mixed_flavors:
        mix += [
            RichTemplate(
                "any-tune",
                _TUNE,
                P5,
                (1, 3),
                (4,),
                None,
                (120, 360),
                0.08,
                tolerate=0.5,
                any_flavor=True,
            ),
            RichTemplate(
                "any-us",
                _TRAIN,
                GB200,
                (2, 4),
                (4,),
                _US_REQUIRED,
                (180, 420),
                0.03,
                "",
                _US_CPU,
                tolerate=0.8,
                any_flavor=True,
            ),
        ]
    if fidelity.misfits and fidelity.taint_gb200:
        mix.append(
            RichTemplate(
                "us-notol",
                _TUNE,
                GB200,
                (1, 2),
                (4,),
                None,
                (60, 120),
                0.01,
                "",
                _US_CPU,
                tolerate=0.0,
            )
        )
    return tuple(mix)


LAUNCHER = {CPU: 8_000, MEMORY: 32 * GI}


def pod_sets_for(
    template: JobTemplate, pods: int, gpus_per_pod: int, rng: random.Random
) -> tuple[tuple[SimPodSet, ...], bool]:
    """The pod sets a job of `template` asks for, and whether it names no instance type."""
    if not isinstance(template, RichTemplate):
        return (SimPodSet("main", pods, {GPU: gpus_per_pod}, template.topology),), False
    per_pod: dict[str, int] = {}
    if gpus_per_pod:
        per_pod[GPU] = gpus_per_pod
    cpu = template.cpu_per_pod if template.cpu_per_pod is not None else None
    per_pod[CPU] = cpu if cpu is not None else template.cpu_per_gpu * gpus_per_pod
    if template.memory_per_pod:
        per_pod[MEMORY] = rng.choice(template.memory_per_pod)
    else:
        per_pod[MEMORY] = template.memory_per_gpu * gpus_per_pod
    tainted_target = template.flavor == layout.GB200 or template.any_flavor
    tolerations: tuple[Toleration, ...] = ()
    if tainted_target and rng.random() < template.tolerate:
        tolerations = (GPU_TOLERATION,)
    name = "workers" if template.launcher else "main"
    workers = SimPodSet(name, pods, per_pod, template.topology, tolerations)
    if template.launcher:
        return (SimPodSet("launcher", 1, dict(LAUNCHER), None, tolerations), workers), False
    return (workers,), template.any_flavor


def strip_resources(pod_sets: Sequence[SimPodSet]) -> tuple[SimPodSet, ...]:
    """GPU-only requests (a world without fine-grained quota)."""
    return tuple(
        SimPodSet(ps.name, ps.count, {GPU: ps.requests.get(GPU, 0)}, ps.topology, ps.tolerations)
        for ps in pod_sets
        if ps.requests.get(GPU, 0)
    )
