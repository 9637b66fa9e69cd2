"""What topowatch exposes, as Prometheus would scrape it, for tests that check dashboards and
alert rules against real metric names.

Two sources: the node agent on each simulated hardware profile, its kernel log monitor on, with
faults that light up every health finding, an XID and kernel log lines of every severity, and
the cluster service over a few minutes of the simulated HyperPod cluster (preemptions, pending
workloads, a workload spread past the layer it preferred, a cordoned node, a remediation
controller in observe mode that has seen a sick node, quota advice, EFA remote errors reported
by all but one node of a workload, which names that one). Everything runs on simulated time, so
the text is the same on every run up to sample values.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from exporter.cluster.service import ClusterService
from exporter.core.exposition import Exposition
from exporter.core.findings import FINDINGS_ANNOTATION, Finding, findings_to_json
from exporter.core.provenance import agent_entry
from exporter.node.poller import Poller
from exporter.sim.cluster import SimulatedCluster
from exporter.sim.faults import parse_faults
from exporter.sim.hardware.node import SimulatedNode
from exporter.sim.hardware.profiles import get_profile
from exporter.sim.kubeapi.server import ObjectStore
from healthcheck.detection.monitor import HealthMonitor
from healthcheck.remediation.controller import RemediationController
from healthcheck.remediation.policy import PolicyConfig

PROFILES = ("p5.48xlarge", "p6e-gb200.36xlarge")
START = 1_795_000_000.0  # the simulated cluster's default epoch
SIMULATED_MINUTES = 10
NODE_POLLS = 4  # enough for rates (two readings) and for damping to make findings actionable
SPREAD_JOB = "spread-train"  # a workload whose preferred topology could not be met
LAYER3 = "topology.k8s.aws/network-node-layer-3"

# Per profile, faults covering every check the simulation can trigger (row_remap_pending follows
# from the ECC fault; numa_misplaced from the unpinned process), and kernel log lines
# of each severity (gpu-lost logs XID 79 and a fatal fallen-off-the-bus line).
FAULTS: dict[str, tuple[str, ...]] = {
    "p5.48xlarge": (
        "xid=79@gpu3",
        "gpu-lost@gpu2",
        "nvlink-down@gpu0:link3",
        "nvlink-crc@gpu1:link0",
        "ecc-dbe@gpu1",
        "remap-failure@gpu4",
        "thermal@gpu5",
        "pcie-degraded@gpu6",
        "efa-missing@rdmap16s27",
        "efa-unresponsive@rdmap16s28",
        # rdmap48s27 (EFA device index 8) is one of the few p5 devices with a paired ENA
        # interface: the simulation pairs every eighth, as only their netdev_up series exist.
        "efa-link-down@rdmap48s27",
        "efa-reset-failed@rdmap16s29",
        "aer@gpu4",
        "hung-task",
        "rootfs-ro",
        "numa-unpinned@gpu7",
    ),
    "p6e-gb200.36xlarge": (
        "xid=79@gpu3",
        "gpu-lost@gpu2",
        "nvlink-down@gpu0:link3",
        "nvlink-crc@gpu1:link0",
        "ecc-dbe@gpu1",
        "remap-failure@gpu0",
        "thermal@gpu3",
        "pcie-degraded@gpu3",
        "efa-missing@rdmap32s0",
        "efa-unresponsive@rdmap32s1",
        "rootfs-ro",
        "numa-unpinned@gpu3",
    ),
}

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)")


@dataclass
class SimulatedWorld:
    """The simulated cluster and the service that modelled it (shared, read-only after build)."""

    store: ObjectStore
    cluster: SimulatedCluster
    service: ClusterService
    controller: RemediationController
    now: float
    sick_node: str
    cordoned_node: str

    def node_name(self, instance_type: str) -> str:
        """The first cluster node of `instance_type` (node agents take its name, so PromQL
        joins between agent and cluster series find each other)."""
        for node in self.cluster.nodes():
            if node.instance_type in (instance_type, f"ml.{instance_type}"):
                return node.name
        raise LookupError(f"no simulated node of type {instance_type}")


class FaultyNode:
    """A simulated node of one profile with every fault in FAULTS, polled with health checks
    on simulated time."""

    def __init__(
        self,
        profile: str,
        node_name: str,
        start: float = START,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """With `clock` (e.g. time.time) the node runs on that clock, for a node agent polling
        in its own thread; without it `poll(step)` advances simulated time."""
        self.node = SimulatedNode(get_profile(profile), parse_faults(FAULTS[profile]), start=start)
        self.sources = self.node.sources()
        # The kernel log monitor on, as the agent runs it by default (--kernel-log auto): it
        # must be wired before the Poller is built, which sets up its ledger then.
        self.sources.kernel_log = self.node.kernel_log_source()
        self.now = start
        self.poller = Poller(
            node_name, self.sources, clock=clock or (lambda: self.now), health=HealthMonitor()
        )

    def poll(self, step: float = 5.0) -> Exposition:
        self.now += step
        _, exposition = self.poller.poll()
        time.sleep(0.02)  # XIDs arrive on NVML's event thread; let it deliver before the next
        return exposition

    def close(self) -> None:
        self.sources.close()
        self.node.close()


@contextmanager
def faulty_node(profile: str, node_name: str, start: float = START) -> Iterator[FaultyNode]:
    node = FaultyNode(profile, node_name, start)
    try:
        yield node
    finally:
        node.close()


def node_exposition(profile: str, node_name: str) -> bytes:
    with faulty_node(profile, node_name) as node:
        text = b""
        for _ in range(NODE_POLLS):
            text = node.poll().text
        return text


@functools.cache
def simulated_world() -> SimulatedWorld:
    """A default-shaped cluster stepped for a few simulated minutes, modelled by a service that
    listed it before the minutes began and re-lists it after them, as informers resuming a
    watch do: what happened in between (admissions, preemptions) happened while it watched."""
    now = START
    store = ObjectStore(clock=lambda: now)
    # Without elastic jobs: the placement scenario below (the spread job, EFA remote errors)
    # needs the capacity they would take. `elastic_cluster_exposition` has them.
    cluster = SimulatedCluster(store, seed=0, start=START, elastic=False)
    cluster.bootstrap()
    clock = [START]
    controller = RemediationController(PolicyConfig(), [], clock=lambda: clock[0])
    service = ClusterService(controller=controller, clock=lambda: clock[0], quota_min_observed_s=0)
    nodes = cluster.nodes()
    sick = nodes[0].name
    # Two days ago the sick node had a hardware incident of its own (an NVLink link down, gone
    # since): with today's XID it is a repeat offender (2 in 7 days).
    earlier = {sick: [_nvlink_down_finding(START - 2 * 86_400)]}
    for kind, plural in _PLURALS:
        items = [dict(obj, kind=kind) for obj in store.items(plural)]
        if kind == "Node":
            items = [
                _with_findings(obj, earlier[_name(obj)], bump=0) if _name(obj) in earlier else obj
                for obj in items
            ]
        service.replace(kind, items)
    cordoned = nodes[1].name
    cluster.cordon(cordoned)
    # 48 GPUs preferring one layer-3 domain (32 GPUs of p5 each): admitted, but spread
    cluster.submit("llm", SPREAD_JOB, 8, 6, "training-priority", ("preferred", LAYER3), START + 1)
    for tick in range(1, SIMULATED_MINUTES * 6 + 1):
        now = START + 10.0 * tick
        cluster.step(now)
    clock_now = clock[0] = now
    findings = {sick: [_xid_finding(clock_now)]}
    # EFA remote errors on every node of the spread workload but one: the cluster service's
    # correlation names the silent one (only-silent-node). No finding here asks for an action,
    # so the remediation controller still sees exactly one sick node.
    spread = sorted(
        node.name
        for node in nodes
        if any(
            pod.startswith(f"{SPREAD_JOB}-") for _, pod, _ in cluster.gpu_pods(node.name).values()
        )
    )
    for name in spread[:-1]:
        findings.setdefault(name, []).append(_remote_errors_finding(clock_now))
    for kind, plural in _PLURALS:
        items = [dict(obj, kind=kind) for obj in store.items(plural)]
        if kind == "Node":
            items = [
                _with_findings(obj, findings[_name(obj)]) if _name(obj) in findings else obj
                for obj in items
            ]
        service.replace(kind, items)
    controller.run_once()
    service.sample_quota()
    return SimulatedWorld(store, cluster, service, controller, clock_now, sick, cordoned)


_PLURALS = (
    ("Topology", "topologies"),
    ("ResourceFlavor", "resourceflavors"),
    ("WorkloadPriorityClass", "workloadpriorityclasses"),
    ("Cohort", "cohorts"),
    ("ClusterQueue", "clusterqueues"),
    ("LocalQueue", "localqueues"),
    ("Node", "nodes"),
    ("HyperPodPyTorchJob", "hyperpodpytorchjobs"),
    ("Workload", "workloads"),
    ("Pod", "pods"),
    ("Event", "events"),
)


def _name(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("name", ""))


def _xid_finding(now: float) -> Finding:
    """An XID 79 (fatal, replace) as the node agent reports it."""
    return Finding("xid", "gpu3", "fatal", "replace", "XID 79 fallen off the bus", now, now, True)


def _nvlink_down_finding(since: float) -> Finding:
    """Link 3 of GPU 0 inactive since `since` (critical, reboot), as the node agent reports it."""
    return Finding(
        "nvlink_down", "gpu0:link3", "critical", "reboot", "link 3 inactive", since, since, True
    )


def _remote_errors_finding(now: float) -> Finding:
    """The node agent's `efa_remote_errors` finding (warning, no action;
    healthcheck/detection/checks/efa.py) on a node whose peers stopped answering for the last five
    minutes."""
    return Finding(
        "efa_remote_errors",
        "rdmap16s27:1",
        "warning",
        "none",
        "unresponsive_remote_events +12.0/s (max 1)",
        now - 300.0,
        now,
    )


def _with_findings(node: dict[str, Any], findings: list[Finding], bump: int = 1) -> dict[str, Any]:
    """`node` as its agent would report it with `findings` in its annotation, at the new
    resourceVersion the API server gives the patched object (the model skips a re-listed
    object whose version it already holds). `bump=0` for the first list, so that a later
    patch of the same object is still news."""
    meta = dict(node.get("metadata") or {})
    version = str(meta.get("resourceVersion") or "0")
    if bump:
        meta["resourceVersion"] = (
            str(int(version) + bump) if version.isdigit() else f"{version}-{bump}"
        )
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        FINDINGS_ANNOTATION: findings_to_json(findings),
    }
    meta["managedFields"] = [*(meta.get("managedFields") or []), agent_entry()]
    return {**node, "metadata": meta}


def deployment_fault_exposition(node_name: str) -> bytes:
    """A p5 node whose agent may not open the GPUs' device files (nvml-no-permission)."""
    sim = SimulatedNode(get_profile("p5.48xlarge"), parse_faults(["nvml-no-permission"]))
    sources = sim.sources()
    now = [START]
    try:
        poller = Poller(node_name, sources, clock=lambda: now[0], health=HealthMonitor())
        text = b""
        for _ in range(NODE_POLLS):
            now[0] += 5.0
            text = poller.poll()[1].text
        return text
    finally:
        sources.close()
        sim.close()


@functools.cache
def expositions() -> dict[str, bytes]:
    """Source name ("node/<profile>", "node/deployment-fault", "cluster") -> its exposition."""
    world = simulated_world()
    out = {
        f"node/{profile}": node_exposition(profile, world.node_name(profile))
        for profile in PROFILES
    }
    out["node/deployment-fault"] = deployment_fault_exposition("hyperpod-i-0ffffffffffffffff")
    out["cluster"] = world.service.metrics_body(openmetrics=False)
    out["cluster/elastic"] = elastic_cluster_exposition()
    return out


def elastic_cluster_exposition() -> bytes:
    """The default simulated cluster with its elastic jobs, a few simulated minutes in."""
    now = START
    store = ObjectStore(clock=lambda: now)
    cluster = SimulatedCluster(store, seed=0, start=START, elastic=True)
    cluster.bootstrap()
    clock = [START]
    service = ClusterService(clock=lambda: clock[0])
    for kind, plural in _PLURALS:
        service.replace(kind, [dict(obj, kind=kind) for obj in store.items(plural)])
    for tick in range(1, SIMULATED_MINUTES * 6 + 1):
        now = clock[0] = START + 10.0 * tick
        cluster.step(now)
        for kind, plural in _PLURALS:
            service.replace(kind, [dict(obj, kind=kind) for obj in store.items(plural)])
    return service.metrics_body(openmetrics=False)


@functools.cache
def exposed_metric_names() -> frozenset[str]:
    """Every sample name in any exposition (suffixes such as _total and _bucket kept)."""
    names: set[str] = set()
    for text in expositions().values():
        for line in text.decode().splitlines():
            if line and not line.startswith("#"):
                match = _SAMPLE.match(line)
                if match:
                    names.add(match.group(1))
    return frozenset(names)
