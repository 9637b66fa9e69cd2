"""The static shape of the simulated HyperPod cluster: nodes, topology, teams, quotas, job mix.

p5 nodes sit in EC2's three-layer network topology (4 nodes per layer-3 network node, 2 layer-3
nodes per layer-2 node, one layer-1 node); the p6e-gb200 nodes form UltraServers of up to 18
nodes, each under its own layer-3 node. Network node ids are `nn-` plus 17 hex digits, as
DescribeInstanceTopology returns them, drawn from the seed so a run is repeatable.

Teams get HyperPod task-governance names (namespace `hyperpod-ns-<team>`, queues
`hyperpod-ns-<team>-localqueue` / `-clusterqueue`), a share of each flavor's GPUs as nominal
quota, half of it lendable to the cohort, and may borrow as much again.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass

from exporter.sim.kueue.scheduler import HOSTNAME, FlavorSpec, Mode, QueuePolicy, Quota
from exporter.topology.labels import (
    HEALTH_STATUS_KEY,
    INSTANCE_GROUP_KEY,
    INSTANCE_TYPE_KEY,
    LAYER_KEYS,
    REGION_KEY,
    ULTRASERVER_KEY,
    ZONE_KEY,
)

LAYER1, LAYER2, LAYER3 = LAYER_KEYS[:3]
ULTRASERVER = ULTRASERVER_KEY
ZONE = ZONE_KEY
REGION = REGION_KEY
INSTANCE_TYPE = INSTANCE_TYPE_KEY
HEALTH = HEALTH_STATUS_KEY

JOB_NAME = re.compile(r"(?=.{1,40}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # room for Kueue's prefixes
POD_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery rand.String

P5 = "ml.p5.48xlarge"
GB200 = "ml.p6e-gb200.36xlarge"
GPUS = {P5: 8, GB200: 4}
TOPOLOGY_DEFAULT = "hyperpod-default"
TOPOLOGY_ULTRASERVER = "hyperpod-ultraserver"
FLAVORS = {
    P5: FlavorSpec(P5, TOPOLOGY_DEFAULT, (LAYER1, LAYER2, LAYER3, HOSTNAME)),
    GB200: FlavorSpec(GB200, TOPOLOGY_ULTRASERVER, (LAYER1, LAYER2, LAYER3, ULTRASERVER, HOSTNAME)),
}
COHORT = "hyperpod-cohort"
REGION_NAME = "us-east-2"
ZONE_NAME = "us-east-2a"
NODES_PER_LAYER3 = 4
LAYER3_PER_LAYER2 = 2
ULTRASERVER_SIZE = 18

# HyperPod task governance's example cluster policy (name, weight); Kueue sees the weight as the
# WorkloadPriorityClass value.
PRIORITY_CLASSES: tuple[tuple[str, int, str], ...] = (
    ("inference-priority", 90, "Real-time inference: admitted first, preempts training"),
    ("experimentation-priority", 80, "Short interactive experiments"),
    ("training-priority", 70, "Pre-training and large distributed training"),
    ("fine-tuning-priority", 50, "Fine-tuning jobs; first to yield"),
)
# The low class HyperPod elastic scale-up Workloads are queued at, below every class above, so
# Kueue preempts scale-ups first (AWS's "base"/"elastic" pattern: the reference's section 1.2
# and 1.4). Written only when the simulation runs elastic jobs.
ELASTIC_PRIORITY_CLASS = (
    "elastic-priority",
    40,
    "Elastic scale-up increments of training jobs: the first to yield",
)
PRIORITY = {name: value for name, value, _ in (*PRIORITY_CLASSES, ELASTIC_PRIORITY_CLASS)}
BORROW_MAX_PRIORITY = PRIORITY["fine-tuning-priority"]


@dataclass(frozen=True, slots=True)
class SimNode:
    name: str
    instance_type: str
    gpus: int
    labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class ClusterShape:
    p5_nodes: int = 16  # ml.p5.48xlarge, 8 GPUs, 4 per layer-3 network node
    ultraserver_nodes: int = 18  # ml.p6e-gb200.36xlarge, 4 GPUs, UltraServers of 18
    teams: tuple[str, ...] = ("llm", "vision", "research")
    arrivals_per_minute: float = 2.3  # random job arrivals; 0 for a fully scripted cluster
    initial_workloads: int = 12  # random jobs already queued when the cluster boots
    # elastic jobs running when the cluster boots (exporter/sim/elastic.py), when elastic jobs
    # are on: HyperPodPyTorchJobs, and Kueue-native elastic batch Jobs
    elastic_hyperpod_jobs: int = 2
    elastic_batch_jobs: int = 1


def default_shape() -> ClusterShape:
    return ClusterShape()


def namespace(team: str) -> str:
    return f"hyperpod-ns-{team}"


def local_queue(team: str) -> str:
    return f"{namespace(team)}-localqueue"


def cluster_queue(team: str) -> str:
    return f"{namespace(team)}-clusterqueue"


def _hex(rng: random.Random, digits: int) -> str:
    return f"{rng.getrandbits(4 * digits):0{digits}x}"


def network_node_id(rng: random.Random) -> str:
    return "nn-" + _hex(rng, 17)


def instance_id(rng: random.Random) -> str:
    return "i-0" + _hex(rng, 16)


def build_nodes(shape: ClusterShape, rng: random.Random) -> list[SimNode]:
    """Every node with its HyperPod labels; p5 nodes first, in topology order."""
    layer1 = network_node_id(rng)
    nodes: list[SimNode] = []
    layer2 = layer3 = ""
    for i in range(shape.p5_nodes):
        if i % (NODES_PER_LAYER3 * LAYER3_PER_LAYER2) == 0:
            layer2 = network_node_id(rng)
        if i % NODES_PER_LAYER3 == 0:
            layer3 = network_node_id(rng)
        nodes.append(_node(rng, P5, {LAYER1: layer1, LAYER2: layer2, LAYER3: layer3}))
    if shape.ultraserver_nodes:
        layer2 = network_node_id(rng)
    ultraserver = ""
    for i in range(shape.ultraserver_nodes):
        if i % ULTRASERVER_SIZE == 0:
            layer3 = network_node_id(rng)
            ultraserver = "us-" + _hex(rng, 17)
        network = {LAYER1: layer1, LAYER2: layer2, LAYER3: layer3, ULTRASERVER: ultraserver}
        nodes.append(_node(rng, GB200, network))
    return nodes


def _node(rng: random.Random, instance_type: str, network: Mapping[str, str]) -> SimNode:
    name = "hyperpod-" + instance_id(rng)
    arch = "arm64" if instance_type == GB200 else "amd64"
    group = "gb200-ultraserver" if instance_type == GB200 else "p5-workers"
    labels = {
        "kubernetes.io/arch": arch,
        "kubernetes.io/os": "linux",
        HOSTNAME: name,
        INSTANCE_TYPE: instance_type,
        REGION: REGION_NAME,
        ZONE: ZONE_NAME,
        **network,
        "sagemaker.amazonaws.com/compute-type": "hyperpod",
        INSTANCE_GROUP_KEY: group,
        "sagemaker.amazonaws.com/deep-health-check-status": "Passed",
        HEALTH: "Schedulable",
    }
    return SimNode(name, instance_type, GPUS[instance_type], labels)


def flavors_in(nodes: list[SimNode]) -> dict[str, FlavorSpec]:
    present = {n.instance_type for n in nodes}
    return {name: spec for name, spec in FLAVORS.items() if name in present}


def team_weights(teams: tuple[str, ...]) -> dict[str, int]:
    """The first team is the big one (twice the others' share)."""
    return {team: 2 if i == 0 else 1 for i, team in enumerate(teams)}


def queue_policies(shape: ClusterShape, nodes: list[SimNode]) -> dict[str, QueuePolicy]:
    weights = team_weights(shape.teams)
    total_weight = sum(weights.values())
    quotas: dict[str, dict[str, Quota]] = {team: {} for team in shape.teams}
    for flavor in flavors_in(nodes):
        unit = GPUS[flavor]
        capacity = sum(n.gpus for n in nodes if n.instance_type == flavor)
        shares = {t: capacity * w // total_weight // unit * unit for t, w in weights.items()}
        shares[shape.teams[0]] += capacity - sum(shares.values())
        for team, nominal in shares.items():
            lend = nominal // 2 // unit * unit
            quotas[team][flavor] = Quota(nominal, borrowing_limit=nominal, lending_limit=lend)
    return {
        cluster_queue(team): QueuePolicy(
            name=cluster_queue(team),
            cohort=COHORT,
            quotas=quotas[team],
            borrow_within_cohort_max_priority=BORROW_MAX_PRIORITY,
        )
        for team in shape.teams
    }


@dataclass(frozen=True, slots=True)
class JobTemplate:
    """One kind of job the teams submit, with its share of arrivals."""

    stem: str
    priority_class: str
    flavor: str
    pods: tuple[int, int]
    gpus_per_pod: tuple[int, ...]
    topology: tuple[Mode, str] | None
    runtime: tuple[float, float]  # seconds
    weight: float
    elastic: str = ""  # "hyperpod" | "slice": an elastic job (exporter/sim/elastic.py)


_INFER, _EXPERIMENT, _TRAIN, _TUNE = (name for name, _, _ in PRIORITY_CLASSES)
_L3_REQUIRED: tuple[Mode, str] = ("required", LAYER3)
_L3_PREFERRED: tuple[Mode, str] = ("preferred", LAYER3)
_US_REQUIRED: tuple[Mode, str] = ("required", ULTRASERVER)
_US_PREFERRED: tuple[Mode, str] = ("preferred", ULTRASERVER)

# stem, priority class, flavor, pods (min, max), GPUs per pod, topology, runtime (s), share
JOB_MIX: tuple[JobTemplate, ...] = (
    JobTemplate("infer", _INFER, P5, (1, 1), (8,), None, (90, 240), 0.12),
    JobTemplate("exp", _EXPERIMENT, P5, (1, 1), (1, 2, 4, 8), None, (60, 200), 0.28),
    JobTemplate("pretrain", _TRAIN, P5, (2, 4), (8,), _L3_REQUIRED, (240, 540), 0.22),
    JobTemplate("finetune", _TUNE, P5, (1, 3), (8,), _L3_PREFERRED, (180, 420), 0.26),
    JobTemplate("us-train", _TRAIN, GB200, (4, 9), (4,), _US_REQUIRED, (240, 540), 0.07),
    JobTemplate("us-tune", _TUNE, GB200, (1, 4), (4,), _US_PREFERRED, (180, 360), 0.05),
)

# Elastic arrivals, added to the mix when the simulation runs elastic jobs: HyperPodPyTorchJobs
# (pods = minReplicas; they grow to maxReplicas by scale-up Workloads) and Kueue-native elastic
# batch Jobs (pods = the first slice's size). Shares relative to JOB_MIX (which sums to 1.0):
# with the bootstrap elastic jobs and the several Workloads each keeps, elastic jobs own about
# a fifth of the Workloads over time.
ELASTIC_MIX: tuple[JobTemplate, ...] = (
    JobTemplate("elastic", _TRAIN, P5, (2, 2), (8,), None, (1200, 2700), 0.025, "hyperpod"),
    JobTemplate("elastic-batch", _TUNE, P5, (1, 2), (4,), None, (900, 1800), 0.015, "slice"),
)
